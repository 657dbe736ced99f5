"""The floor: the same rules as the service, one record at a time, awaiting every round trip.

Per record: decode, `MessageHistory.recall` / `persist_turn` straight on `MongoHistoryStorage` (so one
`get_thread` and one `find` per request, one save per response), `send_and_wait` the output, then
`commit` the record's offset and wait for it. This is the per-message shape that ends near 10^3 events/s
even on a fast database (peers note, section 5), kept here as the baseline the batching must beat.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pymongo import AsyncMongoClient

from message_history.core.memory_options import turn_last_messages
from message_history.core.persist_plan import turn_input
from message_history.processor import MessageHistory
from message_history.settings import Settings
from producers.connection import kafka_options
from schemas.codec import decode_request, decode_response, encode
from schemas.events import EnrichedRequest, HistoryPersisted
from schemas.limits import Limits
from storage.mongodb import MongoHistoryStorage


async def run(config: dict[str, Any], stop: asyncio.Event) -> None:
    """Run the naive `config["path"]` ("recall" or "persist") until `stop` is set."""
    settings = Settings()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        settings.mongodb_uri.get_secret_value(), tz_aware=True
    )
    storage = MongoHistoryStorage(client[config["db"]])
    processor = MessageHistory(storage=storage, last_messages=settings.last_messages)
    limits = Limits.from_settings(settings)
    consumer = AIOKafkaConsumer(
        config["in_topic"],
        **kafka_options(settings, client_id="bench-naive"),
        group_id=config["group_id"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",  # as the service: the harness releases its backlog atomically
    )
    producer = AIOKafkaProducer(
        **kafka_options(settings, client_id="bench-naive"),
        acks="all",
        enable_idempotence=True,
        max_request_size=16 * 1024 * 1024,
    )
    await consumer.start()
    await producer.start()
    out = config["out_topic"]
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=1)
            for records in batch.values():
                for rec in records:
                    if config["path"] == "recall":
                        value = await _recall(processor, rec.value, limits, settings.last_messages)
                    else:
                        value = await _persist(processor, rec.value, limits)
                    await producer.send_and_wait(out, value, key=rec.key, headers=list(rec.headers or ()))
                    await consumer.commit({TopicPartition(rec.topic, rec.partition): rec.offset + 1})
    finally:
        await producer.stop()
        await consumer.stop()
        await client.close()


async def _recall(processor: MessageHistory, raw: bytes, limits: Limits, default_limit: int) -> bytes:
    request = decode_request(raw, limits)
    outcome = await processor.recall(
        thread_id=request.threadId,
        resource_id=request.resourceId,
        incoming=request.messages,
        last_messages=turn_last_messages(request, default_limit),
    )
    enriched = EnrichedRequest.from_request(
        request, outcome.context, recalled=outcome.recalled, limit=outcome.limit
    )
    return encode(enriched)


async def _persist(processor: MessageHistory, raw: bytes, limits: Limits) -> bytes:
    response = decode_response(raw, limits)
    outcome = await processor.persist_turn(
        thread_id=response.threadId,
        resource_id=response.resourceId,
        input=turn_input(response),
        response=response.response,
        finish_reason=response.finishReason,
        read_only=bool(response.memory and response.memory.readOnly),
    )
    thread = outcome.thread
    event = HistoryPersisted.for_response(
        response,
        saved_ids=outcome.saved_ids,
        skipped=outcome.skipped,
        thread_updated_at=thread.updatedAt if thread is not None else None,
    )
    return encode(event)
