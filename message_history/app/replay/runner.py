"""The replay's work: one worker per partition over its range (`offsets.plan_replay`), each batch run
through the live handler to the end with the live loop's retry policy."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from consumers.consumer import build_reader
from consumers.contract import BatchHandler, settled
from consumers.runtime.containment import report_unexpected, settle_outcomes
from consumers.runtime.emit import FileUnderOffset, SendNow
from consumers.runtime.retry import Backoff, Failure, is_outage, retry_batch, retry_call
from consumers.unreadable import is_unreadable, read_carefully
from message_history.app.replay.observe_wait import ObservationWaits, record_lanes
from message_history.app.replay.options import CLIENT_ID, ReplayOptions
from message_history.app.replay.plan import Counts, TokenBucket
from message_history.app.replay.progress import ProgressDisplay
from message_history.app.replay.sinks import InvalidReport
from message_history.errors import MessageHistoryError, error_type
from message_history.settings import Settings
from producers.dead_letters import DeadLetterPublisher
from producers.transactions import HeldOutput, PartitionTransactions
from schemas.events import EnrichedRequest, HistoryPersisted

log = logging.getLogger(__name__)

T = TypeVar("T")

FETCH_TIMEOUT_MS = 500


class ReplayAbortedError(MessageHistoryError):
    """A dependency stayed unavailable longer than `--max-retry-s`: the replay stops where it is."""


class StoppedError(Exception):
    """A signal came while waiting to retry a connection: not a failure, an interruption."""


@dataclass(frozen=True, slots=True)
class _Invalid:
    """A bad record's outcome: reported, and dead-lettered unless `--skip-invalid`."""

    error: BaseException
    dead_lettered: bool


# --- one batch, with the live loop's retry policy ----------------------------------------------------------


@dataclass(slots=True)
class PartitionState:
    """One partition's range and how far it got: every offset below `next` is done."""

    partition: int
    start: int
    end: int
    next: int

    @property
    def finished(self) -> bool:
        return self.next >= self.end

    @property
    def done(self) -> int:
        return max(0, min(self.next, self.end) - self.start)


Sleep = Callable[[float, asyncio.Event], Awaitable[bool]]


async def sleep_or_stop(seconds: float, stop: asyncio.Event) -> bool:
    """Wait `seconds`; True when `stop` was set meanwhile (returns at once then)."""
    if stop.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


@dataclass
class BatchRunner:
    """Runs one partition's batch through the handler to the end: every record settled, or an outage too long.

    The live loop's own retry loop and outcome sorting (`consumers.runtime`): the handler's result per record
    is a `Done` or a `Refused` (reported / dead-lettered); records whose outputs failed
    for an outage are retried with the live backoff; a record whose output Kafka refuses for size is treated
    as bad input.
    """

    handler: BatchHandler
    counts: Counts
    report: InvalidReport
    dead_letters: DeadLetterPublisher | None
    # where the outputs go: sent at once, or (exactly-once) filed under their record's offset for the batch's
    # transaction (`consumers.runtime.emit`)
    emit: SendNow | FileUnderOffset
    max_retry_s: float
    retry_initial_s: float
    retry_max_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Sleep = sleep_or_stop
    rand: Callable[[], float] = field(default_factory=lambda: random.Random().random)  # noqa: S311 -- jitter
    # exactly-once: a batch's outputs held per record, then in one transaction per partition (the live
    # service's transaction code, `PartitionTransactions.for_client(..., replay=True)`)
    transactions: PartitionTransactions | None = None
    # `--observe`: the wait for the observations each record's save sent (None: no wait, batches whole)
    observations: ObservationWaits | None = None

    async def run(
        self, records: Sequence[ConsumerRecord], state: PartitionState, stop: asyncio.Event
    ) -> None:
        """Process `records` (one partition, ascending); moves `state.next` past what is done.

        Raises `ReplayAbortedError` when an outage outlasts `max_retry_s` (`state.next` is then the first
        record not done), and re-raises what is neither an outage nor contained (a systemic refusal,
        `consumers.runtime.containment.is_systemic`: `state.next` stays before the batch).

        With `observations` (`--observe`), one record at a time, each first waiting for the claims open on
        its lanes (its thread's and resource's OM rows) and at the range's end for every claim still open:
        `replay.observe_wait`. A wait that times out raises `ObservationWaitError` with `state.next` at the
        record that waited (a rerun reads its lanes' rows and waits again); a stop while waiting leaves it
        there too.
        """
        waits = self.observations
        if waits is None:
            await self._batch(records, state, stop)
            return
        for record in records:
            if stop.is_set():
                return  # `next` is this record: a clean stop between records
            lanes = record_lanes(record.key, record.value)
            # `next` is this record while it waits: a stop or the bound leaves it for the resume
            if not await waits.before(record, lanes, stop):
                return
            await self._batch([record], state, stop)
            if state.next <= record.offset:
                return  # stopped (or given up) before it was done
        if state.finished:
            await waits.drain(state.partition, stop)  # a replay that finished leaves its rows settled

    async def _batch(
        self, records: Sequence[ConsumerRecord], state: PartitionState, stop: asyncio.Event
    ) -> None:
        failing_since: float | None = None

        async def wait(failure: Failure[ConsumerRecord]) -> bool:
            nonlocal failing_since
            now = self.clock()
            failing_since = now if failing_since is None else failing_since
            error = failure.error
            reason = f"{type(error).__name__}: {error}" if error is not None else "outputs not acknowledged"
            if now - failing_since >= self.max_retry_s:
                state.next = failure.failed[0].offset
                raise ReplayAbortedError(
                    f"partition {state.partition}: dependency unavailable for {now - failing_since:.0f} s "
                    f"(--max-retry-s {self.max_retry_s:g}); last error {reason}"
                )
            log.warning(
                "outage: retrying batch",
                extra={
                    "partition": state.partition,
                    "attempt": failure.attempt,
                    "records": len(failure.failed),
                    "delay_s": round(failure.delay, 2),
                    "reason": reason,
                },
            )
            return await self.sleep(failure.delay, stop)

        backoff = Backoff(self.retry_initial_s, self.retry_max_s, self.rand)
        transactions = self.transactions
        tp = TopicPartition(records[0].topic, state.partition) if records else None
        if transactions is not None and tp is not None and not transactions.owns(tp):
            # a transactional producer first (fencing a replay of this partition still running)
            opened = await self._transact(lambda: transactions.open([tp]), records[0], backoff, wait)
            if not opened:
                return  # stopped before it opened: `next` stays before the batch
        left = await retry_batch(records, self._attempt, backoff=backoff, wait=wait)
        if transactions is not None and tp is not None:
            # only what is done below the first record left: the rest is redone on resume
            below = left[0].offset if left else records[-1].offset + 1
            if not await self._transact(lambda: _commit(transactions, tp, below), records[0], backoff, wait):
                return  # stopped before the batch's transaction committed: `next` stays before the batch
        if left:  # stopped during the backoff: the first record not done is where to resume
            state.next = left[0].offset
        elif records:
            state.next = max(state.next, records[-1].offset + 1)

    @staticmethod
    async def _transact(
        step: Callable[[], Awaitable[None]],
        first: ConsumerRecord,
        backoff: Backoff,
        wait: Callable[[Failure[ConsumerRecord]], Awaitable[bool]],
    ) -> bool:
        """`step` (a partition's producer opened, or its transaction), retried through outages like the batch
        (a replay that gives up resumes at the batch's `first` record). False when stopped before it ended."""

        async def once(_: list[None]) -> list[None]:
            await step()
            return []

        async def retry(failure: Failure[None]) -> bool:
            return await wait(Failure(failure.attempt, failure.delay, [first], failure.error))

        return not await retry_batch([None], once, backoff=backoff, wait=retry)

    async def _attempt(self, records: list[ConsumerRecord]) -> list[ConsumerRecord]:
        """One try; returns the records whose outputs failed for an outage (to retry), in order."""
        results = await self.handler.handle(records, self.emit)
        failed = await settle_outcomes(
            records,
            await asyncio.gather(*(settled(result) for result in results)),  # a replay parks nothing
            reject=self._invalid,
            explain=lambda error: error,  # the report and the dead letter name Kafka's own error
            done=self._settle,
        )
        return sorted(failed, key=lambda r: r.offset)

    async def _invalid(self, record: ConsumerRecord, error: BaseException) -> _Invalid:
        if self.dead_letters is None:
            return _Invalid(error, dead_lettered=False)
        await self.dead_letters.deliver(self.emit, record, error)  # as the live loop: one that fits the limit
        return _Invalid(error, dead_lettered=True)

    def _settle(self, record: ConsumerRecord, outcome: object) -> None:
        if isinstance(self.emit, FileUnderOffset):
            self._hold(record, self.emit.take(record))  # its event, or its dead letter
        if isinstance(outcome, HistoryPersisted):
            self.counts.add_persisted(outcome.skipped)
        elif isinstance(outcome, EnrichedRequest):
            self.counts.add_enriched(outcome.history.recalled)
        elif isinstance(outcome, _Invalid):
            report_unexpected("replay", record, outcome.error)
            dlq = self.dead_letters.topic if outcome.dead_lettered and self.dead_letters else None
            self.counts.add_invalid(
                partition=record.partition,
                offset=record.offset,
                error=f"{error_type(outcome.error)}: {outcome.error}",
                dead_lettered=outcome.dead_lettered,
            )
            self.report.write(record, outcome.error, dead_letter_topic=dlq)
            log.warning(
                "invalid record: %s",
                "dead-lettered" if dlq else "skipped and reported",
                extra={
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "error_type": error_type(outcome.error),
                    "error": str(outcome.error)[:1024],
                    "dead_letter_topic": dlq,
                },
            )
        else:  # pragma: no cover -- the recorders above resolve with one of these
            raise TypeError(f"unexpected outcome {type(outcome).__name__}")

    def _hold(self, record: ConsumerRecord, outputs: list[HeldOutput]) -> None:
        if self.transactions is not None:
            self.transactions.hold(TopicPartition(record.topic, record.partition), record.offset, outputs)


async def _commit(transactions: PartitionTransactions, tp: TopicPartition, below: int) -> None:
    """The outputs held for `tp` below `below`, in offset order, in one transaction (none: nothing to do)."""
    if not await transactions.commit(tp, below):
        raise ReplayAbortedError(
            f"partition {tp.partition}: its transactional id was taken by another replay of it (fenced)"
        )


# --- the partitions ----------------------------------------------------------------------------------------


class Replay:
    """One run: the partitions' workers, the progress display, the tallies."""

    def __init__(
        self,
        settings: Settings,
        options: ReplayOptions,
        *,
        stop: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.options = options
        self.stop = stop
        self.counts = Counts()
        self.partitions: list[PartitionState] = []
        self.notes: list[str] = []
        self.read_s = 0.0  # time spent reading and processing (setup and summary left out)
        self._bucket = TokenBucket(options.rate, now=time.monotonic()) if options.rate else None
        self._batch_limit = min(
            options.batch_size, self._bucket.batch_limit() if self._bucket else options.batch_size
        )
        self._slots = asyncio.Semaphore(options.concurrency)

    # --- setup ---

    async def retrying(self, what: str, step: Callable[[], Awaitable[T]]) -> T:
        """`step()` with the live backoff while it fails for an outage, for at most `--max-retry-s`."""
        started = time.monotonic()

        async def wait(failure: Failure[None]) -> bool:
            error = failure.error
            waited = time.monotonic() - started
            if waited >= self.options.max_retry_s:
                raise ReplayAbortedError(
                    f"{what}: unavailable for {waited:.0f} s "
                    f"(--max-retry-s {self.options.max_retry_s:g}): {type(error).__name__}: {error}"
                ) from error
            log.warning(
                "%s failed, retrying", what, extra={"attempt": failure.attempt, "error": type(error).__name__}
            )
            if await sleep_or_stop(failure.delay, self.stop):
                raise StoppedError from error
            return False

        backoff = Backoff(
            self.settings.retry_initial_backoff_s,
            self.settings.retry_max_backoff_s,
            random.Random().random,  # noqa: S311 -- jitter
        )
        return await retry_call(step, backoff=backoff, wait=wait)

    def progress(self) -> tuple[int, int]:
        """(offsets done, offsets in the plan)."""
        return sum(p.done for p in self.partitions), sum(p.end - p.start for p in self.partitions)

    # --- workers ---

    async def run_partitions(self, runner: BatchRunner, abandon: asyncio.Event) -> BaseException | None:
        """Run every partition (at most `--concurrency` at once); the first failure stops the others."""
        started = time.monotonic()
        try:
            return await self._run_partitions(runner, abandon)
        finally:
            self.read_s = time.monotonic() - started

    async def _run_partitions(self, runner: BatchRunner, abandon: asyncio.Event) -> BaseException | None:
        workers = [
            asyncio.create_task(self._partition(state, runner), name=f"replay-p{state.partition}")
            for state in self.partitions
            if not state.finished
        ]
        abandoned = asyncio.create_task(abandon.wait(), name="replay-abandon")
        failure: BaseException | None = None
        try:
            pending: set[asyncio.Task[Any]] = set(workers)
            while pending:
                done, pending = await asyncio.wait(pending | {abandoned}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(abandoned)
                for task in done:
                    if task is abandoned or task.cancelled():
                        continue
                    error = task.exception()
                    if error is not None and failure is None:
                        failure = error
                        self.stop.set()  # the others finish their batch and stop
                if abandoned.done():
                    for task in pending:
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    log.warning("second signal: in-flight batches abandoned")
                    break
        finally:
            abandoned.cancel()
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, abandoned, return_exceptions=True)
        return failure

    async def _partition(self, state: PartitionState, runner: BatchRunner) -> None:
        async with self._slots:
            if self.stop.is_set():
                return
            tp = TopicPartition(self.options.topic, state.partition)
            consumer = build_reader(
                self.settings, client_id=CLIENT_ID, reset="none", max_records=self._batch_limit
            )
            try:
                try:
                    await self.retrying(f"partition {state.partition}: connect to Kafka", consumer.start)
                except StoppedError:
                    return
                consumer.assign([tp])
                consumer.seek(tp, state.next)
                await self._consume(consumer, tp, state, runner)
            finally:
                await consumer.stop()

    async def _consume(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, state: PartitionState, runner: BatchRunner
    ) -> None:
        quiet_since: float | None = None  # no record and no error since then, while work is left
        while not state.finished and not self.stop.is_set():
            try:
                fetched = await consumer.getmany(
                    tp, timeout_ms=FETCH_TIMEOUT_MS, max_records=self._batch_limit
                )
            except OffsetOutOfRangeError:
                await self._skip_deleted(consumer, tp, state)
                continue
            except Exception as exc:
                if not is_outage(exc):
                    if not is_unreadable(exc):
                        raise
                    # a batch that cannot be decompressed or parsed: its offsets become invalid records
                    consumer.seek(tp, state.next)
                    found, _ = await read_carefully(
                        consumer, [tp], max_records=self._batch_limit, timeout_ms=FETCH_TIMEOUT_MS
                    )
                    fetched = {tp: found}
                else:
                    fetched = {}
                    log.warning(
                        "fetch failed, retrying",
                        extra={"partition": state.partition, "error": type(exc).__name__},
                    )
                    await sleep_or_stop(self.settings.retry_initial_backoff_s, self.stop)
            records = [r for r in fetched.get(tp, []) if state.next <= r.offset < state.end]
            if not records:
                if fetched.get(tp):  # only records past the end: this partition is finished
                    state.next = state.end
                    break
                position = await consumer.position(tp)
                if position > state.next:  # transaction markers or aborted records: nothing to do there
                    state.next = min(position, state.end)
                    continue
                now = time.monotonic()
                quiet_since = quiet_since if quiet_since is not None else now
                if now - quiet_since >= self.options.max_retry_s:
                    raise ReplayAbortedError(
                        f"partition {state.partition}: no record at offset {state.next} (end {state.end}) "
                        f"for {now - quiet_since:.0f} s (--max-retry-s {self.options.max_retry_s:g}); "
                        "is Kafka reachable?"
                    )
                continue
            quiet_since = None
            if self._bucket is not None:
                delay = self._bucket.take(len(records), time.monotonic())
                if delay > 0 and await sleep_or_stop(delay, self.stop):
                    return  # stopped before this batch started: it is not done, `next` stays before it
            await runner.run(records, state, self.stop)

    async def _skip_deleted(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, state: PartitionState
    ) -> None:
        """Retention deleted the next offsets while we ran: say how many, go on from the first one kept."""
        first = (await consumer.beginning_offsets([tp]))[tp]
        if first <= state.next:  # not a retention gap: a real error
            raise ReplayAbortedError(f"partition {state.partition}: offset {state.next} is out of range")
        lost = min(first, state.end) - state.next
        self.counts.lost_to_retention += lost
        log.warning(
            "offsets deleted by retention before they were read",
            extra={"partition": state.partition, "from": state.next, "to": first - 1, "count": lost},
        )
        state.next = min(first, state.end)
        consumer.seek(tp, state.next)

    async def tick(self, display: ProgressDisplay) -> None:
        """Redraw the progress until cancelled."""
        every = 0.2 if display.mode == "bar" else min(1.0, self.options.progress_interval_s)
        while True:
            display.update(*self.progress(), self.counts)
            await asyncio.sleep(every)
