"""A loop's outage state: while a dependency is down the path is not ready, its intake is held paused
(`intake.OUTAGE`), and the outage is said once per dependency (`OutageLog`: one WARNING when it starts, a
summary every so often, one INFO when it is back); the batch in hand waits out its backoff polling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from consumers.consumer import Health
from consumers.outage_log import OutageLog
from consumers.runtime.intake import OUTAGE, Intake
from consumers.runtime.retry import Failure, outage_dependency, wait_to_retry

log = logging.getLogger(__name__)

T = TypeVar("T")


class Outages:
    """Entered at a failed attempt, left at the first clean one (or when the batch ends)."""

    def __init__(self, path: str, health: Health, intake: Intake, stopping: Callable[[], bool]) -> None:
        self.path = path
        self._health = health
        self._intake = intake
        self._stopping = stopping
        self._logs = {dep: OutageLog(path, dep) for dep in ("kafka", "mongodb")}

    async def wait_out(self, failure: Failure[T], stop: asyncio.Event, tick: Callable[[], None]) -> bool:
        """Report the outage, wait out the backoff polling (`tick` after each poll); True when told to stop
        meanwhile."""
        dependency = self._enter(failure.error, failure.attempt)
        await wait_to_retry(
            self.path,
            dependency,
            failure.delay,
            sleep=lambda delay: self._intake.wait_polling(delay, stop, tick),
        )
        return stop.is_set()

    def _enter(self, error: BaseException | None, attempt: int) -> str:
        """Not ready, intake paused, said once; returns the dependency that is down."""
        dependency = outage_dependency(error)
        reason = f"{dependency} unavailable: {type(error).__name__ if error else 'outputs not acknowledged'}"
        detail = f" ({str(error)[:200]})" if error else ""
        self._logs[dependency].failed(f"{reason}: intake paused{detail}")
        self._health.set_ready(self.path, False, reason)
        self._intake.hold(OUTAGE)
        log.debug("retrying batch", extra={"path": self.path, "attempt": attempt, "reason": reason})
        return dependency

    def leave(self) -> None:
        """Back (nothing when no outage is on): intake resumes unless held for another reason."""
        if not self._intake.holds(OUTAGE):
            return
        self._intake.release(OUTAGE)
        if not self._stopping():
            self._health.set_ready(self.path, True)
        for outage_log in self._logs.values():
            outage_log.back()
