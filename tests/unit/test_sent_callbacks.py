"""`BatchGate.sent` by done-callbacks (a future's send) gives what its task (a coroutine's send) gives: the
same result or error, the same clear of the busy mark, the same cancellation (issue 33: no task a record)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from consumers.turn_gate import BatchGate, TurnGate
from message_history.errors import StorageUnavailableError
from tests.unit.test_turn_gate import FakeMarkers

SEND_OUTCOMES: list[object] = [
    "ok",
    MessageSizeTooLargeError("over 1 MiB"),  # a dead letter at send time: the mark is cleared
    ValueError("a bug met on the record"),  # contained: cleared too
    KafkaTimeoutError(),  # an outage: kept
    "cancelled",
]
MARK_OUTCOMES: list[object] = ["ok", StorageUnavailableError("down"), "cancelled"]


async def _gate() -> tuple[BatchGate, FakeMarkers]:
    markers = FakeMarkers()
    batch = await TurnGate(barrier=None, markers=markers, policy="enqueue", timeout_s=0.1).open_batch(
        [(0, "a")]
    )
    first = batch.enriched("a", "a1")  # the batch's view: a1 pending
    assert first is not None
    await first
    return batch, markers


def _settle(future: asyncio.Future[Any], outcome: object) -> None:
    if outcome == "cancelled":
        future.cancel()
    elif isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


async def _run(by_future: bool, send: object, mark_outcome: object, *, cancel_first: bool) -> tuple[Any, ...]:
    """What `sent` gives for one send outcome and one mark outcome, and what it left behind."""
    batch, markers = await _gate()
    loop = asyncio.get_running_loop()
    mark: asyncio.Future[None] = loop.create_future()
    sending: asyncio.Future[Any] = loop.create_future()

    async def coroutine() -> Any:
        return await sending

    ack = asyncio.ensure_future(batch.sent("a", "a1", mark, sending if by_future else coroutine()))
    await asyncio.sleep(0)
    if cancel_first:
        ack.cancel()
        await asyncio.sleep(0)
    if not sending.done():
        _settle(sending, send)
    await asyncio.sleep(0)
    if not mark.done():
        _settle(mark, mark_outcome)
    try:
        outcome: object = await ack
    except asyncio.CancelledError:
        outcome = "cancelled"
    except Exception as exc:  # the outcome compared
        outcome = type(exc)
    await asyncio.sleep(0)
    return outcome, list(markers.released), batch.markers["a"].pending, sending.cancelled(), mark.cancelled()


@pytest.mark.parametrize("send", SEND_OUTCOMES, ids=str)
@pytest.mark.parametrize("mark", MARK_OUTCOMES, ids=str)
@pytest.mark.parametrize("cancel_first", [False, True], ids=["", "cancelled-by-the-loop"])
async def test_callbacks_and_task_agree(send: object, mark: object, cancel_first: bool) -> None:
    by_task = await _run(False, send, mark, cancel_first=cancel_first)
    by_callbacks = await _run(True, send, mark, cancel_first=cancel_first)
    assert by_callbacks == by_task


async def test_the_send_result_comes_once_the_mark_is_durable() -> None:
    """The guard the callbacks keep: a record is acknowledged only once its mark is written too."""
    batch, _ = await _gate()
    loop = asyncio.get_running_loop()
    mark: asyncio.Future[None] = loop.create_future()
    sending: asyncio.Future[Any] = loop.create_future()
    ack = asyncio.ensure_future(batch.sent("a", "a1", mark, sending))
    sending.set_result("metadata")
    await asyncio.sleep(0.01)
    assert not ack.done()
    mark.set_result(None)
    assert await ack == "metadata"
