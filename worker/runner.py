"""`AgentWorker`: the other half of the pipeline, `agent.requests.enriched` in, `agent.responses` out.

    async def answer(turn: Turn) -> Reply | str:
        return Reply.text(await my_model(turn.messages))

    async with AgentWorker(answer, bootstrap_servers="localhost:9092", group_id="my-agent") as worker:
        await worker.run()  # until SIGTERM/SIGINT or worker.stop()

Per batch of enriched requests: one thread's turns in order, different threads concurrently (at most
`max_concurrent_turns`). Per turn (`worker.answer`), the handler is called with the `Turn`; its `Reply`
becomes the `AgentResponse` (see `worker.turn`), sent with the enriched record's headers (the `traceparent`
replaced by the turn's span when tracing is on) and waited for. A handler that raises (or times out) answers a
failed turn, `finishReason: "error"`, logged with the traceback. Offsets are committed once the batch's
responses are acknowledged by Kafka: a crash redelivers, never loses (at-least-once), and copies of an
`eventId` already answered are dropped (`worker.turn.SeenEvents` says how far that goes). An enriched record
that does not decode is logged and skipped (the service never writes one; the worker has no dead-letter
topic).

With `processing_guarantee="exactly-once"` (the service's `MESSAGE_HISTORY_PROCESSING_GUARANTEE`, which
`from_settings` follows) each response is held, and at the end of the batch the answered responses of each
partition go out with that partition's consumed offset in one Kafka transaction. A crash, a rebalance or a
zombie worker then never makes a response visible twice to `read_committed` readers (the service's persist
path reads so). The worker always reads `read_committed`: under exactly-once the service's aborted enriched
requests are never answered.

The Kafka side is the service's runtime (`consumers.runtime`): `Intake` fetches (a record batch that cannot
be read is read record by record, its records skipped as invalid; records of a partition whose assignment is
not taken yet are handed back) and `Checkpoint` commits, at-least-once or exactly-once (a transactional
producer per partition, opened and fenced before the partition is read; a commit in doubt settled before
anything is sent again). A commit that fails for an outage is retried by the next commit, as the service's.

SIGTERM (and SIGINT) stop fetching; the batch in flight gets `shutdown_grace_s` to finish, then what is left
is cancelled and not committed (the next owner answers it); then the offsets of what was answered are
committed, the consumer leaves the group and the producer flushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.consumer import LoopOptions
from consumers.lanes import run_lanes
from consumers.offsets import OffsetTracker, PartitionOffsets
from consumers.runtime.checkpoint import Checked, Checkpoint, checkpoint_for
from consumers.runtime.intake import HELD, Fetched, Intake, Listener, partition_of
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.transactions import PartitionTransactions
from worker.answer import (
    PATH,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    Answerer,
    Handler,
    WorkerStats,
    backoff,
)
from worker.turn import SeenEvents

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S: Final = 10.0  # one try at a commit; past it a transaction is in doubt, settled next try
COMMIT_RETRY_S: Final = 1.0  # how often a commit that failed is tried again while no batch comes

Item = tuple[Fetched, PartitionOffsets]  # a record and its partition's assignment, which it is done in


def _utc_now() -> datetime:
    return datetime.now(UTC)


class _NoProbe:
    """The runtime's health reports: the worker has no readiness endpoint (the runtime logs what matters)."""

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None:
        return None

    def beat(self, component: str) -> None:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Runtime:
    """What a worker runs on inside `async with`: its clients and the runtime around them."""

    consumer: AIOKafkaConsumer
    producer: AIOKafkaProducer | None  # at-least-once's; exactly-once sends in its transactions
    intake: Intake
    checkpoint: Checkpoint


class AgentWorker:
    """Consumes enriched requests, calls `handler` per turn, produces responses; an async context manager."""

    def __init__(
        self,
        handler: Handler,
        *,
        bootstrap_servers: str,
        enriched_topic: str = "agent.requests.enriched",
        responses_topic: str = "agent.responses",
        group_id: str = "agent-worker",
        client_options: Mapping[str, Any] | None = None,
        max_concurrent_turns: int = 32,
        max_batch_records: int = 100,
        poll_timeout_ms: int = 500,
        seen_per_partition: int = 10_000,
        handler_timeout_s: float | None = None,
        retry_later_initial_s: float = 1.0,
        retry_later_max_s: float = 60.0,
        shutdown_grace_s: float = 25.0,
        handle_signals: bool = True,
        clock: Callable[[], datetime] = _utc_now,
        processing_guarantee: Literal["at-least-once", "exactly-once"] = "at-least-once",
    ) -> None:
        if max_concurrent_turns < 1:
            raise ValueError("max_concurrent_turns must be at least 1")
        self._turns = Answerer(
            handler,
            responses_topic,
            clock,
            handler_timeout_s,
            SeenEvents(seen_per_partition),
            retry_later=(retry_later_initial_s, retry_later_max_s),
        )
        self.stats = self._turns.stats
        self._enriched_topic, self._responses_topic = enriched_topic, responses_topic
        self._group_id, self._max_concurrent = group_id, max_concurrent_turns
        self._options = {"bootstrap_servers": bootstrap_servers, **(client_options or {})}
        self._options.setdefault("client_id", f"agent-worker-{group_id}")
        # the runtime's knobs (`consumers.runtime`): the worker's batches, retry and commit bounds, grace
        self._opts = LoopOptions(
            max_batch_records=max_batch_records,
            poll_timeout_ms=poll_timeout_ms,
            commit_interval_s=COMMIT_RETRY_S,
            retry_initial_s=RETRY_INITIAL_S,
            retry_max_s=RETRY_MAX_S,
            revoke_drain_s=shutdown_grace_s,
            commit_timeout_s=COMMIT_TIMEOUT_S,
            exit_timeout_s=shutdown_grace_s,
        )
        self._handle_signals = handle_signals
        self._exactly_once = processing_guarantee == "exactly-once"
        self._stop, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()  # answered offsets, per assignment
        self._attached: _Runtime | None = None  # inside `async with`
        self._signals: list[signal.Signals] = []

    @classmethod
    def from_settings(
        cls, handler: Handler, settings: Settings, *, group_id: str = "agent-worker", **options: Any
    ) -> AgentWorker:
        """A worker on the service's Kafka (security included) and topics, from the same environment."""
        client = kafka_options(settings, client_id=f"agent-worker-{group_id}")
        return cls(
            handler,
            bootstrap_servers=client.pop("bootstrap_servers"),
            enriched_topic=settings.enriched_topic,
            responses_topic=settings.responses_topic,
            group_id=group_id,
            client_options=client,
            **{"processing_guarantee": settings.processing_guarantee, **options},
        )

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> AgentWorker:
        producer = (
            None
            if self._exactly_once
            else AIOKafkaProducer(**self._options, acks="all", enable_idempotence=True, linger_ms=5)
        )
        consumer = AIOKafkaConsumer(
            **self._options,
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=self._opts.max_batch_records,
        )
        if producer is not None:
            await producer.start()
        try:
            await consumer.start()
        except BaseException:
            if producer is not None:
                await producer.stop()
            raise
        self._attach(consumer, producer)
        consumer.subscribe([self._enriched_topic], listener=Listener(self._on_revoked, self._on_assigned))
        if self._handle_signals:
            self._install_signals()
        return self

    def _attach(self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer | None) -> None:
        """The runtime around the clients: the intake fetching, the checkpoint committing."""
        probe = _NoProbe()
        output = (
            PartitionTransactions.for_client(self._options, group_id=self._group_id, path=PATH)
            if producer is None
            else producer
        )
        checkpoint = checkpoint_for(
            output,
            Checked(PATH, consumer, self._tracker, probe, self._opts),
            refused=self._turns.refused,
            backoff=backoff(),
            stopping=self._stop.is_set,
        )
        intake = Intake(
            path=PATH, topic=self._enriched_topic, consumer=consumer, health=probe, options=self._opts
        )
        self._attached = _Runtime(consumer, producer, intake, checkpoint)

    @property
    def _runtime(self) -> _Runtime:
        runtime = self._attached
        if runtime is None:
            raise RuntimeError("AgentWorker used outside its `async with`")
        return runtime

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._remove_signals()
        runtime = self._attached
        if runtime is None:
            return
        try:
            await runtime.consumer.stop()  # leaves the group
        finally:
            self._attached = None
            await runtime.checkpoint.close()
            if runtime.producer is not None:
                await runtime.producer.stop()  # flushes

    def stop(self) -> None:
        """Stop fetching; `run` returns once the batch in flight is answered (or the grace is over)."""
        self._stop.set()

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """The batch in flight commits what it answered (within the grace), then the partitions' last
        commit; what they held is dropped (the next owner answers it again)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self._opts.revoke_drain_s)
        intake, checkpoint = self._runtime.intake, self._runtime.checkpoint
        await checkpoint.commit_now(
            intake.owned(sorted(revoked, key=lambda tp: tp.partition)), reason="revoke"
        )
        await checkpoint.revoked(revoked)
        self._tracker.forget(revoked)
        intake.drop(revoked)

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Exactly-once: the new partitions' producers opened (fencing), each read from its committed
        offset."""
        await self._runtime.checkpoint.assigned(assigned)
        self._runtime.intake.take(assigned)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals
                continue
            self._signals.append(sig)

    def _remove_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.remove_signal_handler(sig)
        self._signals.clear()

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("signal received: stopping", extra={"signal": sig.name})
        self.stop()

    # --- the loop -------------------------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Answer enriched requests until stopped; returns the stats. Inside `async with` only."""
        intake, checkpoint = self._runtime.intake, self._runtime.checkpoint
        log.info(
            "agent worker started",
            extra={"topic": self._enriched_topic, "responses_topic": self._responses_topic},
        )
        while not self._stop.is_set():
            if checkpoint.failure is not None:
                raise checkpoint.failure  # a commit (or a partition's opening) refused for good
            if checkpoint.full():  # exactly-once, commits failing: answer no more until they drain
                intake.hold(HELD)
                await intake.wait_polling(0.1, self._stop, checkpoint.maybe_commit)
                intake.release(HELD)
                continue
            records = await intake.fetch()
            if records:
                await self._run_batch(records)
            checkpoint.maybe_commit()
        await checkpoint.commit_now(intake.owned(self._tracker.keys()), reason="shutdown")
        log.info("agent worker stopped", extra={"stats": dataclasses.asdict(self.stats)})
        return self.stats

    async def _run_batch(self, records: Sequence[Fetched]) -> None:
        """Answer the batch (threads concurrently, each in order), then commit what was answered.

        The commit policy is the service's (`consumers.runtime.checkpoint`): a commit failing for an outage
        is not retried here but by the next commit (the next batch's, or `maybe_commit` while none comes).
        The loop then keeps polling (the consumer stays in its group past `max.poll.interval.ms`), a stop
        is honoured at once, and the commit code is one; the offsets stay committable meanwhile, and under
        exactly-once the held responses wait (intake pauses when they reach their cap)."""
        self._idle.clear()
        items = [(rec, self._tracker.track(partition_of(rec), rec.offset)) for rec in records]
        batch = asyncio.create_task(self._answer_all(items))
        stopper = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({batch, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not batch.done():  # stopping: the grace period, then what is left goes to the next owner
                await asyncio.wait({batch}, timeout=self._opts.exit_timeout_s)
                if not batch.done():
                    log.warning("shutdown grace over: unanswered turns left for the next owner")
                    batch.cancel()
                    await asyncio.gather(batch, return_exceptions=True)
        finally:
            stopper.cancel()
            try:  # per partition, past its answered run
                partitions = sorted({partition_of(r) for r in records}, key=lambda tp: tp.partition)
                await self._runtime.checkpoint.commit_now(partitions, reason="batch")
            finally:
                self._idle.set()
        if not batch.cancelled() and batch.exception() is not None:
            raise batch.exception()  # type: ignore[misc]  # checked just above

    async def _answer_all(self, items: Sequence[Item]) -> None:
        """Answer the batch on the service's lane runner: a lane per (partition, key = thread id), one
        thread's turns in order; an error (Kafka refused a send) cancels the other lanes and is raised."""

        async def answer(item: Item) -> None:
            record, part = item
            await self._turns.answer(record, self._runtime.checkpoint.emit)
            tp = partition_of(record)
            if self._tracker.owns(tp, part):  # not revoked meanwhile: its filed response is ours to commit
                self._runtime.checkpoint.hold(tp, record)
            part.done(record.offset)

        await run_lanes(
            items,
            key=lambda item: (item[0].partition, item[0].key),
            work=answer,
            max_concurrent=self._max_concurrent,
        )
