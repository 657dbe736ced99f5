"""Health state (liveness/readiness rules) and the probe HTTP server, over real sockets on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import resource
import socket
import time
from collections.abc import AsyncIterator

import pytest

from message_history import __version__, metrics
from message_history.app import health_http as health_module
from message_history.app.health import Health
from message_history.app.health_http import HealthServer, serve_http
from message_history.errors import StartupError
from message_history.logs import clear_secrets, register_secret


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes; return (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    async with asyncio.timeout(10):
        data = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


async def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    return await request(port, f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())


def gauge(component: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("message_history_ready", {"component": component})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def health(clock: FakeClock) -> Health:
    return Health(clock=clock, max_loop_lag_s=1.0)


@pytest.fixture
async def server(health: Health) -> AsyncIterator[HealthServer]:
    async with serve_http(health, "127.0.0.1", 0) as srv:
        yield srv


# --- rules -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], False),
        ([("recall", True, "")], True),
        ([("recall", False, "mongodb unreachable")], False),
        ([("recall", True, ""), ("persist", False, "kafka unreachable")], False),
        ([("recall", False, "starting"), ("recall", True, "")], True),
        ([("recall", True, ""), ("persist", True, ""), ("recall", False, "revoked")], False),
    ],
    ids=["nothing-reported", "one-ready", "one-down", "one-of-two-down", "recovered", "went-down-again"],
)
def test_readiness_requires_every_reported_component(
    health: Health, states: list[tuple[str, bool, str]], expected: bool
) -> None:
    """Ready only when at least one component reported and the latest report of each is ready."""
    for component, ready, reason in states:
        health.set_ready(component, ready, reason)
    ready, reasons = health.readiness()
    assert ready is expected
    latest = {component: (state, reason) for component, state, reason in states}
    if latest:
        assert reasons == {c: ("ok" if state else reason) for c, (state, reason) in latest.items()}
    else:
        assert set(reasons) == {"service"}


def test_readiness_reasons_and_gauge(health: Health) -> None:
    """Each component's reason is reported ('ok' when ready) and the ready gauge follows set_ready."""
    health.set_ready("unit-gauge-a", False, "mongodb unreachable")
    health.set_ready("unit-gauge-b", True)
    assert health.readiness() == (False, {"unit-gauge-a": "mongodb unreachable", "unit-gauge-b": "ok"})
    assert gauge("unit-gauge-a") == 0
    assert gauge("unit-gauge-b") == 1
    health.set_ready("unit-gauge-a", True)
    assert health.readiness()[0] is True
    assert gauge("unit-gauge-a") == 1


@pytest.mark.parametrize(
    ("max_silence", "elapsed", "beat_at", "live"),
    [
        (10.0, 5.0, None, True),
        (10.0, 10.0, None, True),
        (10.0, 10.5, None, False),
        (10.0, 15.0, 8.0, True),
        (10.0, 30.0, 8.0, False),
    ],
    ids=[
        "quiet-within-limit",
        "at-limit",
        "silent-too-long",
        "beat-resets-silence",
        "silent-since-last-beat",
    ],
)
def test_liveness_follows_heartbeats(
    health: Health, clock: FakeClock, max_silence: float, elapsed: float, beat_at: float | None, live: bool
) -> None:
    """A registered loop keeps the process live only while it beats within its maximum silence."""
    start = clock.now
    health.register_loop("consume", max_silence)
    if beat_at is not None:
        clock.now = start + beat_at
        health.beat("consume")
    clock.now = start + elapsed
    ok, details = health.liveness()
    assert ok is live
    assert details["loops"]["consume"]["ok"] is live


def test_unregistered_and_unknown_loops_do_not_count(health: Health, clock: FakeClock) -> None:
    """A loop that was unregistered stops counting, and beats of unknown loops are ignored."""
    health.register_loop("consume", 1.0)
    health.beat("never-registered")
    clock.now += 5
    assert health.liveness()[0] is False
    health.unregister_loop("consume")
    assert health.liveness()[0] is True
    assert "never-registered" not in health.liveness()[1]["loops"]


@pytest.mark.parametrize(
    ("lag", "live"),
    [(0.0, True), (0.9, True), (1.5, False), (-0.1, True)],
    ids=["no-lag", "below-threshold", "above-threshold", "negative-clamped"],
)
def test_liveness_fails_when_event_loop_lags(health: Health, lag: float, live: bool) -> None:
    """A measured event-loop lag above the threshold makes the process not live."""
    health.record_loop_lag(lag)
    assert health.liveness()[0] is live


def test_register_loop_rejects_nonpositive_silence(health: Health) -> None:
    """A loop cannot be registered with a zero maximum silence."""
    with pytest.raises(ValueError, match="positive"):
        health.register_loop("consume", 0)


# --- HTTP ------------------------------------------------------------------------------------------------


async def test_ephemeral_port_is_exposed(server: HealthServer) -> None:
    """Asking for port 0 binds a free port and exposes it as server.port."""
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


async def test_readyz_flips_with_set_ready(server: HealthServer, health: Health) -> None:
    """/readyz answers 503 with reasons until every component is ready, then 200, and 503 again on failure."""
    status, headers, body = await get(server.port, "/readyz")
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert json.loads(body)["ready"] is False

    health.set_ready("recall", False, "waiting for partitions")
    status, _, body = await get(server.port, "/readyz")
    assert (status, json.loads(body)) == (
        503,
        {"ready": False, "components": {"recall": "waiting for partitions"}},
    )

    health.set_ready("recall", True)
    status, _, body = await get(server.port, "/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True, "components": {"recall": "ok"}})

    health.set_ready("persist", False, "mongodb unreachable")
    status, _, body = await get(server.port, "/readyz?verbose=1")
    assert status == 503
    assert json.loads(body)["components"]["persist"] == "mongodb unreachable"


async def test_livez_flips_with_missed_beats(server: HealthServer, health: Health, clock: FakeClock) -> None:
    """/livez answers 200 while the loop beats and 503 once it has been silent longer than allowed."""
    health.register_loop("recall-loop", 2.0)
    status, _, body = await get(server.port, "/livez")
    assert status == 200
    assert json.loads(body)["live"] is True

    clock.now += 3.0
    status, _, body = await get(server.port, "/livez")
    doc = json.loads(body)
    assert status == 503
    assert doc["live"] is False
    assert doc["loops"]["recall-loop"]["ok"] is False

    health.beat("recall-loop")
    status, _, _ = await get(server.port, "/livez")
    assert status == 200


async def test_metrics_serves_the_registry(server: HealthServer, health: Health) -> None:
    """/metrics answers in the Prometheus text format and lists the service's metrics."""
    health.set_ready("http-test", True)
    status, headers, body = await get(server.port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    text = body.decode()
    for name in (
        "message_history_records_consumed",
        "message_history_dead_letters",
        "message_history_stage_seconds",
        "message_history_consumer_lag",
        'message_history_ready{component="http-test"} 1.0',
    ):
        assert name in text


async def test_metrics_serves_process_platform_gc_and_build_info(server: HealthServer) -> None:
    """/metrics carries the standard process, Python and GC series and `message_history_build_info` with the
    running version, although the registry is private (the default registry's collectors are not on it)."""
    status, _, body = await get(server.port, "/metrics")
    assert status == 200
    lines = body.decode().splitlines()
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert any(line.startswith(name) for line in lines), name
    (build,) = [line for line in lines if line.startswith("message_history_build_info{")]
    assert f'version="{__version__}"' in build
    assert f'python="{platform.python_version()}"' in build
    assert build.endswith(" 1.0")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"GET / HTTP/1.1\r\n\r\n", 404),
        (b"POST /readyz HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 405),
        (b"garbage\r\n\r\n", 400),
        (b"GET /livez SPDY/3\r\n\r\n", 400),
        (b"GET " + b"/x" * 10_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /livez HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
        (b"GET /livez HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (b"GET /livez HTTP/1.1\r\nHost: x\r\n", 400),
    ],
    ids=[
        "unknown-path",
        "root",
        "post",
        "garbage",
        "not-http",
        "long-line",
        "too-many-headers",
        "huge-header",
        "closed-mid-headers",
    ],
)
async def test_bad_requests_get_an_error_and_the_server_survives(
    server: HealthServer, health: Health, raw: bytes, status: int
) -> None:
    """A bad request gets a 4xx answer and the next request is still served."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(raw)
    await writer.drain()
    writer.write_eof()  # "closed-mid-headers": the client stops sending before the blank line
    async with asyncio.timeout(10):
        data = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert int(data.split(b" ", 2)[1]) == status

    health.set_ready("recall", True)
    assert (await get(server.port, "/readyz"))[0] == 200


async def test_slow_client_is_timed_out(health: Health, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that never finishes its request gets 408 after the read timeout and the server goes on."""
    monkeypatch.setattr(health_module, "_READ_TIMEOUT_S", 0.2)
    async with serve_http(health, "127.0.0.1", 0) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /livez HTTP/1.1\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            data = await reader.read()
        writer.close()
        await writer.wait_closed()
        assert data.startswith(b"HTTP/1.1 408 ")
        assert (await get(srv.port, "/livez"))[0] == 200


async def test_client_that_disconnects_immediately_does_not_kill_the_server(server: HealthServer) -> None:
    """Connections closed without a byte are tolerated."""
    for _ in range(3):
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.close()
        await writer.wait_closed()
    assert (await get(server.port, "/livez"))[0] == 200


async def test_port_in_use_is_a_clear_startup_error(health: Health) -> None:
    """Binding a port that is taken raises StartupError naming the address and the setting to change."""
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, reuse_address=False)
    port = blocker.sockets[0].getsockname()[1]
    try:
        with pytest.raises(StartupError, match=rf"127\.0\.0\.1:{port}.*MESSAGE_HISTORY_HTTP_PORT"):
            async with serve_http(health, "127.0.0.1", port):
                pass
    finally:
        blocker.close()
        await blocker.wait_closed()


async def test_loop_lag_sampler_feeds_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's sampler measures a blocked event loop and /livez reports it as not live."""
    # One sample per second: the late wake-up after the block stays the latest sample while we ask.
    monkeypatch.setattr(health_module, "_LAG_SAMPLE_INTERVAL_S", 1.0)
    health = Health(max_loop_lag_s=0.1)
    async with serve_http(health, "127.0.0.1", 0) as srv:
        await asyncio.sleep(0)  # the sampler starts its timed sleep
        time.sleep(1.4)  # noqa: ASYNC251 -- block the event loop on purpose: the sampler wakes ~0.4 s late
        await asyncio.sleep(0)
        status, _, body = await get(srv.port, "/livez")
        doc = json.loads(body)
        assert status == 503
        assert doc["eventLoop"]["ok"] is False
        assert doc["eventLoop"]["lagS"] > 0.1


async def test_secrets_never_reach_the_endpoints(server: HealthServer, health: Health) -> None:
    """A readiness reason quoting a registered secret or a URI password is masked in /readyz and /metrics."""
    register_secret("Very-Secret-Pw-42")
    try:
        health.set_ready(
            "mongodb", False, "auth failed for mongodb://svc:Other-Pw-7@db:27017 (Very-Secret-Pw-42)"
        )
        for path in ("/readyz", "/livez", "/metrics"):
            _, _, body = await get(server.port, path)
            assert b"Very-Secret-Pw-42" not in body
            assert b"Other-Pw-7" not in body
        _, _, body = await get(server.port, "/readyz")
        assert json.loads(body)["components"]["mongodb"].startswith("auth failed for mongodb://svc:***@db")
    finally:
        clear_secrets()


# --- many slow clients -------------------------------------------------------------------------------------

FLOOD = 200
PROBE_TIMEOUT_S = 3.0  # the chart's liveness probe timeoutSeconds: a slower answer is a failed probe


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _shed(reason: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value("message_history_http_connections_shed_total", {"reason": reason})
        or 0
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_livez_answers_under_a_flood_of_slow_connections(
    server: HealthServer, caplog: pytest.LogCaptureFixture
) -> None:
    """200 connections that never finish a request, in a process allowed only ~40 descriptors beyond them:
    /livez still answers within the probe's timeout, the server never holds more than its cap, and the
    flood leaves a counter and at most one warning, no ERROR line. (Without the cap, the server took every
    connection until accept() failed with EMFILE, then logged an ERROR per failed accept and left the probe
    in the backlog until the slow ones timed out.)"""
    evicted_before = _shed("evicted")
    loop = asyncio.get_running_loop()
    probe = socket.socket()  # made before the limit: the probe's own descriptor is not the one missing
    probe.setblocking(False)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    flood: list[socket.socket] = []
    caplog.set_level(logging.INFO)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + FLOOD + 40, hard))
    try:
        for _ in range(FLOOD):
            slow = socket.socket()
            slow.setblocking(False)
            slow.connect_ex(("127.0.0.1", server.port))
            flood.append(slow)
        await asyncio.sleep(0.5)  # let the server meet the flood first (pacing, not an assertion)
        for slow in flood:
            with contextlib.suppress(OSError):
                slow.send(b"GET /li")  # started, never finished
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            await loop.sock_connect(probe, ("127.0.0.1", server.port))
            await loop.sock_sendall(probe, b"GET /livez HTTP/1.1\r\nHost: k\r\n\r\n")
            answer = await loop.sock_recv(probe, 4096)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert server.open_connections <= health_module.MAX_CONNECTIONS
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        probe.close()
        for slow in flood:
            slow.close()
    assert _shed("evicted") > evicted_before  # the cap met the flood
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) <= 1


class _FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_the_cap_evicts_the_oldest_waiting_connection_or_refuses() -> None:
    """At the cap, a newcomer closes the oldest connection still waiting for its request; when every slot is
    answering, the newcomer itself is refused. Either way the count stays at the cap."""
    shedding = health_module._Shedding(clock=lambda: 0.0)
    connections = health_module._Connections(shedding, limit=3, reserve=0, clock=lambda: 0.0)
    made = [health_module._Connection(_FakeTransport()) for _ in range(6)]  # type: ignore[arg-type]
    for c in made[:3]:
        assert connections.admit(c)
    made[0].waiting = False  # answering: not evictable
    assert connections.admit(made[3])
    assert (made[0].shed, made[1].shed, made[1].transport.aborted) == (False, True, True)  # type: ignore[attr-defined]
    made[2].waiting = made[3].waiting = False
    assert not connections.admit(made[4])
    assert made[4].shed
    assert made[4].transport.aborted  # type: ignore[attr-defined]
    assert len(connections) == 3
    connections.close(made[0])
    assert connections.admit(made[5])


def test_shedding_warns_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """A thousand shed connections make one warning with the counts, then nothing until the interval ends."""
    clock = FakeClock()
    shedding = health_module._Shedding(clock=clock)
    caplog.set_level(logging.WARNING, logger="message_history.app.health")
    for _ in range(1000):
        shedding.count("evicted")
    clock.now += health_module._SHED_WARNING_INTERVAL_S
    shedding.count("timeout")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[1].startswith("health server shed 1000 connection(s)")
    assert "evicted: 999" in messages[1]
    assert "timeout: 1" in messages[1]


def test_the_probes_reserve_and_the_answer_deadline() -> None:
    """With every slot answering, a newcomer takes a probe-only reserved slot; once an answer has been taking
    longer than the deadline, its connection is evicted for the newcomer instead; past both, it is refused."""
    clock = FakeClock()
    connections = health_module._Connections(
        health_module._Shedding(clock=clock), limit=2, reserve=1, clock=clock
    )
    made = [health_module._Connection(_FakeTransport()) for _ in range(6)]  # type: ignore[arg-type]
    for c in made[:2]:
        assert connections.admit(c)
        connections.answering(c)
    assert connections.admit(made[2])
    assert made[2].probe_only  # the reserve: only /livez and /readyz are answered on it
    connections.answering(made[2])
    assert not connections.admit(made[3])  # normal slots and reserve busy, nobody late yet
    clock.now += health_module._ANSWER_DEADLINE_S
    assert connections.admit(made[4])
    assert made[0].shed
    assert not made[4].probe_only  # it took the slow reader's normal slot
    assert len(connections) == 3
    connections.close(made[2])  # the reserved slot is free again
    connections.answering(made[4])
    assert connections.admit(made[5])


BIG_METRICS = 4 * 1024 * 1024
SLOW_READERS = health_module.MAX_CONNECTIONS + 4


async def _probe(port: int, path: str) -> bytes:
    loop = asyncio.get_running_loop()
    probe = socket.socket()
    probe.setblocking(False)
    try:
        await loop.sock_connect(probe, ("127.0.0.1", port))
        await loop.sock_sendall(probe, f"GET {path} HTTP/1.1\r\nHost: k\r\n\r\n".encode())
        return await loop.sock_recv(probe, 64)
    finally:
        probe.close()


@pytest.mark.timeout(60)
async def test_probes_answer_while_slow_readers_hold_a_large_metrics(
    server: HealthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 clients ask for a 4 MiB /metrics and never read it. /livez and /readyz still answer at once (the
    reserved slots), and once the deadline has passed a scraper that reads is served, a slow reader evicted
    for it. (Before: every slot was busy answering, each for up to the 5 s write timeout, and every newcomer,
    the kubelet's probe too, was refused.)"""
    monkeypatch.setattr(health_module, "generate_latest", lambda registry: b"#" * BIG_METRICS)
    slow_before = _shed("slow_reader")
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW_READERS):
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes nothing
            reader.connect(("127.0.0.1", server.port))
            reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: k\r\n\r\n")
            slow.append(reader)
        await asyncio.sleep(0.3)  # let the server start answering them (pacing, not an assertion)
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            assert (await _probe(server.port, "/livez")).startswith(b"HTTP/1.1 200 ")
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            assert (await _probe(server.port, "/readyz")).startswith(b"HTTP/1.1 503 ")  # nothing reported
        assert server.open_connections <= health_module.MAX_CONNECTIONS + health_module.PROBE_RESERVE
        await asyncio.sleep(health_module._ANSWER_DEADLINE_S)
        async with asyncio.timeout(30):
            status, _, body = await get(server.port, "/metrics")
        assert (status, len(body)) == (200, BIG_METRICS)
        assert _shed("slow_reader") > slow_before
    finally:
        for reader in slow:
            reader.close()
