"""Containment, in one place for the stream loop, the paths and the replay: what is not a record's fault, how
a batch failure is narrowed down to its record, how one attempt's outcomes are sorted, and how a bug met on a
record is reported (once per record).

A *systemic* refusal (`is_systemic`: MongoDB refusing for good, a broker refusing authorization or our
configuration, memory exhausted) is no property of any record: it is raised and stops the loop, rather than
dead-lettering every record. An outage is the retry policy's (`consumers.runtime.retry.is_outage`). Anything
else met on one record (bad input, a record whose output Kafka refuses for its size, and any other exception:
a bug) makes that record a dead letter and the stream goes on (Kafka Streams' deserialization and processing
exception handlers, KIP-1033; Kafka Connect's `errors.tolerance=all`). When a handler raises for a whole
batch, `Contained` splits the batch in halves until the record that raises is alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

from aiokafka.errors import KafkaError

from consumers.contract import Ack, BatchHandler, Done, Emit, Record, Refused, Result
from consumers.runtime.retry import is_outage
from message_history import metrics, tracing
from message_history.errors import (
    EventValidationError,
    FatalStorageError,
    InvalidInputError,
    StartupError,
    UnexpectedRecordError,
)
from producers.output import OUTPUT_TOO_LARGE

log = logging.getLogger(__name__)

T = TypeVar("T")

# record positions an `UnexpectedReports` remembers (bugs are rare; a bound all the same): 1.7 MB when full
# (tracemalloc, 10,000 large offsets)
_REMEMBERED = 10_000


def is_systemic(error: BaseException) -> bool:
    """True for a failure that is no record's fault and would fail every record alike: stop, do not
    dead-letter. Call it only for errors that are not outages.

    MongoDB refusing an operation for good (`FatalStorageError`: authentication, configuration, an index or a
    stored row it cannot read; the documents' shapes are the service's, a record's content is JSON text in
    them), a configuration the service cannot run with (`StartupError`), any Kafka error that is neither an
    outage nor a size refusal (authorization, an unsupported version, an illegal state: the broker treats
    every record of ours alike), and memory exhausted.
    """
    if isinstance(error, OUTPUT_TOO_LARGE):
        return False
    return isinstance(error, (FatalStorageError, StartupError, KafkaError, MemoryError))


def contain(error: BaseException, stage: str) -> InvalidInputError:
    """`error`, met on one record, as what dead-letters it: bad input as it is, anything else wrapped."""
    if isinstance(error, InvalidInputError):
        return error
    return UnexpectedRecordError(error, stage)


def containable(error: BaseException) -> bool:
    """True when `error`, met on one record, makes that record a dead letter (neither outage nor systemic)."""
    return not (is_outage(error) or is_systemic(error))


def report_unexpected(path: str, record: Record, error: BaseException) -> None:
    """For a record dead-lettered for a bug (`UnexpectedRecordError`): the ERROR line naming where the record
    is, with the traceback, and the metric the chart alerts on. Nothing for other errors."""
    if not isinstance(error, UnexpectedRecordError):
        return
    cause = error.cause
    metrics.UNEXPECTED_ERRORS.labels(path=path, error_type=error.error_type).inc()
    log.error(
        "unexpected error on a record (a bug): it is dead-lettered and the stream goes on",
        extra={
            "path": path,
            "stage": error.stage,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "error_type": error.error_type,
            "error": str(error)[:1024],
        },
        exc_info=(type(cause), cause, cause.__traceback__),
    )


class UnexpectedReports:
    """`report_unexpected` once per record for one path: a record dead-lettered again (its batch abandoned at
    a revoke and read again by this process: aiokafka's eager rebalance gives most partitions straight back)
    is a bug met once, so the counter the chart alerts on and the ERROR line count records. An outage retry
    needs no memory: it attempts only the records whose outputs failed, never a delivered dead letter.
    Remembers the last `_REMEMBERED` positions, across rebalances (a re-read is the case it is for)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: OrderedDict[tuple[str, int, int], None] = OrderedDict()

    def report(self, record: Record, error: BaseException) -> None:
        if not isinstance(error, UnexpectedRecordError):
            return
        position = (record.topic, record.partition, record.offset)
        if position in self._seen:
            self._seen.move_to_end(position)
            log.debug(
                "unexpected error on a record met again (reported once)",
                extra={"path": self.path, "topic": record.topic, "offset": record.offset},
            )
            return
        self._seen[position] = None
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        report_unexpected(self.path, record, error)


class Contained:
    """A batch handler whose exceptions are narrowed down to the record that causes them.

    When the inner handler raises for a batch (anything but an outage or a systemic refusal, which are
    raised), the batch is handled again in two halves, recursively, until the record that raises is alone:
    that record's result is the error (wrapped in `UnexpectedRecordError` unless it is bad input), the others
    are handled as usual. A batch of n records with one such record costs about 2·log2(n) more calls. The
    records before the failure may have been handled once already (their outputs sent): handling them again
    sends them again, which the outputs' ids make harmless (at least once, as after a restart).
    """

    def __init__(self, inner: BatchHandler, path: str) -> None:
        self.inner = inner
        self.path = path

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        try:
            return await self.inner.handle(records, emit)
        except Exception as exc:
            if not records or not containable(exc):
                raise
            if len(records) == 1:
                return [Refused(contain(exc, "batch"))]
            log.warning(
                "a batch failed and no record was named: splitting it to find the record",
                extra={
                    "path": self.path,
                    "records": len(records),
                    "first": f"{records[0].topic}[{records[0].partition}]@{records[0].offset}",
                    "error_type": type(exc).__name__,
                },
            )
        middle = len(records) // 2
        return [*await self.handle(records[:middle], emit), *await self.handle(records[middle:], emit)]


def decode_each(
    records: Sequence[Record], spans: tracing.BatchSpans, decode: Callable[[Record, bytes], T]
) -> tuple[list[Result | None], list[tuple[int, T]]]:
    """Each record decoded (`decode(record, value)`), its span started: (per-record results with the refused
    ones' errors filled in, the decoded ones with their index). An empty record is refused here, and so is
    one whose decode raises anything `containable` (a bug met on it included)."""
    results: list[Result | None] = [None] * len(records)
    items: list[tuple[int, T]] = []
    for index, record in enumerate(records):
        spans.start(index, record)
        error: InvalidInputError
        if record.value is None:
            error = EventValidationError("empty record (no value)")  # made only when refused: issue 33
        else:
            try:
                items.append((index, decode(record, record.value)))
                continue
            except Exception as exc:
                if not containable(exc):
                    raise
                error = contain(exc, "decode")
        results[index] = Refused(error)
        spans.fail(index, error)
    return results, items


async def settle_outcomes(
    items: Sequence[T],
    results: Sequence[Done | Refused],
    *,
    reject: Callable[[T, BaseException], Ack],
    explain: Callable[[BaseException], BaseException],
    done: Callable[[T, object], None],
) -> list[T]:
    """Wait for one attempt's outcomes; returns the items whose outputs failed for an outage, in order.

    `results` are a handler's, one per item (the parked ones taken out). A `Refused` goes to `reject` (a dead
    letter, or a report); each item whose `Done` acknowledgement resolved goes to `done` with what it
    resolved with. An output
    Kafka refused for its size makes its input bad input: `reject(item, explain(error))`; any other failure of
    a record's output that is neither an outage nor systemic is contained the same way (`contain`). A
    systemic failure, or a `reject` that fails for anything but an outage, is raised (after the items before
    it are done).
    """
    acks = [_ack(item, result, reject) for item, result in zip(items, results, strict=True)]
    rejected = [isinstance(result, Refused) for result in results]
    outcomes = await asyncio.gather(*acks, return_exceptions=True)
    failed, refused = _sort(items, outcomes, rejected, done)
    if refused:
        letters = [
            reject(item, explain(error) if isinstance(error, OUTPUT_TOO_LARGE) else contain(error, "output"))
            for item, error in refused
        ]
        again, _ = _sort(
            [item for item, _ in refused],
            await asyncio.gather(*letters, return_exceptions=True),
            [True] * len(letters),
            done,
        )
        failed += again
    return failed


def _ack(item: T, result: Done | Refused, reject: Callable[[T, BaseException], Ack]) -> Ack:
    match result:
        case Refused(error=error):
            return reject(item, error)
        case Done(sent=sent):
            return sent


def _sort(
    items: Sequence[T],
    outcomes: Sequence[object],
    rejected: Sequence[bool],
    done: Callable[[T, object], None],
) -> tuple[list[T], list[tuple[T, BaseException]]]:
    """(outage failures, outputs refused for the record's sake); the rest done, or raised when neither.

    `rejected` says which outcomes are already a dead letter's: when one of those fails (not for an
    outage), there is nowhere else to put the record, so it is raised.
    """
    failed: list[T] = []
    refused: list[tuple[T, BaseException]] = []
    for item, outcome, dead_letter in zip(items, outcomes, rejected, strict=True):
        if not isinstance(outcome, BaseException):
            done(item, outcome)
        elif is_outage(outcome):
            failed.append(item)
        elif dead_letter or not containable(outcome) or not isinstance(outcome, Exception):
            raise outcome
        else:
            refused.append((item, outcome))
    return failed, refused
