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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, KafkaUnavailableError

from message_history import metrics
from message_history.errors import (
    FatalStorageError,
    InvalidInputError,
    RetriableError,
    StartupError,
    UnexpectedRecordError,
)
from producers.output import OUTPUT_TOO_LARGE

if TYPE_CHECKING:  # annotations only: `consumers.contract` imports this module's containment rules
    from consumers.contract import Ack, BatchHandler, Record

log = logging.getLogger(__name__)

T = TypeVar("T")

_OUTAGE_KAFKA_ERRORS = (KafkaConnectionError, KafkaTimeoutError, KafkaUnavailableError)


def is_outage(error: BaseException) -> bool:
    """True for a dependency that is down or slow (retry later), False for anything else."""
    if isinstance(error, RetriableError):
        return True
    if isinstance(error, KafkaError):
        return bool(getattr(error, "retriable", False)) or isinstance(error, _OUTAGE_KAFKA_ERRORS)
    return isinstance(error, (ConnectionError, TimeoutError))


def outage_dependency(error: BaseException | None) -> str:
    """The dependency an outage is of, for the metrics, `/readyz` and the log: Kafka for its own errors,
    outputs not acknowledged (None) and the errors that say so (the turn barrier's); MongoDB otherwise."""
    if error is None or isinstance(error, KafkaError):
        return "kafka"
    return getattr(error, "dependency", "") or "mongodb"


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


def backoff_delay(attempt: int, *, initial: float, maximum: float, rand: Callable[[], float]) -> float:
    """Seconds to wait before retry `attempt` (1-based): exponential, capped, with "equal jitter".

    Half of the capped delay is fixed and half random, so instances that failed together do not retry in step
    and a retry never comes sooner than half the nominal delay.
    """
    nominal: float = min(maximum, initial * 2.0 ** max(0, attempt - 1))
    return nominal / 2 + rand() * nominal / 2


@dataclass(frozen=True, slots=True)
class Backoff:
    """The retry settings: the first delay, the cap, the jitter's source."""

    initial: float
    maximum: float
    rand: Callable[[], float]

    def delay(self, attempt: int) -> float:
        return backoff_delay(attempt, initial=self.initial, maximum=self.maximum, rand=self.rand)


@dataclass(frozen=True, slots=True)
class Failure(Generic[T]):
    """One failed attempt: what to try again, why, and how long to wait first."""

    attempt: int  # failed attempts in a row, 1-based
    delay: float  # the backoff before the next attempt
    failed: list[T]  # the items of the attempt whose outputs failed for an outage, to try again
    error: BaseException | None  # the outage the attempt raised; None: some outputs were not acknowledged


class ChunkLimit:
    """Items per attempt: half of what failed, doubled again after `grow_after` clean attempts in a row.

    A dependency that is slow (or, like FerretDB, stalls on large bulk writes) rather than down then gets work
    it can finish within its timeout, instead of the same batch timing out forever.
    """

    def __init__(self, maximum: int, *, grow_after: int) -> None:
        self.maximum = maximum
        self.limit = maximum
        self._grow_after = grow_after
        self._clean = 0

    def failed(self, tried: int) -> None:
        self.limit = max(1, tried // 2)
        self._clean = 0

    def succeeded(self) -> None:
        self._clean += 1
        if self._clean >= self._grow_after and self.limit < self.maximum:
            self.limit = min(self.maximum, self.limit * 2)
            self._clean = 0


async def retry_batch(
    items: Sequence[T],
    attempt: Callable[[list[T]], Awaitable[list[T]]],
    *,
    backoff: Backoff,
    wait: Callable[[Failure[T]], Awaitable[bool]],
    keep: Callable[[list[T]], list[T]] = list,
    chunks: ChunkLimit | None = None,
    recovered: Callable[[], None] | None = None,
) -> list[T]:
    """Attempt `items` until each is settled; returns the items left when `wait` said stop ([] when done).

    `attempt` tries some items and returns those whose outputs failed for an outage (an outage it raises
    fails them all; anything else it raises propagates). After a failure, `wait` gets the `Failure` with the
    backoff delay; it waits (or raises to give up) and returns True to stop retrying. `keep` drops items no
    longer ours before each attempt; with `chunks`, items go in chunks of its limit, in order, and the limit
    learns from each attempt; `recovered` is called after each attempt that failed nothing.
    """
    pending = list(items)
    failures = 0
    while True:
        pending = keep(pending)
        if not pending:
            return []
        size = chunks.limit if chunks is not None else len(pending)
        head, tail = pending[:size], pending[size:]
        error: BaseException | None = None
        try:
            failed = await attempt(head)
        except Exception as exc:
            if not is_outage(exc):
                raise
            failed, error = head, exc
        pending = failed + tail
        if not failed:
            if recovered is not None:
                recovered()
            failures = 0
            if chunks is not None:
                chunks.succeeded()
            continue
        failures += 1
        if chunks is not None:
            chunks.failed(len(head))
        if await wait(Failure(failures, backoff.delay(failures), failed, error)):
            return pending


async def retry_call(
    step: Callable[[], Awaitable[T]], *, backoff: Backoff, wait: Callable[[Failure[None]], Awaitable[bool]]
) -> T:
    """`step()`, retried with `retry_batch` while it fails for an outage; `wait` must raise to give up."""
    result: list[T] = []

    async def once(_: list[None]) -> list[None]:
        result.append(await step())
        return []

    await retry_batch([None], once, backoff=backoff, wait=wait)
    if not result:
        raise RuntimeError("retry_call: stopped without a result")  # `wait` returned True instead of raising
    return result[0]


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
