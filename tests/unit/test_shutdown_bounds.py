"""Every step of the shutdown has its own bound, and a step that overruns it does not hold up the next one.

Fakes stand in for aiokafka and the service's resources (pure logic); the real case, a consumer whose group
is mid-rebalance, is tests/integration/test_service_shutdown.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from consumers.barrier import TurnBarrier
from consumers.consumer import (
    commit_timeout_s,
    heartbeat_interval_ms,
    rebalance_timeout_ms,
    revoke_drain_s,
    stop_consumer,
)
from message_history.app.shutdown import Bounded, ShutdownClock
from message_history.settings import Settings

pytestmark = pytest.mark.timeout(10)


class _Coordinator:
    def __init__(self, calls: list[str]) -> None:
        self._calls = calls

    async def _maybe_leave_group(self) -> None:
        self._calls.append("leave")


class _Client:
    def __init__(self, calls: list[str]) -> None:
        self._calls = calls

    async def close(self) -> None:
        self._calls.append("close")


class _Consumer:
    """`stop()` as aiokafka's when its coordinator is inside a join the broker holds: it never returns."""

    def __init__(self, *, hangs: bool) -> None:
        self.calls: list[str] = []
        self._hangs = hangs
        self._coordinator = _Coordinator(self.calls)
        self._client = _Client(self.calls)

    async def stop(self) -> None:
        self.calls.append("stop")
        if self._hangs:
            await asyncio.Event().wait()


async def test_a_consumer_stop_held_by_a_join_is_cut_off_and_the_member_leaves() -> None:
    consumer = _Consumer(hangs=True)
    assert await stop_consumer(consumer, 0.05) is False
    assert consumer.calls == ["stop", "leave", "close"]


async def test_a_consumer_that_stops_in_time_is_left_alone() -> None:
    consumer = _Consumer(hangs=False)
    assert await stop_consumer(consumer, 5.0) is True
    assert consumer.calls == ["stop"]


@contextlib.asynccontextmanager
async def _step(log: list[str], name: str, *, hangs: bool = False) -> AsyncIterator[str]:
    yield name
    log.append(f"{name} exit started")
    if hangs:
        await asyncio.Event().wait()
    log.append(f"{name} closed")


async def test_a_step_that_overruns_is_abandoned_and_the_next_still_closes() -> None:
    """The consumers' step hangs; the producer's (entered first, so closed after it) still closes, and the
    overrun is recorded for the exit code."""
    clock = ShutdownClock(grace_s=0.3)
    log: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(Bounded("producer", _step(log, "producer"), clock, 0.0))
        await stack.enter_async_context(Bounded("consumers", _step(log, "consumers", hangs=True), clock, 0.5))
        clock.start()
    assert log == ["consumers exit started", "producer exit started", "producer closed"]
    assert clock.unfinished == ["consumers"]


async def test_steps_that_close_in_time_leave_nothing_unfinished() -> None:
    clock = ShutdownClock(grace_s=5.0)
    log: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        for name in ("a", "b"):
            await stack.enter_async_context(Bounded(name, _step(log, name), clock, 0.2))
        clock.start()
    assert log == ["b exit started", "b closed", "a exit started", "a closed"]
    assert clock.unfinished == []


@pytest.mark.parametrize(
    ("reserve", "grace_s", "kept_s"), [(0.0, 10.0, 0.0), (0.2, 10.0, 2.0), (0.5, 1.0, 0.5)]
)
def test_a_step_keeps_its_reserve_for_the_later_steps(reserve: float, grace_s: float, kept_s: float) -> None:
    clock = ShutdownClock(grace_s=grace_s, started=time.monotonic())
    assert clock.deadline - clock.step_deadline(reserve) == pytest.approx(kept_s, abs=0.05)


def test_past_the_budget_a_step_still_gets_a_moment() -> None:
    """Never a deadline in the past: a step can still close what closes at once."""
    clock = ShutdownClock(grace_s=1.0, started=time.monotonic() - 100)
    assert clock.step_deadline(0.0) > time.monotonic()


@pytest.mark.parametrize(
    ("session_ms", "expected"),
    [(6_000, 600), (10_000, 1_000), (30_000, 3_000), (45_000, 3_000), (5_000, 500)],
)
def test_heartbeat_interval_is_a_tenth_of_the_session_within_bounds(session_ms: int, expected: int) -> None:
    assert heartbeat_interval_ms(session_ms) == expected


@pytest.mark.parametrize(
    ("overrides", "drain_s", "rebalance_ms"),
    [
        ({}, 2.5, 17_500),  # defaults: session 10 s, grace 25 s
        ({"session_timeout_ms": 60_000}, 12.5, 77_500),  # the grace's half bounds the drain
        ({"session_timeout_ms": 6_000, "shutdown_grace_s": 4.0}, 1.5, 12_500),
        ({"session_timeout_ms": 60_000, "max_poll_interval_ms": 20_000}, 5.0, 70_000),  # a quarter poll
    ],
)
def test_a_revoke_fits_in_the_rebalance_timeout(
    overrides: dict[str, float], drain_s: float, rebalance_ms: int
) -> None:
    """The broker waits for a live member's whole revoke (drain + commit) before dropping it from the
    generation, and never less than the session timeout (aiokafka's default, too short for a revoke)."""
    settings = Settings(**overrides)  # type: ignore[arg-type]
    assert revoke_drain_s(settings) == drain_s
    assert rebalance_timeout_ms(settings) == rebalance_ms
    assert rebalance_timeout_ms(settings) >= (revoke_drain_s(settings) + commit_timeout_s(settings)) * 1000


class _Committed:
    """The barrier's consumer: `committed()` answers `offset` once released (until then, a look-up in
    flight when a rebalance cancels the wait)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.released = asyncio.Event()
        self.asked = asyncio.Event()

    async def committed(self, tp: Any) -> int:
        self.asked.set()
        await self.released.wait()
        return self.offset


async def test_a_barrier_wait_cancelled_mid_look_up_leaves_the_partition_free() -> None:
    """A revoke cancels a request's barrier wait (its records go to the partition's next owner): the wait
    ends at once, even inside an OffsetFetch, and the partition's shared look-up is not left locked for the
    waits after it."""
    consumer = _Committed(offset=7)
    barrier = TurnBarrier(consumer, admin=None, settings=Settings())
    barrier.remote_poll_s = 0.0  # every poll asks
    waiting = asyncio.create_task(barrier.reach(0, target=7, timeout_s=60))
    await consumer.asked.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    consumer.released.set()
    assert await barrier.reach(0, target=7, timeout_s=5) is True
