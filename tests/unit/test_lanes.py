"""Per-thread lanes: order inside a thread, concurrency across threads, a bound, and error handling."""

from __future__ import annotations

import asyncio

import pytest

from consumers.lanes import Failed, group_lanes, run_lanes


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        pytest.param([], [], id="empty"),
        pytest.param(["a"], [[0]], id="one"),
        pytest.param(["a", "b", "a", "c", "b"], [[0, 2], [1, 4], [3]], id="interleaved"),
        pytest.param(["x", "x", "x"], [[0, 1, 2]], id="single-thread"),
    ],
)
def test_group_lanes(keys: list[str], expected: list[list[int]]) -> None:
    """Lanes come in order of first appearance and keep each thread's items in batch order."""
    assert group_lanes(keys, key=lambda k: k) == expected


async def test_one_thread_runs_in_order_others_interleave() -> None:
    """Items of one key never overlap and run in batch order, while distinct keys overlap in time."""
    events: list[tuple[str, str, int]] = []

    async def work(item: tuple[str, int]) -> int:
        key, n = item
        events.append(("start", key, n))
        await asyncio.sleep(0.01 if key == "slow" else 0)
        events.append(("end", key, n))
        return n * 10

    items = [("slow", 0), ("fast", 1), ("slow", 2), ("fast", 3)]
    results = await run_lanes(items, key=lambda i: i[0], work=work, max_concurrent=8)

    assert results == [0, 10, 20, 30]
    slow = [e for e in events if e[1] == "slow"]
    assert slow == [("start", "slow", 0), ("end", "slow", 0), ("start", "slow", 2), ("end", "slow", 2)]
    # the fast lane finished while the slow lane was still sleeping on its first item
    assert events.index(("end", "fast", 3)) < events.index(("end", "slow", 0))


@pytest.mark.parametrize("bound", [1, 2, 3], ids=["bound-1", "bound-2", "bound-3"])
async def test_concurrency_bound(bound: int) -> None:
    """No more than `max_concurrent` lanes run at once, and with enough lanes the bound is reached."""
    running = 0
    peak = 0

    async def work(item: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        running -= 1

    await run_lanes(list(range(10)), key=lambda i: i, work=work, max_concurrent=bound)
    assert peak == bound


async def test_tolerated_error_is_a_result_and_lane_goes_on() -> None:
    """A tolerated error (bad input) becomes that item's result; the same thread's later items still run."""

    async def work(item: int) -> int:
        if item == 1:
            raise ValueError("bad")
        return item

    results = await run_lanes(
        [0, 1, 2], key=lambda _: "t", work=work, max_concurrent=2, item_errors=(ValueError,)
    )
    assert results[0] == 0
    assert isinstance(results[1], Failed)
    assert isinstance(results[1].error, ValueError)
    assert results[2] == 2


async def test_other_error_fails_the_batch_and_stops_lanes() -> None:
    """An untolerated error propagates, and no later item of the failing thread runs."""
    ran: list[int] = []

    async def work(item: tuple[str, int]) -> None:
        ran.append(item[1])
        if item[1] == 0:
            raise ConnectionError("down")
        await asyncio.sleep(0.05)

    items = [("a", 0), ("b", 1), ("a", 2)]
    with pytest.raises(ConnectionError):
        await run_lanes(items, key=lambda i: i[0], work=work, max_concurrent=4, item_errors=(ValueError,))
    assert 2 not in ran


async def test_an_error_cancels_the_other_lanes() -> None:
    """The first untolerated error stops the batch: a lane still working is cancelled, not left running."""
    finished: list[str] = []
    cancelled: list[str] = []

    async def work(item: str) -> None:
        if item == "fails":
            raise ConnectionError("down")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise
        finished.append(item)

    with pytest.raises(ConnectionError):
        await run_lanes(["slow", "fails"], key=lambda i: i, work=work, max_concurrent=4)
    assert (cancelled, finished) == (["slow"], [])


async def test_a_cancelled_caller_cancels_every_lane() -> None:
    """The worker's shutdown grace cancels its batch: no lane may outlive it."""
    started = asyncio.Event()
    cancelled: list[str] = []

    async def work(item: str) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise

    batch = asyncio.ensure_future(run_lanes(["a", "b", "c"], key=lambda i: i, work=work, max_concurrent=4))
    await started.wait()
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert sorted(cancelled) == ["a", "b", "c"]
