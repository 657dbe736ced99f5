"""Liveness and readiness of the service: what the probes answer.

Two separate questions, as Kubernetes asks them:

- **live** (`/livez`): is the process still making progress? Every long-running loop registers itself with a
  maximum silence and calls `beat()` each time round (also while it is backing off during an outage: an outage
  is not a reason to be restarted). A loop silent for longer than its maximum, or an event loop that lags
  badly, means the process is wedged and a restart helps.
- **ready** (`/readyz`): should work be routed here? Every component reports `set_ready(...)` with a reason;
  the service is ready only when every component that reported is ready. An outage makes a component
  not-ready, never not-live.

The probes' HTTP server is `message_history.app.health_http` (`serve_http`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from message_history import metrics
from message_history.logs import scrub

__all__ = ["DEFAULT_MAX_LOOP_LAG_S", "Health"]

log = logging.getLogger(__name__)

DEFAULT_MAX_LOOP_LAG_S = 5.0
"""Event-loop lag above which the process counts as wedged (a sampled sleep overshooting by this much)."""


@dataclass
class _Loop:
    max_silence_s: float
    last_beat: float


class Health:
    """What the service knows about its own state; shared by every component, read by the probes.

    Call it from the event loop's thread (the components and the HTTP server all live there).
    `clock` is injectable so that silence can be tested without sleeping.
    """

    def __init__(
        self,
        *,
        max_loop_lag_s: float = DEFAULT_MAX_LOOP_LAG_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._max_loop_lag_s = max_loop_lag_s
        self._ready: dict[str, tuple[bool, str]] = {}
        self._loops: dict[str, _Loop] = {}
        self._loop_lag_s = 0.0

    # --- readiness ----------------------------------------------------------------------------------------

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None:
        """Record whether `component` can take work now, and why not; also sets the `ready` gauge."""
        previous = self._ready.get(component)
        reason = scrub(reason)  # reasons often quote a driver error, which may echo a URI
        self._ready[component] = (ready, reason)
        metrics.READY.labels(component=component).set(1 if ready else 0)
        if previous is None or previous[0] != ready:
            log.info(
                "component %s is %s",
                component,
                "ready" if ready else "not ready",
                extra={"component": component, "ready": ready, "reason": reason},
            )

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, reason per component): not ready before any component reported, nor while one is not."""
        if not self._ready:
            return False, {"service": "starting: no component has reported yet"}
        reasons = {name: ("ok" if ok else (why or "not ready")) for name, (ok, why) in self._ready.items()}
        return all(ready for ready, _ in self._ready.values()), reasons

    # --- liveness -----------------------------------------------------------------------------------------

    def register_loop(self, component: str, max_silence_s: float) -> None:
        """Watch a loop: from now on it must `beat()` at least every `max_silence_s` seconds to stay live."""
        if max_silence_s <= 0:
            raise ValueError("max_silence_s must be positive")
        self._loops[component] = _Loop(max_silence_s=max_silence_s, last_beat=self._clock())

    def unregister_loop(self, component: str) -> None:
        """Stop watching a loop that ended on purpose (shutdown); unknown names are ignored."""
        self._loops.pop(component, None)

    def beat(self, component: str) -> None:
        """A loop's heartbeat. Beats of a loop that was never registered are ignored."""
        loop = self._loops.get(component)
        if loop is not None:
            loop.last_beat = self._clock()

    def record_loop_lag(self, lag_s: float) -> None:
        """Latest event-loop lag (how late a timed sleep woke up); fed by the HTTP server's sampler."""
        self._loop_lag_s = max(0.0, lag_s)

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """(live, details): live unless a watched loop is silent too long or the event loop lags too much."""
        now = self._clock()
        loops: dict[str, Any] = {}
        live = True
        for name, loop in self._loops.items():
            silence = now - loop.last_beat
            ok = silence <= loop.max_silence_s
            live = live and ok
            loops[name] = {"ok": ok, "silenceS": round(silence, 3), "maxSilenceS": loop.max_silence_s}
        lag_ok = self._loop_lag_s <= self._max_loop_lag_s
        details: dict[str, Any] = {
            "loops": loops,
            "eventLoop": {
                "ok": lag_ok,
                "lagS": round(self._loop_lag_s, 3),
                "maxLagS": self._max_loop_lag_s,
            },
        }
        return live and lag_ok, details
