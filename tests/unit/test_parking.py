"""Parked requests without Kafka: a request that must wait holds its own thread's lane, not its batch.

Fake records, the in-memory storage and the fake barrier and markers of `test_turn_gate`: the recall handler
returns a batch at once with a `Parked` for the waiting request, later requests of that thread (in the
same batch or a later one) are parked behind it in order, and the lanes themselves run in order, retry an
outage in place, and drop a revoked partition's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from consumers.contract import Done, Emit, Parked, Refused, delivered
from consumers.parking import Lane, ParkedLanes
from consumers.recall import RecallHandler
from consumers.runtime.retry import Backoff
from consumers.turn_gate import TurnGate
from message_history.core.turn_rules import BusyPolicy, TurnMarker
from message_history.errors import EventValidationError, StorageUnavailableError, ThreadOwnershipError
from message_history.settings import Settings
from producers.output import Headers, Positioned
from tests.paths import no_emit
from tests.unit.test_batch_stand_ins import T0, _CountingPages, _message, _seed
from tests.unit.test_recall_once import _Sent
from tests.unit.test_turn_gate import FakeBarrier, FakeMarkers

pytestmark = pytest.mark.timeout(30)

BOUND_S = 5.0  # a deadlock guard, not a measurement
WAIT_S = 20.0  # the turn timeout: longer than the guard, so a wait in the batch shows as a timeout


def _record(offset: int, thread: str, *, partition: int = 0, resource: str = "u", rid: str = "") -> Any:
    event = {
        "schemaVersion": 1,
        "requestId": rid or f"{thread}-r{offset}",
        "threadId": thread,
        "resourceId": resource,
        "createdAt": (T0 + timedelta(days=1)).isoformat(),
        "messages": [
            _message(f"{thread}-in{offset}", "user", "next?", 1000 + offset).model_dump(mode="json")
        ],
    }
    value = json.dumps(event).encode()
    return SimpleNamespace(
        topic="requests", partition=partition, offset=offset, key=thread.encode(), value=value, headers=[]
    )


def _handler(
    markers: FakeMarkers | None = None,
    *,
    barrier: FakeBarrier | None = None,
    policy: BusyPolicy = "enqueue",
    storage: _CountingPages | None = None,
) -> tuple[RecallHandler, _Sent]:
    gate = TurnGate(barrier=barrier, markers=markers, policy=policy, timeout_s=WAIT_S)
    publisher = _Sent()
    return RecallHandler(Settings(), storage or _CountingPages(), publisher, gate=gate), publisher


def _sent(publisher: _Sent) -> list[dict[str, Any]]:
    return [json.loads(v) for v in publisher.values]


async def _settle(results: Sequence[object]) -> list[object]:
    """Every result awaited the way a caller that knows no parking would (`delivered`)."""
    out: list[object] = []
    for result in results:
        assert isinstance(result, (Done, Parked)), result
        out.append(await asyncio.wait_for(delivered(result), BOUND_S))
    return out


async def test_a_busy_thread_holds_its_lane_only_and_later_batches_are_not_held() -> None:
    """Thread t has an unanswered turn: its request is parked, the batch returns with the other threads (of
    its partition and another) enriched; a later batch's request on t is parked behind it, the others go. Each
    of t's requests goes once the turn before it is answered, in order, complete, having waited."""
    markers = FakeMarkers({"t": TurnMarker(pending="t-old")})
    handler, publisher = _handler(markers)
    first = await asyncio.wait_for(
        handler.handle([_record(0, "t"), _record(1, "u"), _record(2, "v", partition=1)], no_emit), BOUND_S
    )
    assert isinstance(first[0], Parked)
    await _settle(first[1:])
    assert [e["requestId"] for e in _sent(publisher)] == ["u-r1", "v-r2"]

    second = await asyncio.wait_for(handler.handle([_record(3, "t"), _record(4, "w")], no_emit), BOUND_S)
    assert isinstance(second[0], Parked)
    await _settle(second[1:])
    assert [e["requestId"] for e in _sent(publisher)] == ["u-r1", "v-r2", "w-r4"]
    assert len(handler.parking) == 2

    await asyncio.sleep(0.01)  # parked a while: waitedMs counts it
    markers.answer("t")  # t-old answered: t-r0 goes, and marks t busy with itself
    await _settle(first[:1])
    assert not second[0].settled.done()
    await asyncio.sleep(0.05)
    assert [e["requestId"] for e in _sent(publisher)][-1] == "t-r0"  # t-r3 waits for t-r0's answer
    markers.answer("t")
    await _settle(second[:1])
    events = {e["requestId"]: e for e in _sent(publisher)}
    assert [e["requestId"] for e in _sent(publisher)] == ["u-r1", "v-r2", "w-r4", "t-r0", "t-r3"]
    for rid in ("t-r0", "t-r3"):
        assert events[rid]["history"]["complete"] is True
        assert events[rid]["history"]["waitedMs"] > 0
    for rid in ("u-r1", "v-r2", "w-r4"):
        assert events[rid]["history"]["waitedMs"] == 0
    assert len(handler.parking) == 0


async def test_a_partition_behind_the_barrier_parks_its_requests_only() -> None:
    """Partition 0 behind: its requests are parked; partition 1's goes in the batch; the barrier reached,
    partition 0's go, recalled fresh and complete."""
    barrier = FakeBarrier({0: 10})
    handler, publisher = _handler(FakeMarkers(), barrier=barrier)
    results = await asyncio.wait_for(
        handler.handle([_record(0, "a"), _record(1, "b"), _record(2, "c", partition=1)], no_emit), BOUND_S
    )
    assert [isinstance(r, Parked) for r in results] == [True, True, False]
    await _settle(results[2:])
    assert [e["requestId"] for e in _sent(publisher)] == ["c-r2"]
    await asyncio.sleep(0.01)  # parked a while: waitedMs counts it
    barrier.release.set()
    await _settle(results[:2])
    events = {e["requestId"]: e["history"] for e in _sent(publisher)}
    assert events["a-r0"]["complete"] is True
    assert events["b-r1"]["complete"] is True
    assert events["a-r0"]["waitedMs"] > 0


@pytest.mark.parametrize("policy", ["enqueue", "reject"])
async def test_a_foreign_request_is_refused_before_any_busy_gate(policy: BusyPolicy) -> None:
    """Thread t is resource u's, with u's turn pending: resource x's request on t is refused at once as an
    ownership refusal (never parked in u's lane, never a busy refusal naming u's pending request)."""
    storage = _CountingPages()
    await _seed(storage, "t", "u", 1)
    markers = FakeMarkers({"t": TurnMarker(pending="u-secret-pending")})
    handler, publisher = _handler(markers, policy=policy, storage=storage)
    [refused] = await asyncio.wait_for(handler.handle([_record(0, "t", resource="x")], no_emit), BOUND_S)
    assert isinstance(refused, Refused)
    result = refused.error
    assert isinstance(result, ThreadOwnershipError)
    assert "u-secret-pending" not in str(result)
    assert len(handler.parking) == 0
    assert publisher.values == []


async def test_a_foreign_request_on_a_thread_not_saved_yet_is_refused_before_the_busy_gate() -> None:
    """Thread t has no stored row yet, only resource u's turn pending on it: resource x's request is refused
    for ownership at once, not parked behind u's turn; u's own next request waits as before."""
    markers = FakeMarkers({"t": TurnMarker(pending="u-secret-pending", resource_id="u")})
    handler, _ = _handler(markers)
    foreign, own = await asyncio.wait_for(
        handler.handle([_record(0, "t", resource="x"), _record(1, "t")], no_emit), BOUND_S
    )
    assert isinstance(foreign, Refused)
    assert isinstance(foreign.error, ThreadOwnershipError)
    assert "u-secret-pending" not in str(foreign.error)
    assert isinstance(own, Parked)
    await handler.parking.cancel()


class _FailingFor(_Sent):
    """Sends like `_Sent`, but Kafka is down for one thread's event."""

    def __init__(self, thread: str) -> None:
        super().__init__()
        self.thread = thread.encode()

    async def _send(
        self, emit: Emit, record: Positioned, key: bytes, value: bytes, headers: Headers
    ) -> asyncio.Future[Any]:
        if key == self.thread:
            raise KafkaConnectionError("down")
        return await super()._send(emit, record, key, value, headers)


async def test_a_batch_that_fails_drops_what_it_parked_so_its_retry_parks_it_once() -> None:
    """t's request is parked, then the batch fails for an outage (u's send): the loop will try the whole
    batch again, so t's parked copy is dropped (never sent); the retry parks it again, once."""
    markers = FakeMarkers({"t": TurnMarker(pending="t-old")})
    gate = TurnGate(barrier=None, markers=markers, policy="enqueue", timeout_s=WAIT_S)
    publisher = _FailingFor("u")
    handler = RecallHandler(Settings(), _CountingPages(), publisher, gate=gate)
    batch = [_record(0, "t"), _record(1, "u")]
    with pytest.raises(KafkaConnectionError):
        await asyncio.wait_for(handler.handle(batch, no_emit), BOUND_S)
    assert len(handler.parking) == 0
    publisher.thread = b"nobody"  # Kafka is back
    again = await asyncio.wait_for(handler.handle(batch, no_emit), BOUND_S)
    assert isinstance(again[0], Parked)
    await _settle(again[1:])
    await asyncio.sleep(0.01)  # parked a while: waitedMs counts it
    markers.answer("t")
    await _settle(again[:1])
    assert [e["requestId"] for e in _sent(publisher)] == ["u-r1", "t-r0"]  # t-r0 once


async def test_lanes_keep_order_retry_an_outage_in_place_and_drop_revoked_work() -> None:
    """One lane's entries run one after the other (an outage retried before the next entry); another lane
    runs meanwhile; a refusal is the entry's outcome; `cancel` drops a partition's lanes."""
    lanes: ParkedLanes[list[str]] = ParkedLanes(
        path="recall", capacity=3, backoff=Backoff(0.001, 0.002, lambda: 0.5)
    )
    release, never = asyncio.Event(), asyncio.Event()
    order: list[str] = []
    failures = {"a1": 1}

    def work(name: str, *, hold: asyncio.Event | None = None) -> Any:
        async def run(lane: Lane[list[str]]) -> Any:
            if hold is not None:
                await hold.wait()
            if failures.get(name, 0):
                failures[name] -= 1
                raise StorageUnavailableError("down")
            if name == "a3":
                return EventValidationError("bad")
            order.append(name)
            lane.state.append(name)
            done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            done.set_result(name)
            return done

        return run

    a1 = lanes.park((0, "a"), work("a1", hold=release), [])
    a2 = lanes.park((0, "a"), work("a2"), [])
    b1 = lanes.park((1, "b"), work("b1"), [])
    assert lanes.full()
    assert await asyncio.wait_for(delivered(b1), BOUND_S) == "b1"  # lane b is not behind lane a
    a3 = lanes.park((0, "a"), work("a3"), [])
    c1 = lanes.park((2, "c"), work("c1", hold=never), [])
    release.set()
    assert await asyncio.wait_for(delivered(a2), BOUND_S) == "a2"
    assert await delivered(a1) == "a1"
    a3_outcome = await a3.settled
    assert isinstance(a3_outcome, Refused)
    assert isinstance(a3_outcome.error, EventValidationError)
    assert order == ["b1", "a1", "a2"]  # a1's outage was retried before a2 ran
    assert await lanes.cancel([2]) == 1  # c1, still waiting: dropped, never run
    with pytest.raises(asyncio.CancelledError):
        await c1.settled
    assert order == ["b1", "a1", "a2"]
    assert len(lanes) == 0
    assert not lanes.full()


async def test_a_lane_dropped_while_its_work_swallows_the_cancel_ends_quietly() -> None:
    """`cancel` clears a lane whose running entry's work swallows the cancellation and returns normally
    (a wait that ends early on stop): the lane's task ends without touching the cleared lane, so a revoke
    or shutdown does not fail with it."""
    lanes: ParkedLanes[list[str]] = ParkedLanes(
        path="recall", capacity=3, backoff=Backoff(0.001, 0.002, lambda: 0.5)
    )
    started = asyncio.Event()

    async def run(lane: Lane[list[str]]) -> Any:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):  # swallowed: the work answers anyway
            await asyncio.Event().wait()
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result("late")
        return done

    parked = lanes.park((0, "a"), run, [])
    await asyncio.wait_for(started.wait(), BOUND_S)
    assert await asyncio.wait_for(lanes.cancel([0]), BOUND_S) == 1
    with pytest.raises(asyncio.CancelledError):
        await parked.settled
    assert len(lanes) == 0
