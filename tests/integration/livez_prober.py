"""A background prober of a running service's `/livez`, for the adversarial integration tests: the loop must
keep answering its liveness probe while it meets hostile input (a held event loop would get the pod killed).

A thread (not a task of the service's own event loop, which a held loop would stall with it) asks `/livez`
every `interval_s` with a generous socket timeout: a hang guard, never a timing assertion. At the end every
probe must have been answered; the latencies are printed (`pytest -s` shows them) for the record.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

PROBE_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, for the service's `http_port` (the in-process service binds port 0 silently)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Probes:
    """What the prober saw: each probe's status (None: not answered), its latency, the failures' reasons."""

    statuses: list[int | None] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def max_latency_s(self) -> float:
        return max(self.latencies_s, default=0.0)

    def summary(self, name: str) -> str:
        answered = sum(1 for s in self.statuses if s is not None)
        codes = sorted({s for s in self.statuses if s is not None})
        return (
            f"/livez during {name}: {answered}/{len(self.statuses)} probes answered (statuses {codes}), "
            f"max latency {self.max_latency_s * 1000:.1f} ms"
        )


def _probe(url: str) -> tuple[int | None, float, str | None]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as reply:
            reply.read()
            status = int(reply.status)
    except urllib.error.HTTPError as refused:  # answered, with a non-2xx status
        status = refused.code
    except OSError as exc:  # refused, reset, or timed out: not answered
        return None, time.monotonic() - started, f"{type(exc).__name__}: {exc}"
    return status, time.monotonic() - started, None


@contextlib.contextmanager
def probing(port: int, name: str, *, host: str = "127.0.0.1") -> Iterator[Probes]:
    """Probe `http://host:port/livez` every `PROBE_INTERVAL_S` while the block runs (starting once the first
    probe is answered: the service binds its port after its start-up steps); prints the summary at the end."""
    probes = Probes()
    stop = threading.Event()
    url = f"http://{host}:{port}/livez"

    def run() -> None:
        started = False
        while not stop.is_set():
            status, latency, failure = _probe(url)
            if status is not None or started:
                started = True
                probes.statuses.append(status)
                probes.latencies_s.append(latency)
                if failure is not None:
                    probes.failures.append(failure)
            stop.wait(PROBE_INTERVAL_S)

    thread = threading.Thread(target=run, name="livez-prober", daemon=True)
    thread.start()
    try:
        yield probes
    finally:
        stop.set()
        thread.join(PROBE_TIMEOUT_S + 1)
        print(probes.summary(name))


def assert_all_answered(probes: Probes) -> None:
    """Every probe was answered (some were made), each with 200: the service stayed live throughout."""
    assert probes.statuses, "no probe of /livez was answered at all"
    assert probes.failures == [], probes.failures[:5]
    assert set(probes.statuses) == {200}, probes.summary("the test")
