"""The TypeScript package's `ObserverWorker` (`worker-ts/test/fixtures/observer.ts`: KafkaJS, a stub
observer) beside the service on the local stack: a long conversation's ObserveRequest is answered from Node,
and the service applies it (recall then carries it: tests/integration/test_observational_stream.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeTopic
from tests.infra import skip_or_fail
from tests.integration.om_service import om_service_settings, sent_work, the_row
from tests.integration.service_harness import drop_database, running_service
from tests.integration.stream_helpers import produce, wait_committed
from tests.integration.test_observational_stream import THREAD, _turn
from tests.interop.node22 import node22

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

PACKAGE = Path(__file__).resolve().parents[2] / "worker-ts"
FIXTURE = "build/test/fixtures/observer.js"


@pytest.fixture(scope="module")
def node() -> str:
    node = node22()
    for package in ("kafkajs", "typescript"):
        if not (PACKAGE / "node_modules" / package).is_dir():
            skip_or_fail(
                f"worker-ts/node_modules/{package} is missing (run `deploy/local/stack install --all`)"
            )
    built = subprocess.run(
        [node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return node


def _start(node: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([node, FIXTURE], cwd=PACKAGE, env=env, stdout=out, stderr=subprocess.STDOUT)


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return [line for line in out if isinstance(line, dict)]


async def test_a_typescript_observer_answers_the_service(
    node: str, kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    settings = await om_service_settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    log = tmp_path / "observer.log"
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "MESSAGE_HISTORY_OBSERVE_REQUESTS_TOPIC": settings.observe_requests_topic,
        "MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC": settings.observe_results_topic,
        "OBSERVER_GROUP_ID": f"{settings.group_id}-ts-observer",
    }
    process = _start(node, env, log)
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            work = await sent_work(settings, 1)
            await wait_committed(
                bootstrap, settings.group_id, settings.observe_results_topic, {0: 1}, timeout_s=90
            )
        row = await the_row(settings)
        assert row["activeObservations"] == f"- ts observer: {len(work[0].messages)} messages of {THREAD}"
        assert row["isObserving"] is False
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 30)
        events = _events(log)
        assert [e["cycle"] for e in events if e.get("event") == "observe"] == [1], log.read_text()[-3000:]
        assert events[-1] == {"event": "stopped", "answered": 1}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        await drop_database(settings)
