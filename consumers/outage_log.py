"""What a path says about an outage of one dependency: the lines `message_history.core.reach.Narration`
decides, written with the path, the dependency, the reason, since when (UTC), retries and duration.

Both the stream loop (an attempt that failed for MongoDB or Kafka) and the Kafka watch (a probe that got no
answer) report here, so an outage reads the same whoever saw it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from message_history.core.reach import Line, Narration

log = logging.getLogger(__name__)

SUMMARY_EVERY_S = 30.0
"""How often an outage that lasts is summed up (one WARNING per path and dependency)."""


class OutageLog:
    """One path's narration of one dependency's outages."""

    def __init__(
        self,
        path: str,
        dependency: str,
        *,
        every_s: float = SUMMARY_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.dependency = dependency
        self._narration = Narration(every_s)
        self._clock = clock
        self._wall = wall

    @property
    def open(self) -> bool:
        """True while an outage is being reported."""
        return self._narration.open

    def failed(self, reason: str, *, since: float | None = None) -> None:
        """One failed attempt (`since`: the monotonic time the dependency last answered, if known)."""
        self._write(self._narration.failed(self._clock(), since), reason)

    def back(self) -> None:
        self._write(self._narration.back(self._clock()), "")

    def _write(self, line: Line | None, reason: str) -> None:
        if line is None:
            return
        started = datetime.fromtimestamp(self._wall() - (self._clock() - line.since), UTC)
        fields = {
            "path": self.path,
            "dependency": self.dependency,
            "since": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "retries": line.retries,
            "outage_s": round(line.lasted_s, 1),
        }
        if line.kind == "back":
            log.info(
                "%s reachable again after %.0f s (%d retries): resumed",
                self.dependency,
                line.lasted_s,
                line.retries,
                extra=fields,
            )
            return
        opening = line.kind == "unreachable"
        log.warning(
            "%s unreachable since %s%s: %s",
            self.dependency,
            fields["since"],
            "" if opening else f" ({line.lasted_s:.0f} s, {line.retries} retries so far)",
            reason or "no answer",
            extra={**fields, "reason": reason},
        )
