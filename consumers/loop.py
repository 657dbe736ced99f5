"""The batch consumer loop shared by both paths: fetch, hand a batch to the path, route dead letters, commit.

One `StreamLoop` per path, each with its own `AIOKafkaConsumer` in the service's consumer group. Per batch:

1. `getmany` returns up to `max_batch_records` records; each is tracked in the partition's watermark.
2. The path's `BatchHandler` returns, per record, either an acknowledgement to wait for (the output was sent,
   and for the persist path the MongoDB write is already acknowledged) or an `InvalidInputError`: that record
   is sent to the path's dead-letter topic. When the handler raises for the whole batch, the batch is split
   in halves until the record that raises is alone (containment's `Contained`), and that one is the dead
   letter.
3. The loop gathers every acknowledgement of the batch; a record is done when all of its outputs are. A
   parked record (a recall request waiting in its thread's lane, `consumers.parking`) is settled in the
   background instead: the loop fetches on, and its commit stops below it until it is done.
4. A background commit, at most every `commit_interval_ms`, commits each partition's contiguous done
   watermark; the loop never waits for it. Revoke and shutdown commit synchronously. Under exactly-once
   the outputs were only held (`producers.transactions`): each partition's commit is a transaction that
   produces the outputs of its records below the watermark, then commits the watermark.

Outages (MongoDB or Kafka unreachable: `RetriableError`, retriable or timed-out Kafka errors) are not bad
input: the loop pauses its partitions, reports not-ready, backs off exponentially with jitter, and retries
the same records that are not done yet. While it waits it keeps calling `getmany` (on paused partitions, so
nothing is returned) so that the consumer stays in the group. A record whose output is too large for Kafka
is dead-lettered like bad input, and so is each offset of a record batch the consumer cannot decompress or
parse (see `consumers.unreadable`). Any other exception met on one record (a bug) is contained the same way:
the record is dead-lettered with the exception's class and message, logged at ERROR with its topic,
partition and offset, and counted once per record in `message_history_unexpected_errors_total`; the loop
never exits on a record. Only a systemic refusal (`consumers.runtime.containment.is_systemic`: MongoDB
refusing for good, Kafka refusing authorization or configuration) stops the loop: the service exits non-zero
without committing past the failed work, since dead-lettering every record would be wrong.

The consumer and the knobs are built in `consumers.consumer`, the retry policy is `consumers.runtime.retry`,
containment `consumers.runtime.containment`, what a path promises the loop is `consumers.contract`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaConnectionError, KafkaError
from opentelemetry.trace import Span

from consumers.consumer import Health, LoopOptions, stop_consumer
from consumers.contract import BatchHandler
from consumers.kafka_watch import KafkaWatch
from consumers.offsets import OffsetTracker, PartitionOffsets
from consumers.outage_log import OutageLog
from consumers.runtime.containment import Contained, UnexpectedReports, settle_outcomes
from consumers.runtime.intake import HELD, OUTAGE, PARKED, Intake, Listener, partition_of, positions
from consumers.runtime.retry import (
    Backoff,
    ChunkLimit,
    Failure,
    outage_dependency,
    retry_batch,
    retry_call,
    wait_to_retry,
)
from consumers.runtime.settlement import Settlement
from consumers.unreadable import SkippingUnreadable, UnreadableRecord
from message_history import metrics, tracing
from message_history.errors import RetriableError, error_type
from producers.dead_letters import DeadLetterPublisher
from producers.output import explain_too_large
from producers.transactions import (
    UNAUTHORIZED,
    HeldOutput,
    PartitionTransactions,
    commit_failure,
    held_outputs,
)

log = logging.getLogger(__name__)


_TOPIC_POLL_S = 1.0  # how often a missing input topic is looked for
_TOPIC_REPORT_EVERY_S = 30.0  # how often the wait for it is logged
_GROW_AFTER = 8  # clean attempts before a shrunken chunk limit doubles again


class StreamLoop:
    """Consumes one topic for one path until told to stop; an async context manager owning its consumer."""

    exit_deadline: float | None = None  # when `__aexit__` must be done (monotonic); the service sets it
    stopped_cleanly = False  # after `__aexit__`: everything done committed and the consumer stopped in time

    def __init__(
        self,
        *,
        path: str,
        topic: str,
        consumer: AIOKafkaConsumer,
        handler: BatchHandler,
        dead_letters: DeadLetterPublisher,
        health: Health,
        options: LoopOptions,
        transactions: PartitionTransactions | None = None,
    ) -> None:
        self.path = path
        self.topic = topic
        self._consumer = consumer
        self._intake = Intake(path=path, topic=topic, consumer=consumer, health=health, options=options)
        # an unreadable record is refused before the path sees it; a batch the path raises for is split
        self._handler = Contained(SkippingUnreadable(handler), path)
        self._dead_letters = dead_letters
        self._health = health
        self._opts = options
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._idle = asyncio.Event()  # set while no batch is in flight
        self._idle.set()
        self._stopping = False
        self._commit_task: asyncio.Task[None] | None = None
        self._last_commit = time.monotonic()
        self._random = random.Random()  # noqa: S311 -- jitter, not security
        self._chunks = ChunkLimit(options.max_batch_records, grow_after=_GROW_AFTER)  # shrinks after failures
        self._backoff = Backoff(options.retry_initial_s, options.retry_max_s, self._random.random)
        # parked records (a request waiting in its thread's lane) settling in the background
        self._settlement = Settlement(
            path=path,
            topic=topic,
            settle=self._settle_now,
            still_ours=self._still_ours,
            backoff=self._backoff,
            stopping=lambda: self._stopping,
        )
        self._parked_failure: BaseException | None = None  # a commit that failed for good: raised by `run`
        # exactly-once: outputs held per record, committed with the offsets (`producers.transactions`)
        self._transactions = transactions
        self._unauthorized = False  # exactly-once: a transaction was refused for a missing ACL
        # exactly-once: partitions whose commits fail (a failure streak is logged once)
        self._failing: set[TopicPartition] = set()
        if transactions is not None:
            transactions.refused = self._refused_output
            transactions.read_committed = consumer.committed
        # Kafka's reachability, which `getmany` does not tell (hooks: `run`, `__aexit__`)
        self._kafka_watch = KafkaWatch(consumer, health, path, grace_s=options.kafka_grace_s)
        self._outage_logs = {dep: OutageLog(path, dep) for dep in ("kafka", "mongodb")}
        self._unexpected = UnexpectedReports(path)  # a bug counted once per record, not per attempt

    def done_offset(self, partition: int) -> int | None:
        """Next offset of `partition` of this loop's topic not yet done here; None when not owned or not read.

        The turn barrier reads it for the persist path: everything below it is written and acknowledged.
        """
        tp = TopicPartition(self.topic, partition)
        if tp not in self._intake.assigned:
            return None
        return self._tracker.watermark(tp)

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> StreamLoop:
        await self._consumer.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Final commit of what is done, then leave the group; both by `exit_deadline` (a monotonic time,
        set by the service from its shutdown budget; else `exit_timeout_s` from now).

        `stopped_cleanly` says afterwards whether everything done was committed and the consumer stopped in
        time. The commit gets half of the time left and at most its usual bound; the stop gets the rest:
        whatever the group is doing (a join held for a dead member, a revoke callback), this returns by the
        deadline.
        """
        await self._kafka_watch.stop()
        await self._settlement.drop(None)  # parked requests are left uncommitted, for the next owner
        self._stopping = True
        self._health.set_ready(self.path, False, "stopping")
        deadline = self.exit_deadline or time.monotonic() + self._opts.exit_timeout_s
        committed = False
        try:
            bound = min(self._opts.commit_timeout_s, (deadline - time.monotonic()) / 2)
            async with asyncio.timeout(max(0.0, bound)):
                await self._commit_now(self._tracker.keys(), reason="shutdown")
            # a refused or failed commit is logged by `_commit` and leaves the offsets committable; under
            # exactly-once a partition fenced meanwhile is another instance's to commit, not ours
            ours = [
                tp
                for tp in self._intake.assigned
                if self._transactions is None or self._transactions.owns(tp)
            ]
            committed = not self._tracker.committable(ours)
        except TimeoutError:
            log.warning("shutdown commit did not finish in time", extra={"path": self.path})
        finally:
            if self._transactions is not None:
                await self._transactions.close()
            # leaves the group (no LeaveGroup with static membership)
            left = await stop_consumer(self._consumer, deadline - time.monotonic())
            if not left:
                log.error(
                    "consumer did not stop in time (its group is rebalancing?): closed without waiting",
                    extra={"path": self.path},
                )
            self.stopped_cleanly = committed and left

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and process batches until `stop` is set; returns once the batch in hand is finished."""
        listener = Listener(self.on_revoked, self._on_assigned)
        if not await self._intake.subscribe_once_topic_exists(stop, listener):
            return
        self._kafka_watch.start()
        while not stop.is_set():
            self._health.beat(self.path)
            failure = self._failure()
            if failure is not None:
                raise failure
            if self._settlement.full():
                await self._wait_for_parking_room(stop)
                continue
            if self._transactions is not None and self._transactions.full():
                await self._wait_for_held_room(stop)
                continue
            batch = await self._intake.fetch()
            if batch:
                await self._process(batch, stop)
            self._maybe_commit()
        self._stopping = True

    # --- processing -----------------------------------------------------------------------------------------

    async def _process(self, records: list[ConsumerRecord | UnreadableRecord], stop: asyncio.Event) -> None:
        """Process one batch to the end: every record done, dead-lettered, or abandoned by a revoke/stop.

        After a failure the rest of the batch goes in halving chunks, and the loop remembers the size that
        worked: a dependency that is slow (or, like FerretDB, stalls on large bulk writes) rather than down
        then gets work it can finish within its timeout, instead of the same batch timing out forever. The
        limit doubles again after `_GROW_AFTER` attempts in a row without a failure. Chunks keep batch order,
        so a thread's records still go in order.
        """
        metrics.RECORDS_CONSUMED.labels(path=self.path).inc(len(records))
        metrics.BATCH_SIZE.labels(path=self.path).observe(len(records))
        pending = [(rec, self._tracker.track(partition_of(rec), rec.offset)) for rec in records]
        metrics.IN_FLIGHT.labels(path=self.path).set(self._tracker.pending())
        self._idle.clear()
        try:
            left = await retry_batch(
                pending,
                self._attempt,
                backoff=self._backoff,
                wait=lambda failure: self._wait_out(failure, stop),
                keep=self._still_ours,
                chunks=self._chunks,
                recovered=self._recovered,
            )
            if left:
                log.warning(
                    "stopping during an outage: %d records left for the next owner",
                    len(left),
                    extra={"path": self.path},
                )
        except Exception as exc:  # systemic (records are contained): say which batch was in hand
            log.error(  # noqa: TRY400 -- the service logs the traceback once, when the loop's task ends
                "a failure that is no record's fault stops the loop; nothing past the batch is committed",
                extra={"path": self.path, "error_type": type(exc).__name__, "batch": positions(records)},
            )
            raise
        finally:
            if self._intake.holds(OUTAGE):
                self._leave_outage()
            metrics.IN_FLIGHT.labels(path=self.path).set(self._tracker.pending())
            self._idle.set()

    def _still_ours(
        self, items: list[tuple[ConsumerRecord, PartitionOffsets]]
    ) -> list[tuple[ConsumerRecord, PartitionOffsets]]:
        """The items whose partition is still ours (not revoked since they were tracked)."""
        return [(rec, part) for rec, part in items if self._tracker.owns(partition_of(rec), part)]

    def _recovered(self) -> None:
        if self._intake.holds(OUTAGE):
            self._leave_outage()

    async def _wait_out(
        self, failure: Failure[tuple[ConsumerRecord, PartitionOffsets]], stop: asyncio.Event
    ) -> bool:
        """Report the outage, wait out the backoff polling; True when told to stop meanwhile."""
        dependency = self._enter_outage(failure.error, failure.attempt)
        await wait_to_retry(
            self.path,
            dependency,
            failure.delay,
            sleep=lambda delay: self._intake.wait_polling(delay, stop, self._maybe_commit),
        )
        return stop.is_set()

    async def _attempt(
        self, pending: list[tuple[ConsumerRecord, PartitionOffsets]]
    ) -> list[tuple[ConsumerRecord, PartitionOffsets]]:
        """One try at `pending`; returns the records whose outputs failed for an outage (to retry)."""
        results = await self._handler.handle([rec for rec, _ in pending])
        pending, results = self._settlement.take_parked(pending, results)
        started = time.perf_counter()
        failed = await self._settle_now(pending, results)
        metrics.STAGE_SECONDS.labels(path=self.path, stage="produce").observe(time.perf_counter() - started)
        if failed:
            failed.sort(key=lambda item: (item[0].partition, item[0].offset))
            log.warning("%d outputs not acknowledged, will retry", len(failed), extra={"path": self.path})
        return failed

    async def _settle_now(
        self, items: list[tuple[ConsumerRecord, PartitionOffsets]], results: Sequence[Any]
    ) -> list[tuple[ConsumerRecord, PartitionOffsets]]:
        """Wait for the outcomes of `items`: done, or dead letters; returns those failed for an outage."""
        return await settle_outcomes(
            items,
            results,
            reject=lambda item, error: self._dead_letter(item[0], error),
            # Kafka refused the output for its size: the input is dead-lettered (its own bytes fit).
            explain=lambda error: explain_too_large(error, self.path),
            done=self._done,
        )

    def _failure(self) -> BaseException | None:
        """What stops the loop, met outside `run`'s own call chain: a commit, then a parked record's."""
        return self._parked_failure or self._settlement.failure

    def _done(self, item: tuple[ConsumerRecord, PartitionOffsets], outcome: object) -> None:
        """A record's outputs are acknowledged (under exactly-once: held, filed under its offset)."""
        record, part = item
        if self._transactions is not None and self._tracker.owns(partition_of(record), part):
            self._transactions.hold(partition_of(record), record.offset, held_outputs(outcome), record)
        part.done(record.offset)

    # --- parked records -------------------------------------------------------------------------------------

    async def _wait_for_parking_room(self, stop: asyncio.Event) -> None:
        """Too many parked requests: fetch nothing (partitions paused, still polling to stay in the group)
        until some are settled."""
        log.warning(
            "parked requests at their cap: intake paused until some are answered",
            extra={"path": self.path, "parked": self._settlement.parked()},
        )
        self._intake.hold(PARKED)
        while not stop.is_set() and self._settlement.full():
            if self._failure() is not None:
                break
            await self._intake.wait_polling(0.1, stop, self._maybe_commit)
        self._intake.release(PARKED)

    async def _dead_letter(self, record: ConsumerRecord, error: BaseException) -> object:
        """Send `record` to the dead-letter topic and wait for Kafka's acknowledgement."""
        with tracing.output_span("dead-letter", record, **{"message_history.path": self.path}) as span:
            return await self._send_dead_letter(record, error, span)

    async def _send_dead_letter(
        self, record: ConsumerRecord, error: BaseException, span: Span | None
    ) -> object:
        # too large for Kafka: without the value, then without the record's own headers too, saying so
        result = await self._dead_letters.deliver(record, error, span=span)
        kind = error_type(error)
        self._unexpected.report(record, error)
        metrics.DEAD_LETTERS.labels(path=self.path, error_type=kind).inc()
        metrics.OUTCOMES.labels(path=self.path, outcome="dead-letter").inc()
        log.warning(
            "dead-lettered a record",
            extra={
                "path": self.path,
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "error_type": kind,
                "dead_letter_topic": self._dead_letters.topic,
            },
        )
        return result

    # --- outages --------------------------------------------------------------------------------------------

    def _enter_outage(self, error: BaseException | None, attempt: int) -> str:
        """Not ready, intake paused, said once (`OutageLog`); returns the dependency that is down."""
        dependency = outage_dependency(error)
        reason = f"{dependency} unavailable: {type(error).__name__ if error else 'outputs not acknowledged'}"
        # one WARNING when it starts, a summary every so often, one INFO when it is back (`OutageLog`)
        detail = f" ({str(error)[:200]})" if error else ""
        self._outage_logs[dependency].failed(f"{reason}: intake paused{detail}")
        self._health.set_ready(self.path, False, reason)
        self._intake.hold(OUTAGE)
        log.debug("retrying batch", extra={"path": self.path, "attempt": attempt, "reason": reason})
        return dependency

    def _leave_outage(self) -> None:
        self._intake.release(OUTAGE)
        if not self._stopping:
            self._health.set_ready(self.path, True)
        for outage_log in self._outage_logs.values():
            outage_log.back()

    # --- commits --------------------------------------------------------------------------------------------

    def _maybe_commit(self) -> None:
        """Start a background commit when the interval has passed and none is running."""
        if self._commit_task is not None and not self._commit_task.done():
            return
        if time.monotonic() - self._last_commit < self._opts.commit_interval_s:
            return
        self._last_commit = time.monotonic()
        offsets = self._tracker.committable()
        if offsets:
            self._commit_task = asyncio.create_task(self._commit(offsets, reason="interval"))

    async def _commit_now(self, partitions: Sequence[TopicPartition], *, reason: str) -> None:
        """Commit the done watermark of `partitions` and wait for it (revoke, shutdown)."""
        if self._commit_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
        offsets = self._tracker.committable([tp for tp in partitions if tp in self._intake.assigned])
        if offsets:
            await self._commit(offsets, reason=reason)

    async def _commit(self, offsets: dict[TopicPartition, int], *, reason: str) -> None:
        started = time.perf_counter()
        if self._transactions is not None:
            offsets = await self._commit_transactions(self._transactions, offsets, reason=reason)
            self._committed(offsets, reason, started)
            return
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), self._opts.commit_timeout_s)
        except (CommitFailedError, IllegalStateError) as exc:
            # the group rebalanced under us: the revoke commit (or the next owner) takes over
            log.warning("commit refused", extra={"path": self.path, "reason": reason, "error": str(exc)})
            return
        except (KafkaError, TimeoutError) as exc:
            metrics.RETRIES.labels(path=self.path, dependency="kafka").inc()
            log.warning(
                "commit failed; the next one retries",
                extra={"path": self.path, "reason": reason, "error": type(exc).__name__},
            )
            return
        self._committed(offsets, reason, started)

    def _committed(self, offsets: dict[TopicPartition, int], reason: str, started: float) -> None:
        self._tracker.mark_committed(offsets)
        metrics.STAGE_SECONDS.labels(path=self.path, stage="commit").observe(time.perf_counter() - started)
        for tp, offset in offsets.items():
            metrics.COMMITTED_OFFSET.labels(topic=tp.topic, partition=str(tp.partition)).set(offset)
        log.debug(
            "committed",
            extra={
                "path": self.path,
                "reason": reason,
                "offsets": {str(tp.partition): o for tp, o in offsets.items()},
            },
        )

    async def _commit_transactions(
        self, transactions: PartitionTransactions, offsets: dict[TopicPartition, int], *, reason: str
    ) -> dict[TopicPartition, int]:
        """Each partition's held outputs below its watermark and the watermark, one transaction per partition,
        all at once; returns the offsets committed. What a failure means is `commit_failure`'s: an outage
        (or a commit in doubt, settled by the next one before anything is sent again) is retried, missing
        ACLs make the path not ready, anything else stops the loop."""
        parts = list(offsets.items())
        results = await asyncio.gather(
            *(
                asyncio.wait_for(transactions.commit(tp, offset), self._opts.commit_timeout_s)
                for tp, offset in parts
            ),
            return_exceptions=True,
        )
        committed: dict[TopicPartition, int] = {}
        for (tp, offset), result in zip(parts, results, strict=True):
            if result is True:
                committed[tp] = offset
                self._failing.discard(tp)
            elif isinstance(result, (KafkaError, TimeoutError, ConnectionError, RetriableError)):
                self._transaction_failed(tp, result, in_doubt=tp in transactions.in_doubt(), reason=reason)
            elif isinstance(result, BaseException) and self._parked_failure is None:
                self._parked_failure = result  # a bug, maybe in a background commit: `run` raises it
        if committed and self._unauthorized:
            self._unauthorized = False
            self._health.set_ready(self.path, True)
            log.info("transactions authorized again", extra={"path": self.path})
        return committed

    def _transaction_failed(
        self, tp: TopicPartition, error: BaseException, *, in_doubt: bool, reason: str
    ) -> None:
        where = {
            "path": self.path,
            "reason": reason,
            "partition": tp.partition,
            "error": type(error).__name__,
        }
        failure = commit_failure(error)
        if failure == "outage":
            metrics.RETRIES.labels(path=self.path, dependency="kafka").inc()
            # once per partition and failure streak (an outage fails every commit: said, not shouted)
            level = logging.DEBUG if tp in self._failing else logging.WARNING
            self._failing.add(tp)
            if in_doubt:  # asked, not answered in time: the same producer waits for the answer, never guessed
                log.log(
                    level,
                    "commit outcome unknown yet (no answer in time); settled before any resend",
                    extra=where,
                )
            else:
                log.log(
                    level, "transaction failed (aborted); the next commit retries its outputs", extra=where
                )
        elif failure == "unauthorized":
            self._refused_access(error, where)
        elif self._parked_failure is None:  # neither retriable nor fencing: never retried at every commit
            log.error("a transaction refused for good (not retriable): stopping the loop", extra=where)
            self._parked_failure = error

    def _refused_access(self, error: BaseException, where: dict[str, object]) -> None:
        """A missing ACL (not fencing: nobody else holds the partition): not ready, ERROR, counted (the
        chart alerts on it); retried, and ready again once a transaction goes through."""
        metrics.KAFKA_AUTHORIZATION_FAILURES.labels(path=self.path, error_type=type(error).__name__).inc()
        log.error(  # an ACL to grant, not a traceback to read
            "Kafka authorization failed for a transaction: grant the ACLs (docs/security.md); not ready",
            extra={**where, "detail": str(error)[:300]},
        )
        self._unauthorized = True
        self._health.set_ready(self.path, False, f"kafka authorization failed: {type(error).__name__}")

    async def _refused_output(
        self, tp: TopicPartition, offset: int, source: object, error: BaseException
    ) -> list[HeldOutput]:
        """Exactly-once: the broker refused an output of the record at `offset` for its size (the topic's
        `max.message.bytes`): the record's dead letter replaces its outputs, in the same transaction."""
        if not isinstance(source, ConsumerRecord):
            return []
        explained = explain_too_large(error, self.path)
        return held_outputs(await self._send_dead_letter(source, explained, None))

    async def _wait_for_held_room(self, stop: asyncio.Event) -> None:
        """Exactly-once: held outputs at their cap (commits failing, or slower than intake): fetch nothing,
        partitions paused and still polling, until commits drain them."""
        transactions = self._transactions
        if transactions is None:
            return
        log.warning(
            "held outputs at their cap (MAX_HELD_OUTPUTS): intake paused until commits drain them",
            extra={"path": self.path, "held": transactions.held()},
        )
        self._intake.hold(HELD)
        while not stop.is_set() and transactions.full() and self._failure() is None:
            await self._intake.wait_polling(0.1, stop, self._maybe_commit)
        self._intake.release(HELD)

    async def open_transactions(self, assigned: set[TopicPartition]) -> None:
        """Exactly-once: before the new partitions are read, a transactional producer for each (fencing any
        zombie holding its id, completing its open transaction), then the partitions start from the offset
        committed after that: pending transactional offsets are not visible before (no KIP-447 here)."""
        if self._transactions is None or not assigned:
            return
        owned = sorted(assigned, key=lambda tp: tp.partition)
        transactions = self._transactions

        async def wait(failure: Failure[None]) -> bool:
            # the partitions cannot be read safely before their ids are fenced: retry, holding the rebalance
            if self._stopping and failure.error is not None:
                metrics.RETRIES.labels(path=self.path, dependency="kafka").inc()
                raise failure.error
            await wait_to_retry(
                self.path,
                "kafka",
                failure.delay,
                "transactional producers not ready; retrying",
                extra={"error": type(failure.error).__name__, "attempt": failure.attempt},
                logger=log,
            )
            return False

        async def open_and_seek() -> None:
            try:
                await transactions.open(owned)
            except UNAUTHORIZED as exc:  # InitProducerId refused: an ACL to grant, retried meanwhile
                self._refused_access(exc, {"path": self.path, "error": type(exc).__name__})
                raise KafkaConnectionError(f"transactional producers not authorized: {exc}") from exc
            if self._unauthorized:
                self._unauthorized = False
                self._health.set_ready(self.path, True)
            for tp in owned:
                offset = await self._consumer.committed(tp)
                if offset is not None:
                    self._consumer.seek(tp, offset)

        try:
            await retry_call(open_and_seek, backoff=self._backoff, wait=wait)
        except Exception as exc:
            # raised out of the listener, aiokafka would log it and keep the partitions assigned but never
            # taken (a silent stall): stop the loop with it instead (`run` raises it)
            if not self._stopping and self._parked_failure is None:
                log.error(  # noqa: TRY400 -- the service logs the traceback once, when the loop's task ends
                    "transactional producers could not be opened (not an outage): stopping the loop",
                    extra={"path": self.path, "error_type": type(exc).__name__, "error": str(exc)[:300]},
                )
                self._parked_failure = exc
            raise

    # --- rebalances -----------------------------------------------------------------------------------------

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish (within the drain deadline) or abandon the batch in flight; commit; forget."""
        metrics.REBALANCES.labels(path=self.path, kind="revoked").inc()
        if not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), self._opts.revoke_drain_s)
            except TimeoutError:
                log.warning(
                    "revoke: in-flight batch not finished in time, abandoning it",
                    extra={"path": self.path, "pending": self._tracker.pending()},
                )
        await self._settlement.drop(revoked)
        await self._commit_now(sorted(revoked), reason="revoke")
        if self._transactions is not None:
            await self._transactions.close(revoked)  # held outputs not committed: the next owner redoes them
        self._tracker.forget(revoked)
        self._intake.drop(revoked)
        log.info(
            "partitions revoked",
            extra={"path": self.path, "partitions": sorted(tp.partition for tp in revoked)},
        )

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.open_transactions(assigned)
        self.on_assigned(assigned)

    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Take the new partitions; fetching starts from the group's committed offsets."""
        metrics.REBALANCES.labels(path=self.path, kind="assigned").inc()
        self._intake.take(assigned)  # fetching starts again from the committed offset
        log.info(
            "partitions assigned",
            extra={"path": self.path, "partitions": sorted(tp.partition for tp in assigned)},
        )
