"""What the batch loop and a path agree on: the records a path is handed, what it returns for each, and the
two small helpers both sides use on them. Types only otherwise: containment is
`consumers.runtime.containment`, the paths' base classes are `consumers.handler`.

A path (`consumers.recall`, `consumers.persist`, `consumers.commands`, the replay) implements
`BatchHandler`; the loop (`consumers.loop`, or replay's runner) calls it and waits for the returned `Ack`s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Protocol

from message_history.errors import InvalidInputError

Ack = Awaitable[object]
"""Resolves when every output of one record is durable; raises when one could not be written."""


class Record(Protocol):
    """The fields of a consumed record the paths read: aiokafka's `ConsumerRecord` has them, and so does
    `consumers.unreadable.UnreadableRecord` (a record whose batch could not be read)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...


class BatchHandler(Protocol):
    """One path's work on a batch of records (the recall or the persist path)."""

    async def handle(self, records: Sequence[Record]) -> list[Ack | InvalidInputError]:
        """Process `records`; one entry per record, in order.

        An `Ack` once the record's outputs are sent (and, where it writes MongoDB, written); an
        `InvalidInputError` to dead-letter the record. Raises `RetriableError` (or a Kafka error) when a
        dependency is down: the loop retries the same records later.
        """
        ...


def ack_after(first: Awaitable[object], ack: Ack) -> Ack:
    """`ack`, resolved only once `first` (another write the record caused) is durable too; either failing
    fails the record, so the loop retries it.

    A future, not a bare coroutine: when the batch raises after it was made (and containment's `Contained`
    splits the batch), it is dropped without a "never awaited" warning.
    """
    return asyncio.ensure_future(_after(first, ack))


async def _after(first: Awaitable[object], ack: Ack) -> object:
    await first
    return await ack


def record_headers(record: Record) -> list[tuple[str, bytes]]:
    """The record's headers as (str, bytes) pairs, ready to be passed on to an output."""
    return [(key, value or b"") for key, value in record.headers or ()]
