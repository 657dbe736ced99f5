"""The outage and containment policy, in one place for the stream loop and the replay: what an outage is,
what is not a record's fault, how long to wait, the retry loop around a batch attempt, how a batch failure
is narrowed down to its record, and how one attempt's outcomes are sorted.

An outage (MongoDB or Kafka unreachable or slow: `RetriableError`, retriable or timed-out Kafka errors) is
never bad input: the records whose outputs failed for one are tried again after an exponential backoff with
jitter. A *systemic* refusal (`is_systemic`: MongoDB refusing for good, a broker refusing authorization or
our configuration, memory exhausted) is not a property of any record either: it is raised and stops the
loop, rather than dead-lettering every record. Anything else met on one record (bad input, a record whose
output Kafka refuses for its size, and any other exception: a bug) makes that record a dead letter and the
stream goes on (Kafka Streams' deserialization and processing exception handlers, KIP-1033; Kafka Connect's
`errors.tolerance=all`). When a handler raises for a whole batch, `Contained` splits the batch in halves
until the record that raises is alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from aiokafka.errors import KafkaError

from consumers.runtime.retry import (
    Backoff,
    ChunkLimit,
    Failure,
    backoff_delay,
    is_outage,
    outage_dependency,
    retry_batch,
    retry_call,
)
from message_history import metrics
from message_history.errors import (
    FatalStorageError,
    InvalidInputError,
    StartupError,
    UnexpectedRecordError,
)
from producers.output import OUTPUT_TOO_LARGE

if TYPE_CHECKING:  # annotations only: `consumers.contract` imports this module's containment rules
    from consumers.contract import Ack, BatchHandler, Record

log = logging.getLogger(__name__)

__all__ = [  # the retry policy lives in `consumers.runtime.retry`; named here for the importers not moved yet
    "Backoff",
    "ChunkLimit",
    "Failure",
    "backoff_delay",
    "is_outage",
    "outage_dependency",
    "retry_batch",
    "retry_call",
]

T = TypeVar("T")


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

    async def handle(self, records: Sequence[Record]) -> list[Ack | InvalidInputError]:
        try:
            return await self.inner.handle(records)
        except Exception as exc:
            if not records or not containable(exc):
                raise
            if len(records) == 1:
                return [contain(exc, "batch")]
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
        return [*await self.handle(records[:middle]), *await self.handle(records[middle:])]


async def settle_outcomes(
    items: Sequence[T],
    results: Sequence[Ack | InvalidInputError],
    *,
    reject: Callable[[T, BaseException], Ack],
    explain: Callable[[BaseException], BaseException],
    done: Callable[[T, object], None],
) -> list[T]:
    """Wait for one attempt's outcomes; returns the items whose outputs failed for an outage, in order.

    `results` are a handler's, one per item. An `InvalidInputError` goes to `reject` (a dead letter, or a
    report); each item whose acknowledgement resolved goes to `done` with what it resolved with. An output
    Kafka refused for its size makes its input bad input: `reject(item, explain(error))`; any other failure of
    a record's output that is neither an outage nor systemic is contained the same way (`contain`). A
    systemic failure, or a `reject` that fails for anything but an outage, is raised (after the items before
    it are done).
    """
    acks = [
        reject(item, result) if isinstance(result, InvalidInputError) else result
        for item, result in zip(items, results, strict=True)
    ]
    rejected = [isinstance(result, InvalidInputError) for result in results]
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
