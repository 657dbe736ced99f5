"""`AgentWorker`: the other half of the pipeline, `agent.requests.enriched` in, `agent.responses` out.

    async def answer(turn: Turn) -> Reply | str:
        return Reply.text(await my_model(turn.messages))

    async with AgentWorker(answer, bootstrap_servers="localhost:9092", group_id="my-agent") as worker:
        await worker.run()  # until SIGTERM/SIGINT or worker.stop()

Per batch of enriched requests: one thread's turns in order, different threads concurrently (at most
`max_concurrent_turns`). Per turn, the handler is called with the `Turn`; its `Reply` becomes the
`AgentResponse` (see `worker.turn`), sent with the enriched record's headers (the `traceparent` replaced by
the turn's span when tracing is on) and waited for. A handler that raises (or times out) answers a failed
turn, `finishReason: "error"`, logged with the traceback. Offsets are committed once the batch's responses
are acknowledged by Kafka: a crash redelivers, never loses (at-least-once), and copies of an `eventId`
already answered are dropped (`worker.turn.SeenEvents` says how far that goes). An enriched record that does
not decode is logged and skipped (the service never writes one; the worker has no dead-letter topic).

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
import random
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from consumers.consumer import LoopOptions
from consumers.lanes import run_lanes
from consumers.offsets import OffsetTracker, PartitionOffsets
from consumers.runtime.checkpoint import Checked, Checkpoint, checkpoint_for
from consumers.runtime.intake import HELD, Fetched, Intake, Listener, partition_of
from consumers.runtime.retry import Backoff, Failure, retry_call, wait_to_retry
from message_history import tracing
from message_history.errors import InvalidInputError
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import OUTPUT_TOO_LARGE
from producers.transactional import HeldOutput, HoldingProducer
from producers.transactions import PartitionTransactions
from schemas.codec import decode_enriched, encode
from schemas.events import AgentResponse
from worker.turn import FAILED, Reply, SeenEvents, Turn, build_response, failed_response

log = logging.getLogger(__name__)

Handler = Callable[[Turn], Awaitable[Reply | str]]
"""The user's code: one turn in, its reply out (a string is one assistant text message)."""

PATH: Final = "worker"  # the runtime's name for this loop (metrics, logs)
RETRY_INITIAL_S: Final = 0.2
RETRY_MAX_S: Final = 5.0
COMMIT_TIMEOUT_S: Final = 10.0  # one try at a commit; past it a transaction is in doubt, settled next try
COMMIT_RETRY_S: Final = 1.0  # how often a commit that failed is tried again while no batch comes
_JITTER = random.Random()  # noqa: S311 -- retry jitter, not security

Item = tuple[Fetched, PartitionOffsets]  # a record and its partition's assignment, which it is done in


@dataclasses.dataclass(slots=True)
class WorkerStats:
    """What the worker did since it started (for logs, tests, a metrics exporter of the user's)."""

    answered: int = 0
    failed: int = 0  # answered as failed turns (the handler raised or timed out)
    duplicates: int = 0  # dropped: the eventId was already answered
    invalid: int = 0  # skipped: not a valid EnrichedRequest


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _backoff() -> Backoff:
    return Backoff(RETRY_INITIAL_S, RETRY_MAX_S, _JITTER.random)


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
    producer: AIOKafkaProducer | HoldingProducer
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
        shutdown_grace_s: float = 25.0,
        handle_signals: bool = True,
        clock: Callable[[], datetime] = _utc_now,
        processing_guarantee: Literal["at-least-once", "exactly-once"] = "at-least-once",
    ) -> None:
        if max_concurrent_turns < 1:
            raise ValueError("max_concurrent_turns must be at least 1")
        self._handler, self._handler_timeout_s, self._clock = handler, handler_timeout_s, clock
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
        self._seen = SeenEvents(seen_per_partition)
        self._stop, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()  # answered offsets, per assignment
        self._attached: _Runtime | None = None  # inside `async with`
        self._signals: list[signal.Signals] = []
        self.stats = WorkerStats()

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
        producer: AIOKafkaProducer | HoldingProducer = (
            HoldingProducer()
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
        if isinstance(producer, AIOKafkaProducer):
            await producer.start()
        try:
            await consumer.start()
        except BaseException:
            if isinstance(producer, AIOKafkaProducer):
                await producer.stop()
            raise
        self._attach(consumer, producer)
        consumer.subscribe([self._enriched_topic], listener=Listener(self._on_revoked, self._on_assigned))
        if self._handle_signals:
            self._install_signals()
        return self

    def _attach(self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer | HoldingProducer) -> None:
        """The runtime around the clients: the intake fetching, the checkpoint committing."""
        probe = _NoProbe()
        transactions = (
            PartitionTransactions.for_client(self._options, group_id=self._group_id, path=PATH)
            if self._exactly_once
            else None
        )
        checkpoint = checkpoint_for(
            transactions,
            Checked(PATH, consumer, self._tracker, probe, self._opts),
            refused=self._refused_response,
            backoff=_backoff(),
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
            if isinstance(runtime.producer, AIOKafkaProducer):
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
            sent = await self._answer(record)
            tp = partition_of(record)
            if self._tracker.owns(tp, part):  # not revoked meanwhile: its held response is ours to commit
                self._runtime.checkpoint.hold(tp, record, sent)
            part.done(record.offset)

        await run_lanes(
            items,
            key=lambda item: (item[0].partition, item[0].key),
            work=answer,
            max_concurrent=self._max_concurrent,
        )

    async def _refused_response(self, record: ConsumerRecord, error: BaseException) -> list[HeldOutput]:
        """Exactly-once: the broker refused a response for its size (the topic's `max.message.bytes`): the
        turn is answered as failed instead, in the same transaction (as `_send` does at-least-once)."""
        turn = Turn(decode_enriched(record.value or b""), record.partition, record.offset)
        log.error(
            "response refused by the broker for its size: answering a failed turn",
            extra={"request_id": turn.request_id, "partition": record.partition, "offset": record.offset},
        )
        self.stats.failed += 1
        failed = failed_response(turn, now=self._clock())
        return [HeldOutput(self._responses_topic, turn.thread_id.encode(), encode(failed), ())]

    # --- one turn -------------------------------------------------------------------------------------------

    async def _answer(self, record: Fetched) -> object:
        """Answer `record`; returns what its response's acknowledgement resolved with (under exactly-once:
        the held response; None when nothing was sent)."""
        where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        try:
            event = decode_enriched(record.value if record.value is not None else b"")
        except InvalidInputError as exc:
            self.stats.invalid += 1
            log.error("not an EnrichedRequest: skipped", extra={**where, "reason": str(exc)})  # noqa: TRY400
            return None
        if (record.partition, event.eventId) in self._seen:
            self.stats.duplicates += 1
            log.info("duplicate enriched request dropped", extra={**where, "event_id": event.eventId})
            return None
        turn = Turn(event, record.partition, record.offset)
        ids = {"request_id": event.requestId, "thread_id": event.threadId}
        with tracing.output_span("agent turn", record, **{"messaging.message.id": event.requestId}) as span:
            response = await self._respond(turn, ids)
            headers = tracing.output_headers([(k, v or b"") for k, v in record.headers or ()], span)
            sent = await self._send(turn, response, headers)
        self._seen.add(record.partition, event.eventId)
        self.stats.answered += 1
        return sent

    async def _respond(self, turn: Turn, ids: dict[str, str]) -> AgentResponse:
        try:
            if self._handler_timeout_s is None:
                reply = await self._handler(turn)
            else:
                reply = await asyncio.wait_for(self._handler(turn), self._handler_timeout_s)
            return build_response(turn, reply, now=self._clock())
        except asyncio.CancelledError:
            raise
        except Exception:  # the user's code: whatever it raises is a failed turn, never a stopped worker
            self.stats.failed += 1
            log.exception("handler failed: answering a failed turn", extra=ids)
            return failed_response(turn, now=self._clock())

    async def _send(self, turn: Turn, response: AgentResponse, headers: list[tuple[str, bytes]]) -> object:
        """Send the response and wait for Kafka's acknowledgement, retried while Kafka is out (the service's
        outage policy, `consumers.runtime.retry`); returns what the acknowledgement resolved with (under
        exactly-once: the held response). A response too large for Kafka is answered as a failed turn."""
        producer = self._runtime.producer
        sending = [response]  # a retry after an outage sends what the last try sent

        async def send() -> object:
            while True:
                try:
                    ack = await producer.send(
                        self._responses_topic,
                        value=encode(sending[0]),
                        key=turn.thread_id.encode(),
                        headers=headers,
                    )
                    return await ack
                except OUTPUT_TOO_LARGE:
                    ids = {"request_id": turn.request_id}
                    if sending[0].finishReason == FAILED and not sending[0].response:
                        # even the bare input does not fit: nothing to say for this turn; the stream goes on
                        log.error("failed-turn response too large for Kafka: turn dropped", extra=ids)  # noqa: TRY400
                        return None
                    log.error("response too large for Kafka: answering a failed turn", extra=ids)  # noqa: TRY400
                    self.stats.failed += 1
                    sending[0] = failed_response(turn, now=self._clock())

        async def wait(failure: Failure[None]) -> bool:
            said = "response not acknowledged, retrying"
            extra = {"request_id": turn.request_id, "attempt": failure.attempt}
            await wait_to_retry(
                PATH, "kafka", failure.delay, said, extra={**extra, "error": type(failure.error).__name__}
            )
            return False

        return await retry_call(send, backoff=_backoff(), wait=wait)
