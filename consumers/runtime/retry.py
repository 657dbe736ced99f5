"""The retry policy, in one place for the stream loop, the parked lanes and the replay: what an outage is, how
long to wait, the retry loop around a batch attempt, and the one retry wait (`wait_to_retry`: metric, log,
sleep).

An outage (MongoDB or Kafka unreachable or slow: `RetriableError`, retriable or timed-out Kafka errors) is
never bad input: the records whose outputs failed for one are tried again after an exponential backoff with
jitter. What is not an outage is containment's (`consumers.runtime.containment`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, KafkaUnavailableError

from message_history import metrics
from message_history.errors import RetriableError

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


async def wait_to_retry(
    path: str,
    dependency: str,
    delay: float,
    message: str = "",
    *,
    extra: Mapping[str, object] | None = None,
    logger: logging.Logger = log,
    level: int = logging.WARNING,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """The one retry wait: count the retry (`message_history_retries_total{path,dependency}`), say
    `message` (when given) with the path and `extra`, then `sleep(delay)` (a polling wait if passed one)."""
    metrics.RETRIES.labels(path=path, dependency=dependency).inc()
    if message:
        logger.log(level, message, extra={"path": path, **(extra or {})})
    await sleep(delay)


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
