"""The batch consumer loop of one path: run -> fetch -> attempt -> settle -> checkpoint; rebalances; shutdown.

One `StreamLoop` per path, each with its own `AIOKafkaConsumer` in the service's consumer group. Per batch:
the intake fetches it (`runtime.intake`: careful reads of unreadable batches, pausing held by named reasons);
each record is tracked in its partition's done watermark (`consumers.offsets`); the path's `BatchHandler`
returns a `Done`, `Refused` or `Parked` per record (`consumers.contract`), a batch it raises for being halved
down to the record that raises (`runtime.containment`); the outcomes are settled: done, or dead letters
(`runtime.dead_letters`), a parked record in the background (`runtime.settlement`); what is done is committed
by the checkpoint (`runtime.checkpoint`: at-least-once, or exactly-once with the outputs in one transaction
per partition), in the background at most every `commit_interval_ms`, and at revoke and shutdown.

An outage is no record's fault: the loop holds its intake paused, reports not-ready and retries the records
not done after a backoff (`runtime.retry`, `runtime.outages`), polling to stay in the group. A bug met on one
record is that record's dead letter, counted once per record; only a systemic refusal stops the loop, without
committing past the failed work. The README's "consumers/runtime" section says which job lives where.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from consumers.consumer import Health, LoopOptions, stop_consumer
from consumers.contract import BatchHandler, Done, Refused
from consumers.kafka_watch import KafkaWatch
from consumers.offsets import OffsetTracker
from consumers.runtime.checkpoint import Checked, checkpoint_for
from consumers.runtime.containment import Contained, settle_outcomes
from consumers.runtime.dead_letters import DeadLetters
from consumers.runtime.emit import Sender
from consumers.runtime.intake import HELD, PARKED, Intake, Listener, partition_of, positions
from consumers.runtime.outages import Outages
from consumers.runtime.retry import Backoff, ChunkLimit, retry_batch
from consumers.runtime.settlement import Item, Settlement
from consumers.unreadable import SkippingUnreadable, UnreadableRecord
from message_history import metrics
from producers.dead_letters import DeadLetterPublisher
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
        output: Sender | PartitionTransactions,
    ) -> None:
        """`output`: where the path's outputs go, the shared producer (at-least-once) or one transaction per
        partition (exactly-once); the checkpoint hands each batch its channel (`runtime.emit`)."""
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
        self._checkpoint = checkpoint_for(
            output,
            Checked(path, consumer, self._tracker, health, options),
            refused=self._dead_letters.refused_output,
            backoff=self._backoff,
            stopping=lambda: self._stopping,
        )
        # Kafka's reachability, which `getmany` does not tell (hooks: `run`, `__aexit__`)
        self._kafka_watch = KafkaWatch(consumer, health, path, grace_s=options.kafka_grace_s)
        self._outages = Outages(path, health, self._intake, lambda: self._stopping)

    def done_offset(self, partition: int) -> int | None:
        """Next offset of `partition` of this loop's topic not yet done here (None: not owned or not read);
        the turn barrier reads it for the persist path: everything below it is written and acknowledged."""
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
        """Final commit of what is done (half of the time left, at most its usual bound), then leave the
        group (the rest), by `exit_deadline` (monotonic; set by the service, else `exit_timeout_s` from now)
        whatever the group does; `stopped_cleanly` says afterwards whether both were done in time."""
        await self._kafka_watch.stop()
        await self._settlement.drop(None)  # parked requests are left uncommitted, for the next owner
        self._stopping = True
        self._health.set_ready(self.path, False, "stopping")
        deadline = self.exit_deadline or time.monotonic() + self._opts.exit_timeout_s
        committed = False
        try:
            bound = min(self._opts.commit_timeout_s, (deadline - time.monotonic()) / 2)
            async with asyncio.timeout(max(0.0, bound)):
                await self._checkpoint.commit_now(self._intake.owned(self._tracker.keys()), reason="shutdown")
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
        listener = Listener(self.on_revoked, self.on_assigned)
        if not await self._intake.subscribe_once_topic_exists(stop, listener):
            return
        self._kafka_watch.start()
        while not stop.is_set():
            self._health.beat(self.path)
            failure = self._failure()
            if failure is not None:
                raise failure
            if self._settlement.full():
                said = "parked requests at their cap: intake paused until some are answered"
                await self._wait_for_room(
                    PARKED, self._settlement.full, stop, said, self._settlement.parked()
                )
                continue
            if self._checkpoint.full():
                said = "held outputs at their cap (MAX_HELD_OUTPUTS): intake paused until commits drain them"
                await self._wait_for_room(HELD, self._checkpoint.full, stop, said, self._checkpoint.held())
                continue
            batch = await self._intake.fetch()
            if batch:
                await self._process(batch, stop)
            self._checkpoint.maybe_commit()
        self._stopping = True

    # --- processing -----------------------------------------------------------------------------------------

    async def _process(self, records: list[ConsumerRecord | UnreadableRecord], stop: asyncio.Event) -> None:
        """Process one batch to the end: every record done, dead-lettered, or abandoned by a revoke/stop.
        After a failure the rest goes in halving chunks (`ChunkLimit`: a slow dependency gets work it can
        finish), doubled again after `_GROW_AFTER` clean attempts; chunks keep batch order."""
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
                wait=lambda failure: self._outages.wait_out(failure, stop, self._checkpoint.maybe_commit),
                keep=self._still_ours,
                chunks=self._chunks,
                recovered=self._outages.leave,
            )
            if left:
                said = "stopping during an outage: %d records left for the next owner"
                log.warning(said, len(left), extra={"path": self.path})
        except Exception as exc:  # systemic (records are contained): say which batch was in hand
            log.error(  # noqa: TRY400 -- the service logs the traceback once, when the loop's task ends
                "a failure that is no record's fault stops the loop; nothing past the batch is committed",
                extra={"path": self.path, "error_type": type(exc).__name__, "batch": positions(records)},
            )
            raise
        finally:
            self._outages.leave()
            metrics.IN_FLIGHT.labels(path=self.path).set(self._tracker.pending())
            self._idle.set()

    def _still_ours(self, items: list[Item]) -> list[Item]:
        """The items whose partition is still ours (not revoked since they were tracked)."""
        return [(rec, part) for rec, part in items if self._tracker.owns(partition_of(rec), part)]

    async def _attempt(self, pending: list[Item]) -> list[Item]:
        """One try at `pending`; returns the records whose outputs failed for an outage (to retry)."""
        results = await self._handler.handle([rec for rec, _ in pending], self._checkpoint.emit)
        pending, now = self._settlement.take_parked(pending, results)
        started = time.perf_counter()
        failed = await self._settle_now(pending, now)
        metrics.STAGE_SECONDS.labels(path=self.path, stage="produce").observe(time.perf_counter() - started)
        if failed:
            failed.sort(key=lambda item: (item[0].partition, item[0].offset))
            log.warning("%d outputs not acknowledged, will retry", len(failed), extra={"path": self.path})
        return failed

    async def _settle_now(self, items: list[Item], results: Sequence[Done | Refused]) -> list[Item]:
        """Wait for the outcomes of `items`: done, or dead letters; returns those failed for an outage."""
        return await settle_outcomes(
            items,
            results,
            reject=lambda item, error: self._dead_letters.send(item[0], error, self._checkpoint.emit),
            explain=self._dead_letters.explain,  # an output too large: the input is the dead letter
            done=self._done,
        )

    def _failure(self) -> BaseException | None:
        """What stops the loop, met outside `run`'s own call chain: a commit, then a parked record's."""
        return self._checkpoint.failure or self._settlement.failure

    def _done(self, item: Item, outcome: object) -> None:
        """A record's outputs are acknowledged (under exactly-once: held, filed under its offset)."""
        record, part = item
        if self._tracker.owns(partition_of(record), part):
            self._checkpoint.hold(partition_of(record), record)
        part.done(record.offset)

    # --- waits and commits ----------------------------------------------------------------------------------

    async def _wait_for_room(
        self, reason: str, full: Callable[[], bool], stop: asyncio.Event, said: str, count: int
    ) -> None:
        """Parked requests (PARKED) or, exactly-once, held outputs (HELD) at their cap: fetch nothing
        (partitions paused, still polling to stay in the group) until some are settled or committed."""
        log.warning(said, extra={"path": self.path, reason: count})
        self._intake.hold(reason)
        while not stop.is_set() and full() and self._failure() is None:
            await self._intake.wait_polling(0.1, stop, self._checkpoint.maybe_commit)
        self._intake.release(reason)

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
        await self._checkpoint.commit_now(self._intake.owned(sorted(revoked)), reason="revoke")
        await self._checkpoint.revoked(revoked)
        self._tracker.forget(revoked)
        self._intake.drop(revoked)
        log.info(
            "partitions revoked",
            extra={"path": self.path, "partitions": sorted(tp.partition for tp in revoked)},
        )

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Take the new partitions (exactly-once: their producers opened first); fetching starts from the
        group's committed offsets."""
        await self._checkpoint.assigned(assigned)
        metrics.REBALANCES.labels(path=self.path, kind="assigned").inc()
        self._intake.take(assigned)  # fetching starts again from the committed offset
        log.info(
            "partitions assigned",
            extra={"path": self.path, "partitions": sorted(tp.partition for tp in assigned)},
        )
