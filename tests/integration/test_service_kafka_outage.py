"""A Kafka broker that goes away mid-stream and comes back: the service waits, then loses and repeats nothing.

The broker is a private one (same jars and configuration as the local stack's, its own ports and data), so
stopping it disturbs no other test. It is stopped with SIGTERM while a wave of events sits in it unread and
started again on the same ports and data after about ten seconds.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shlex
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from message_history.app.health import Health
from tests.infra import skip_or_fail
from tests.integration.service_harness import (
    ROOT,
    dead_letters,
    drop_database,
    fresh_settings,
    read_request_ids,
    running_service,
    stored_messages,
    values,
    wave,
)
from tests.integration.stream_helpers import produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

OUTAGE_S = 10.0
THREADS = [f"th{i}" for i in range(6)]


def _stack_module() -> ModuleType:
    """`deploy/local/stack.py` (stdlib only), for the broker's configuration, classpath and JVM options."""
    spec = importlib.util.spec_from_file_location("local_stack", ROOT / "deploy" / "local" / "stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Kafka:
    """A private single-node KRaft broker that the test stops and starts again on the same ports and data."""

    def __init__(self, stack: ModuleType, home: Path) -> None:
        self.stack = stack
        self.home = home
        self.port, self.controller_port = stack.free_ports(2)
        self.config = home / "server.properties"
        self.log = home / "kafka.log"
        self.java = stack.java_executable()
        self.process: subprocess.Popen[bytes] | None = None
        data = home / "data"
        data.mkdir(parents=True)
        stack.write_kafka_config(self.config, data, self.port, self.controller_port)
        subprocess.run(
            [self.java, "-Xmx256m", *self._common(), "kafka.tools.StorageTool", "format",
             "-t", stack.kafka_cluster_id(), "-c", str(self.config)],
            stdin=subprocess.DEVNULL, capture_output=True, check=True,
        )  # fmt: skip

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _common(self) -> list[str]:
        log4j = f"-Dlog4j2.configurationFile=file:{self.stack.KAFKA_LOG4J}"
        return [log4j, "-cp", f"{self.stack.KAFKA_LIBS}/*"]

    def start(self) -> None:
        started = self._ready_lines()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [self.java, *shlex.split("-Xms128m -Xmx384m"), *self.stack.KAFKA_JVM_OPTS, *self._common(),
                 f"-Dkafka.logs.dir={self.home}", "kafka.Kafka", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while self._ready_lines() <= started:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Kafka did not start: {self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def _ready_lines(self) -> int:
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count(self.stack.KAFKA_READY_LINE)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # controlled shutdown, as a rolling restart does
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[_Kafka]:
    stack = _stack_module()
    if not Path(stack.KAFKA_LIBS).is_dir():
        reason = f"{stack.KAFKA_LIBS} is missing: run `deploy/local/stack install` first"
        skip_or_fail(reason)
    broker = _Kafka(stack, tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def _make_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1) for name in names], timeout_ms=30_000)
    finally:
        await admin.close()


async def test_kafka_outage_is_waited_out_without_loss_or_duplicates(
    kafka: _Kafka, mongo_uri: str, tmp_path: Path
) -> None:
    """The broker stopped ~10 s with a wave unread: afterwards every turn is stored once, every request
    enriched, nothing dead-lettered, and the service, never restarted, stops cleanly."""
    settings = fresh_settings(kafka.bootstrap, mongo_uri, retry_max_backoff_s=1.0)
    bootstrap = kafka.bootstrap
    await _make_topics(bootstrap, [settings.requests_topic, settings.responses_topic])
    total_turns = 9
    health = Health()
    async with running_service(settings, health=health) as service:
        requests, responses = wave(THREADS, range(1, 4))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= len(responses))

        # A wave lands in the broker, which then goes away before (or while) the service handles it.
        requests, responses = wave(THREADS, range(4, 7))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        await asyncio.to_thread(kafka.stop)
        await asyncio.sleep(OUTAGE_S)
        assert not service.done(), "the service gave up during the outage"
        await asyncio.to_thread(kafka.start)

        requests, responses = wave(THREADS, range(7, total_turns + 1))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        want = len(THREADS) * total_turns
        persisted = await read_request_ids(bootstrap, settings.persisted_topic, want, timeout_s=180)
        enriched = await read_request_ids(bootstrap, settings.enriched_topic, want, timeout_s=180)
    rows = await stored_messages(settings)
    letters = await dead_letters(settings)
    await drop_database(settings)

    assert letters == []
    counts = Counter(r["id"] for r in rows)
    assert len(counts) == 2 * want  # one user and one assistant message per turn
    assert set(counts.values()) == {1}
    expected = {f"{t}-turn{n}" for t in THREADS for n in range(1, total_turns + 1)}
    assert {v["requestId"] for v in values(persisted)} == expected
    assert {v["requestId"] for v in values(enriched)} == expected
    # Whatever a recall saw (the paths run independently, so a late recall may see later turns too), it saw
    # each stored message once, oldest first; a redelivered event is the same event, so every copy must pass.
    for event in values(enriched):
        recalled = [m for m in event["messages"] if m["source"] == "memory"]
        ids = [m["id"] for m in recalled]
        assert len(ids) == len(set(ids)), event["requestId"]
        assert len(ids) == event["history"]["recalled"], event["requestId"]
        assert set(ids) <= set(counts), event["requestId"]
        assert ids == [m["id"] for m in sorted(recalled, key=lambda m: (m["createdAt"], m["id"]))]
