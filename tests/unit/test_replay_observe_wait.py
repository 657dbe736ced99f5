"""`replay --observe`'s wait (`replay.observe_wait`) and the runner's record-at-a-time mode, with a scripted
claim reader and a fake clock: settled claims let the partition go on, a held one past the bound stops it
at the record that claimed, a stop while waiting leaves that record for the resume."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from consumers.contract import Emit, Result
from message_history.app.replay.observe_wait import ObservationWaitError, ObservationWaits
from message_history.app.replay.plan import Counts
from message_history.app.replay.progress import outcome_parts
from storage.observational import Claim, ClaimOutcome
from tests.unit.test_replay_runner import FakeTime, ScriptedHandler, record, runner, state

pytestmark = pytest.mark.timeout(20)

OBSERVE = Claim("row-1", 0, 1, "observe")
REFLECT = Claim("row-1", 0, 2, "reflect")


class ScriptedRows:
    """Answers `claim_outcome` with `outcomes` in order (the last one repeated), counting the reads."""

    def __init__(self, *outcomes: ClaimOutcome) -> None:
        self.outcomes = list(outcomes)
        self.reads = 0

    async def claim_outcome(self, claim: Claim) -> ClaimOutcome:
        self.reads += 1
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]


def waits(rows: ScriptedRows, time: FakeTime, counts: Counts | None = None) -> ObservationWaits:
    return ObservationWaits(
        rows, counts or Counts(), wait_s=10.0, sleep=time.sleep, clock=time.clock, poll_s=1.0, grace_s=2.0
    )


def at(offset: int, partition: int = 3) -> Any:
    return SimpleNamespace(topic="rs", partition=partition, offset=offset)


async def test_nothing_sent_nothing_read() -> None:
    rows, time = ScriptedRows("held"), FakeTime()
    assert await waits(rows, time).settle(3, asyncio.Event())
    assert rows.reads == 0


async def test_an_observation_is_waited_for_until_settled_and_counted() -> None:
    rows, time, counts = ScriptedRows("held", "held", "settled"), FakeTime(), Counts()
    wait = waits(rows, time, counts)
    wait.noted(at(12), OBSERVE, "t1")
    wait.noted(at(12), OBSERVE, "t1")  # the same claim again (a retried send): waited for once
    assert await wait.settle(3, asyncio.Event())
    assert (rows.reads, time.sleeps, counts.observations, counts.observing) == (3, [1.0, 1.0], 1, 0)


async def test_another_partitions_claim_is_not_this_ones() -> None:
    rows, time = ScriptedRows("held"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12, partition=4), OBSERVE, "t1")
    assert await wait.settle(3, asyncio.Event())
    assert rows.reads == 0


async def test_a_reflection_is_waited_for_until_its_next_generation_exists() -> None:
    """Its claim settled first, the next generation a moment later: the partition waits for both."""
    rows, time = ScriptedRows("held", "settled", "reflected"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12), REFLECT, "t1")
    assert await wait.settle(3, asyncio.Event())
    assert rows.reads == 3


async def test_a_released_reflection_counts_as_settled_after_the_grace() -> None:
    rows, time = ScriptedRows("settled"), FakeTime()
    wait = waits(rows, time)
    wait.noted(at(12), REFLECT, "t1")
    assert await wait.settle(3, asyncio.Event())
    assert time.now == 2.0  # the grace, not the bound


async def test_a_claim_held_past_the_bound_is_a_clear_error() -> None:
    rows, time, counts = ScriptedRows("held"), FakeTime(), Counts()
    wait = waits(rows, time, counts)
    wait.noted(at(12), OBSERVE, "t1")
    with pytest.raises(ObservationWaitError) as raised:
        await wait.settle(3, asyncio.Event())
    message = str(raised.value)
    assert "thread 't1'" in message
    assert "observe claim (row row-1, generation 0, cycle 1)" in message
    assert "partition 3 offset 12" in message
    assert "not settled within 10 s (--observe-wait-s)" in message
    assert time.now == 10.0
    assert counts.observing == 0  # no longer waited for


async def test_the_progress_shows_the_wait() -> None:
    counts = Counts(observations=4, observing=2)
    assert outcome_parts(counts) == ["observed 4", "waiting for 2 observations"]


# --- the runner with the wait ------------------------------------------------------------------------------


class ClaimingHandler(ScriptedHandler):
    """Every record a clean save; the records in `claims` send an observation (the emitter's `on_work`)."""

    def __init__(self, wait: ObservationWaits, claims: dict[int, Claim]) -> None:
        super().__init__([{}])
        self.wait = wait
        self.claims = claims

    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]:
        results = await super().handle(records, emit)
        for rec in records:
            if rec.offset in self.claims:
                self.wait.noted(rec, self.claims[rec.offset], "t1")
        return results


async def test_with_the_wait_records_go_one_at_a_time_and_a_claim_is_settled_before_the_next() -> None:
    """The save that claims is the last the partition makes until the claim is settled: no batch of later
    turns is saved meanwhile (the cycle covers what came before it, whatever the batch size)."""
    time, counts = FakeTime(), Counts()
    rows = ScriptedRows("held", "settled")
    wait = waits(rows, time, counts)
    handler = ClaimingHandler(wait, {11: OBSERVE})
    run, _ = runner(handler, time)
    run.counts = counts
    run.observations = wait
    part = state()
    read_when: list[int] = []
    original = rows.claim_outcome

    async def reading(claim: Claim) -> ClaimOutcome:
        read_when.append(len(handler.calls))
        return await original(claim)

    rows.claim_outcome = reading  # type: ignore[method-assign]
    await run.run([record(10), record(11), record(12)], part, asyncio.Event())
    assert handler.calls == [[10], [11], [12]]
    assert read_when == [2, 2]  # both reads after record 11's save, before record 12's
    assert (part.next, counts.events, counts.observations) == (13, 3, 1)


async def test_a_wait_past_the_bound_stops_at_the_claiming_record() -> None:
    time = FakeTime()
    wait = waits(ScriptedRows("held"), time)
    handler = ClaimingHandler(wait, {11: OBSERVE})
    run, _ = runner(handler, time)
    run.observations = wait
    part = state()
    with pytest.raises(ObservationWaitError):
        await run.run([record(10), record(11), record(12)], part, asyncio.Event())
    assert handler.calls == [[10], [11]]
    assert part.next == 11  # redone on resume: its turn sends the same claim's work again


async def test_a_stop_while_waiting_leaves_the_claiming_record_for_the_resume() -> None:
    time = FakeTime()
    wait = waits(ScriptedRows("held"), time)
    handler = ClaimingHandler(wait, {11: OBSERVE})
    run, _ = runner(handler, time)
    run.observations = wait
    part, stop = state(), asyncio.Event()
    stop.set()  # the first sleep of the wait sees it
    await run.run([record(10), record(11), record(12)], part, stop)
    assert part.next == 10  # stopped before the first record: a clean stop between records
    stop.clear()
    handler.calls.clear()

    async def stop_now(seconds: float, event: asyncio.Event) -> bool:
        return True

    wait.sleep = stop_now  # the signal comes while waiting
    await run.run([record(10), record(11), record(12)], part, stop)
    assert handler.calls == [[10], [11]]
    assert part.next == 11
