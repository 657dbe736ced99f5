"""The worker's answer to one turn, without Kafka: replies, failures, timeouts become the right response."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    KafkaUnavailableError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
)

from consumers.runtime.emit import FileUnderOffset, SendNow
from schemas.codec import encode
from schemas.events import AgentResponse
from tests.unit.test_worker_turn import _turn
from worker import AgentWorker, Reply, RetryLater, Turn

NOW = datetime(2025, 3, 1, 10, 5, tzinfo=UTC)


def _worker(handler: object, **options: object) -> AgentWorker:
    # Never entered: no Kafka client is created, only the per-turn logic runs.
    return AgentWorker(
        handler,  # type: ignore[arg-type]
        bootstrap_servers="127.0.0.1:1",
        handle_signals=False,
        clock=lambda: NOW,
        **options,  # type: ignore[arg-type]
    )


async def test_a_reply_becomes_the_response() -> None:
    """The handler's reply is the response's message, finishReason "stop"."""

    async def handler(turn: Turn) -> Reply:
        return Reply.text(f"{len(turn.memory)} remembered")

    response = await _worker(handler)._turns.respond(_turn(), {})
    assert (response.finishReason, [m.content.parts[0].text for m in response.response]) == (  # type: ignore[union-attr]
        "stop",
        ["2 remembered"],
    )


async def _raises(turn: Turn) -> str:
    raise RuntimeError("model down")


async def _slow(turn: Turn) -> str:
    await asyncio.sleep(10)
    return "late"


async def _invalid(turn: Turn) -> Reply:
    return Reply([{"role": "robot", "content": "?"}])


@pytest.mark.parametrize("handler", [_raises, _slow, _invalid], ids=["raises", "times-out", "invalid-reply"])
async def test_a_failing_handler_answers_a_failed_turn(
    handler: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Raising, running past the timeout and an invalid reply all give finishReason "error", no response."""
    worker = _worker(handler, handler_timeout_s=0.05)
    response = await worker._turns.respond(_turn(), {"request_id": "r2"})
    assert (response.finishReason, response.response, len(response.input)) == ("error", [], 3)
    assert worker.stats.failed == 1
    assert [r.message for r in caplog.records] == ["handler failed: answering a failed turn"]
    assert caplog.records[0].exc_info is not None


class _RateLimitedError(Exception):
    """A provider's own error marked retriable (as `retriable: true` in the TypeScript SDK)."""

    retriable = True


@pytest.mark.parametrize(
    "limit", [RetryLater("429"), _RateLimitedError("429")], ids=["RetryLater", "retriable-attribute"]
)
async def test_a_rate_limited_turn_is_retried_then_answered_not_failed(
    limit: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that asks to retry later is called again for the same turn after a backoff, and its answer
    is the response: no failed turn (which would save nothing of the user's message)."""
    calls: list[str] = []

    async def handler(turn: Turn) -> str:
        calls.append(turn.request_id)
        if len(calls) <= 2:
            raise limit
        return "answered"

    worker = _worker(handler, retry_later_initial_s=0.001, retry_later_max_s=0.001)
    response = await worker._turns.respond(_turn(), {"request_id": "r2"})
    assert response.finishReason == "stop"
    assert calls == [calls[0]] * 3
    assert (worker.stats.retried, worker.stats.failed) == (2, 0)
    assert [r.message for r in caplog.records] == [
        "the handler asked to retry later: backing off, then the same turn again"
    ] * 2


def test_the_retry_later_backoff_doubles_to_its_ceiling_and_keeps_the_errors_floor() -> None:
    """Equal jitter under a ceiling doubling from `retry_later_initial_s` to `retry_later_max_s`; a
    RetryLater's `after_s` (a provider's Retry-After) is the floor."""
    worker = _worker(_hi, retry_later_initial_s=1.0, retry_later_max_s=4.0)
    plain = RetryLater("429")
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (9, 4.0)]:
        delay = worker._turns._retry_later_delay(attempt, plain)
        assert ceiling / 2 <= delay <= ceiling
    assert worker._turns._retry_later_delay(1, RetryLater("429", after_s=30.0)) == 30.0


async def _hi(turn: Turn) -> str:
    return "hi"


_AT: Any = SimpleNamespace(topic="t", partition=0, offset=1)  # the enriched record a response answers


class _FlakyProducer:
    """Refuses the first sends with `errors`, then acknowledges; records what was sent."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.sent: list[bytes] = []

    async def send(
        self, topic: str, *, value: bytes | None, key: bytes | None, headers: object = ()
    ) -> asyncio.Future[None]:
        if self.errors:
            raise self.errors.pop(0)
        self.sent.append(value or b"")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.mark.parametrize(
    "error",
    [KafkaUnavailableError(), KafkaConnectionError(), KafkaTimeoutError(), NotLeaderForPartitionError()],
    ids=lambda e: type(e).__name__,
)
async def test_a_response_is_sent_again_while_kafka_is_out(
    error: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every error the service counts as an outage is retried by the worker too (one policy,
    `consumers.runtime.retry.is_outage`); `KafkaUnavailableError` used to crash the worker."""
    monkeypatch.setattr("worker.answer.RETRY_INITIAL_S", 0.001)
    worker = _worker(_hi)
    producer = _FlakyProducer([error, error])
    turn = _turn()
    response = await worker._turns.respond(turn, {})
    await worker._turns.send(SendNow(producer), _AT, turn, response, [])
    assert (producer.errors, len(producer.sent)) == ([], 1)


async def test_a_refusal_that_is_not_an_outage_is_raised() -> None:
    """A Kafka error that is no outage (here: not authorized) is not retried forever."""
    worker = _worker(_hi)
    producer = _FlakyProducer([TopicAuthorizationFailedError()])
    turn = _turn()
    response = await worker._turns.respond(turn, {})
    with pytest.raises(TopicAuthorizationFailedError):
        await worker._turns.send(SendNow(producer), _AT, turn, response, [])
    assert producer.sent == []


@dataclass(frozen=True)
class _Record:
    topic: str
    partition: int
    offset: int
    key: bytes


class _CommittingConsumer:
    """Commits offsets; the first `failures` commits raise it (an outage)."""

    def __init__(self, failures: list[BaseException] | None = None) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.failures = failures or []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.commits.append(dict(offsets))

    def assignment(self) -> set[TopicPartition]:
        return set()


class _ScriptedTurns:
    """Stands in for the worker's `Answerer`: answering a record runs `script` on it."""

    def __init__(self, script: Callable[[_Record], Awaitable[None]]) -> None:
        self.script = script

    async def answer(self, record: _Record, producer: object) -> object:
        await self.script(record)
        return None


def _attached(
    worker: AgentWorker, consumer: _CommittingConsumer, producer: _FlakyProducer | None = None
) -> None:
    """The worker's runtime on fakes: `consumer` commits, `producer` sends."""
    fake_consumer: Any = consumer
    fake_producer: Any = producer or _FlakyProducer([])
    worker._attach(fake_consumer, fake_producer)


async def test_a_batch_commits_each_partition_past_its_answered_run_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per partition, the batch's commit goes past the turns answered from its start and stops at the first
    turn not answered (here: one still running when the shutdown grace ended), however many later turns of
    other threads were answered: those go to the next owner again, never lost."""
    worker = _worker(_hi, shutdown_grace_s=0)
    consumer = _CommittingConsumer()
    _attached(worker, consumer)
    stuck = (0, 2)
    records = [_Record("t", 0, o, f"k{o}".encode()) for o in range(5)]
    records += [_Record("t", 1, o, f"k{o}".encode()) for o in (10, 11, 13)]  # offsets need not be contiguous
    others_answered = asyncio.Event()
    answered: list[tuple[int, int]] = []

    async def answer(record: _Record) -> None:
        if (record.partition, record.offset) == stuck:
            await others_answered.wait()
            worker.stop()  # the shutdown: this turn never gets its answer
            await asyncio.Event().wait()
        answered.append((record.partition, record.offset))
        if len(answered) == len(records) - 1:
            others_answered.set()

    worker._turns = _ScriptedTurns(answer)  # type: ignore[assignment]
    await worker._run_batch(records)
    assert consumer.commits == [{TopicPartition("t", 0): 2, TopicPartition("t", 1): 14}]


async def test_a_commit_failing_for_an_outage_is_retried_by_the_next_commit_not_raised() -> None:
    """The worker's commit policy is the service's (`consumers.runtime.checkpoint`): a commit that fails for
    an outage neither stops the worker (the worker before the shared checkpoint raised it out of `run`) nor
    blocks it retrying; the next batch's commit takes the first batch's offsets with its own."""
    worker = _worker(_hi)
    consumer = _CommittingConsumer([KafkaConnectionError()])
    _attached(worker, consumer)

    async def answer(record: _Record) -> None:
        return None

    worker._turns = _ScriptedTurns(answer)  # type: ignore[assignment]
    await worker._run_batch([_Record("t", 0, o, b"k") for o in range(3)])
    assert (consumer.failures, consumer.commits) == ([], [])  # tried once, failed, not retried inline
    await worker._run_batch([_Record("t", 0, o, b"k") for o in range(3, 5)])
    assert consumer.commits == [{TopicPartition("t", 0): 5}]


async def test_under_exactly_once_a_response_the_broker_refuses_for_size_becomes_a_failed_turn() -> None:
    """The checkpoint hands back the enriched record whose held response the broker refused: the worker
    answers that turn as failed, in the same transaction (one output, on the responses topic)."""
    worker = _worker(_hi, processing_guarantee="exactly-once")
    turn = _turn()
    record: Any = SimpleNamespace(topic="t", partition=0, offset=7, value=encode(turn.event))
    letter = FileUnderOffset()
    await worker._turns.refused(record, MessageSizeTooLargeError(), letter)
    outputs = letter.take(record)
    assert [(o.topic, o.key) for o in outputs] == [("agent.responses", turn.thread_id.encode())]
    assert AgentResponse.model_validate_json(outputs[0].value or b"").finishReason == "error"
    assert worker.stats.failed == 1
