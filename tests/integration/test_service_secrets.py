"""The running service (`message-history run`, as the container runs it) logs JSON lines only, and the
secrets it is configured with (MongoDB URI with a password, Kafka SASL password) appear in none of its
outputs: logs, /metrics, /readyz, /livez, dead-letter headers, `config` and `check`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
import uuid
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from pydantic import SecretStr
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.infra import skip_or_fail
from tests.integration.service_harness import (
    ServiceProcess,
    drop_database,
    encoded,
    fresh_settings,
    request_event,
    response_event,
    settings_env,
)
from tests.integration.stream_helpers import produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _uri_with_password(base: str, user: str, password: str) -> str:
    """`base` with SCRAM credentials of a user in the `admin` database."""
    parts = urlsplit(base)
    netloc = f"{quote(user)}:{quote(password)}@{parts.netloc.rsplit('@', 1)[-1]}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, parts.fragment))


@contextlib.contextmanager
def _scram_user(mongo_uri: str, user: str, password: str) -> Iterator[None]:
    """A SCRAM user created for the test (MongoDB and SecantusDB both do SCRAM-SHA-256), dropped after."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, serverSelectionTimeoutMS=10_000)
    try:
        try:
            client.admin.command("createUser", user, pwd=password, roles=[{"role": "root", "db": "admin"}])
        except OperationFailure as exc:
            reason = f"cannot create a SCRAM user on the test server: {exc.details or exc}"
            skip_or_fail(reason)
        yield
    finally:
        with contextlib.suppress(OperationFailure):
            client.admin.command("dropUser", user)
        client.close()


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:  # 503 bodies (not ready) are checked too
        return str(exc.read().decode())


async def _http_port(service: ServiceProcess, timeout_s: float = 60.0) -> int:
    """The port the service bound (it was given port 0), read from its `serving ...` log line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in service.log().splitlines():
            if line.startswith("{") and "http_port" in line:
                return int(json.loads(line)["http_port"])
        await asyncio.sleep(0.2)
    raise AssertionError(f"the service never logged its HTTP port:\n{service.log()[-2000:]}")


async def _metrics_when(url: str, done: str, timeout_s: float = 60.0) -> str:
    """/metrics once it contains `done` (work has flowed through), polled without asserting on time."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(_get, url)
        if done in text:
            return text
        await asyncio.sleep(0.3)
    raise AssertionError(f"/metrics never showed {done!r}:\n{text[-2000:]}")


async def test_secrets_stay_out_of_logs_metrics_probes_and_dead_letters(
    kafka_bootstrap: str, mongo_uri: str, tmp_path: Path
) -> None:
    """With a password in MONGODB_URI and a SASL password set, at DEBUG, after good and poison records, every
    log line is a JSON object and neither secret nor the full URI shows up anywhere the service writes."""
    password = f"mongo-pw-{uuid.uuid4().hex}"
    sasl_password = f"sasl-pw-{uuid.uuid4().hex}"
    if "@" in urlsplit(mongo_uri).netloc:  # a server that needs credentials: its password is the secret
        uri = mongo_uri
        password = urlsplit(mongo_uri).password or password
        user_cm: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    else:
        user = f"mh-{uuid.uuid4().hex[:8]}"
        uri = _uri_with_password(mongo_uri, user, password)
        user_cm = _scram_user(mongo_uri, user, password)
    with user_cm:
        await _run_and_check(kafka_bootstrap, uri, password, sasl_password, tmp_path)


async def _run_and_check(
    kafka_bootstrap: str, uri: str, password: str, sasl_password: str, tmp_path: Path
) -> None:
    settings = fresh_settings(
        kafka_bootstrap,
        uri,
        kafka_sasl_password=SecretStr(sasl_password),
        log_level="DEBUG",
    )
    request = request_event("th-secret", "owner", 1, "hello")
    response = response_event("th-secret", "owner", 1, request["messages"], "hi")
    service = ServiceProcess(settings, tmp_path / "service.log")
    outputs: dict[str, str] = {}
    try:
        service.start()
        port = await _http_port(service)
        base = f"http://127.0.0.1:{port}"
        await produce(kafka_bootstrap, settings.requests_topic, [encoded(request), (b"th-bad", b"not json")])
        await produce(kafka_bootstrap, settings.responses_topic, [encoded(response)])
        outputs["metrics"] = await _metrics_when(
            f"{base}/metrics", 'message_history_records_produced_total{topic="' + settings.persisted_topic
        )
        outputs["readyz"] = await asyncio.to_thread(_get, f"{base}/readyz")
        outputs["livez"] = await asyncio.to_thread(_get, f"{base}/livez")
        dead = await read_topic(
            kafka_bootstrap, settings.requests_dlq, until=lambda records: len(records) >= 1
        )
        outputs["dead-letter headers"] = repr([record.headers for record in dead])
        service.signal(signal.SIGTERM)
        assert await service.wait(settings.shutdown_grace_s + 15) == 0
    finally:
        service.stop_now()
        await drop_database(settings)
    outputs["log"] = service.log()
    # `message-history config` and `check` print settings and targets: masked, never the values.
    env = {**os.environ, **settings_env(settings)}
    for command in ("config", "check"):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "message_history", command, env=env, stdout=PIPE, stderr=STDOUT
        )
        stdout, _ = await asyncio.wait_for(process.communicate(), timeout=60)
        outputs[command] = stdout.decode()
        assert process.returncode == 0, outputs[command]
    assert "**********" in outputs["config"]  # the secret fields are there, masked

    lines = [line for line in outputs["log"].splitlines() if line.strip()]
    assert len(lines) > 5
    for line in lines:
        record: dict[str, Any] = json.loads(line)  # a non-JSON line fails here, showing itself
        assert {"ts", "level", "logger", "msg"} <= set(record), line
    for where, text in outputs.items():
        for secret in (password, sasl_password, uri):
            assert secret not in text, f"a secret leaked into {where}"
