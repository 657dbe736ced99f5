"""`OutputProducer.send`'s per-topic gate: one send of a topic inside aiokafka at a time, first come first
served, a queued send bounded like aiokafka's own wait for room, and too-large records still a failed future.

aiokafka is replaced by a fake whose `send` waits for "room" (as aiokafka's does on a full batch): the gate is
our logic, and what it must guarantee does not depend on the broker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, RecordTooLargeError

from message_history.settings import Settings
from producers import output
from producers.output import OutputProducer


class _FullBatches:
    """aiokafka's `send` as the gate sees it: may wait for room; records who was inside and in which order."""

    def __init__(self) -> None:
        self.room = asyncio.Event()
        self.inside = 0
        self.most_inside = 0
        self.order: list[bytes | None] = []
        self.too_large: set[bytes] = set()

    async def send(self, topic: str, *, value: bytes | None, key: bytes | None, headers: Any) -> Any:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            await self.room.wait()
            self.order.append(value)
            if value in self.too_large:
                raise RecordTooLargeError()
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(topic)
            return done
        finally:
            self.inside -= 1


def _producer(fake: _FullBatches) -> OutputProducer:
    producer = OutputProducer(Settings())
    producer._producer = fake  # stands in for AIOKafkaProducer (untyped)
    return producer


async def _settle() -> None:
    for _ in range(20):  # let every started send reach the gate or the fake
        await asyncio.sleep(0)


async def test_while_one_send_waits_for_room_the_others_queue_in_order() -> None:
    fake = _FullBatches()
    producer = _producer(fake)
    sends = [asyncio.ensure_future(producer.send("t", key=b"k", value=bytes([i]))) for i in range(6)]
    await _settle()
    assert fake.inside == 1  # the others wait on the gate, not each on aiokafka's drain
    fake.room.set()
    await asyncio.gather(*sends)
    assert fake.most_inside == 1
    assert fake.order == [bytes([i]) for i in range(6)]


async def test_topics_do_not_wait_for_each_other() -> None:
    fake = _FullBatches()
    producer = _producer(fake)
    first = asyncio.ensure_future(producer.send("a", key=None, value=b"a"))
    other = asyncio.ensure_future(producer.send("b", key=None, value=b"b"))
    await _settle()
    assert fake.inside == 2
    fake.room.set()
    assert [f.result() for f in await asyncio.gather(first, other)] == ["a", "b"]


async def test_a_queued_send_fails_like_aiokafka_when_no_room_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(output, "REQUEST_TIMEOUT_MS", 10)
    fake = _FullBatches()
    producer = _producer(fake)
    head = asyncio.ensure_future(producer.send("t", key=None, value=b"head"))  # holds the gate, no room
    await _settle()
    with pytest.raises(KafkaTimeoutError):
        # the outer bound only turns a hang (no bound on the queue) into a failure of this test
        await asyncio.wait_for(producer.send("t", key=None, value=b"queued"), 30)
    assert fake.order == []
    head.cancel()
    fake.room.set()
    await asyncio.gather(head, return_exceptions=True)
    assert (await (await producer.send("t", key=None, value=b"after"))) == "t"  # the gate was released


async def test_a_record_too_large_is_a_failed_future_queued_or_not() -> None:
    fake = _FullBatches()
    fake.too_large = {b"big-1", b"big-2"}
    producer = _producer(fake)
    sends = [
        asyncio.ensure_future(producer.send("t", key=None, value=v)) for v in (b"big-1", b"ok", b"big-2")
    ]
    await _settle()
    fake.room.set()
    big1, ok, big2 = await asyncio.gather(*sends)
    assert isinstance(big1.exception(), RecordTooLargeError)
    assert isinstance(big2.exception(), RecordTooLargeError)
    assert (await ok) == "t"
