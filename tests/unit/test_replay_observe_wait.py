"""`replay --observe`'s wait (`replay.observe_wait`) and the runner's record-at-a-time mode, with a scripted
claim reader and a fake clock: a claim holds the next record of its lane (its thread's or resource's OM row)
until settled, records of other lanes go on meanwhile; a held one past the bound stops the partition at the
record that waited; a stop while waiting leaves that record for the resume, and a resume finds a claim still
open on a lane's row on the lane's first record (the lane bookkeeping's rules are pure, tested by table)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.contract import Emit, Result
from message_history.app.replay.observe_wait import (
    NO_LANES,
    LaneClaims,
    ObservationWaitError,
    ObservationWaits,
    Pending,
    RecordLanes,
    lane_row,
    open_claims,
    record_lanes,
)
from message_history.app.replay.plan import Counts
from message_history.app.replay.progress import outcome_parts
from storage.observational import Claim, ClaimOutcome, ObservationalRecord
from tests.unit.test_replay_runner import FakeTime, ScriptedHandler, runner, state

pytestmark = pytest.mark.timeout(20)

OBSERVE = Claim("row-1", 0, 1, "observe")
REFLECT = Claim("row-1", 0, 2, "reflect")
LANE = "thread:t1"
T1 = RecordLanes(("thread:t1", "resource:u1"), "q1")
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=300)


class ScriptedRows:
    """Answers `claim_outcome` with `outcomes` in order (the last one repeated), counting the reads; `get`
    returns `rows[lookup key]` (none by default), counting those reads too."""

    def __init__(self, *outcomes: ClaimOutcome, rows: dict[str, ObservationalRecord] | None = None) -> None:
        self.outcomes = list(outcomes)
        self.rows = rows or {}
        self.reads = 0
        self.gets: list[str] = []

    async def claim_outcome(self, claim: Claim) -> ClaimOutcome:
        self.reads += 1
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None:
        key = f"thread:{thread_id}" if thread_id else f"resource:{resource_id}"
        self.gets.append(key)
        return self.rows.get(key)


def waits(rows: ScriptedRows, time: FakeTime, counts: Counts | None = None) -> ObservationWaits:
    return ObservationWaits(
        rows,
        counts or Counts(),
        wait_s=10.0,
        sleep=time.sleep,
        clock=time.clock,
        now=lambda: NOW,
        poll_s=1.0,
        grace_s=2.0,
    )


def at(offset: int, partition: int = 3) -> Any:
    return SimpleNamespace(topic="rs", partition=partition, offset=offset)


def row(**changes: Any) -> ObservationalRecord:
    base = ObservationalRecord(
        id="row-1",
        lookup_key="thread:t1",
        scope="thread",
        thread_id="t1",
        resource_id="u1",
        generation=0,
        origin_type="initial",
        active_observations="",
        observation_token_count=0,
        pending_message_tokens=0,
        total_tokens_observed=0,
        last_observed_at=None,
        observed_message_ids=(),
        is_observing=False,
        is_reflecting=False,
        config={},
        metadata=None,
        created_at=NOW,
        updated_at=NOW - timedelta(seconds=5),
        cycle=1,
        claimed_by="q0",
    )
    return replace(base, **changes)


# --- pure rules --------------------------------------------------------------------------------------------


def _value(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (b"t1", _value(resourceId="u1", requestId="q1"), T1),
        (b"t1", _value(resourceId="u1"), RecordLanes(("thread:t1", "resource:u1"), None)),
        (b"t1", _value(resourceId="u1", requestId=7), RecordLanes(("thread:t1", "resource:u1"), None)),
        (None, _value(resourceId="u1"), NO_LANES),  # no key: refused by the persist path, holds nothing
        (b"", _value(resourceId="u1"), NO_LANES),
        (b"t1", None, NO_LANES),  # a tombstone
        (b"t1", b"not json", NO_LANES),
        (b"t1", b"[1, 2]", NO_LANES),
        (b"t1", _value(resourceId=""), NO_LANES),
        (b"t1", _value(resourceId={"$ne": None}), NO_LANES),
        (b"\xff\xfe", _value(resourceId="u1"), NO_LANES),  # a key that is no text
        (b"t1", b"[" * 100_000, NO_LANES),  # deep: refused by the parser's depth limit, not a recursion
        (b"t1", b'{"resourceId": "u1", "n": 1e99999}', RecordLanes(("thread:t1", "resource:u1"), None)),
    ],
)
def test_a_records_lanes(key: bytes | None, value: bytes | None, expected: RecordLanes) -> None:
    assert record_lanes(key, value) == expected


@given(st.one_of(st.none(), st.binary(max_size=64)), st.one_of(st.none(), st.binary(max_size=256)))
def test_any_record_has_lanes_or_none_and_never_raises(key: bytes | None, value: bytes | None) -> None:
    lanes = record_lanes(key, value)
    assert lanes == NO_LANES or len(lanes.lanes) == 2


@pytest.mark.parametrize(
    ("lane", "expected"),
    [("thread:t1", ("t1", "")), ("resource:u1", (None, "u1")), ("thread:a:b", ("a:b", ""))],
)
def test_a_lanes_row_is_read_by_its_ids(lane: str, expected: tuple[str | None, str]) -> None:
    assert lane_row(lane) == expected


@pytest.mark.parametrize(
    ("found", "request_id", "expected"),
    [
        (None, "q1", []),  # no row: nothing open
        (row(), "q1", []),  # no flag set
        (row(is_observing=True), "q1", [Claim("row-1", 0, 1, "observe")]),
        (row(is_reflecting=True, cycle=4), "q1", [Claim("row-1", 0, 4, "reflect")]),
        (
            row(is_observing=True, is_reflecting=True),
            "q1",
            [Claim("row-1", 0, 1, "observe"), Claim("row-1", 0, 1, "reflect")],
        ),
        (row(is_observing=True), "q0", []),  # this record's own claim: its turn sends the work again
        (row(is_observing=True, claimed_by=None), None, [Claim("row-1", 0, 1, "observe")]),  # a Mastra app's
        (row(is_observing=True, updated_at=NOW - TIMEOUT - timedelta(seconds=1)), "q1", []),  # stale
        (row(is_observing=True, updated_at=None), "q1", []),  # stale as the emitter sees it
    ],
)
def test_the_open_claims_a_record_waits_for(
    found: ObservationalRecord | None, request_id: str | None, expected: list[Claim]
) -> None:
    assert open_claims(found, request_id, NOW, TIMEOUT) == expected


def _pending(claim: Claim, offset: int = 1) -> Pending:
    return Pending(claim, "thread 't1'", 3, offset)


A, B, R = Claim("a", 0, 1, "observe"), Claim("b", 0, 1, "observe"), Claim("r", 0, 1, "observe")


@pytest.mark.parametrize(
    ("notes", "lanes", "held"),
    [
        ([], ["thread:a"], []),
        ([("thread:a", A)], ["thread:a", "resource:u"], [A]),
        ([("thread:a", A)], ["thread:b", "resource:u"], []),  # another thread's claim holds nothing here
        ([("thread:a", A), ("thread:b", B)], ["thread:b", "resource:u"], [B]),
        ([("resource:u", R)], ["thread:b", "resource:u"], [R]),  # a resource claim holds all its threads
        ([("thread:a", A), ("resource:u", R)], ["thread:a", "resource:u"], [A, R]),
        ([("thread:a", A), ("thread:a", A)], ["thread:a"], [A]),  # a retried send: the same claim, once
    ],
)
def test_which_claims_hold_a_record(
    notes: list[tuple[str, Claim]], lanes: list[str], held: list[Claim]
) -> None:
    book = LaneClaims()
    for lane, claim in notes:
        book.note(lane, _pending(claim))
    assert [p.claim for p in book.holding(lanes)] == held


def test_a_settled_claim_holds_nothing_and_a_lane_is_come_to_once() -> None:
    book = LaneClaims()
    assert book.unseen(["thread:a", "resource:u", "thread:a"]) == ["thread:a", "resource:u"]
    assert book.unseen(["thread:a", "thread:b"]) == ["thread:b"]
    book.note("thread:c", _pending(A))  # a noted lane is come to
    assert book.unseen(["thread:c"]) == []
    book.note("thread:a", _pending(B))
    book.settled(A)
    assert [p.claim for p in book.all()] == [B]
    book.settled(B)
    assert book.open == {}


# --- the wait ----------------------------------------------------------------------------------------------


async def test_nothing_sent_nothing_open_nothing_waited_for() -> None:
    rows, time = ScriptedRows("held"), FakeTime()
    wait = waits(rows, time)
    assert await wait.before(at(13), T1, asyncio.Event())
    assert await wait.before(at(14), T1, asyncio.Event())
    assert await wait.drain(3, asyncio.Event())
    assert (rows.reads, rows.gets) == (0, ["thread:t1", "resource:u1"])  # each lane's row read once


async def test_an_observation_is_waited_for_before_its_lanes_next_record_and_counted() -> None:
    rows, time, counts = ScriptedRows("held", "held", "settled"), FakeTime(), Counts()
    wait = waits(rows, time, counts)
    wait.noted(at(12), OBSERVE, "t1", LANE)
    wait.noted(at(12), OBSERVE, "t1", LANE)  # the same claim again (a retried send): waited for once
    other = RecordLanes(("thread:t2", "resource:u1"), "q2")
    assert await wait.before(at(13), other, asyncio.Event())  # another thread of the resource: not held
    assert rows.reads == 0
    assert await wait.before(at(14), T1, asyncio.Event())
    assert (rows.reads, time.sleeps, counts.observations, counts.observing) == (3, [1.0, 1.0], 1, 0)
    assert "thread:t1" not in rows.gets  # a lane noted in the run is not read again


async def test_a_resource_claim_holds_every_thread_of_the_resource() -> None:
    rows, time = ScriptedRows("held", "settled"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12), OBSERVE, "t1", "resource:u1")
    assert await wait.before(at(13), RecordLanes(("thread:t2", "resource:u1"), "q2"), asyncio.Event())
    assert rows.reads == 2


async def test_another_partitions_claim_is_not_this_ones() -> None:
    rows, time = ScriptedRows("held"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12, partition=4), OBSERVE, "t1", LANE)
    assert await wait.before(at(13), T1, asyncio.Event())
    assert await wait.drain(3, asyncio.Event())
    assert rows.reads == 0


async def test_the_end_of_the_range_waits_for_every_open_claim() -> None:
    rows, time, counts = ScriptedRows("held", "settled"), FakeTime(), Counts()
    wait = waits(rows, time, counts)
    wait.noted(at(12), OBSERVE, "t1", LANE)
    wait.noted(at(13), Claim("row-2", 0, 1, "observe"), "t2", "thread:t2")
    assert await wait.drain(3, asyncio.Event())
    assert (rows.reads, counts.observations) == (3, 2)
    assert await wait.drain(3, asyncio.Event())  # settled: nothing left
    assert rows.reads == 3


async def test_a_claim_open_on_the_row_is_found_on_the_lanes_first_record_and_waited_for() -> None:
    """A resume (after a stop, a crash, the bound): the claim an earlier run sent is read off the row."""
    open_row = row(is_observing=True, cycle=3)
    rows, time, counts = ScriptedRows("held", "settled", rows={LANE: open_row}), FakeTime(), Counts()
    wait = waits(rows, time, counts)
    assert await wait.before(at(20), T1, asyncio.Event())
    assert (rows.reads, counts.observations) == (2, 1)
    assert await wait.before(at(21), T1, asyncio.Event())  # not read again
    assert (rows.gets, rows.reads) == (["thread:t1", "resource:u1"], 2)


async def test_a_claim_found_open_past_the_bound_names_where_it_was_found() -> None:
    rows, time = (
        ScriptedRows("held", rows={"resource:u1": row(is_observing=True, thread_id=None)}),
        FakeTime(),
    )
    wait = waits(rows, time)
    with pytest.raises(ObservationWaitError) as raised:
        await wait.before(at(20), T1, asyncio.Event())
    message = str(raised.value)
    assert "resource 'u1': its observe claim (row row-1, generation 0, cycle 1)" in message
    assert "found open on its row at partition 3 offset 20" in message


async def test_a_reflection_is_waited_for_until_its_next_generation_exists() -> None:
    """Its claim settled first, the next generation a moment later: the record waits for both."""
    rows, time = ScriptedRows("held", "settled", "reflected"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12), REFLECT, "t1", LANE)
    assert await wait.before(at(13), T1, asyncio.Event())
    assert rows.reads == 3


async def test_a_released_reflection_counts_as_settled_after_the_grace() -> None:
    rows, time = ScriptedRows("settled"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12), REFLECT, "t1", LANE)
    assert await wait.before(at(13), T1, asyncio.Event())
    assert time.now == 2.0  # the grace, not the bound


async def test_a_claim_held_past_the_bound_is_a_clear_error() -> None:
    rows, time, counts = ScriptedRows("held"), FakeTime(), Counts()
    wait = waits(rows, time, counts)
    wait.noted(at(12), OBSERVE, "t1", LANE)
    with pytest.raises(ObservationWaitError) as raised:
        await wait.before(at(13), T1, asyncio.Event())
    message = str(raised.value)
    assert "thread 't1'" in message
    assert "observe claim (row row-1, generation 0, cycle 1)" in message
    assert "sent by partition 3 offset 12" in message
    assert "not settled within 10 s (--observe-wait-s)" in message
    assert time.now == 10.0
    assert counts.observing == 0  # no longer waited for
    assert [p.claim for p in wait.lanes(3).all()] == [OBSERVE]  # still open: the next try waits again


async def test_the_progress_shows_the_wait() -> None:
    counts = Counts(observations=4, observing=2)
    assert outcome_parts(counts) == ["observed 4", "waiting for 2 observations"]


# --- the runner with the wait ------------------------------------------------------------------------------


def rec(offset: int, thread: str = "t1", partition: int = 3) -> Any:
    """A responses record of `thread` (resource `u1`), request `q<offset>`."""
    return SimpleNamespace(
        topic="rs",
        partition=partition,
        offset=offset,
        key=thread.encode(),
        value=_value(threadId=thread, resourceId="u1", requestId=f"q{offset}"),
        headers=[],
        timestamp=1_700_000_000_000,
    )


class ClaimingHandler(ScriptedHandler):
    """Every record a clean save; the records in `claims` send an observation (the emitter's `on_work`) on
    their thread's row."""

    def __init__(self, wait: ObservationWaits, claims: dict[int, Claim]) -> None:
        super().__init__([{}])
        self.wait = wait
        self.claims = claims

    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]:
        results = await super().handle(records, emit)
        for r in records:
            if r.offset in self.claims:
                thread = r.key.decode()
                self.wait.noted(r, self.claims[r.offset], thread, f"thread:{thread}")
        return results


def _logged(rows: ScriptedRows, handler: ScriptedHandler) -> list[int]:
    """How many saves had been made at each claim read."""
    read_when: list[int] = []
    original = rows.claim_outcome

    async def reading(claim: Claim) -> ClaimOutcome:
        read_when.append(len(handler.calls))
        return await original(claim)

    rows.claim_outcome = reading  # type: ignore[method-assign]
    return read_when


async def test_a_claim_holds_its_threads_next_record_and_lets_the_other_threads_go_on() -> None:
    """Thread t1's record 11 claims: t2's records 12 and 13 are saved meanwhile (no read of the claim), t1's
    record 14 waits until it is settled; one record at a time (a cycle covers what came before it)."""
    time, counts = FakeTime(), Counts()
    rows = ScriptedRows("held", "settled")
    wait = waits(rows, time, counts)
    handler = ClaimingHandler(wait, {11: OBSERVE})
    run, _ = runner(handler, time)
    run.counts = counts
    run.observations = wait
    part = state()
    read_when = _logged(rows, handler)
    batch = [rec(10), rec(11), rec(12, "t2"), rec(13, "t2"), rec(14), rec(15, "t2")]
    await run.run(batch, part, asyncio.Event())
    assert handler.calls == [[10], [11], [12], [13], [14], [15]]
    assert read_when == [4, 4]  # after t2's two saves, before t1's record 14
    assert (part.next, counts.events, counts.observations) == (16, 6, 1)


async def test_the_range_end_waits_for_the_claims_still_open() -> None:
    time, counts = FakeTime(), Counts()
    rows = ScriptedRows("held", "settled")
    wait = waits(rows, time, counts)
    handler = ClaimingHandler(wait, {12: OBSERVE})
    run, _ = runner(handler, time)
    run.counts, run.observations = counts, wait
    part = state(end=13)
    read_when = _logged(rows, handler)
    await run.run([rec(10), rec(11, "t2"), rec(12)], part, asyncio.Event())
    assert (read_when, part.next, counts.observations) == ([3, 3], 13, 1)


async def test_a_wait_past_the_bound_stops_at_the_record_that_waited() -> None:
    time = FakeTime()
    wait = waits(ScriptedRows("held"), time)
    handler = ClaimingHandler(wait, {11: OBSERVE})
    run, _ = runner(handler, time)
    run.observations = wait
    part = state()
    with pytest.raises(ObservationWaitError):
        await run.run([rec(10), rec(11), rec(12, "t2"), rec(13), rec(14)], part, asyncio.Event())
    assert handler.calls == [[10], [11], [12]]
    assert part.next == 13  # a resume starts there and finds the claim on t1's row


async def test_a_stop_while_waiting_leaves_the_waiting_record_for_the_resume_which_waits_again() -> None:
    """Stopped while record 13 waits for record 11's claim: the resume point is 13 (past the claiming
    record); a new run from there (nothing in memory) reads t1's row, finds the claim open and waits for it
    before record 13. Without that read, record 13 would be saved while the claim is open."""
    time = FakeTime()
    rows = ScriptedRows("held")
    wait = waits(rows, time)
    handler = ClaimingHandler(wait, {11: OBSERVE})
    run, _ = runner(handler, time)
    run.observations = wait
    part, stop = state(), asyncio.Event()

    async def stop_now(seconds: float, event: asyncio.Event) -> bool:
        return True

    wait.sleep = stop_now  # the signal comes while waiting
    await run.run([rec(10), rec(11), rec(12, "t2"), rec(13), rec(14)], part, stop)
    assert handler.calls == [[10], [11], [12]]
    assert part.next == 13

    # the resume: a new process, the claim still open on the row (made by record 11's turn, q11)
    time = FakeTime()
    rows = ScriptedRows("held", "held", "settled", rows={LANE: row(is_observing=True, claimed_by="q11")})
    resumed = waits(rows, time)
    handler = ClaimingHandler(resumed, {})
    run, _ = runner(handler, time)
    run.observations = resumed
    read_when = _logged(rows, handler)
    await run.run([rec(13), rec(14)], part, asyncio.Event())
    assert read_when == [0, 0, 0]  # waited for before record 13 was saved
    assert handler.calls == [[13], [14]]
    assert part.next == 15


async def test_a_resume_at_the_claiming_record_does_not_wait_for_its_own_claim() -> None:
    """Stopped before record 11's transaction committed: the resume starts at 11, whose turn made the claim
    on the row (`claimedBy` q11) and sends its work again; it is not waited for before it."""
    time = FakeTime()
    rows = ScriptedRows("held", rows={LANE: row(is_observing=True, claimed_by="q11")})
    wait = waits(rows, time)
    handler = ClaimingHandler(wait, {})
    run, _ = runner(handler, time)
    run.observations = wait
    part = state(start=11)
    await run.run([rec(11)], part, asyncio.Event())
    assert (handler.calls, rows.reads, part.next) == ([[11]], 0, 12)
