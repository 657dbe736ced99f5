"""What the batch loop and a path agree on: the records a path is handed, what it returns for each, and the
helpers both sides use on them.

A path (`consumers.recall`, `consumers.persist`, `consumers.commands`, the replay) implements
`BatchHandler`; the loop (`consumers.loop`, or replay's runner) calls it and waits for the returned `Ack`s.

Containment (docs/operations-stream.md, "Bad input never stops the stream"): what a path meets on one record
is that record's result. `decode_each` and `per_thread` turn any exception of one record's decode or work
into its dead-letter reason, except an outage or a systemic refusal (`consumers.outage.containable` says
which): those are raised for the whole batch, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from consumers.lanes import Failed, run_lanes
from consumers.outage import contain, containable
from message_history import tracing
from message_history.errors import EventValidationError, InvalidInputError
from message_history.settings import Settings
from schemas.limits import Limits
from storage.protocol import BatchHistoryStorage

T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")

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

    A future, not a bare coroutine: when the batch raises after it was made (and `consumers.outage.Contained`
    splits the batch), it is dropped without a "never awaited" warning.
    """
    return asyncio.ensure_future(_after(first, ack))


async def _after(first: Awaitable[object], ack: Ack) -> object:
    await first
    return await ack


def record_headers(record: Record) -> list[tuple[str, bytes]]:
    """The record's headers as (str, bytes) pairs, ready to be passed on to an output."""
    return [(key, value or b"") for key, value in record.headers or ()]


def decode_each(
    records: Sequence[Record], spans: tracing.BatchSpans, decode: Callable[[Record, bytes], T]
) -> tuple[list[Ack | InvalidInputError | None], list[tuple[int, T]]]:
    """Each record decoded (`decode(record, value)`), its span started: (per-record results with the refused
    ones' errors filled in, the decoded ones with their index). An empty record is refused here, and so is
    one whose decode raises anything `containable` (a bug met on it included)."""
    results: list[Ack | InvalidInputError | None] = [None] * len(records)
    items: list[tuple[int, T]] = []
    for index, record in enumerate(records):
        spans.start(index, record)
        error: InvalidInputError = EventValidationError("empty record (no value)")
        if record.value is not None:
            try:
                items.append((index, decode(record, record.value)))
                continue
            except Exception as exc:
                if not containable(exc):
                    raise
                error = contain(exc, "decode")
        results[index] = error
        spans.fail(index, error)
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


class PathHandler(SpannedPath, Generic[P]):
    """What the recall and the persist path both hold: the storage, the publisher of their outputs, the input
    limits and the cap on threads worked on at once, the last two from the settings."""

    def __init__(self, settings: Settings, storage: BatchHistoryStorage, publisher: P) -> None:
        self.storage = storage
        self.publisher = publisher
        self.limits = Limits.from_settings(settings)
        self.max_in_flight = settings.max_in_flight_threads

    async def per_thread(
        self,
        items: Sequence[tuple[int, T]],
        thread_of: Callable[[T], str],
        work: Callable[[tuple[int, T]], Awaitable[R]],
    ) -> list[R | Failed]:
        """`work` on every decoded record: one thread's in batch order, up to `max_in_flight` threads at once;
        what a record's work raises that is `containable` comes back as its `Failed`, an
        `InvalidInputError` (the others go on)."""

        async def contained(entry: tuple[int, T]) -> R:
            try:
                return await work(entry)
            except Exception as exc:
                if not containable(exc):
                    raise
                raise contain(exc, "process") from exc

        return await run_lanes(
            items,
            key=lambda entry: thread_of(entry[1]),
            work=contained,
            max_concurrent=self.max_in_flight,
            item_errors=(InvalidInputError,),
        )
