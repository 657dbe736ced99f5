"""The replay's plan read from Kafka: the topic's partitions, their start and end offsets now, and the
offsets `--from-time` / `--until` name (`plan.plan_ranges` turns them into ranges)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.consumer import build_reader
from message_history.app.replay.options import CLIENT_ID, ReplayOptions
from message_history.app.replay.plan import Plan, UsageError, plan_ranges, to_millis
from message_history.app.topics import existing_partitions
from message_history.settings import Settings

__all__ = ["plan_replay"]


async def plan_replay(settings: Settings, options: ReplayOptions) -> Plan:
    """The partitions' ranges: the topic's partitions, start and end offsets now, the start/until lookups."""
    found = await existing_partitions(settings, [options.topic], client_id=CLIENT_ID)
    if options.topic not in found:
        raise UsageError(f"topic {options.topic!r} does not exist")
    partitions = found[options.topic]
    tps = [TopicPartition(options.topic, p) for p in partitions]
    consumer = build_reader(settings, client_id=CLIENT_ID, max_records=1)
    await consumer.start()
    try:
        consumer.assign(tps)
        beginning = {tp.partition: o for tp, o in (await consumer.beginning_offsets(tps)).items()}
        end = {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
        start: dict[int, int | None]
        if options.start.offsets is not None:
            start = dict(options.start.offsets)
        elif options.start.timestamp is not None:
            start = await _offsets_at(consumer, tps, options.start.timestamp)
        else:
            start = dict(beginning)
        until = await _offsets_at(consumer, tps, options.until) if options.until is not None else None
    finally:
        await consumer.stop()
    return plan_ranges(beginning=beginning, end=end, start=start, until=until)


async def _offsets_at(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], at: datetime
) -> dict[int, int | None]:
    """Per partition, the first offset whose timestamp is at or after `at` (None: no such record yet)."""
    found = await consumer.offsets_for_times({tp: to_millis(at) for tp in tps})
    return {tp.partition: (meta.offset if meta is not None else None) for tp, meta in found.items()}
