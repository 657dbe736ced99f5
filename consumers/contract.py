"""What the batch loop and a path agree on: the records a path is handed, what it returns for each, and the
small helpers both sides use on them. Types only otherwise: containment is `consumers.runtime.containment`,
the paths' base classes are `consumers.handler`.

A path (`consumers.recall`, `consumers.persist`, `consumers.commands`, the replay) implements
`BatchHandler`: `handle(records, emit)` sends each record's output through `emit`, the channel the loop's
checkpoint hands the batch (`consumers.runtime.emit`: sent at once, or filed under the record's offset for
its transaction; a path holds no producer), and returns per record, in order, one `Result`, a closed union
the loop reads by its type alone:

- `Done(sent)`: the record's work is done; `sent` resolves once its outputs (and the writes it caused) are
  durable, and raises when one could not be written (an outage: the record is retried).
- `Refused(error)`: bad input, or a bug met on the record: its dead letter.
- `Parked(settled, lanes)`: the record waits in its thread's lane (`consumers.parking`); `settled` resolves
  with its `Done` or `Refused` once its work ran, and the loop settles it in the background.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from message_history.errors import InvalidInputError
from message_history.futures import chained
from producers.output import Emit, Positioned

__all__ = [
    "Ack",
    "BatchHandler",
    "Done",
    "Emit",
    "Lanes",
    "Parked",
    "Record",
    "Refused",
    "Result",
    "ack_after",
    "delivered",
    "record_headers",
    "settled",
]

Ack = Awaitable[object]
"""Resolves when every output of one record is durable; raises when one could not be written."""


@dataclass(frozen=True, slots=True)
class Done:
    """The record's work is done; `sent` resolves once its outputs are durable (see the module docstring)."""

    sent: Ack


@dataclass(frozen=True, slots=True)
class Refused:
    """The record is refused: `error` is its dead letter's reason."""

    error: InvalidInputError


class Lanes(Protocol):
    """What the loop needs of the lanes a record is parked in (`consumers.parking.ParkedLanes`)."""

    def full(self) -> bool: ...

    def __len__(self) -> int: ...

    async def cancel(self, partitions: Iterable[int] | None = None) -> int: ...


@dataclass(frozen=True, slots=True, eq=False)
class Parked:
    """The record waits in its thread's lane: `settled` resolves with its outcome once its work ran, and is
    cancelled when its lane is dropped (a revoke, a shutdown)."""

    settled: asyncio.Future[Done | Refused]
    lanes: Lanes


Result = Done | Refused | Parked
"""What a path returns for one record (see the module docstring)."""


class Record(Positioned, Protocol):
    """The fields of a consumed record the paths read (where it is, and these): aiokafka's `ConsumerRecord`
    has them, and so does `consumers.unreadable.UnreadableRecord` (a record whose batch could not be read)."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...


class BatchHandler(Protocol):
    """One path's work on a batch of records (the recall or the persist path)."""

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        """Process `records`, their outputs through `emit`; one `Result` per record, in order.

        Raises `RetriableError` (or a Kafka error) when a dependency is down: the loop retries the same
        records later.
        """
        ...


async def settled(result: Result) -> Done | Refused:
    """A record's outcome as it ends: a parked one's once its work ran (raises `CancelledError` when its
    lane was dropped)."""
    match result:
        case Parked(settled=outcome):
            return await asyncio.shield(outcome)
        case Done() | Refused():
            return result


async def delivered(result: Result) -> object:
    """Awaited the way a caller that knows neither parking nor dead letters would (tests, tools): the value
    the record's outputs resolved with; raises its refusal."""
    match await settled(result):
        case Refused(error=error):
            raise error
        case Done(sent=sent):
            return await sent


def ack_after(first: Awaitable[object], ack: Ack) -> Ack:
    """`ack`, resolved only once `first` (another write the record caused) is durable too; either failing
    fails the record, so the loop retries it.

    A future, not a bare coroutine: when the batch raises after it was made (and containment's `Contained`
    splits the batch), it is dropped without a "never awaited" warning.
    """
    if asyncio.isfuture(first) and asyncio.isfuture(ack):
        # by callbacks: the same outcome as the task below (tests/unit/test_ack_after.py holds the two equal)
        return chained(first, ack)
    return asyncio.ensure_future(_after(first, ack))


async def _after(first: Awaitable[object], ack: Ack) -> object:
    await first
    return await ack


def record_headers(record: Record) -> list[tuple[str, bytes]]:
    """The record's headers as (str, bytes) pairs, ready to be passed on to an output."""
    return [(key, value or b"") for key, value in record.headers or ()]
