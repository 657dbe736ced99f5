"""The per-batch turn gate with fake look-ups: who waits, for how long, and what it does to the rest."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from consumers.lanes import run_lanes
from consumers.turn_gate import GO, Admission, TurnGate
from message_history.core.turn_rules import BusyPolicy, TurnMarker
from message_history.errors import StorageUnavailableError, WaitInterruptedError


class FakeBarrier:
    """Partitions behind until `release` is set (or never)."""

    def __init__(self, behind: dict[int, int]) -> None:
        self._behind = behind
        self.release = asyncio.Event()
        self.reached: list[int] = []

    async def behind(self, partitions: Sequence[int]) -> dict[int, int]:
        return {p: e for p, e in self._behind.items() if p in partitions}

    async def reach(
        self, partition: int, target: int, timeout_s: float, stop: asyncio.Event | None = None
    ) -> bool:
        try:
            await asyncio.wait_for(self.release.wait(), timeout_s)
        except TimeoutError:
            return False
        self.reached.append(partition)
        return True


class FakeMarkers:
    """Markers in a dict; `answer(thread)` clears a pending turn for the waiters."""

    def __init__(self, markers: dict[str, TurnMarker] | None = None, *, fail: bool = False) -> None:
        self.markers = dict(markers or {})
        self.marked: list[tuple[str, str]] = []
        self.released: list[tuple[str, str]] = []
        self.changed = asyncio.Event()
        self.fail = fail

    async def get_many(self, thread_ids: Sequence[str]) -> dict[str, TurnMarker]:
        return {t: self.markers[t] for t in thread_ids if t in self.markers}

    async def mark(self, thread_id: str, request_id: str, *, resource_id: str | None = None) -> None:
        self.marked.append((thread_id, request_id))
        self.markers[thread_id] = TurnMarker(pending=request_id)

    async def release(self, thread_id: str, request_id: str) -> None:
        self.released.append((thread_id, request_id))
        marker = self.markers.get(thread_id)
        if marker is not None and marker.pending == request_id:
            self.markers[thread_id] = TurnMarker(pending=None, answered=marker.answered)
            self.changed.set()

    def answer(self, thread_id: str) -> None:
        marker = self.markers[thread_id]
        assert marker.pending is not None
        self.markers[thread_id] = TurnMarker(pending=None, answered=(marker.pending,))
        self.changed.set()

    async def wait_answered(
        self, thread_id: str, awaited: str, timeout_s: float, stop: asyncio.Event | None = None
    ) -> TurnMarker | None:
        if self.fail:
            raise StorageUnavailableError("MongoDB unavailable during find")
        if stop is not None and stop.is_set():
            raise WaitInterruptedError("stopping")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.markers[thread_id].pending == awaited:
            left = deadline - loop.time()
            if left <= 0:
                return None
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                return None
        return self.markers[thread_id]


def _gate(
    *,
    barrier: FakeBarrier | None = None,
    markers: FakeMarkers | None = None,
    policy: BusyPolicy = "enqueue",
    timeout_s: float = 5.0,
    stop: asyncio.Event | None = None,
) -> TurnGate:
    return TurnGate(barrier=barrier, markers=markers, policy=policy, timeout_s=timeout_s, stop=stop)


async def test_caught_up_and_idle_admits_at_once() -> None:
    """No partition behind, no busy thread: every request goes without waiting or reading again."""
    batch = await _gate(barrier=FakeBarrier({}), markers=FakeMarkers()).open_batch([(0, "a"), (1, "b")])
    assert await batch.admit(0, "a", "a1") is GO
    assert await batch.admit(1, "b", "b1") is GO


async def test_a_lagging_partition_holds_only_its_own_lanes() -> None:
    """Partition 0 behind: its request waits; partition 1's request is done meanwhile."""
    barrier = FakeBarrier({0: 10})
    batch = await _gate(barrier=barrier).open_batch([(0, "a"), (1, "b")])
    order: list[str] = []

    async def work(item: tuple[int, str]) -> Any:
        admission = await batch.admit(item[0], item[1], f"{item[1]}1")
        order.append(item[1])
        if item[1] == "b":
            barrier.release.set()  # persist catches up only after the other thread went on
        return admission

    results = await run_lanes([(0, "a"), (1, "b")], key=lambda i: i[1], work=work, max_concurrent=8)
    assert order == ["b", "a"]
    waited, went = results
    assert went is GO
    assert isinstance(waited, Admission)
    assert waited.fresh
    assert waited.complete


async def test_a_barrier_wait_that_runs_out_is_incomplete() -> None:
    """Persist never catches up: the request is admitted at the deadline with complete false."""
    batch = await _gate(barrier=FakeBarrier({0: 10}), timeout_s=0.05).open_batch([(0, "a")])
    admission = await batch.admit(0, "a", "a1")
    assert admission.complete is False
    assert admission.fresh is True


@pytest.mark.parametrize("policy", ["enqueue", "reject", "allow"])
async def test_busy_thread_policies(policy: BusyPolicy) -> None:
    """Turn k pending: enqueue waits for its answer, reject refuses, allow goes on."""
    markers = FakeMarkers({"a": TurnMarker(pending="a1")})
    batch = await _gate(markers=markers, policy=policy).open_batch([(0, "a")])
    admitting = asyncio.ensure_future(batch.admit(0, "a", "a2"))
    await asyncio.sleep(0.01)
    if policy == "enqueue":
        assert not admitting.done()
        markers.answer("a")
    admission = await admitting
    if policy == "reject":
        assert admission.refused is not None
        assert "thread-busy" in str(admission.refused)
        assert admission.refused.error_type == "ThreadBusyError"
    elif policy == "allow":
        assert admission is GO
    else:
        assert admission.complete
        assert admission.fresh


async def test_a_redelivered_pending_request_does_not_wait_on_itself() -> None:
    """The pending turn's own copy goes at once, and marking it again changes nothing."""
    markers = FakeMarkers({"a": TurnMarker(pending="a1")})
    batch = await _gate(markers=markers).open_batch([(0, "a")])
    assert await batch.admit(0, "a", "a1") is GO


async def test_the_second_request_of_a_thread_in_one_batch_waits_for_the_first() -> None:
    """Turns 1 and 2 in one batch: turn 2 waits for turn 1's answer (the mark the batch just made)."""
    markers = FakeMarkers()
    batch = await _gate(markers=markers, timeout_s=0.05).open_batch([(0, "a"), (0, "a")])
    assert await batch.admit(0, "a", "a1") is GO
    mark = batch.enriched("a", "a1")
    assert mark is not None
    await mark
    assert markers.marked == [("a", "a1")]
    second = await batch.admit(0, "a", "a2")
    assert second.complete is False  # no answer came within the timeout


async def test_an_answered_request_is_not_marked_again() -> None:
    """A replayed request whose answer is recorded leaves the thread idle."""
    markers = FakeMarkers({"a": TurnMarker(pending=None, answered=("a1",))})
    batch = await _gate(markers=markers).open_batch([(0, "a")])
    assert batch.enriched("a", "a1") is None
    assert markers.marked == []


async def test_an_outage_during_a_wait_blocks_the_rest_of_the_thread() -> None:
    """A marker read that fails is an outage: retried, and later requests of the thread do not overtake."""
    markers = FakeMarkers({"a": TurnMarker(pending="a1")}, fail=True)
    batch = await _gate(markers=markers).open_batch([(0, "a")])
    first = await batch.admit(0, "a", "a2")
    assert isinstance(first.retry, StorageUnavailableError)
    later = await batch.admit(0, "a", "a3")
    assert later.retry is first.retry


async def test_a_stop_interrupts_a_wait() -> None:
    """Stopping ends the wait with a retriable error (the record is left for the next owner)."""
    stop = asyncio.Event()
    stop.set()
    markers = FakeMarkers({"a": TurnMarker(pending="a1")})
    batch = await _gate(markers=markers, stop=stop).open_batch([(0, "a")])
    admission = await batch.admit(0, "a", "a2")
    assert isinstance(admission.retry, WaitInterruptedError)


@pytest.mark.parametrize("policy", ["reject", "enqueue"])
@pytest.mark.parametrize(("abandon_after_s", "held"), [(900.0, False), (10 * 86400.0, True)])
async def test_a_turn_never_answered_stops_holding_its_thread(
    policy: BusyPolicy, abandon_after_s: float, held: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A pending turn enriched an hour ago and never answered: past the abandon horizon (15 min) the next
    request goes at once and a warning names the dropped turn; with a horizon beyond its age (as before
    there was one), `reject` refuses every later request of the thread and `enqueue` makes each wait."""
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    markers = FakeMarkers({"a": TurnMarker(pending="a0", pending_since=an_hour_ago)})
    gate = TurnGate(
        barrier=None, markers=markers, policy=policy, timeout_s=0.05, abandon_after_s=abandon_after_s
    )
    batch = await gate.open_batch([(0, "a")])
    admission = await batch.admit(0, "a", "a1")
    if not held:
        # no wait, no refusal; the history lacks the dropped turn's answer, and says so
        assert (admission.refused, admission.complete, admission.waited_ms) == (None, False, 0)
        named = [getattr(r, "abandoned_request_id", None) for r in caplog.records]
        assert [n for n in named if n is not None] == ["a0"]
    elif policy == "reject":
        assert admission.refused is not None
    else:  # waited for the answer until the deadline
        assert (admission.refused, admission.complete, admission.fresh) == (None, False, True)


async def test_every_request_of_a_partition_the_barrier_waited_for_is_recalled_fresh() -> None:
    """Partition 0 behind: the first request waits for the barrier; a request of another thread on that
    partition admitted after the wait does not wait again, but is recalled from MongoDB too (`fresh`): the
    batch's prefetch predates the turns persisted during the wait. (It used to take the prefetch: a batch
    with more threads than `max_in_flight_threads` on a lagging partition could miss an earlier turn.)"""
    barrier = FakeBarrier({0: 10})
    batch = await _gate(barrier=barrier).open_batch([(0, "a"), (0, "b"), (1, "c")])
    barrier.release.set()
    first = await batch.admit(0, "a", "a1")
    later = await batch.admit(0, "b", "b1")
    other = await batch.admit(1, "c", "c1")
    assert (first.fresh, first.complete) == (True, True)
    assert (later.fresh, later.complete, later.waited_ms) == (True, True, 0)
    assert other is GO
    assert barrier.reached == [0]


async def _acked(result: object) -> object:
    if isinstance(result, BaseException):
        raise result
    return result


@pytest.mark.parametrize(
    ("outcome", "released"),
    [
        pytest.param("ok", False, id="sent"),
        pytest.param(MessageSizeTooLargeError("over 1 MiB"), True, id="too-large-dead-letter"),
        pytest.param(ValueError("a bug met on the record"), True, id="contained-dead-letter"),
        pytest.param(KafkaTimeoutError(), False, id="outage-retried"),
        pytest.param(StorageUnavailableError("down"), False, id="mongodb-outage-retried"),
    ],
)
async def test_a_send_that_fails_for_the_record_clears_its_busy_mark(outcome: object, released: bool) -> None:
    """The record is a dead letter at send time: no answer will come, so its mark is cleared and the next
    request of the thread does not wait for it. An outage keeps the mark (the record is sent again)."""
    markers = FakeMarkers()
    batch = await _gate(markers=markers).open_batch([(0, "a")])
    mark = batch.enriched("a", "a1")
    ack = batch.sent("a", "a1", mark, _acked(outcome))
    if isinstance(outcome, BaseException):
        with pytest.raises(type(outcome)):
            await ack
    else:
        assert await ack == "ok"
    assert markers.released == ([("a", "a1")] if released else [])
    assert (markers.markers["a"].pending is None) is released
    assert batch.must_wait(0, "a", "a2") is not released
