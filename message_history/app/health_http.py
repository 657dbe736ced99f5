"""The tiny HTTP server that answers the probes (`/livez`, `/readyz`) and serves `/metrics`.

The HTTP server is stdlib asyncio, GET only, one request per connection, with capped request sizes, so a
misbehaving client can neither block nor crash it. `/metrics` serves the service's Prometheus registry.

Slow or idle clients cannot starve the probes or the process's file descriptors: at most `MAX_CONNECTIONS`
are open at once, plus `PROBE_RESERVE` kept for `/livez` and `/readyz`. A new connection beyond the cap
closes the oldest one still waiting for its request (a probe sends its request at once, so a slowloris flood
evicts itself, not the kubelet), else the oldest one still being answered after `_ANSWER_DEADLINE_S` (a slow
reader of a large `/metrics`), else it takes a reserved slot, where only the probes are answered (anything
else gets a short 503); a request must arrive within `_READ_TIMEOUT_S`, its answer be taken within
`_WRITE_TIMEOUT_S`. Shed connections are counted
(`message_history_http_connections_shed_total{reason}`), never logged one by one: at most one warning per
`_SHED_WARNING_INTERVAL_S` sums them up. The server accepts one connection at a time itself (not
`asyncio.start_server`, whose accept loop takes up to a backlog's worth before any handler can refuse one, and
logs an ERROR per accept that fails when descriptors run out): a failed accept is counted the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from message_history import metrics
from message_history.errors import StartupError

__all__ = ["MAX_CONNECTIONS", "PROBE_PATHS", "PROBE_RESERVE", "HealthServer", "Probed", "serve_http"]

log = logging.getLogger("message_history.app.health")  # the probes' logger, as before the server had a module

_LAG_SAMPLE_INTERVAL_S = 0.5
MAX_CONNECTIONS = 16
"""Most connections open at once: probes and scrapes each hold one for milliseconds, so 16 is ample, and few
enough that a flood of them cannot use up the descriptors Kafka and MongoDB need."""
PROBE_RESERVE = 4
"""Connections beyond `MAX_CONNECTIONS` that only `/livez` and `/readyz` are answered on: when every other
slot is busy answering (16 slow readers of `/metrics`, say), a probe still gets one."""
PROBE_PATHS = ("/livez", "/readyz")
_ANSWER_DEADLINE_S = 1.0  # an answer still being taken after this may be evicted for a newcomer
_READ_TIMEOUT_S = 2.0  # kubelet and Prometheus send their request as soon as they connect
_WRITE_TIMEOUT_S = 5.0  # /metrics is tens of kB: a reader slower than this is not a scraper
_SHED_WARNING_INTERVAL_S = 60.0
_ACCEPT_BACKLOG = 128  # the kernel's queue: a probe arriving during a flood waits there, not in SYN retries
_ACCEPT_RETRY_S = 0.1  # after a failed accept (out of descriptors): others must close first
_MAX_REQUEST_LINE = 8 * 1024
_MAX_HEADER_BYTES = 16 * 1024
_MAX_HEADERS = 100
_LINGER_S = 0.5
_LINGER_BYTES = 256 * 1024


class Probed(Protocol):
    """What the server asks of the service's state (`message_history.app.health.Health`)."""

    def liveness(self) -> tuple[bool, dict[str, Any]]: ...

    def readiness(self) -> tuple[bool, dict[str, str]]: ...

    def record_loop_lag(self, lag_s: float) -> None: ...


class HealthServer:
    """A running probe server; `port` is the bound port (useful when asked for port 0)."""

    def __init__(self, host: str, port: int, connections: _Connections) -> None:
        self.host = host
        self.port = port
        self._connections = connections

    @property
    def open_connections(self) -> int:
        """Connections open now (never more than `MAX_CONNECTIONS` + `PROBE_RESERVE`)."""
        return len(self._connections)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class _BadRequestError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _json(status: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body, sort_keys=True).encode() + b"\n"


def _route(health: Probed, method: str, target: str) -> tuple[int, str, bytes]:
    path = target.split("?", 1)[0]
    if path not in ("/livez", "/readyz", "/metrics"):
        return _json(404, {"error": "not found", "paths": ["/livez", "/readyz", "/metrics"]})
    if method != "GET":
        return _json(405, {"error": "only GET is served"})
    if path == "/livez":
        live, details = health.liveness()
        return _json(200 if live else 503, {"live": live, **details})
    if path == "/readyz":
        ready, reasons = health.readiness()
        return _json(200 if ready else 503, {"ready": ready, "components": reasons})
    return 200, CONTENT_TYPE_LATEST, generate_latest(metrics.REGISTRY)


async def _read_line(reader: asyncio.StreamReader, too_long: tuple[int, str], where: str) -> bytes:
    """One line; over the reader's limit is `too_long` (status, reason), a closed connection a 400."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError as exc:
        raise _BadRequestError(*too_long) from exc
    except asyncio.IncompleteReadError as exc:
        raise _BadRequestError(400, f"connection closed {where}") from exc


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """Read the request line and headers (bodies are never read: GET only); return (method, target)."""
    line = await _read_line(reader, (414, "request line too long"), "before the request line ended")
    if len(line) > _MAX_REQUEST_LINE:
        raise _BadRequestError(414, "request line too long")
    parts = line.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise _BadRequestError(400, "malformed request line")
    method, target, _ = parts
    total = 0
    for _ in range(_MAX_HEADERS + 1):
        header = await _read_line(reader, (431, "header line too long"), "inside the headers")
        total += len(header)
        if total > _MAX_HEADER_BYTES:
            raise _BadRequestError(431, "headers too large")
        if header in (b"\r\n", b"\n"):
            return method, target
    raise _BadRequestError(431, "too many headers")


async def _write(writer: asyncio.StreamWriter, status: int, content_type: str, body: bytes) -> None:
    header = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode("latin-1")
    writer.write(header + body)
    await writer.drain()


async def _discard_unread(reader: asyncio.StreamReader) -> None:
    # Closing a socket with unread input makes the kernel send RST, which can destroy the error answer
    # before the client reads it; swallow a bounded amount first (a "lingering close").
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(_LINGER_S):
            budget = _LINGER_BYTES
            while budget > 0 and (chunk := await reader.read(min(budget, 4096))):
                budget -= len(chunk)


class _Connection:
    """One open connection: its transport, and whether its request has arrived (only then it is answered)."""

    __slots__ = ("answering_since", "probe_only", "shed", "transport", "waiting")

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self.waiting = True  # no complete request yet: the one to evict first
        self.answering_since: float | None = None  # then: past the deadline, the next to evict
        self.probe_only = False  # in a reserved slot: only /livez and /readyz are answered
        self.shed = False


class _Shedding:
    """Counts shed connections; at most one warning per interval sums them up (no line per connection)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since_warning: dict[str, int] = {}
        self._last_warning: float | None = None

    def count(self, reason: str) -> None:
        metrics.HTTP_CONNECTIONS_SHED.labels(reason=reason).inc()
        self._since_warning[reason] = self._since_warning.get(reason, 0) + 1
        now = self._clock()
        if self._last_warning is not None and now - self._last_warning < _SHED_WARNING_INTERVAL_S:
            return
        self._last_warning = now
        counts, self._since_warning = self._since_warning, {}
        log.warning(
            "health server shed %d connection(s) (at most %d open; %s)",
            sum(counts.values()),
            MAX_CONNECTIONS,
            ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items())),
            extra={"shed": counts, "max_connections": MAX_CONNECTIONS},
        )


class _Connections:
    """The open connections, oldest first, and the cap on them (with the probes' reserve beyond it)."""

    def __init__(
        self,
        shedding: _Shedding,
        limit: int = MAX_CONNECTIONS,
        reserve: int = PROBE_RESERVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open: dict[int, _Connection] = {}  # insertion order = age
        self._reserved = 0  # how many of them are probe-only
        self._shedding = shedding
        self._limit = limit
        self._reserve = reserve
        self._clock = clock

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, connection: _Connection) -> bool:
        """Make room for `connection` (evicting the oldest still waiting for its request, else the oldest
        answered past the deadline), give it a probe-only reserved slot, or refuse it."""
        if len(self._open) - self._reserved >= self._limit:
            late = self._clock() - _ANSWER_DEADLINE_S
            waiting = next((c for c in self._open.values() if c.waiting), None)
            slow = next(
                (
                    c
                    for c in self._open.values()
                    if c.answering_since is not None and c.answering_since <= late
                ),
                None,
            )
            victim, reason = (waiting, "evicted") if waiting is not None else (slow, "slow_reader")
            if victim is not None:
                self._shed(victim, reason)
                if victim.probe_only:  # the newcomer takes its slot as it was: reserved
                    connection.probe_only = True
                    self._reserved += 1
            elif self._reserved < self._reserve:
                connection.probe_only = True
                self._reserved += 1
            else:  # every slot is busy answering: the newcomer waits for nothing
                self._shed(connection, "refused")
                return False
        self._open[id(connection)] = connection
        return True

    def answering(self, connection: _Connection) -> None:
        """Its request has arrived: from now on it is being answered (evictable past the deadline)."""
        connection.waiting = False
        connection.answering_since = self._clock()

    def close(self, connection: _Connection) -> None:
        if self._open.pop(id(connection), None) is not None and connection.probe_only:
            self._reserved -= 1

    def timed_out(self, connection: _Connection) -> None:
        self._shed(connection, "timeout")

    def count(self, reason: str) -> None:
        self._shedding.count(reason)

    def _shed(self, connection: _Connection, reason: str) -> None:
        connection.shed = True
        connection.transport.abort()  # no answer, no lingering close: the descriptor is free at once
        self.close(connection)
        self._shedding.count(reason)


async def _handle(
    connections: _Connections,
    connection: _Connection,
    writer: asyncio.StreamWriter,
    serving: Coroutine[Any, Any, None],
) -> None:
    """Await `serving` (the connection's `_serve`), then close the connection, however serving ended."""
    try:
        await serving
    except (ConnectionError, TimeoutError, _BadRequestError):
        pass  # the client went away, or was shed; nothing to answer
    finally:
        connections.close(connection)
        if not connection.shed:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(_READ_TIMEOUT_S):
                    await writer.wait_closed()


async def _serve(
    health: Probed,
    connections: _Connections,
    connection: _Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        async with asyncio.timeout(_READ_TIMEOUT_S):
            method, target = await _read_request(reader)
    except TimeoutError:  # idle or slowloris: a short 408, closed without the lingering read
        connections.count("timeout")
        status, ctype, body = _json(408, {"error": "request not received in time"})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_WRITE_TIMEOUT_S):
                await _write(writer, status, ctype, body)
        return
    except _BadRequestError as exc:
        if connection.shed:
            return  # evicted while waiting: the transport is gone
        status, ctype, body = _json(exc.status, {"error": exc.reason})
    else:
        connections.answering(connection)
        if connection.probe_only and target.split("?", 1)[0] not in PROBE_PATHS:
            status, ctype, body = _json(503, {"error": "busy: this slot is kept for /livez and /readyz"})
        else:
            try:
                status, ctype, body = _route(health, method, target)
            except Exception:  # a probe must answer even if a collector breaks
                log.exception("health endpoint failed", extra={"target": target[:200]})
                status, ctype, body = _json(500, {"error": "internal error"})
    try:
        async with asyncio.timeout(_WRITE_TIMEOUT_S):
            await _write(writer, status, ctype, body)
    except TimeoutError:
        connections.timed_out(connection)  # a reader too slow to take the answer
        return
    if status >= 400 and not connection.probe_only:  # a reserved slot is freed at once, not after a linger
        await _discard_unread(reader)


async def _sample_loop_lag(health: Probed, interval_s: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval_s)
        health.record_loop_lag(loop.time() - started - interval_s)


def _listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket on host:port (the first address `host` resolves to)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_ACCEPT_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def _accept(
    sock: socket.socket, health: Probed, connections: _Connections, handlers: set[asyncio.Task[None]]
) -> None:
    """Accept one connection at a time, admit it under the cap (evicting or refusing at once), serve it."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            client, _ = await loop.sock_accept(sock)
        except OSError:  # EMFILE, ENFILE, ENOBUFS, ECONNABORTED: counted, not logged per accept
            connections.count("accept_failed")
            await asyncio.sleep(_ACCEPT_RETRY_S)
            continue
        try:
            reader, writer = await asyncio.open_connection(sock=client, limit=_MAX_REQUEST_LINE)
        except OSError:
            client.close()
            connections.count("accept_failed")
            continue
        connection = _Connection(writer.transport)
        if connections.admit(connection):
            serving = _serve(health, connections, connection, reader, writer)
            task = loop.create_task(_handle(connections, connection, writer, serving))
            handlers.add(task)
            task.add_done_callback(handlers.discard)


@contextlib.asynccontextmanager
async def serve_http(health: Probed, host: str, port: int) -> AsyncIterator[HealthServer]:
    """Serve `/livez`, `/readyz` and `/metrics` on host:port while the block runs (port 0: any free port).

    Also samples the event loop's lag for liveness. Raises `StartupError` if the address cannot be bound.
    """
    try:
        sock = _listen(host, port)
    except OSError as exc:
        raise StartupError(
            f"cannot serve health and metrics on {host}:{port}: {exc.strerror or exc} "
            "(set MESSAGE_HISTORY_HTTP_PORT / MESSAGE_HISTORY_HTTP_HOST, 0 = any free port)"
        ) from exc
    bound_host, bound_port = sock.getsockname()[:2]
    connections = _Connections(_Shedding())
    handlers: set[asyncio.Task[None]] = set()
    accepter = asyncio.create_task(_accept(sock, health, connections, handlers), name="health-accept")
    sampler = asyncio.create_task(_sample_loop_lag(health, _LAG_SAMPLE_INTERVAL_S), name="loop-lag-sampler")
    log.info(
        "serving /livez /readyz /metrics on %s:%s",
        bound_host,
        bound_port,
        extra={"http_host": bound_host, "http_port": bound_port},
    )
    try:
        yield HealthServer(str(bound_host), int(bound_port), connections)
    finally:
        background = [accepter, sampler, *handlers]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        sock.close()
