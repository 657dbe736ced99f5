"""The emit channel: where a path's outputs go. A path never holds a producer; the loop's checkpoint hands
each batch its channel (`Checkpoint.emit`) and the path calls it once per output (`producers.output.Emit`):

- `SendNow` (at-least-once): the output goes to the shared producer at once; the returned future resolves
  once Kafka acknowledged it. Sends are not awaited one by one: a path gathers a batch's futures (its
  records' `Done.sent`), so a batch's outputs travel together (the pipelining the bench measures).
- `FileUnderOffset` (exactly-once): the output is filed under its input record's offset and the returned
  future is resolved at once (refused at once when Kafka would refuse it for its size, as the producer
  would); once the record is done, the checkpoint takes its outputs (`take`) and holds them until the
  transaction that commits its offset.

A record has at most one output per topic (its event, and Observational Memory's work for its thread) or its
dead letter alone: an output emitted again for the same record and topic (an attempt made again after a split
or an outage) replaces the one filed before, and a dead letter (`alone=True`) replaces all of them, so a
record's outputs are produced once, as the last attempt made them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from producers.output import MAX_REQUEST_BYTES, Headers, Positioned
from producers.transactional import HeldOutput

Position = tuple[str, int, int]  # (topic, partition, offset) of an input record


class Sender(Protocol):
    """What `SendNow` needs of the shared producer (`producers.output.OutputProducer`)."""

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> asyncio.Future[Any]: ...


class _Channel:
    """What both channels share: the `producers.output.Emit` call, each output handed to `_put`."""

    async def __call__(
        self,
        record: Positioned,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Headers = (),
        alone: bool = False,
    ) -> asyncio.Future[Any]:
        pairs = tuple((k, v) for k, v in headers)
        return await self._put(record, HeldOutput(topic, key, value, pairs), alone=alone)

    async def _put(self, record: Positioned, output: HeldOutput, *, alone: bool) -> asyncio.Future[Any]:
        raise NotImplementedError


class SendNow(_Channel):
    """At-least-once: each output sent at once on the shared producer (see the module docstring)."""

    def __init__(self, producer: Sender) -> None:
        self._producer = producer

    async def _put(self, record: Positioned, output: HeldOutput, *, alone: bool) -> asyncio.Future[Any]:
        o = output
        # a list: aiokafka's C record builder refuses a tuple of headers (the worker's sends meet it)
        return await self._producer.send(o.topic, key=o.key, value=o.value, headers=list(o.headers))


class FileUnderOffset(_Channel):
    """Exactly-once: each output filed under its record's offset, taken when the record is done (see the
    module docstring)."""

    def __init__(self) -> None:
        self._filed: dict[Position, dict[str, HeldOutput]] = {}

    async def _put(self, record: Positioned, output: HeldOutput, *, alone: bool) -> asyncio.Future[Any]:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
            output.key, output.value, list(output.headers)
        )
        if size > MAX_REQUEST_BYTES:  # refused now, as the producer would: the input is dead-lettered
            done.set_exception(MessageSizeTooLargeError(f"the record is {size} bytes when serialized"))
            return done
        position = _position(record)
        if alone or position not in self._filed:
            self._filed[position] = {}
        self._filed[position][output.topic] = output
        done.set_result(None)
        return done

    def take(self, record: Positioned) -> list[HeldOutput]:
        """The outputs filed for `record` (none: it has none), no longer filed."""
        return list(self._filed.pop(_position(record), {}).values())

    def filed(self) -> int:
        """Records with outputs filed and not taken (tests)."""
        return len(self._filed)

    def drop(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Forget what is filed for `partitions` (None: all): let go of, their records are redone."""
        if partitions is None:
            self._filed.clear()
            return
        gone = {(tp.topic, tp.partition) for tp in partitions}
        for position in [p for p in self._filed if p[:2] in gone]:
            del self._filed[position]


def _position(record: Positioned) -> Position:
    return (record.topic, record.partition, record.offset)
