"""The worker's answer to one turn, without Kafka: replies, failures, timeouts become the right response."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    KafkaUnavailableError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
)

from tests.unit.test_worker_turn import _turn
from worker import AgentWorker, Reply, Turn

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

    response = await _worker(handler)._respond(_turn(), {})
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
    response = await worker._respond(_turn(), {"request_id": "r2"})
    assert (response.finishReason, response.response, len(response.input)) == ("error", [], 3)
    assert worker.stats.failed == 1
    assert [r.message for r in caplog.records] == ["handler failed: answering a failed turn"]
    assert caplog.records[0].exc_info is not None


async def _hi(turn: Turn) -> str:
    return "hi"


class _FlakyProducer:
    """Refuses the first sends with `errors`, then acknowledges; records what was sent."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.sent: list[bytes] = []

    async def send(self, topic: str, *, value: bytes, key: bytes, headers: object) -> asyncio.Future[None]:
        if self.errors:
            raise self.errors.pop(0)
        self.sent.append(value)
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
    monkeypatch.setattr("worker.runner.RETRY_INITIAL_S", 0.001)
    worker = _worker(_hi)
    producer = _FlakyProducer([error, error])
    worker._producer = producer
    turn = _turn()
    await worker._send(turn, await worker._respond(turn, {}), [])
    assert (producer.errors, len(producer.sent)) == ([], 1)


async def test_a_refusal_that_is_not_an_outage_is_raised() -> None:
    """A Kafka error that is no outage (here: not authorized) is not retried forever."""
    worker = _worker(_hi)
    producer = _FlakyProducer([TopicAuthorizationFailedError()])
    worker._producer = producer
    turn = _turn()
    with pytest.raises(TopicAuthorizationFailedError):
        await worker._send(turn, await worker._respond(turn, {}), [])
    assert producer.sent == []
