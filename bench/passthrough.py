"""B1: the ceiling for moving the events: consume and produce the same bytes, with nothing in between.

Shaped like the service's loop at its best: `getmany` batches of up to `batch` records, every record sent
without awaiting it (the producer lingers and batches as the service's does: `acks=all`, idempotent, same
linger and batch size; `config["linger_ms"]` overrides the linger), the batch's acknowledgements gathered,
then the batch's offsets committed in the background. Headers are passed through, so the harness can match
outputs to inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import MAX_BATCH_BYTES


async def run(config: dict[str, Any], stop: asyncio.Event) -> None:
    """Pass records from `config["in_topic"]` to `config["out_topic"]` until `stop` is set."""
    settings = Settings()
    consumer = AIOKafkaConsumer(
        config["in_topic"],
        **kafka_options(settings, client_id="bench-b1"),
        group_id=config["group_id"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",  # as the service: the harness releases its backlog atomically
        max_poll_records=config["batch"],
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    producer = AIOKafkaProducer(
        **kafka_options(settings, client_id="bench-b1"),
        acks="all",
        enable_idempotence=True,
        # the service's linger unless told (the idle line's forwarder is the floor: no linger at all)
        linger_ms=int(config.get("linger_ms", settings.linger_ms)),
        max_batch_size=MAX_BATCH_BYTES,
        max_request_size=16 * 1024 * 1024,
    )
    await consumer.start()
    await producer.start()
    commit: asyncio.Task[None] | None = None
    uncommitted: dict[Any, int] = {}
    out = config["out_topic"]
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=config["batch"])
            if not batch:
                continue
            acks = [
                await producer.send(out, value=rec.value, key=rec.key, headers=list(rec.headers or ()))
                for records in batch.values()
                for rec in records
            ]
            await asyncio.gather(*acks)
            uncommitted.update({tp: records[-1].offset + 1 for tp, records in batch.items() if records})
            if commit is None or commit.done():  # one commit in flight at a time; the next one catches up
                commit = asyncio.create_task(consumer.commit(dict(uncommitted)))
                uncommitted.clear()
    finally:
        if commit is not None:
            with contextlib.suppress(Exception):
                await commit
        await producer.stop()
        await consumer.stop()
