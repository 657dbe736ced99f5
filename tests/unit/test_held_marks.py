"""A batch's busy marks held by its gate until `write_marks`, and the markers' one-write-in-flight
coalescing (issue 33; on the real server: tests/integration/test_batch_marks.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consumers.turn_gate import BatchGate, TurnGate
from message_history.errors import StorageUnavailableError
from storage.turns import _Coalesced
from storage.update_command import Statement
from tests.unit.test_turn_gate import FakeMarkers


class _FailingFor(FakeMarkers):
    """Marks of `bad` fail as an outage; the others are written."""

    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad

    async def mark(self, thread_id: str, request_id: str, *, resource_id: str | None = None) -> None:
        if thread_id == self.bad:
            raise StorageUnavailableError("down")
        await super().mark(thread_id, request_id, resource_id=resource_id)


def _gate(markers: FakeMarkers) -> TurnGate:
    return TurnGate(barrier=None, markers=markers, policy="enqueue", timeout_s=0.1)


async def _held_pair(
    markers: FakeMarkers,
) -> tuple[BatchGate, asyncio.Future[None], asyncio.Future[None]]:
    """A batch holding its marks, with a1 on thread a and b1 on thread b marked."""
    batch = await _gate(markers).open_batch([(0, "a"), (0, "b")], defer_marks=True)
    a, b = batch.enriched("a", "a1"), batch.enriched("b", "b1")
    assert a is not None
    assert b is not None
    return batch, a, b


async def test_held_marks_are_written_only_by_write_marks_and_settle_as_written() -> None:
    markers = FakeMarkers()
    batch, a, b = await _held_pair(markers)
    await asyncio.sleep(0.01)
    assert (markers.marked, a.done(), b.done()) == ([], False, False)  # held
    await batch.write_marks()
    assert markers.marked == [("a", "a1"), ("b", "b1")]
    await asyncio.gather(a, b)


async def test_a_failed_mark_fails_only_its_own_record() -> None:
    markers = _FailingFor("b")
    batch, a, b = await _held_pair(markers)
    await batch.write_marks()  # never fails itself: each record's acknowledgement carries its own error
    await a
    with pytest.raises(StorageUnavailableError):
        await b


async def test_a_mark_given_up_before_the_write_is_not_written() -> None:
    markers = FakeMarkers()
    batch, a, _ = await _held_pair(markers)
    a.cancel()
    await batch.write_marks()
    assert markers.marked == [("b", "b1")]


async def test_after_write_marks_and_without_holding_marks_are_written_at_once() -> None:
    markers = FakeMarkers()
    held = await _gate(markers).open_batch([(0, "a"), (0, "b")], defer_marks=True)
    await held.write_marks()
    late = held.enriched("a", "a1")
    plain = (await _gate(markers).open_batch([(0, "b")])).enriched("b", "b1")
    assert late is not None
    assert plain is not None
    await asyncio.gather(late, plain)
    assert sorted(markers.marked) == [("a", "a1"), ("b", "b1")]


async def test_marks_submitted_while_a_write_is_in_flight_go_together_in_the_next_one() -> None:
    """One bulk in flight at a time: the marks made meanwhile wait for it and go as one, in order."""
    release = asyncio.Event()
    writes: list[list[str]] = []
    in_flight = 0

    async def write(ops: list[Statement]) -> None:
        nonlocal in_flight
        in_flight += 1
        assert in_flight == 1  # never two bulks at once
        writes.append([op["q"]["_id"] for op in ops])
        await release.wait()
        in_flight -= 1

    coalesced = _Coalesced(write)

    def submit(thread: str) -> asyncio.Future[Any]:
        return asyncio.ensure_future(coalesced.submit({"q": {"_id": thread}, "u": {"$set": {"p": 1}}}))

    first = submit("a")
    await asyncio.sleep(0.01)  # "a" is being written
    later = [submit(t) for t in ("b", "c")]
    await asyncio.sleep(0)
    later.append(submit("d"))  # another turn of the loop: still while "a" is in flight
    await asyncio.sleep(0.01)
    assert writes == [["a"]]
    release.set()
    await asyncio.gather(first, *later)
    assert writes == [["a"], ["b", "c", "d"]]
    assert coalesced.flushes == 2


async def test_a_failed_write_fails_its_marks_and_the_next_ones_still_go() -> None:
    calls = 0

    async def write(ops: list[Statement]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(0.01)
            raise StorageUnavailableError("down")

    coalesced = _Coalesced(write)
    first = asyncio.ensure_future(coalesced.submit({"q": {"_id": "a"}, "u": {"$set": {"p": 1}}}))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    second = asyncio.ensure_future(coalesced.submit({"q": {"_id": "b"}, "u": {"$set": {"p": 1}}}))
    with pytest.raises(StorageUnavailableError):
        await first
    await second
    assert calls == 2
