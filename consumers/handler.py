"""The base classes of the recall and the persist path: one span per record around a path's work
(`SpannedPath`), and what both paths hold and how they work on each thread's records (`PathHandler`).

What a path meets on one record is that record's result (docs/operations-stream.md, "Bad input never stops
the stream"): `per_thread` turns any exception of one record's work into its dead-letter reason, except an
outage or a systemic refusal (`consumers.runtime.containment.containable` says which), raised for the batch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from consumers.contract import Emit, Record, Result
from consumers.lanes import Failed, run_lanes
from consumers.runtime.containment import contain, containable
from message_history import tracing
from message_history.errors import InvalidInputError
from message_history.settings import Settings
from schemas.limits import Limits
from storage import unreadable
from storage.protocol import BatchHistoryStorage

T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")


class SpannedPath:
    """A path's `handle` with one span per record (`tracing.batch_spans`); `_handle` does the work."""

    path: str

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        with tracing.batch_spans(self.path, records) as spans:
            return await self._handle(records, spans, emit)

    async def _handle(self, records: Sequence[Record], spans: tracing.BatchSpans, emit: Emit) -> list[Result]:
        raise NotImplementedError


class PathHandler(SpannedPath, Generic[P]):
    """What the recall and the persist path both hold: the storage, the publisher of their outputs (how an
    event is keyed and encoded: it goes through the batch's `Emit`), the input limits and the cap on threads
    worked on at once, the last two from the settings."""

    def __init__(self, settings: Settings, storage: BatchHistoryStorage, publisher: P) -> None:
        self.storage = storage
        self.publisher = publisher
        self.limits = Limits.from_settings(settings)
        self.max_in_flight = settings.max_in_flight_threads

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        """`SpannedPath.handle`, the batch's reads noting the stored rows they skip in one ledger
        (`storage.unreadable`; the batch's tasks, parked ones included, share it)."""
        with unreadable.collecting(self.path):
            return await super().handle(records, emit)

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
