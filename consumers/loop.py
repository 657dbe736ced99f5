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
import logging
import random
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from consumers.consumer import Health, LoopOptions, stop_consumer
from consumers.contract import BatchHandler
from consumers.kafka_watch import KafkaWatch
from consumers.offsets import OffsetTracker, PartitionOffsets
from consumers.outage_log import OutageLog
from consumers.runtime.checkpoint import AtLeastOnce, Checkpoint, ExactlyOnce
from consumers.runtime.containment import Contained, settle_outcomes
from consumers.runtime.dead_letters import DeadLetters
from consumers.runtime.intake import HELD, OUTAGE, PARKED, Intake, Listener, partition_of, positions
from consumers.runtime.retry import (
    Backoff,
    ChunkLimit,
    Failure,
    outage_dependency,
    retry_batch,
    wait_to_retry,
)
from consumers.runtime.settlement import Settlement
from consumers.unreadable import SkippingUnreadable, UnreadableRecord
from message_history import metrics
from producers.dead_letters import DeadLetterPublisher
from producers.output import explain_too_large
from producers.transactions import PartitionTransactions

log = logging.getLogger(__name__)


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
        self._dead_letters = DeadLetters(path, dead_letters, log)
        self._health = health
        self._opts = options
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._idle = asyncio.Event()  # set while no batch is in flight
        self._idle.set()
        self._stopping = False
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
        # what is done becomes committed: the consumer's commits, or transactions (`producers.transactions`)
        self._checkpoint: Checkpoint = AtLeastOnce(
            path=path, consumer=consumer, tracker=self._tracker, health=health, options=options
        )
        if transactions is not None:
            self._checkpoint = ExactlyOnce(
                transactions,
                refused=self._dead_letters.refused_output,
                backoff=self._backoff,
                stopping=lambda: self._stopping,
                path=path,
                consumer=consumer,
                tracker=self._tracker,
                health=health,
                options=options,
            )
        # Kafka's reachability, which `getmany` does not tell (hooks: `run`, `__aexit__`)
        self._kafka_watch = KafkaWatch(consumer, health, path, grace_s=options.kafka_grace_s)
        self._outage_logs = {dep: OutageLog(path, dep) for dep in ("kafka", "mongodb")}

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
            ours = [tp for tp in self._intake.assigned if self._checkpoint.owns(tp)]
            committed = not self._tracker.committable(ours)
        except TimeoutError:
            log.warning("shutdown commit did not finish in time", extra={"path": self.path})
        finally:
            await self._checkpoint.close()
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
            if self._checkpoint.full():
                await self._wait_for_held_room(stop)
                continue
            batch = await self._intake.fetch()
            if batch:
                await self._process(batch, stop)
            self._checkpoint.maybe_commit()
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
            sleep=lambda delay: self._intake.wait_polling(delay, stop, self._checkpoint.maybe_commit),
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
            reject=lambda item, error: self._dead_letters.send(item[0], error),
            # Kafka refused the output for its size: the input is dead-lettered (its own bytes fit).
            explain=lambda error: explain_too_large(error, self.path),
            done=self._done,
        )

    def _failure(self) -> BaseException | None:
        """What stops the loop, met outside `run`'s own call chain: a commit, then a parked record's."""
        return self._checkpoint.failure or self._settlement.failure

    def _done(self, item: tuple[ConsumerRecord, PartitionOffsets], outcome: object) -> None:
        """A record's outputs are acknowledged (under exactly-once: held, filed under its offset)."""
        record, part = item
        if self._tracker.owns(partition_of(record), part):
            self._checkpoint.hold(partition_of(record), record, outcome)
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
            await self._intake.wait_polling(0.1, stop, self._checkpoint.maybe_commit)
        self._intake.release(PARKED)

    async def _commit_now(self, partitions: Sequence[TopicPartition], *, reason: str) -> None:
        """Commit the done watermark of those of `partitions` still assigned, and wait (revoke, shutdown)."""
        assigned = self._intake.assigned
        await self._checkpoint.commit_now([tp for tp in partitions if tp in assigned], reason=reason)

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

    async def _wait_for_held_room(self, stop: asyncio.Event) -> None:
        """Exactly-once: held outputs at their cap (commits failing, or slower than intake): fetch nothing,
        partitions paused and still polling, until commits drain them."""
        log.warning(
            "held outputs at their cap (MAX_HELD_OUTPUTS): intake paused until commits drain them",
            extra={"path": self.path, "held": self._checkpoint.held()},
        )
        self._intake.hold(HELD)
        while not stop.is_set() and self._checkpoint.full() and self._failure() is None:
            await self._intake.wait_polling(0.1, stop, self._checkpoint.maybe_commit)
        self._intake.release(HELD)

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
        await self._checkpoint.revoked(revoked)
        self._tracker.forget(revoked)
        self._intake.drop(revoked)
        log.info(
            "partitions revoked",
            extra={"path": self.path, "partitions": sorted(tp.partition for tp in revoked)},
        )

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._checkpoint.assigned(assigned)
        self.on_assigned(assigned)

    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Take the new partitions; fetching starts from the group's committed offsets."""
        metrics.REBALANCES.labels(path=self.path, kind="assigned").inc()
        self._intake.take(assigned)  # fetching starts again from the committed offset
        log.info(
            "partitions assigned",
            extra={"path": self.path, "partitions": sorted(tp.partition for tp in assigned)},
        )
