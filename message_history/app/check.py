"""`message-history check`: one real round trip on each dependency, one OK/FAIL line each, exit 0 or 1.

Kafka: bootstrap and metadata, then produce one record to a probe topic and read that exact record back
(assigned partition, no consumer group, so nothing is committed and no group is left behind).
MongoDB: `ping`, then insert, read back and delete one document in a probe collection.

Lines never carry secrets: the MongoDB URI is printed without its password and query string.
`deploy/local/stack up` uses it as its readiness probe (`python -m message_history check --timeout S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ValidationError

from message_history.logs import register_settings_secrets, scrub
from message_history.settings import Settings
from producers.connection import kafka_options

Dependency = Literal["kafka", "mongodb"]

PROBE_TOPIC = "message-history.check"
PROBE_COLLECTION = "message_history_check"
DEFAULT_KAFKA_TIMEOUT_S = 20.0
_MAX_DETAIL = 300


@dataclass(frozen=True)
class CheckResult:
    """What one dependency check found; `target` and `detail` are safe to print."""

    dependency: Dependency
    ok: bool
    target: str
    detail: str

    def line(self) -> str:
        return f"{'OK  ' if self.ok else 'FAIL'} {self.dependency:<8} {self.target}  {self.detail}"


def mask_mongodb_uri(uri: str) -> str:
    """The URI with its password replaced by `***` and its query string dropped (it may hold secrets)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparsable MongoDB URI>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hosts}" if ":" in userinfo else f"{user}@{hosts}"
    return f"{parts.scheme}://{netloc}{parts.path or '/'}"


def _scrub(text: str, settings: Settings) -> str:
    """One line, capped, with every secret masked by the logs' one scrubber (driver errors may echo them)."""
    register_settings_secrets(settings)
    text = " ".join(scrub(text).split())
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 1] + "…"


def _error(exc: BaseException) -> str:
    message = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {message}"


async def check_kafka(
    settings: Settings, *, topic: str = PROBE_TOPIC, timeout_s: float = DEFAULT_KAFKA_TIMEOUT_S
) -> CheckResult:
    """Produce one unique record to `topic` and read that same record back by partition and offset."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: PLC0415

    target = settings.kafka_bootstrap_servers
    options = kafka_options(settings, client_id="message-history-check")
    token = uuid.uuid4().hex.encode()
    producer = AIOKafkaProducer(**options, acks="all", request_timeout_ms=int(timeout_s * 1000))
    consumer = AIOKafkaConsumer(**options, enable_auto_commit=False, request_timeout_ms=int(timeout_s * 1000))
    started = time.monotonic()
    step = "connect"
    try:
        async with asyncio.timeout(timeout_s):
            await producer.start()
            step = f"produce to {topic!r}"
            meta = await producer.send_and_wait(topic, token, key=b"check")
            step = f"consume from {topic!r}"
            await consumer.start()
            partition = TopicPartition(topic, meta.partition)
            consumer.assign([partition])
            consumer.seek(partition, meta.offset)
            record = await consumer.getone()
            if record.value != token:
                detail = f"read back a different record at offset {meta.offset}"
                return CheckResult("kafka", False, target, detail)
    except TimeoutError:
        return CheckResult("kafka", False, target, f"{step}: no answer within {timeout_s:g} s")
    except Exception as exc:  # noqa: BLE001 -- any failure is the answer: report it, never raise
        return _failed("kafka", target, step, exc, settings)
    finally:
        await _quietly(consumer.stop)
        await _quietly(producer.stop)
    done = f"produced and read back a record on {topic!r} (partition {meta.partition}, offset {meta.offset})"
    return _passed("kafka", target, done, started)


async def check_mongodb(settings: Settings, *, timeout_s: float | None = None) -> CheckResult:
    """`ping`, then insert, read back and delete one document in the probe collection."""
    from pymongo import AsyncMongoClient  # noqa: PLC0415

    uri = settings.mongodb_uri.get_secret_value()
    target = mask_mongodb_uri(uri)
    timeout_ms = int(timeout_s * 1000) if timeout_s is not None else settings.mongodb_timeout_ms
    started = time.monotonic()
    step = "connect"
    client: AsyncMongoClient[dict[str, Any]] | None = None
    try:
        client = AsyncMongoClient(
            uri, serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms, timeoutMS=timeout_ms
        )
        step = "ping"
        await client.admin.command("ping")
        info = await client.admin.command("buildInfo")
        # SecantusDB (the local stack's server) answers with a MongoDB version and its own key.
        server = (
            f"SecantusDB {info['secantusVersion']}, MongoDB {info.get('version')} wire"
            if "secantusVersion" in info
            else f"MongoDB {info.get('version')}"
        )
        collection = client[settings.mongodb_database][PROBE_COLLECTION]
        probe_id = uuid.uuid4().hex
        step = f"write to {settings.mongodb_database}.{PROBE_COLLECTION}"
        await collection.insert_one({"_id": probe_id, "at": datetime.now(UTC)})
        step = "read back"
        found = await collection.find_one({"_id": probe_id})
        step = "delete"
        deleted = await collection.delete_one({"_id": probe_id})
        if found is None or deleted.deleted_count != 1:
            return CheckResult("mongodb", False, target, "the probe document did not read back")
    except Exception as exc:  # noqa: BLE001 -- any failure is the answer: report it, never raise
        return _failed("mongodb", target, step, exc, settings)
    finally:
        if client is not None:
            await _quietly(client.close)
    done = f"ping, write, read back and delete on {settings.mongodb_database}.{PROBE_COLLECTION} ({server})"
    return _passed("mongodb", target, done, started)


def _passed(dependency: Dependency, target: str, done: str, started: float) -> CheckResult:
    return CheckResult(dependency, True, target, f"{done} in {(time.monotonic() - started) * 1000:.0f} ms")


def _failed(
    dependency: Dependency, target: str, step: str, exc: BaseException, settings: Settings
) -> CheckResult:
    return CheckResult(dependency, False, target, f"{step}: {_scrub(_error(exc), settings)}")


async def _quietly(stop: Callable[[], Awaitable[object]]) -> None:
    # Closing after a failure must not hide the failure.
    with contextlib.suppress(Exception):
        await stop()


async def run_checks(
    settings: Settings, only: Dependency | None = None, timeout_s: float | None = None
) -> list[CheckResult]:
    """Run the selected checks concurrently, Kafka first in the output."""
    jobs: list[Awaitable[CheckResult]] = []
    if only in (None, "kafka"):
        jobs.append(check_kafka(settings, timeout_s=timeout_s or DEFAULT_KAFKA_TIMEOUT_S))
    if only in (None, "mongodb"):
        jobs.append(check_mongodb(settings, timeout_s=timeout_s))
    return list(await asyncio.gather(*jobs))


def main(only: Dependency | None = None, timeout_s: float | None = None) -> int:
    """Print one line per dependency; 0 when every check passed, 1 otherwise."""
    # aiokafka logs a warning while it waits for an auto-created topic; the result line says what matters.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        settings = Settings()
    except ValidationError as exc:  # a bad setting is a FAIL line, not a traceback; values are not echoed
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors(include_input=False, include_url=False)
        )
        print(f"FAIL settings  {problems}")
        return 1
    results = asyncio.run(run_checks(settings, only, timeout_s))
    for result in results:
        print(result.line(), flush=True)
    return 0 if all(result.ok for result in results) else 1
