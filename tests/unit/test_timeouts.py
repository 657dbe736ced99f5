"""The timeout-attribution rule (`consumers.timeouts`) as tables, and with the loop's retry policy: a record
whose own operation keeps timing out while the server answers is dead-lettered after N tries; an outage
(the server not answering, or unreachable) is waited out with nothing dead-lettered."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from consumers.contract import Ack, Done, Emit, Record, Refused, Result
from consumers.parking import Lane, ParkedLanes
from consumers.runtime.retry import Backoff, ChunkLimit, Failure, retry_batch
from consumers.timeouts import TimeoutStrikes, counts_against_record
from message_history.errors import (
    OperationTimedOutError,
    StorageTimeoutError,
    StorageUnavailableError,
)
from tests.paths import FakeRecord, no_emit

TIMED_OUT = OperationTimedOutError("MongoDB timed out during list_messages_many: NetworkTimeout")
UNREACHABLE = StorageUnavailableError(
    "MongoDB unavailable during list_messages_many: ServerSelectionTimeoutError"
)


@pytest.mark.parametrize(
    ("error", "alone", "answers", "strike"),
    [
        pytest.param(TIMED_OUT, True, True, True, id="lone-record-times-out-server-answers"),
        pytest.param(TIMED_OUT, False, True, False, id="a-chunk-times-out-halve-first"),
        pytest.param(TIMED_OUT, True, False, False, id="server-frozen-or-overloaded"),
        pytest.param(UNREACHABLE, True, True, False, id="server-unreachable"),
        pytest.param(UNREACHABLE, True, False, False, id="server-down"),
        pytest.param(ValueError("bug"), True, True, False, id="not-a-timeout"),
    ],
)
def test_what_counts_against_a_record(error: BaseException, alone: bool, answers: bool, strike: bool) -> None:
    assert counts_against_record(error, alone=alone, server_answers=answers) is strike


def Rec(topic: str, partition: int, offset: int) -> FakeRecord:  # noqa: N802 -- reads as the record it makes
    return FakeRecord(topic, partition, offset, b"t", b"{}", ())


class SlowStore:
    """A path whose batch times out whenever it holds a slow record (its read does not fit)."""

    def __init__(self, slow: set[int], error: BaseException = TIMED_OUT) -> None:
        self.slow = slow
        self.error = error
        self.handled: list[int] = []
        self.calls = 0

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        self.calls += 1
        if any(r.offset in self.slow for r in records):
            raise self.error
        self.handled += [r.offset for r in records]
        return [Done(_acknowledged()) for _ in records]


def _acknowledged() -> Ack:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


class Ping:
    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if not self.answers:
            raise StorageUnavailableError("MongoDB unavailable during ping: NetworkTimeout")


async def test_a_lone_record_is_dead_lettered_on_its_nth_timeout() -> None:
    store, ping = SlowStore({7}), Ping(answers=True)
    strikes = TimeoutStrikes(store, ping=ping, tries=3, path="recall")
    record = Rec("in", 0, 7)
    for n in (1, 2):
        with pytest.raises(OperationTimedOutError):
            await strikes.handle([record], no_emit)
        assert strikes.strikes(record) == n
    [refused] = await strikes.handle([record], no_emit)
    assert isinstance(refused, Refused)
    letter = refused.error
    assert isinstance(letter, StorageTimeoutError)
    assert letter.error_type == "StorageTimeout"
    assert "3 times" in str(letter)
    assert strikes.strikes(record) == 0
    assert ping.calls == 3


async def test_a_chunk_never_strikes_and_a_handled_record_is_forgiven() -> None:
    store, ping = SlowStore({7}), Ping(answers=True)
    strikes = TimeoutStrikes(store, ping=ping, tries=2, path="recall")
    with pytest.raises(OperationTimedOutError):
        await strikes.handle([Rec("in", 0, 6), Rec("in", 0, 7)], no_emit)
    assert ping.calls == 0  # a chunk's timeout is no record's yet
    record = Rec("in", 0, 7)
    with pytest.raises(OperationTimedOutError):
        await strikes.handle([record], no_emit)
    assert strikes.strikes(record) == 1
    store.slow.clear()  # the read fits again (a smaller history, a faster server)
    await strikes.handle([record], no_emit)
    assert strikes.strikes(record) == 0


@pytest.mark.parametrize(
    ("error", "answers"),
    [
        pytest.param(TIMED_OUT, False, id="frozen-server-no-ping"),
        pytest.param(UNREACHABLE, True, id="server-down"),
    ],
)
async def test_an_outage_never_strikes(error: BaseException, answers: bool) -> None:
    store = SlowStore({7}, error)
    strikes = TimeoutStrikes(store, ping=Ping(answers), tries=1, path="recall")
    for _ in range(5):
        with pytest.raises(StorageUnavailableError):
            await strikes.handle([Rec("in", 0, 7)], no_emit)
    assert strikes.strikes(Rec("in", 0, 7)) == 0


def test_tries_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TimeoutStrikes(SlowStore(set()), ping=Ping(True), tries=0, path="recall")


async def _run_like_the_loop(store: SlowStore, *, answers: bool, tries: int, give_up_after: int) -> list[int]:
    """A batch of 16 records through the loop's retry policy (`retry_batch` with halving chunks) and
    `TimeoutStrikes`; returns the dead-lettered offsets. `wait` stops after `give_up_after` failures in a
    row (the bounded wait that shows a stall)."""
    strikes = TimeoutStrikes(store, ping=Ping(answers), tries=tries, path="recall")
    dead: list[int] = []

    async def attempt(records: list[FakeRecord]) -> list[FakeRecord]:
        results = await strikes.handle(records, no_emit)
        dead.extend(
            r.offset for r, result in zip(records, results, strict=True) if isinstance(result, Refused)
        )
        return []

    async def wait(failure: Failure[FakeRecord]) -> bool:
        return failure.attempt >= give_up_after

    left = await retry_batch(
        [Rec("in", 0, n) for n in range(16)],
        attempt,
        backoff=Backoff(0.0, 0.0, lambda: 0.0),
        wait=wait,
        chunks=ChunkLimit(16, grow_after=8),
    )
    if left:
        raise TimeoutError(f"stalled with {len(left)} records left")
    return dead


async def test_halving_isolates_the_slow_record_and_the_stream_goes_on() -> None:
    store = SlowStore({5})
    dead = await _run_like_the_loop(store, answers=True, tries=3, give_up_after=50)
    assert dead == [5]
    assert sorted(store.handled) == [n for n in range(16) if n != 5]


async def test_without_the_guard_the_partition_stalls() -> None:
    """Tries never reached (the guard off): the same batch stalls on the slow record for ever."""
    store = SlowStore({5})
    with pytest.raises(TimeoutError, match="stalled"):
        await _run_like_the_loop(store, answers=True, tries=10**9, give_up_after=50)
    assert 5 not in store.handled


async def test_an_outage_is_waited_out_with_nothing_dead_lettered() -> None:
    """The server not answering the ping: the slow record is retried (stalls here), never dead-lettered."""
    store = SlowStore({5})
    with pytest.raises(TimeoutError, match="stalled"):
        await _run_like_the_loop(store, answers=False, tries=1, give_up_after=50)
    store.slow.clear()  # the outage ends: everything goes through, nothing was dead-lettered
    assert await _run_like_the_loop(store, answers=False, tries=1, give_up_after=50) == []


@pytest.mark.parametrize(
    ("answers", "dead"),
    [
        pytest.param(True, True, id="server-answers-dead-letter"),
        pytest.param(False, False, id="server-silent-retried-in-its-lane"),
    ],
)
async def test_a_parked_request_whose_read_keeps_timing_out(answers: bool, dead: bool) -> None:
    """A parked request is retried alone in its lane: the same rule makes it a dead letter after N tries
    when the server answers, and retries it in place (behind it, its thread waits) when it does not."""
    lanes: ParkedLanes[None] = ParkedLanes(
        path="recall", capacity=4, backoff=Backoff(0.001, 0.002, lambda: 0.5)
    )
    ping = Ping(answers)
    lanes.timeouts = TimeoutStrikes(SlowStore(set()), ping=ping, tries=3, path="recall")
    tries = 0

    async def slow(lane: Lane[None]) -> Ack:
        nonlocal tries
        tries += 1
        raise TIMED_OUT

    parked = lanes.park((0, "big"), slow, None)
    if dead:
        outcome = await asyncio.wait_for(parked.settled, 5)
        assert isinstance(outcome, Refused)
        assert isinstance(outcome.error, StorageTimeoutError)
        assert tries == 3
        assert len(lanes) == 0
    else:
        with pytest.raises(TimeoutError):
            # a bounded wait: still retried, nothing decided
            await asyncio.wait_for(asyncio.shield(parked.settled), 0.5)
        assert tries > 3
        assert len(lanes) == 1
        await lanes.cancel()
