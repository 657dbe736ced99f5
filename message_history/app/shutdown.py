"""The shutdown machinery of `message-history run`: one budget for the whole exit, a bound per step, the
signals that start it and the watchdog that ends the process at the grace.

SIGTERM and SIGINT set one stop event (`stop_on_signals`); everything after it is bounded by the grace
(`ShutdownClock`): each step's exit has its own bound inside that budget (`Bounded`), keeping a reserve for
the steps after it, and a step that overruns is abandoned (logged, recorded) so that the next still runs.
The paths' loops are one step (`LoopGroup`), stopped all at once. As a process, a watchdog thread
(`arm_watchdog`) ends it at the grace whatever the event loop is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from consumers.loop import StreamLoop

log = logging.getLogger(__name__)

MIN_STEP_S = 0.1  # even past the budget, each step gets this long to close what closes at once
SIGNALS = (signal.SIGTERM, signal.SIGINT)

T = TypeVar("T")


@dataclass
class ShutdownClock:
    """The shutdown budget: `grace_s` from the moment the service started stopping (`start`)."""

    grace_s: float
    started: float | None = None
    unfinished: list[str] = field(default_factory=list)  # steps that overran or lost work

    def start(self) -> None:
        if self.started is None:
            self.started = time.monotonic()

    @property
    def deadline(self) -> float:
        """When the whole shutdown must be over (monotonic); `grace_s` from now before it started."""
        return (self.started if self.started is not None else time.monotonic()) + self.grace_s

    def step_deadline(self, reserve_share: float) -> float:
        """When a step must be done, keeping `reserve_share` of the grace for the later steps."""
        return max(time.monotonic() + MIN_STEP_S, self.deadline - reserve_share * self.grace_s)

    def failed(self, step: str) -> None:
        self.unfinished.append(step)


class Bounded(AbstractAsyncContextManager[T]):
    """`inner`, whose exit is cut off at the clock's step deadline: an overrun is logged and recorded, not
    raised, so that the steps after it still run."""

    def __init__(
        self, name: str, inner: AbstractAsyncContextManager[T], clock: ShutdownClock, reserve_share: float
    ) -> None:
        self._name = name
        self._inner = inner
        self._clock = clock
        self._reserve = reserve_share

    async def __aenter__(self) -> T:
        return await self._inner.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        deadline = self._clock.step_deadline(self._reserve)
        try:
            async with asyncio.timeout_at(loop_time(deadline)):
                return await self._inner.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            self._clock.failed(self._name)
            log.error(  # noqa: TRY400 -- the step and its bound say it all; the stack is asyncio's
                "shutdown step did not finish within its bound: abandoned",
                extra={"step": self._name, "grace_s": self._clock.grace_s},
            )
            return None


def loop_time(deadline: float) -> float:
    """A `time.monotonic()` deadline on the running event loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())


class LoopGroup:
    """Every path's loop as one step: started one after the other, stopped all at once.

    Stopping them together matters in a rebalance: a consumer leaving the group makes the others of this
    instance rejoin, and each stop after it would wait for that join (held by the broker for any dead member).
    Each loop's own exit is bounded by the step deadline it is given; `clean` says whether all of them
    committed what they had done and left in time.
    """

    def __init__(self, loops: Sequence[StreamLoop], clock: ShutdownClock, reserve_share: float) -> None:
        self.loops = list(loops)
        self._clock = clock
        self._reserve = reserve_share
        self._started: list[StreamLoop] = []

    async def __aenter__(self) -> LoopGroup:
        try:
            for loop in self.loops:
                await loop.__aenter__()
                self._started.append(loop)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        deadline = self._clock.step_deadline(self._reserve)
        for loop in self._started:
            loop.exit_deadline = deadline
        results = await asyncio.gather(
            *(loop.__aexit__(exc_type, exc, tb) for loop in self._started), return_exceptions=True
        )
        for loop, result in zip(self._started, results, strict=True):
            if isinstance(result, BaseException):
                log.error("%s loop failed to stop", loop.path, exc_info=result)
            if isinstance(result, BaseException) or not loop.stopped_cleanly:
                self._clock.failed(f"{loop.path} consumer")


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop` while inside (on the running event loop); the handlers removed after."""
    loop = asyncio.get_running_loop()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, stop, sig)
    try:
        yield
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)


def on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("signal received: stopping", extra={"signal": sig.name})
    stop.set()


async def arm_watchdog(stop: asyncio.Event, grace_s: float) -> None:
    """Once stopping, end the process at the grace whatever the event loop is doing (a join no bound
    reached, a blocked call, asyncio's own teardown); a daemon thread: a clean exit does not wait for it."""
    await stop.wait()
    timer = threading.Timer(grace_s, overrun_exit, args=(grace_s,))
    timer.daemon = True
    timer.start()


def overrun_exit(grace_s: float) -> None:
    log.error("shutdown overran the grace period: exiting now", extra={"grace_s": grace_s, "exit_code": 1})
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(1)
