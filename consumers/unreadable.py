"""Record batches the consumer cannot read: each of their offsets becomes a dead letter; the stream goes on.

aiokafka decompresses and parses a record batch lazily, inside `getmany`, while it hands out records. A batch
it cannot read (a codec whose library is missing, bytes that do not decompress, a CRC mismatch, a header key
that is not UTF-8) raises out of `getmany` for the whole call, and that has two consequences (aiokafka 0.14,
`consumer/fetcher.py`, `Fetcher.fetched_records` and `FetchResult.getall`):

* records of *other* partitions drained earlier in the same call are lost to the caller, while their
  positions already moved past them;
* the failing partition stays where it was, so every later `getmany` raises the same error again.

Left alone, that is a stopped service (the loop treats an unknown error as a bug). `read_carefully` recovers:
it rewinds every partition to one past the last record the caller received, then reads one record at a time
per partition. When a read raises, the partition's position is the offset that cannot be read: that offset
becomes an `UnreadableRecord` (dead-lettered by the loop, with the reason) and reading goes on from the next
offset. A batch of n unreadable records thus costs n fetches; a well-formed batch after it reads normally.

The dead letter of an unreadable record has an empty value: aiokafka exposes no record bytes for a batch it
cannot decode. Its headers name the source topic, partition and offset, where the record still is.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import cramjam
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError, UnsupportedCodecError

from consumers.contract import Emit, Refused, Result
from message_history.errors import InvalidInputError

_UNREADABLE_KAFKA_ERRORS = (UnsupportedCodecError, CorruptRecordException)
# What decompressing or parsing producer-written bytes raises: gzip (OSError, EOFError, zlib.error), snappy /
# lz4 / zstd through cramjam, the record parser (struct, index, value and UTF-8 errors).
_UNREADABLE_ERRORS = (
    cramjam.DecompressionError,
    EOFError,
    zlib.error,
    struct.error,
    IndexError,
    ValueError,
)


class UnreadableRecordError(InvalidInputError):
    """A record whose batch the consumer cannot decompress or parse (the reason says which codec or check)."""


def is_unreadable(error: BaseException) -> bool:
    """True when a `getmany` error comes from the bytes of a record batch, not from the broker or from us.

    Call it only for errors that are not outages (those are retried first).
    """
    if isinstance(error, KafkaError):
        return isinstance(error, _UNREADABLE_KAFKA_ERRORS)
    if isinstance(error, OSError):
        return not isinstance(error, ConnectionError)  # gzip's BadGzipFile is an OSError
    return isinstance(error, _UNREADABLE_ERRORS)


def describe(error: BaseException) -> str:
    """The dead-letter reason for a record that could not be read."""
    if isinstance(error, UnsupportedCodecError):
        return (
            f"the record batch cannot be decompressed: {error}. The producer's compression.type is not "
            "readable here: install the codec library (cramjam) or produce with gzip or none"
        )
    if isinstance(error, CorruptRecordException):
        return f"the record batch is corrupt (CRC mismatch or malformed): {error}"
    return f"the record batch cannot be decompressed or parsed: {type(error).__name__}: {error}"


@dataclass(frozen=True, slots=True)
class UnreadableRecord:
    """One offset of a batch that cannot be read; shaped like the `ConsumerRecord` fields the loop uses."""

    topic: str
    partition: int
    offset: int
    error: UnreadableRecordError
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


async def rewind(
    consumer: AIOKafkaConsumer, partitions: Iterable[TopicPartition], positions: Mapping[TopicPartition, int]
) -> None:
    """Seek each partition to one past the last record handed out (`positions`), else to its committed offset.

    A partition with nothing handed out since it was assigned started at its committed offset (or, with none,
    at the earliest one, as `auto_offset_reset="earliest"` does), so that is where it resumes.
    """
    for tp in partitions:
        known = positions.get(tp)
        if known is not None:
            consumer.seek(tp, known)
            continue
        committed = await consumer.committed(tp)
        if committed is not None and committed >= 0:
            consumer.seek(tp, committed)
        else:
            await consumer.seek_to_beginning(tp)


async def read_carefully(
    consumer: AIOKafkaConsumer,
    partitions: Iterable[TopicPartition],
    *,
    max_records: int,
    timeout_ms: int,
) -> tuple[list[ConsumerRecord | UnreadableRecord], list[tuple[str, Any]]]:
    """Up to `max_records` records of `partitions`, one per fetch, unreadable offsets as `UnreadableRecord`.

    Returns the records (per partition in offset order) and, for the log, the unreadable positions found.
    Call `rewind` first.
    """
    out: list[ConsumerRecord | UnreadableRecord] = []
    found: list[tuple[str, Any]] = []
    for tp in sorted(partitions):
        while len(out) < max_records:
            try:
                fetched = await consumer.getmany(tp, timeout_ms=timeout_ms, max_records=1)
            except Exception as exc:
                if not is_unreadable(exc):
                    raise
                offset = await consumer.position(tp)
                reason = UnreadableRecordError(describe(exc))
                out.append(UnreadableRecord(tp.topic, tp.partition, offset, reason))
                found.append((f"{tp.topic}[{tp.partition}]@{offset}", type(exc).__name__))
                consumer.seek(tp, offset + 1)
                continue
            records = fetched.get(tp, [])
            if not records:
                break
            out.extend(records)
    return out, found


class _Handler(Protocol):
    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]: ...


class SkippingUnreadable:
    """A batch handler answering each `UnreadableRecord` with its error, passing the other records on."""

    def __init__(self, inner: _Handler) -> None:
        self.inner = inner

    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]:
        readable = [rec for rec in records if not isinstance(rec, UnreadableRecord)]
        if len(readable) == len(records):
            return await self.inner.handle(records, emit)
        answers = iter(await self.inner.handle(readable, emit) if readable else [])
        return [Refused(rec.error) if isinstance(rec, UnreadableRecord) else next(answers) for rec in records]
