"""A loop's checkpoint: what is done becomes committed. Two implementations with one shape, `assigned /
revoked / hold / commit / close` (quix-streams' `Checkpoint` is the model):

- `AtLeastOnce`: outputs are sent as they are made (its `emit` is `runtime.emit.SendNow`); a commit is the
  consumer's offset commit.
- `ExactlyOnce`: outputs are filed under their record's offset (its `emit` is `runtime.emit.FileUnderOffset`)
  and held once the record is done (`producers.transactions`); a partition's commit is one transaction
  producing the held outputs below its done watermark, then committing the watermark. Newly assigned
  partitions get their transactional producer (fencing zombies) before they are read.

The loop hands each batch the checkpoint's `emit`: paths hold no producer.

A background commit runs at most every `commit_interval_ms` and never holds the loop up; revoke and shutdown
commit and wait. A commit failing for an outage is retried by the next one (never inline: the loop keeps
polling, so it stays in its group, and a stop is honoured at once); one failing for good is kept in `failure`
for the loop to raise. The service's paths and the worker SDK (`worker.runner`) share this policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaConnectionError, KafkaError

from consumers.consumer import Health, LoopOptions
from consumers.offsets import OffsetTracker
from consumers.runtime.emit import FileUnderOffset, Sender, SendNow
from consumers.runtime.retry import Backoff, Failure, is_outage, retry_call, wait_to_retry
from message_history import metrics
from message_history.errors import RetriableError
from producers.output import Emit
from producers.transactions import (
    UNAUTHORIZED,
    HeldOutput,
    PartitionTransactions,
    commit_failure,
)

log = logging.getLogger(__name__)

RefusedOutput = Callable[[ConsumerRecord, BaseException, Emit], Awaitable[object]]
"""Exactly-once: the dead letter (through the `Emit` given) of a record one of whose outputs the broker
refused for its size."""


@dataclass(frozen=True, slots=True)
class Checked:
    """What a checkpoint works with: the loop's path, consumer, done watermarks, health and knobs."""

    path: str
    consumer: AIOKafkaConsumer
    tracker: OffsetTracker[TopicPartition]
    health: Health
    options: LoopOptions


def checkpoint_for(
    output: Sender | PartitionTransactions,
    checked: Checked,
    *,
    refused: RefusedOutput,
    backoff: Backoff,
    stopping: Callable[[], bool],
) -> Checkpoint:
    """Exactly-once when the loop's outputs go through transactions, else at-least-once on the producer."""
    if not isinstance(output, PartitionTransactions):
        return AtLeastOnce(checked, output)
    return ExactlyOnce(checked, output, refused=refused, backoff=backoff, stopping=stopping)


class Checkpoint:
    """What both implementations share: the commit schedule and what a commit records."""

    emit: Emit  # the channel each batch's outputs go through

    def __init__(self, checked: Checked) -> None:
        self.path = checked.path
        self._consumer = checked.consumer
        self._tracker = checked.tracker
        self._health = checked.health
        self._opts = checked.options
        self._task: asyncio.Task[None] | None = None
        self._last = time.monotonic()
        self.failure: BaseException | None = None  # a commit that failed for good: the loop raises it

    # --- what differs ---------------------------------------------------------------------------------------

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """Before the new partitions are read."""

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        """After the revoked partitions' last commit."""

    def hold(self, tp: TopicPartition, record: ConsumerRecord) -> None:
        """A record is done (its outputs emitted and acknowledged)."""

    def owns(self, tp: TopicPartition) -> bool:
        return True

    def full(self) -> bool:
        """True when intake must wait for commits to drain what is held."""
        return False

    def held(self) -> int:
        return 0

    async def close(self) -> None:
        """At shutdown, after the last commit."""

    async def _write(self, offsets: dict[TopicPartition, int], reason: str) -> dict[TopicPartition, int]:
        raise NotImplementedError

    # --- what is shared -------------------------------------------------------------------------------------

    def maybe_commit(self) -> None:
        """Start a background commit when the interval has passed and none is running."""
        if self._task is not None and not self._task.done():
            return
        if time.monotonic() - self._last < self._opts.commit_interval_s:
            return
        self._last = time.monotonic()
        offsets = self._tracker.committable()
        if offsets:
            self._task = asyncio.create_task(self.commit(offsets, reason="interval"))
            self._task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        """A background commit that raised for anything but an outage (a bug: `_write` turns commit failures
        into results) is the loop's failure, not an exception nobody retrieves while commits go on."""
        error = None if task.cancelled() else task.exception()
        if error is not None and not is_outage(error) and self.failure is None:
            self.failure = error

    async def commit_now(self, partitions: Iterable[TopicPartition], *, reason: str) -> None:
        """Commit the done watermark of `partitions` and wait for it (revoke, shutdown)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        offsets = self._tracker.committable(list(partitions))
        if offsets:
            await self.commit(offsets, reason=reason)

    async def commit(self, offsets: dict[TopicPartition, int], *, reason: str) -> None:
        started = time.perf_counter()
        offsets = await self._write(offsets, reason)
        if not offsets:
            return
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


class AtLeastOnce(Checkpoint):
    """Outputs go at once; a commit is the consumer's."""

    def __init__(self, checked: Checked, producer: Sender) -> None:
        super().__init__(checked)
        self.emit = SendNow(producer)

    async def _write(self, offsets: dict[TopicPartition, int], reason: str) -> dict[TopicPartition, int]:
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), self._opts.commit_timeout_s)
        except (CommitFailedError, IllegalStateError) as exc:
            # the group rebalanced under us: the revoke commit (or the next owner) takes over
            log.warning("commit refused", extra={"path": self.path, "reason": reason, "error": str(exc)})
            return {}
        except (KafkaError, TimeoutError) as exc:
            metrics.RETRIES.labels(path=self.path, dependency="kafka").inc()
            log.warning(
                "commit failed; the next one retries",
                extra={"path": self.path, "reason": reason, "error": type(exc).__name__},
            )
            return {}
        return offsets


class ExactlyOnce(Checkpoint):
    """Outputs held per record, committed with the offsets, one transaction per partition."""

    def __init__(
        self,
        checked: Checked,
        transactions: PartitionTransactions,
        *,
        refused: RefusedOutput,
        backoff: Backoff,
        stopping: Callable[[], bool],
    ) -> None:
        super().__init__(checked)
        self.transactions = transactions
        self.emit = self._filed = FileUnderOffset()
        self._refused = refused
        self._backoff = backoff
        self._stopping = stopping
        self._unauthorized = False  # a transaction was refused for a missing ACL
        self._failing: set[TopicPartition] = set()  # partitions whose commits fail (a streak is logged once)
        transactions.refused = self._refused_output
        transactions.read_committed = checked.consumer.committed

    def hold(self, tp: TopicPartition, record: ConsumerRecord) -> None:
        self.transactions.hold(tp, record.offset, self._filed.take(record), record)

    def owns(self, tp: TopicPartition) -> bool:
        return self.transactions.owns(tp)

    def full(self) -> bool:
        return self.transactions.full()

    def held(self) -> int:
        return self.transactions.held()

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        self._filed.drop(partitions)
        await self.transactions.close(partitions)  # held outputs not committed: the next owner redoes them

    async def close(self) -> None:
        self._filed.drop()
        await self.transactions.close()

    async def _write(self, offsets: dict[TopicPartition, int], reason: str) -> dict[TopicPartition, int]:
        """Each partition's held outputs below its watermark and the watermark, one transaction per partition,
        all at once; returns the offsets committed. What a failure means is `commit_failure`'s: an outage
        (or a commit in doubt, settled by the next one before anything is sent again) is retried, missing
        ACLs make the path not ready, anything else stops the loop."""
        parts = list(offsets.items())
        results = await asyncio.gather(
            *(
                asyncio.wait_for(self.transactions.commit(tp, offset), self._opts.commit_timeout_s)
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
                in_doubt = tp in self.transactions.in_doubt()
                self._transaction_failed(tp, result, in_doubt=in_doubt, reason=reason)
            elif isinstance(result, BaseException) and self.failure is None:
                self.failure = result  # a bug, maybe in a background commit: the loop raises it
        if committed and self._unauthorized:
            self._authorized()
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
        elif self.failure is None:  # neither retriable nor fencing: never retried at every commit
            log.error("a transaction refused for good (not retriable): stopping the loop", extra=where)
            self.failure = error

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

    def _authorized(self) -> None:
        self._unauthorized = False
        self._health.set_ready(self.path, True)
        log.info("transactions authorized again", extra={"path": self.path})

    async def _refused_output(
        self, tp: TopicPartition, offset: int, source: object, error: BaseException
    ) -> list[HeldOutput]:
        """The broker refused an output of the record at `offset` for its size (the topic's
        `max.message.bytes`): the record's dead letter replaces its outputs, in the same transaction."""
        if not isinstance(source, ConsumerRecord):
            return []
        letter = FileUnderOffset()  # its own channel: what is filed there replaces the record's outputs
        await self._refused(source, error, letter)
        return letter.take(source)

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """Before the new partitions are read, a transactional producer for each (fencing any zombie holding
        its id, completing its open transaction), then the partitions start from the offset committed after
        that: pending transactional offsets are not visible before (no KIP-447 here)."""
        if not partitions:
            return
        owned = sorted(partitions, key=lambda tp: tp.partition)
        try:
            await retry_call(lambda: self._open_and_seek(owned), backoff=self._backoff, wait=self._wait_open)
        except Exception as exc:
            # raised out of the listener, aiokafka would log it and keep the partitions assigned but never
            # taken (a silent stall): stop the loop with it instead (the loop raises it)
            if not self._stopping() and self.failure is None:
                log.error(  # noqa: TRY400 -- the service logs the traceback once, when the loop's task ends
                    "transactional producers could not be opened (not an outage): stopping the loop",
                    extra={"path": self.path, "error_type": type(exc).__name__, "error": str(exc)[:300]},
                )
                self.failure = exc
            raise

    async def _wait_open(self, failure: Failure[None]) -> bool:
        # the partitions cannot be read safely before their ids are fenced: retry, holding the rebalance
        if self._stopping() and failure.error is not None:
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

    async def _open_and_seek(self, owned: list[TopicPartition]) -> None:
        try:
            await self.transactions.open_at_committed(owned, lambda tp, at: self._consumer.seek(tp, at))
        except UNAUTHORIZED as exc:  # InitProducerId refused: an ACL to grant, retried meanwhile
            self._refused_access(exc, {"path": self.path, "error": type(exc).__name__})
            raise KafkaConnectionError(f"transactional producers not authorized: {exc}") from exc
        if self._unauthorized:
            self._authorized()
