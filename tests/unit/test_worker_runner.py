"""The worker's answer to one turn, without Kafka: replies, failures, timeouts become the right response."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

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
