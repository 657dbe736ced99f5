"""An outage is visible and quiet: `/readyz` says so while it lasts, the log says it in a few lines.

`message-history run` as a process (its log is the production log: JSON lines through `configure_logging`,
the quieting filter included), its `/readyz` and `/metrics` read over HTTP. Kafka: a private broker stopped
~15 s, then frozen (SIGSTOP) ~10 s. MongoDB: a private server stopped ~15 s, then frozen ~10 s, under a
steady stream of turns. Each time the service must turn
not ready with a reason naming the dependency, be ready again within seconds after, lose nothing, count its
retries in `message_history_retries_total{dependency}` fast enough for the chart's retry alert, and write
at most a few dozen WARNING/ERROR lines for the whole outage.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.ports import restartable_port
from tests.integration.private_kafka import PrivateKafka
from tests.integration.service_harness import (
    ROOT,
    ServiceProcess,
    dead_letters,
    drop_database,
    fresh_settings,
    read_request_ids,
    stored_messages,
    values,
    wave,
)
from tests.integration.stream_helpers import produce
from tests.integration.test_service_kafka_outage import _make_topics
from tests.integration.test_service_mongo_outage import (  # noqa: F401 -- the fixture
    _PrivateServer,
    mongo_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

THREADS = [f"th{i}" for i in range(4)]
MAX_LOUD_LINES = 40  # WARNING/ERROR lines per outage ("a few dozen"); thousands before (issue 36)
_RETRY_RATE = re.compile(r'message_history_retries_total\{dependency="(\w+)",path="(\w+)"\} ([0-9.e+]+)')


def _alert_rate() -> float:
    """The retry rate (per second) above which the chart's MessageHistoryOutageRetries alert fires."""
    values_file = ROOT / "deploy" / "helm" / "message-history" / "values.yaml"
    chart = yaml.safe_load(values_file.read_text(encoding="utf-8"))
    return float(chart["prometheusRule"]["outageRetries"]["ratePerSecond"])


class Probe:
    """The service's HTTP endpoints."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        try:
            status, body = await asyncio.to_thread(self._get, "/readyz")
        except OSError:
            return False, {"probe": "no answer"}
        doc: dict[str, Any] = json.loads(body)
        return status == 200, doc["components"]

    async def retries(self, dependency: str) -> float:
        _, body = await asyncio.to_thread(self._get, "/metrics")
        return sum(float(n) for dep, _, n in _RETRY_RATE.findall(body) if dep == dependency)

    async def wait(
        self, want_ready: bool, timeout_s: float, check: Callable[[dict[str, str]], bool] = lambda _: True
    ) -> dict[str, str]:
        """The components' reasons once readiness is `want_ready` (and `check` holds); bounded."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready, reasons = await self.readiness()
            if ready == want_ready and check(reasons):
                return reasons
            if time.monotonic() > deadline:
                raise AssertionError(f"not {'ready' if want_ready else 'unready'} in {timeout_s}s: {reasons}")
            await asyncio.sleep(0.2)


def _names(dependency: str) -> Callable[[dict[str, str]], bool]:
    return lambda reasons: any(dependency in why.lower() for why in reasons.values() if why != "ok")


def loud_lines(log: str) -> list[dict[str, Any]]:
    """The WARNING and ERROR lines of a JSON log."""
    lines = []
    for text in log.splitlines():
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("level") in ("WARNING", "ERROR", "CRITICAL"):
            lines.append(doc)
    return lines


def _summary(lines: list[dict[str, Any]]) -> str:
    counts = Counter(f"{d['level']} {d['logger']}: {str(d['msg'])[:80]}" for d in lines)
    return "\n".join(f"{n:5d} {line}" for line, n in counts.most_common(30))


async def _outage(
    probe: Probe, service: ServiceProcess, dependency: str, seconds: float, down: Callable[[], None]
) -> dict[str, str]:
    """Take the dependency down with `down`, wait until not ready naming it, then out the `seconds`."""
    started = time.monotonic()
    await asyncio.to_thread(down)
    reasons = await probe.wait(False, seconds + 30, _names(dependency))
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
    assert service.process is not None
    assert service.process.poll() is None, "the service died"
    return reasons


async def _check_stored(settings: Settings, threads: list[str], turns: int) -> None:
    bootstrap = settings.kafka_bootstrap_servers
    want = len(threads) * turns
    persisted = await read_request_ids(bootstrap, settings.persisted_topic, want, timeout_s=180)
    enriched = await read_request_ids(bootstrap, settings.enriched_topic, want, timeout_s=180)
    rows = await stored_messages(settings)
    letters = await dead_letters(settings)
    assert letters == []
    counts = Counter(r["id"] for r in rows)
    assert len(counts) == 2 * want
    assert set(counts.values()) == {1}
    expected = {f"{t}-turn{n}" for t in threads for n in range(1, turns + 1)}
    assert {v["requestId"] for v in values(persisted)} == expected
    assert {v["requestId"] for v in values(enriched)} == expected


async def test_kafka_outage_is_not_ready_and_quiet(
    private_kafka: PrivateKafka, mongo_uri: str, tmp_path: Path
) -> None:
    """Broker stopped ~15 s, then frozen ~10 s: not ready naming Kafka each time, ready again after,
    nothing lost or dead-lettered, Kafka retries counted above the alert's rate, few loud lines."""
    port = restartable_port()
    settings = fresh_settings(
        private_kafka.bootstrap,
        mongo_uri,
        retry_max_backoff_s=1.0,
        kafka_unreachable_grace_ms=2000,
        http_port=port,
    )
    bootstrap = private_kafka.bootstrap
    await _make_topics(bootstrap, [settings.requests_topic, settings.responses_topic])
    service = ServiceProcess(settings, tmp_path / "service.log")
    probe = Probe(port)
    service.start()
    try:
        await probe.wait(True, 120)
        requests, responses = wave(THREADS, range(1, 3))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        await read_request_ids(bootstrap, settings.persisted_topic, len(responses))
        mark = len(service.log())
        retries = await probe.retries("kafka")
        outage_s = 0.0

        started = time.monotonic()
        stopped = await _outage(probe, service, "kafka", 15, private_kafka.stop)
        outage_s += time.monotonic() - started
        await asyncio.to_thread(private_kafka.start)
        await probe.wait(True, 60)
        requests, responses = wave(THREADS, range(3, 5))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)

        started = time.monotonic()
        frozen = await _outage(probe, service, "kafka", 10, private_kafka.freeze)
        outage_s += time.monotonic() - started
        counted = await probe.retries("kafka") - retries  # read before the thaw: it is what Prometheus sees
        await asyncio.to_thread(private_kafka.thaw)
        await probe.wait(True, 60)

        requests, responses = wave(THREADS, range(5, 7))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        await _check_stored(settings, THREADS, 6)
        loud = loud_lines(service.log()[mark:])
    finally:
        service.signal(signal.SIGTERM)
        code = await service.wait(60)
        service.stop_now()
        await drop_database(settings)
    assert code == 0, service.log()[-3000:]
    assert _names("kafka")(stopped), stopped
    assert _names("kafka")(frozen), frozen
    assert counted >= _alert_rate() * outage_s, (counted, outage_s)
    assert len(loud) <= MAX_LOUD_LINES, _summary(loud)


async def test_mongodb_outage_is_not_ready_and_quiet(
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    mongo_server: _PrivateServer,  # noqa: F811 -- the fixture
    tmp_path: Path,
) -> None:
    """MongoDB stopped ~15 s, then frozen ~10 s, under a steady stream of turns: not ready naming MongoDB
    each time, ready again after, nothing lost, retries counted above the alert's rate, few loud lines."""
    port = restartable_port()
    settings = fresh_settings(
        kafka_bootstrap, mongo_server.uri, mongodb_timeout_ms=1500, retry_max_backoff_s=1.0, http_port=port
    )
    await make_topic(partitions=2, name=settings.requests_topic)
    await make_topic(partitions=2, name=settings.responses_topic)
    service = ServiceProcess(settings, tmp_path / "service.log")
    probe = Probe(port)
    threads = [f"m{i}" for i in range(20)]
    turns = [0]
    feeding = asyncio.Event()

    async def feed() -> None:  # a turn of every thread every half second, outages or not
        while feeding.is_set():
            turns[0] += 1
            requests, responses = wave(threads, range(turns[0], turns[0] + 1))
            await produce(kafka_bootstrap, settings.responses_topic, responses)
            await produce(kafka_bootstrap, settings.requests_topic, requests)
            await asyncio.sleep(0.5)

    def freeze() -> None:
        assert mongo_server.process is not None
        mongo_server.process.send_signal(signal.SIGSTOP)

    def thaw() -> None:
        assert mongo_server.process is not None
        mongo_server.process.send_signal(signal.SIGCONT)

    service.start()
    try:
        await probe.wait(True, 120)
        mark = len(service.log())
        retries = await probe.retries("mongodb")
        feeding.set()
        feeder = asyncio.create_task(feed())
        await asyncio.sleep(2)

        started = time.monotonic()
        stopped = await _outage(probe, service, "mongodb", 15, mongo_server.stop)
        outage_s = time.monotonic() - started
        counted = await probe.retries("mongodb") - retries
        await asyncio.to_thread(mongo_server.start)
        await probe.wait(True, 60)

        frozen = await _outage(probe, service, "mongodb", 10, freeze)
        thaw()
        await probe.wait(True, 60)
        feeding.clear()
        await feeder
        await _check_stored(settings, threads, turns[0])
        loud = loud_lines(service.log()[mark:])
    finally:
        if mongo_server.process is not None:
            mongo_server.process.send_signal(signal.SIGCONT)
        service.signal(signal.SIGTERM)
        code = await service.wait(60)
        service.stop_now()
        await drop_database(settings)
    assert code == 0, service.log()[-3000:]
    assert _names("mongodb")(stopped), stopped
    assert _names("mongodb")(frozen), frozen
    assert counted >= _alert_rate() * outage_s, (counted, outage_s)
    assert len(loud) <= MAX_LOUD_LINES, _summary(loud)
