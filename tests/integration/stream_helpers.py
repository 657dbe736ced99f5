"""Stream test helpers: produce records, read a topic, read a group's committed offsets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

Record = Any  # aiokafka's ConsumerRecord (untyped)


async def produce(
    bootstrap: str,
    topic: str,
    items: Sequence[tuple[bytes | None, bytes | None]],
    *,
    headers: Sequence[tuple[str, bytes]] = (),
    compression_type: str | None = None,
    max_request_size: int = 1_048_576,
) -> None:
    """Send (key, value) records in order and wait for all acknowledgements."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type=compression_type,
        max_request_size=max_request_size,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=key, value=value, headers=list(headers)) for key, value in items
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    until: Callable[[list[Record]], bool],
    timeout_s: float = 60.0,
    isolation_level: str = "read_uncommitted",
) -> list[Record]:
    """Read `topic` from the beginning (no group) until `until(records)` holds; fails after `timeout_s`."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
        isolation_level=isolation_level,
    )
    await consumer.start()
    records: list[Record] = []
    try:
        deadline = time.monotonic() + timeout_s
        partitions: set[TopicPartition] = set()
        while not partitions:
            found = consumer.partitions_for_topic(topic)
            if found:
                partitions = {TopicPartition(topic, p) for p in found}
                break
            await consumer._client.force_metadata_update()
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {topic} never appeared")
            await asyncio.sleep(0.2)
        consumer.assign(sorted(partitions))
        await consumer.seek_to_beginning(*partitions)
        while not until(records):
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: condition not met after {timeout_s}s; read {len(records)}")
            batch = await consumer.getmany(timeout_ms=200)
            for recs in batch.values():
                records.extend(recs)
        return records
    finally:
        await consumer.stop()


async def read_all(
    bootstrap: str,
    topic: str,
    *,
    settle_s: float = 2.0,
    timeout_s: float = 60.0,
    isolation_level: str = "read_uncommitted",
) -> list[Record]:
    """Every record of `topic` now: read until the end offsets, then `settle_s` more for stragglers.
    Under `read_committed` the end is the last stable offset (an open transaction's records are skipped)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, isolation_level=isolation_level
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        found = consumer.partitions_for_topic(topic) or set()
        partitions = sorted(TopicPartition(topic, p) for p in found)
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            for recs in batch.values():
                records.extend(recs)
            positions = {tp: await consumer.position(tp) for tp in partitions}
            if all(positions[tp] >= end[tp] for tp in partitions):
                quiet_until = quiet_until or time.monotonic() + settle_s
                if time.monotonic() >= quiet_until:
                    return records
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: end offsets not reached after {timeout_s}s")
    finally:
        await consumer.stop()


async def committed_offsets(bootstrap: str, group_id: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of `topic` (partitions without a commit are absent)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group_id)
    finally:
        await admin.close()
    return {
        tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0
    }


async def wait_committed(
    bootstrap: str, group_id: str, topic: str, expected: dict[int, int], *, timeout_s: float = 60.0
) -> dict[int, int]:
    """Poll the group's offsets until they reach `expected` on every partition; returns the last read."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await committed_offsets(bootstrap, group_id, topic)
        if all(got.get(p, -1) >= o for p, o in expected.items()):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"committed {got}, expected at least {expected}")
        await asyncio.sleep(0.2)
