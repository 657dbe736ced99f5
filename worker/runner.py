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
partition go out with that partition's consumed offset in one Kafka transaction (`worker.exactly_once`). A
crash, a rebalance or a zombie worker then never makes a response visible twice to `read_committed` readers
(the service's persist path reads so). The worker always reads `read_committed`: under exactly-once the
service's aborted enriched requests are never answered.

SIGTERM (and SIGINT) stop fetching; the batch in flight gets `shutdown_grace_s` to finish, then what is left
is cancelled and not committed (the next owner answers it); then the offsets of what was answered are
committed, the consumer leaves the group and the producer flushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
)

from consumers.lanes import run_lanes
from consumers.offsets import OffsetTracker
from consumers.runtime.retry import backoff_delay, is_outage
from message_history import tracing
from message_history.errors import InvalidInputError
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import OUTPUT_TOO_LARGE
from producers.transactional import HeldOutput, HoldingProducer
from schemas.codec import decode_enriched, encode
from schemas.events import AgentResponse
from worker.exactly_once import WorkerTransactions
from worker.turn import (
    FAILED,
    Reply,
    SeenEvents,
    Turn,
    build_response,
    failed_response,
    is_retry_later,
)

log = logging.getLogger(__name__)

Handler = Callable[[Turn], Awaitable[Reply | str]]
"""The user's code: one turn in, its reply out (a string is one assistant text message)."""

RETRY_INITIAL_S: Final = 0.2
RETRY_MAX_S: Final = 5.0
COMMIT_TIMEOUT_S: Final = 10.0  # one try at a transaction; past it the commit is in doubt, settled next try
_JITTER = random.Random()  # noqa: S311 -- retry jitter, not security


@dataclass(slots=True)
class WorkerStats:
    """What the worker did since it started (for logs, tests, a metrics exporter of the user's)."""

    answered: int = 0
    failed: int = 0  # answered as failed turns (the handler raised or timed out)
    duplicates: int = 0  # dropped: the eventId was already answered
    invalid: int = 0  # skipped: not a valid EnrichedRequest
    retried: int = 0  # attempts the handler asked to redo later (RetryLater, or `retriable = True`)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _delay(attempt: int) -> float:
    """The wait before retry `attempt` (1, 2, ...) while Kafka is down: exponential, jittered, capped."""
    return backoff_delay(attempt, initial=RETRY_INITIAL_S, maximum=RETRY_MAX_S, rand=_JITTER.random)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type information
    def __init__(self, worker: AgentWorker) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._worker.wait_idle()  # the batch in flight commits what it answered before we let go
        await self._worker.close_transactions(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._worker.open_transactions(assigned)


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
        self._handler = handler
        self._enriched_topic = enriched_topic
        self._responses_topic = responses_topic
        self._group_id = group_id
        options = {"bootstrap_servers": bootstrap_servers, **(client_options or {})}
        options.setdefault("client_id", f"agent-worker-{group_id}")
        self._options = options
        self._max_concurrent = max_concurrent_turns
        self._max_batch = max_batch_records
        self._poll_timeout_ms = poll_timeout_ms
        self._handler_timeout_s = handler_timeout_s
        self._retry_later = (retry_later_initial_s, retry_later_max_s)
        self._grace_s = shutdown_grace_s
        self._handle_signals = handle_signals
        self._clock = clock
        self._seen = SeenEvents(seen_per_partition)
        self._stop = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._signals: list[signal.Signals] = []
        self.stats = WorkerStats()
        # exactly-once: responses held per (partition, offset), committed with the offsets
        self._transactions = (
            WorkerTransactions(
                options,
                group_id=group_id,
                stop=self._stop,
                delay=_delay,
                refused=self._refused_response,
                commit_timeout_s=COMMIT_TIMEOUT_S,
            )
            if processing_guarantee == "exactly-once"
            else None
        )

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
            if self._transactions is not None
            else AIOKafkaProducer(**self._options, acks="all", enable_idempotence=True, linger_ms=5)
        )
        consumer = AIOKafkaConsumer(
            **self._options,
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=self._max_batch,
        )
        if isinstance(producer, AIOKafkaProducer):
            await producer.start()
        try:
            await consumer.start()
        except BaseException:
            if isinstance(producer, AIOKafkaProducer):
                await producer.stop()
            raise
        consumer.subscribe([self._enriched_topic], listener=_Listener(self))
        if self._transactions is not None:
            self._transactions.attach(consumer)
        self._producer, self._consumer = producer, consumer
        if self._handle_signals:
            self._install_signals()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._remove_signals()
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        try:
            if consumer is not None:
                await consumer.stop()  # leaves the group
        finally:
            if self._transactions is not None:
                await self._transactions.close()
            if isinstance(producer, AIOKafkaProducer):
                await producer.stop()  # flushes

    def stop(self) -> None:
        """Stop fetching; `run` returns once the batch in flight is answered (or the grace is over)."""
        self._stop.set()

    async def wait_idle(self) -> None:
        """Until no batch is in flight (its answers sent and committed), at most the shutdown grace."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self._grace_s)

    async def open_transactions(self, assigned: set[TopicPartition]) -> None:
        """Exactly-once: the new partitions' producers opened, each read from its committed offset."""
        if self._transactions is not None:
            await self._transactions.open(assigned)

    async def close_transactions(self, revoked: set[TopicPartition]) -> None:
        if self._transactions is not None:
            await self._transactions.close(revoked)

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
        consumer = self._require(self._consumer)
        log.info(
            "agent worker started",
            extra={"topic": self._enriched_topic, "responses_topic": self._responses_topic},
        )
        while not self._stop.is_set():
            fetched = await consumer.getmany(timeout_ms=self._poll_timeout_ms, max_records=self._max_batch)
            if self._transactions is not None:
                fetched = self._transactions.only_ready(fetched)
            records = [rec for recs in fetched.values() for rec in recs]
            if records:
                await self._run_batch(records)
        log.info("agent worker stopped", extra={"stats": self._stats_dict()})
        return self.stats

    def _stats_dict(self) -> dict[str, int]:
        s = self.stats
        return {
            "answered": s.answered,
            "failed": s.failed,
            "duplicates": s.duplicates,
            "invalid": s.invalid,
            "retried": s.retried,
        }

    async def _run_batch(self, records: Sequence[ConsumerRecord]) -> None:
        """Answer the batch (threads concurrently, each in order), then commit what was answered."""
        self._idle.clear()
        answered: OffsetTracker[TopicPartition] = OffsetTracker()  # this batch's answered offsets
        for rec in records:
            answered.track(TopicPartition(rec.topic, rec.partition), rec.offset)
        batch = asyncio.create_task(self._answer_all(records, answered))
        stopper = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({batch, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not batch.done():  # stopping: the grace period, then what is left goes to the next owner
                await asyncio.wait({batch}, timeout=self._grace_s)
                if not batch.done():
                    log.warning("shutdown grace over: unanswered turns left for the next owner")
                    batch.cancel()
                    await asyncio.gather(batch, return_exceptions=True)
        finally:
            stopper.cancel()
            try:
                await self._commit(answered.committable())  # per partition, past its answered run
            finally:
                self._idle.set()
        if not batch.cancelled() and batch.exception() is not None:
            raise batch.exception()  # type: ignore[misc]  # checked just above

    async def _answer_all(
        self, records: Sequence[ConsumerRecord], answered: OffsetTracker[TopicPartition]
    ) -> None:
        """Answer the batch on the service's lane runner: a lane per (partition, key = thread id), one
        thread's turns in order; an error (Kafka refused a send) cancels the other lanes and is raised."""

        async def answer(rec: ConsumerRecord) -> None:
            await self._answer(rec)
            answered.partition(TopicPartition(rec.topic, rec.partition)).done(rec.offset)

        await run_lanes(
            records,
            key=lambda rec: (rec.partition, rec.key),
            work=answer,
            max_concurrent=self._max_concurrent,
        )

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit `offsets` (each partition's answered watermark): in transactions under exactly-once."""
        if not offsets:
            return
        if self._transactions is not None:
            await self._transactions.commit(offsets)
            return
        try:
            await self._require(self._consumer).commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # the group rebalanced meanwhile: the next owner redelivers these turns (and drops none by id)
            log.warning("commit refused after a rebalance", extra={"error": str(exc)})

    async def _refused_response(
        self, tp: TopicPartition, offset: int, source: object, error: BaseException
    ) -> list[HeldOutput]:
        """Exactly-once: the broker refused a response for its size (the topic's `max.message.bytes`): the
        turn is answered as failed instead, in the same transaction (as `_send` does at-least-once)."""
        if not isinstance(source, Turn):
            return []
        log.error(
            "response refused by the broker for its size: answering a failed turn",
            extra={"request_id": source.request_id, "partition": tp.partition, "offset": offset},
        )
        self.stats.failed += 1
        failed = failed_response(source, now=self._clock())
        return [HeldOutput(self._responses_topic, source.thread_id.encode(), encode(failed), ())]

    # --- one turn -------------------------------------------------------------------------------------------

    async def _answer(self, record: ConsumerRecord) -> None:
        where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        try:
            event = decode_enriched(record.value if record.value is not None else b"")
        except InvalidInputError as exc:
            self.stats.invalid += 1
            log.error("not an EnrichedRequest: skipped", extra={**where, "reason": str(exc)})  # noqa: TRY400
            return
        if (record.partition, event.eventId) in self._seen:
            self.stats.duplicates += 1
            log.info("duplicate enriched request dropped", extra={**where, "event_id": event.eventId})
            return
        turn = Turn(event, record.partition, record.offset)
        ids = {"request_id": event.requestId, "thread_id": event.threadId}
        with tracing.output_span("agent turn", record, **{"messaging.message.id": event.requestId}) as span:
            response = await self._respond(turn, ids)
            headers = tracing.output_headers([(k, v or b"") for k, v in record.headers or ()], span)
            sent = await self._send(turn, response, headers)
        if self._transactions is not None:
            self._transactions.hold(record, sent, turn)
        self._seen.add(record.partition, event.eventId)
        self.stats.answered += 1

    async def _respond(self, turn: Turn, ids: dict[str, str]) -> AgentResponse:
        """The handler's response, or a failed turn; a `RetryLater` (or `retriable = True`) backs off and
        calls the handler again for the same turn (the shutdown grace's end cancels the wait: left
        uncommitted)."""
        attempt = 0
        while True:
            try:
                if self._handler_timeout_s is None:
                    reply = await self._handler(turn)
                else:
                    reply = await asyncio.wait_for(self._handler(turn), self._handler_timeout_s)
                return build_response(turn, reply, now=self._clock())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the user's code: a failed turn (or a retry), never a stopped worker
                if not is_retry_later(exc):
                    self.stats.failed += 1
                    log.exception("handler failed: answering a failed turn", extra=ids)
                    return failed_response(turn, now=self._clock())
                attempt += 1
                delay = self._retry_later_delay(attempt, exc)
                self.stats.retried += 1
                log.warning(
                    "the handler asked to retry later: backing off, then the same turn again",
                    extra={**ids, "attempt": attempt, "delay_s": round(delay, 3), "error": repr(exc)},
                )
                await asyncio.sleep(delay)

    def _retry_later_delay(self, attempt: int, error: BaseException) -> float:
        """Doubling from `retry_later_initial_s` up to `retry_later_max_s`, equal jitter (as the TypeScript
        SDK's), and at least the error's `after_s`."""
        initial, maximum = self._retry_later
        ceiling = min(maximum, initial * 2 ** (attempt - 1))
        floor = float(getattr(error, "after_s", None) or 0.0)
        jittered: float = ceiling / 2 + _JITTER.random() * ceiling / 2
        return max(floor, jittered)

    async def _send(self, turn: Turn, response: AgentResponse, headers: list[tuple[str, bytes]]) -> object:
        """Send the response and wait for Kafka's acknowledgement, retrying while Kafka is unavailable;
        returns what the acknowledgement resolved with (under exactly-once: the held response)."""
        producer = self._require(self._producer)
        attempt = 0
        while True:
            try:
                ack = await producer.send(
                    self._responses_topic,
                    value=encode(response),
                    key=turn.thread_id.encode(),
                    headers=headers,
                )
                return await ack
            except OUTPUT_TOO_LARGE:
                ids = {"request_id": turn.request_id}
                if response.finishReason == FAILED and not response.response:
                    # even the bare input does not fit: nothing can be said for this turn; the stream goes on
                    log.error("failed-turn response too large for Kafka: turn dropped", extra=ids)  # noqa: TRY400
                    return None
                log.error("response too large for Kafka: answering a failed turn", extra=ids)  # noqa: TRY400
                self.stats.failed += 1
                response = failed_response(turn, now=self._clock())
            except KafkaError as exc:
                if not is_outage(exc):  # the service's outage policy: Kafka down or slow, not a refusal
                    raise
                attempt += 1
                delay = _delay(attempt)
                log.warning(
                    "response not acknowledged, retrying",
                    extra={"request_id": turn.request_id, "attempt": attempt, "error": type(exc).__name__},
                )
                await asyncio.sleep(delay)

    @staticmethod
    def _require(client: Any) -> Any:
        if client is None:
            raise RuntimeError("AgentWorker used outside its `async with`")
        return client
