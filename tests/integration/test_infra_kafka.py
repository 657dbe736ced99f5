"""The Kafka broker the suite runs against does what the service relies on: produce, group consume, commit."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from tests.conftest import MakeTopic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def _consume(consumer: AIOKafkaConsumer, count: int) -> list[ConsumerRecord[bytes, bytes]]:
    received: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(45):
        while len(received) < count:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                received.extend(records)
    return received


async def test_round_trip_with_group_commit_read_back(
    kafka_bootstrap: str, topic: str, group_id: str
) -> None:
    """Records sent by an idempotent producer are consumed in a group, and the offset the group commits is
    what an admin client and a new member of the group read back, and where that member resumes."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        sent = [await producer.send_and_wait(topic, f"v{i}".encode(), key=b"thread-1") for i in range(3)]
    finally:
        await producer.stop()
    partition = TopicPartition(topic, sent[0].partition)
    assert [meta.offset for meta in sent] == [0, 1, 2]

    first = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await first.start()
    try:
        received = await _consume(first, 3)
        assert [(record.key, record.value) for record in received] == [
            (b"thread-1", b"v0"),
            (b"thread-1", b"v1"),
            (b"thread-1", b"v2"),
        ]
        # Commit after the second record only: the third must be redelivered to the next member.
        await first.commit({partition: OffsetAndMetadata(received[1].offset + 1, "infra-test")})
    finally:
        await first.stop()

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group_id)
    finally:
        await admin.close()
    assert offsets[partition].offset == 2
    assert offsets[partition].metadata == "infra-test"

    second = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await second.start()
    try:
        assert await second.committed(partition) == 2
        resumed = await _consume(second, 1)
        assert (resumed[0].offset, resumed[0].value) == (2, b"v2")
    finally:
        await second.stop()


async def test_make_topic_creates_the_partitions_asked_for(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """`make_topic(partitions=3)` yields a topic with exactly three partitions, each accepting records."""
    name = await make_topic(partitions=3)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        partitions = await producer.partitions_for(name)
        landed = {
            (await producer.send_and_wait(name, b"x", partition=p)).partition for p in sorted(partitions)
        }
    finally:
        await producer.stop()
    assert partitions == {0, 1, 2}
    assert landed == {0, 1, 2}
