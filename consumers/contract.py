"""What the batch loop and a path agree on: the records a path is handed, what it returns for each, and the
helpers both sides use on them.

A path (`consumers.recall`, `consumers.persist`, `consumers.commands`, the replay) implements
`BatchHandler`; the loop (`consumers.loop`, or replay's runner) calls it and waits for the returned `Ack`s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from message_history import tracing
from message_history.errors import EventValidationError, InvalidInputError

T = TypeVar("T")

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


async def ack_after(first: Awaitable[object], ack: Ack) -> object:
    """`ack`, resolved only once `first` (another write the record caused) is durable too; either failing
    fails the record, so the loop retries it."""
    await first
    return await ack


def record_headers(record: Record) -> list[tuple[str, bytes]]:
    """The record's headers as (str, bytes) pairs, ready to be passed on to an output."""
    return [(key, value or b"") for key, value in record.headers or ()]


def decode_each(
    records: Sequence[Record], spans: tracing.BatchSpans, decode: Callable[[Record, bytes], T]
) -> tuple[list[Ack | InvalidInputError | None], list[tuple[int, T]]]:
    """Each record decoded (`decode(record, value)`), its span started: (per-record results with the refused
    ones' errors filled in, the decoded ones with their index). An empty record is refused here."""
    results: list[Ack | InvalidInputError | None] = [None] * len(records)
    items: list[tuple[int, T]] = []
    for index, record in enumerate(records):
        spans.start(index, record)
        try:
            if record.value is None:
                raise EventValidationError("empty record (no value)")
            items.append((index, decode(record, record.value)))
        except InvalidInputError as exc:
            results[index] = exc
            spans.fail(index, exc)
    return results, items


class SpannedPath:
    """A path's `handle` with one span per record (`tracing.batch_spans`); `_handle` does the work."""

    path: str

    async def handle(self, records: Sequence[Record]) -> list[Ack | InvalidInputError]:
        with tracing.batch_spans(self.path, records) as spans:
            return await self._handle(records, spans)

    async def _handle(
        self, records: Sequence[Record], spans: tracing.BatchSpans
    ) -> list[Ack | InvalidInputError]:
        raise NotImplementedError
