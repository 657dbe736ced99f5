"""The outage policy shared by the stream loop and the replay: the retry loop, chunking, outcome sorting."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, TopicAuthorizationFailedError

from consumers.contract import Done, Record, Refused, record_headers
from consumers.runtime.containment import settle_outcomes
from consumers.runtime.retry import Backoff, ChunkLimit, Failure, retry_batch, retry_call
from consumers.unreadable import UnreadableRecord, UnreadableRecordError
from message_history.errors import (
    EventValidationError,
    FatalStorageError,
    InvalidInputError,
    StorageUnavailableError,
    ThreadOwnershipError,
    error_type,
)
from schemas.messages import Message
from storage.protocol import SaveTurn, Thread
from storage.save_plan import plan_saves

pytestmark = pytest.mark.timeout(10)

NO_JITTER = Backoff(1.0, 8.0, lambda: 1.0)
DOWN = StorageUnavailableError("MongoDB unavailable")


class Script:
    """An attempt that plays `steps` in order: an exception to raise, or the items (by value) that fail."""

    def __init__(self, steps: Sequence[BaseException | set[int]]) -> None:
        self.steps = list(steps)
        self.calls: list[list[int]] = []

    async def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(items)
        step = self.steps.pop(0) if self.steps else set()
        if isinstance(step, BaseException):
            raise step
        return [i for i in items if i in step]


class Waits:
    def __init__(self, *, stop_after: int | None = None) -> None:
        self.seen: list[tuple[int, float, list[int], str | None]] = []
        self.stop_after = stop_after

    async def __call__(self, failure: Failure[int]) -> bool:
        error = type(failure.error).__name__ if failure.error is not None else None
        self.seen.append((failure.attempt, failure.delay, failure.failed, error))
        return self.stop_after is not None and len(self.seen) >= self.stop_after


@pytest.mark.parametrize(
    ("steps", "calls", "waits"),
    [
        ([set()], [[1, 2, 3]], []),
        (
            [DOWN, DOWN, set()],
            [[1, 2, 3]] * 3,
            [(1, 1.0, [1, 2, 3], "StorageUnavailableError"), (2, 2.0, [1, 2, 3], "StorageUnavailableError")],
        ),
        ([{2}, {2}, set()], [[1, 2, 3], [2], [2]], [(1, 1.0, [2], None), (2, 2.0, [2], None)]),
        (
            [KafkaConnectionError()] * 5 + [set()],
            [[1, 2, 3]] * 6,
            [(n, min(8.0, 2.0 ** (n - 1)), [1, 2, 3], "KafkaConnectionError") for n in range(1, 6)],
        ),
    ],
    ids=["clean", "outage-raised", "outputs-failed", "capped-backoff"],
)
async def test_failed_items_are_retried_with_the_backoff_until_done(
    steps: list[BaseException | set[int]], calls: list[list[int]], waits: list[object]
) -> None:
    """Only what failed is tried again; each wait is told the attempt, the delay, the items and the error."""
    attempt, wait = Script(steps), Waits()
    assert await retry_batch([1, 2, 3], attempt, backoff=NO_JITTER, wait=wait) == []
    assert (attempt.calls, wait.seen) == (calls, waits)


async def test_an_error_that_is_not_an_outage_is_raised_at_once() -> None:
    attempt, wait = Script([RuntimeError("bug")]), Waits()
    with pytest.raises(RuntimeError, match="bug"):
        await retry_batch([1], attempt, backoff=NO_JITTER, wait=wait)
    assert wait.seen == []


async def test_a_stop_returns_what_is_left_failed_first() -> None:
    """`wait` saying stop ends the loop with the failed items, then those not tried yet, in order."""
    chunks = ChunkLimit(2, grow_after=8)
    left = await retry_batch(
        [1, 2, 3, 4], Script([{2}]), backoff=NO_JITTER, wait=Waits(stop_after=1), chunks=chunks
    )
    assert left == [2, 3, 4]


async def test_chunks_halve_after_a_failure_and_keep_drops_items_before_each_attempt() -> None:
    """The loop's chunking: after a failed attempt of 4, attempts of 2; `keep` sees every attempt's input."""
    attempt = Script([DOWN, set(), set(), set()])
    dropped = {3}
    recovered: list[int] = []
    left = await retry_batch(
        [1, 2, 3, 4, 5, 6],
        attempt,
        backoff=NO_JITTER,
        wait=Waits(),
        keep=lambda items: [i for i in items if i not in dropped],
        chunks=ChunkLimit(4, grow_after=8),
        recovered=lambda: recovered.append(1),
    )
    assert left == []
    assert attempt.calls == [[1, 2, 4, 5], [1, 2], [4, 5], [6]]
    assert len(recovered) == 3


@pytest.mark.parametrize(
    ("events", "limits"),
    [
        (["fail:8"], [4]),
        (["fail:8", "fail:4", "fail:1"], [4, 2, 1]),
        (["fail:8"] + ["ok"] * 3, [4, 4, 4, 8]),
        (["fail:8", "fail:4"] + ["ok"] * 6, [4, 2, 2, 2, 4, 4, 4, 8]),
        (["ok"] * 5, [8] * 5),
    ],
)
def test_the_chunk_limit_halves_on_failure_and_doubles_after_clean_runs(
    events: list[str], limits: list[int]
) -> None:
    chunks = ChunkLimit(8, grow_after=3)
    seen = []
    for event in events:
        if event == "ok":
            chunks.succeeded()
        else:
            chunks.failed(int(event.split(":")[1]))
        seen.append(chunks.limit)
    assert seen == limits


async def test_retry_call_returns_the_steps_value_after_outages() -> None:
    outcomes: list[BaseException | str] = [DOWN, KafkaConnectionError(), "connected"]

    async def step() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def wait(failure: Failure[None]) -> bool:
        return False

    assert await retry_call(step, backoff=NO_JITTER, wait=wait) == "connected"


def _resolved(value: object) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


async def test_outcomes_are_sorted_into_done_rejected_and_retried() -> None:
    """Acknowledged: done; bad input and outputs too large for Kafka: rejected; an outage: retried."""
    done: list[tuple[str, object]] = []
    rejected: list[tuple[str, str]] = []

    async def reject(item: str, error: BaseException) -> object:
        rejected.append((item, str(error)))
        return "dead-lettered"

    results: list[Done | Refused] = [
        Done(_resolved("ok")),
        Refused(EventValidationError("not valid JSON", "input.0")),
        Done(_resolved(MessageSizeTooLargeError())),
        Done(_resolved(KafkaConnectionError())),
    ]
    failed = await settle_outcomes(
        ["a", "b", "c", "d"],
        results,
        reject=reject,
        explain=lambda error: InvalidInputError(f"too large: {type(error).__name__}"),
        done=lambda item, outcome: done.append((item, outcome)),
    )
    assert failed == ["d"]
    assert rejected == [("b", "input.0: not valid JSON"), ("c", "too large: MessageSizeTooLargeError")]
    assert done == [("a", "ok"), ("b", "dead-lettered"), ("c", "dead-lettered")]


async def test_a_systemic_outcome_is_raised_after_the_ones_before_it_are_done() -> None:
    """MongoDB refusing for good is no record's fault: raised (the loop stops), nothing dead-lettered."""
    done: list[str] = []

    async def reject(item: str, error: BaseException) -> object:
        raise AssertionError("not called")

    results: list[Done | Refused] = [
        Done(_resolved("ok")),
        Done(_resolved(FatalStorageError("MongoDB refused the write: Unauthorized"))),
        Done(_resolved("ok")),
    ]
    with pytest.raises(FatalStorageError, match="Unauthorized"):
        await settle_outcomes(
            ["a", "b", "c"], results, reject=reject, explain=lambda e: e, done=lambda i, _: done.append(i)
        )
    assert done == ["a"]


async def test_an_unexpected_outcome_is_contained_as_that_records_dead_letter() -> None:
    """A bug surfacing in one record's acknowledgement dead-letters that record (its class and message);
    before containment it was raised and stopped the loop."""
    done: list[tuple[str, object]] = []
    rejected: list[tuple[str, str, str]] = []

    async def reject(item: str, error: BaseException) -> object:
        rejected.append((item, error_type(error), str(error)))
        return "dead-lettered"

    results: list[Done | Refused] = [
        Done(_resolved("ok")),
        Done(_resolved(KeyError("boom"))),
        Done(_resolved("ok")),
    ]
    failed = await settle_outcomes(
        ["a", "b", "c"], results, reject=reject, explain=lambda e: e, done=lambda i, o: done.append((i, o))
    )
    assert failed == []
    assert rejected == [("b", "KeyError", "'boom'")]
    assert done == [("a", "ok"), ("c", "ok"), ("b", "dead-lettered")]


async def test_a_dead_letter_that_fails_for_good_is_raised() -> None:
    """There is nowhere else to put a record whose dead letter is refused (not for an outage)."""

    async def reject(item: str, error: BaseException) -> object:
        raise TopicAuthorizationFailedError()

    with pytest.raises(TopicAuthorizationFailedError):
        await settle_outcomes(
            ["a"],
            [Refused(EventValidationError("bad"))],
            reject=reject,
            explain=lambda e: e,
            done=lambda i, o: None,
        )


def test_an_unreadable_record_is_a_record_and_its_headers_pass_on() -> None:
    unreadable: Record = UnreadableRecord("t", 0, 5, UnreadableRecordError("corrupt"), headers=(("h", b"v"),))
    assert record_headers(unreadable) == [("h", b"v")]


# --- the save planner, shared by `save_many` and replay's dry run -------------------------------------------


def _message(message_id: str, minute: int | None) -> Message:
    created = datetime(2026, 1, 1, 12, minute, tzinfo=UTC) if minute is not None else None
    return Message.model_validate(
        {"id": message_id, "role": "user", "content": {"format": 2, "parts": []}, "createdAt": created}
    )


def test_plan_saves_answers_as_save_many_would_without_io() -> None:
    """Ownership is refused, a new thread spans its messages, a stored one only moves forward."""
    stored = {"mine": Thread("mine", "alice", "t", {}, datetime(2026, 1, 1, tzinfo=UTC), None)}
    now = datetime(2026, 1, 2, tzinfo=UTC)
    results, plan = plan_saves(
        [
            SaveTurn("mine", "bob", [_message("m1", 1)]),
            SaveTurn("new", "bob", [_message("m2", 5), _message("m3", 2)]),
            SaveTurn("mine", "alice", [_message("m4", 3), _message("m5", None)]),
        ],
        stored,
        now=now,
    )
    assert isinstance(results[0], ThreadOwnershipError)
    assert results[1] == Thread(
        "new", "bob", "", {}, datetime(2026, 1, 1, 12, 2, tzinfo=UTC), datetime(2026, 1, 1, 12, 5, tzinfo=UTC)
    )
    assert isinstance(results[2], Thread)
    assert results[2].updatedAt == now  # a message without createdAt is saved at `now`
    assert sorted(plan.messages) == ["m2", "m3", "m4", "m5"]
    assert stored["mine"].updatedAt is None  # the caller's threads are not changed


@pytest.mark.parametrize(
    "turn",
    [SaveTurn("", "r", [_message("m", 1)]), SaveTurn("t", "r", [_message("", 1)]), SaveTurn("gone", "r", [])],
    ids=["empty-thread-id", "message-without-id", "nothing-into-a-missing-thread"],
)
def test_plan_saves_refuses_what_save_many_refuses(turn: SaveTurn) -> None:
    with pytest.raises(InvalidInputError):
        plan_saves([turn], {})
