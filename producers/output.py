"""The service's one Kafka producer: idempotent, `acks=all`, linger-batched, shared by every output topic.

`send` returns as soon as the record is in the producer's buffer, with a future that resolves when Kafka
acknowledged it; callers gather those futures per batch instead of awaiting each send. A record too large for
Kafka comes back as a failed future (not an exception at the call site), so every outcome of a send is seen in
one place: where the futures are gathered.

Sends of one topic pass one at a time through a FIFO gate. When a partition's batch is full, aiokafka makes
every sender of it wait for the batch to drain (`asyncio.wait` with its own timer each) and wakes them all at
once, though only a batch's worth fits: with the recall path's ~50 KB events, ~10 per 512 KiB batch and 500
lanes sending at once, each event went through that wait three to four times (a tenth of the service's CPU in
the bench's profile). Behind the gate only its holder waits for room; the others queue on the lock (a bare
future each) and each bound their whole send by aiokafka's own buffer wait (`REQUEST_TIMEOUT_MS`). Order is
unchanged: a thread's lane awaits each send before its next, and the gate is first come, first served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, RecordTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from message_history import metrics
from message_history.errors import OutputTooLargeError
from message_history.settings import Settings
from producers.connection import kafka_options

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]


class Positioned(Protocol):
    """Where an input record is (aiokafka's `ConsumerRecord` says): what its outputs are filed under."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


class Emit(Protocol):
    """The channel a batch's outputs go through (`consumers.runtime.emit`: sent at once, or filed under the
    input record's offset for its transaction): one output of `record` to `topic` (`alone`: the record's
    only output, its dead letter). The future resolves once the output is durable (at once, when it is
    filed) and fails when Kafka refuses it (for its size: the record is then dead-lettered)."""

    async def __call__(
        self,
        record: Positioned,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Headers = (),
        alone: bool = False,
    ) -> asyncio.Future[Any]: ...


MAX_BATCH_BYTES = 512 * 1024
"""Per-partition batch size. aiokafka keeps one open batch per partition and makes `send` wait while it is
full, so the 16 KiB default would serialize a burst of multi-KiB enriched events into many small requests."""

MAX_REQUEST_BYTES = 1_048_576  # aiokafka's default `max_request_size`

REQUEST_TIMEOUT_MS = 40_000
"""aiokafka's default, set explicitly: it also bounds how long `send` may wait for room in a full batch, and
the gate's queue takes the same bound (a send that waited that long fails as aiokafka's own would)."""

OUTPUT_TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)
"""Kafka refused a record for its size: a property of that record, not an outage."""

_WHAT_TO_LOWER = {
    "recall": (
        "the EnrichedRequest carries the recalled history: lower lastMessages (the request's "
        "memory.lastMessages, or MESSAGE_HISTORY_LAST_MESSAGES) or the size of the thread's messages"
    ),
    "persist": "the HistoryPersisted event lists every saved message id: send fewer messages per response",
}


def explain_too_large(error: BaseException, path: str) -> OutputTooLargeError:
    """Why an input whose output Kafka refused for its size is dead-lettered: the limit, what to lower."""
    hint = _WHAT_TO_LOWER.get(path, "make the event smaller")
    return OutputTooLargeError(
        f"the output is over Kafka's record size limit (the producer's max_request_size, 1 MiB, and the "
        f"topic's max.message.bytes): {error}. {hint}",
        type(error).__name__,
    )


MIN_BATCH_BYTES = 1024  # a floor for the batch size however small a topic's limit is (one record still goes)
_LIMITS_TIMEOUT_S = 10.0


def output_topics(settings: Settings) -> list[str]:
    """Every topic the service's shared producer writes."""
    return [
        settings.enriched_topic,
        settings.persisted_topic,
        settings.forgotten_topic,
        settings.requests_dlq,
        settings.responses_dlq,
        settings.commands_dlq,
        settings.observe_requests_topic,
        settings.observe_results_dlq,
    ]


def parse_limits(resources: Sequence[Any]) -> dict[str, int]:
    """`{topic: max.message.bytes}` from DescribeConfigs resources (error_code, message, type, name, entries);
    a topic the broker answered with an error for (missing, not authorized) is left out."""
    limits: dict[str, int] = {}
    for resource in resources:
        error_code, _, _, name, entries = resource[:5]
        if error_code != 0:
            continue
        for entry in entries:
            if entry[0] == "max.message.bytes" and entry[1] is not None and str(entry[1]).isdigit():
                limits[name] = int(entry[1])
    return limits


def batch_bytes(limits: dict[str, int]) -> int:
    """The producer's batch size: a batch is never larger than the smallest output topic's limit, so the
    broker never refuses a batch of records that each fit (the idempotent producer's sequence would break:
    `OutOfOrderSequenceNumber` on every later send to that partition)."""
    return max(MIN_BATCH_BYTES, min([MAX_BATCH_BYTES, *limits.values()]))


async def topic_limits(settings: Settings, topics: Sequence[str]) -> dict[str, int]:
    """Each existing topic's `max.message.bytes` (DescribeConfigs); {} when they cannot be read (no
    DescribeConfigs ACL, broker away): then only the producer's own 1 MiB limit is checked before sending."""
    admin = AIOKafkaAdminClient(
        **kafka_options(settings, client_id="message-history-limits"), request_timeout_ms=10_000
    )
    resources = [ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None}) for t in topics]
    try:
        async with asyncio.timeout(_LIMITS_TIMEOUT_S):
            await admin.start()
            responses = await admin.describe_configs(resources)
    except Exception as exc:  # noqa: BLE001 -- an optional look-up: the broker still refuses what is too big
        log.warning(
            "output topics' max.message.bytes not read: records are checked against 1 MiB only",
            extra={"error": type(exc).__name__},
        )
        return {}
    finally:
        await admin.close()
    return parse_limits([r for response in responses for r in response.resources])


def compression_type(settings: Settings) -> str | None:
    """aiokafka's `compression_type` for `output_compression` (`none` is aiokafka's None)."""
    return None if settings.output_compression == "none" else settings.output_compression


class OutputProducer:
    """Async context manager around `AIOKafkaProducer`; stopping it flushes what is buffered."""

    def __init__(self, settings: Settings, *, client_id: str = "message-history") -> None:
        self._settings = settings
        self._client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self._gates: dict[str, asyncio.Lock] = {}  # per topic: one send at a time (see the module docstring)
        self._limits: dict[str, int] = {}  # output topic -> max.message.bytes below the producer's 1 MiB

    async def __aenter__(self) -> OutputProducer:
        # a record over its topic's max.message.bytes is refused here, before the broker would: a refusal
        # there breaks the idempotent producer's sequence for the partition (every later send fails)
        limits = await topic_limits(self._settings, output_topics(self._settings))
        self._limits = {topic: limit for topic, limit in limits.items() if limit < MAX_REQUEST_BYTES}
        producer = AIOKafkaProducer(
            **kafka_options(self._settings, client_id=self._client_id),
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            linger_ms=self._settings.linger_ms,
            max_batch_size=batch_bytes(self._limits),
            compression_type=compression_type(self._settings),
        )
        await producer.start()
        self._producer = producer
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes pending batches first

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("OutputProducer used outside its `async with`")
        return self._producer

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> asyncio.Future[Any]:
        """Buffer one record; the returned future resolves with its metadata once Kafka acknowledged it."""
        limit = self._limits.get(topic)
        if limit is not None:
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(headers))
            if size > limit:
                refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                refused.set_exception(
                    MessageSizeTooLargeError(
                        f"the record is {size} bytes, over {topic}'s max.message.bytes {limit}"
                    )
                )
                return refused
        gate = self._gates.get(topic)
        if gate is None:
            gate = self._gates[topic] = asyncio.Lock()
        try:
            if not gate.locked():  # the common case: no suspension, no timer
                async with gate:
                    future: asyncio.Future[Any] = await self.producer.send(
                        topic, value=value, key=key, headers=list(headers)
                    )
            else:
                future = await self._queued_send(gate, topic, key, value, headers)
        except OUTPUT_TOO_LARGE as exc:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        future.add_done_callback(lambda f: _count(topic, f))
        return future

    async def _queued_send(
        self, gate: asyncio.Lock, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> asyncio.Future[Any]:
        """`send` behind the one that holds the gate (it waits for room), all within aiokafka's bound."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_MS / 1000), gate:
                future: asyncio.Future[Any] = await self.producer.send(
                    topic, value=value, key=key, headers=list(headers)
                )
                return future
        except TimeoutError as exc:  # what aiokafka raises when its buffer has no room in time: an outage
            raise KafkaTimeoutError(f"no room in the producer's buffer for {topic} in time") from exc

    async def flush(self) -> None:
        """Wait until everything buffered so far is acknowledged (or failed)."""
        await self.producer.flush()


_PRODUCED: dict[str, Any] = {}  # RECORDS_PRODUCED's child per topic: no label look-up per record


class TopicPublisher:
    """One output topic; a subclass says how its event is keyed and encoded. It holds no producer: each
    output goes through the `Emit` channel its batch was handed."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    async def _send(
        self, emit: Emit, record: Positioned, key: bytes, value: bytes, headers: Headers
    ) -> asyncio.Future[Any]:
        return await emit(record, self.topic, key=key, value=value, headers=headers)


def _count(topic: str, future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        child = _PRODUCED.get(topic)
        if child is None:
            child = _PRODUCED[topic] = metrics.RECORDS_PRODUCED.labels(topic=topic)
        child.inc()
