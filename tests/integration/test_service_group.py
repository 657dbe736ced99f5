"""Two instances in one consumer group share the partitions; everything is processed, each thread in order."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Sequence

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from message_history.errors import InvalidInputError
from message_history.settings import Settings
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.protocol import BatchHistoryStorage, RecallQuery, SaveTurn, Thread
from storage.sequential import SequentialBatches
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    first_occurrences,
    fresh_settings,
    request_id,
    running_service,
    stored_messages,
    values,
    wave,
)
from tests.integration.stream_helpers import Record, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

THREADS = [f"th{i:02d}" for i in range(16)]
PARTITIONS = 4


class _Counting(SequentialBatches):
    """One instance's storage: the shared MongoDB, counting the requests and turns this instance handled."""

    def __init__(self, storage: BatchHistoryStorage) -> None:
        super().__init__(storage)
        self._batches = storage  # the batch forms it counts go to MongoDB's own, one round trip each
        self.recalled: Counter[str] = Counter()
        self.saved: Counter[str] = Counter()

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        return await self._batches.get_threads(thread_ids)

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        self.recalled.update(q.thread_id for q in queries)
        return await self._batches.list_messages_many(queries)

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
        results = await self._batches.save_many(turns)
        self.saved.update(t.thread_id for t in turns)
        return results


async def _wait_members(bootstrap: str, group_id: str, members: int, timeout_s: float = 60) -> None:
    """Until the group is Stable with `members` members (each instance runs one consumer per path)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            [response] = await admin.describe_consumer_groups([group_id])
            group = response.groups[0]
            state, found = group[2], len(group[5])
            if state == "Stable" and found == members:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"group {group_id}: {state} with {found} members, wanted {members}")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def _distinct(records: list[Record]) -> int:
    return len({v["requestId"] for v in values(records)})


def _assert_in_order(records: list[Record], turns: int) -> None:
    by_thread: dict[str, list[str]] = defaultdict(list)
    for event in values(records):
        by_thread[event["threadId"]].append(event["requestId"])
    for thread in THREADS:
        assert first_occurrences(by_thread[thread]) == [request_id(thread, n) for n in range(1, turns + 1)]


async def test_two_instances_share_partitions_in_order(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """A second instance joining mid-stream takes partitions; every turn processed, per thread in order."""
    settings: Settings = fresh_settings(kafka_bootstrap, mongo_uri, max_batch_records=20)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=PARTITIONS, name=settings.requests_topic)
    await make_topic(partitions=PARTITIONS, name=settings.responses_topic)
    turns = 8
    first_requests, first_responses = wave(THREADS, range(1, 5))
    later_requests, later_responses = wave(THREADS, range(5, turns + 1))
    total = len(THREADS) * turns

    try:
        async with contextlib.AsyncExitStack() as stack:
            mongo = await stack.enter_async_context(MongoHistoryStorage.open(settings))
            a, b = _Counting(mongo), _Counting(mongo)
            await stack.enter_async_context(running_service(settings, storage=a))
            await _wait_members(bootstrap, settings.group_id, 2)
            await produce(bootstrap, settings.responses_topic, first_responses)
            await produce(bootstrap, settings.requests_topic, first_requests)
            await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 8)

            await stack.enter_async_context(running_service(settings, storage=b))
            await _wait_members(bootstrap, settings.group_id, 4)
            a_saved, a_recalled = sum(a.saved.values()), sum(a.recalled.values())
            await produce(bootstrap, settings.responses_topic, later_responses)
            await produce(bootstrap, settings.requests_topic, later_requests)
            persisted = await read_topic(
                bootstrap, settings.persisted_topic, until=lambda rs: _distinct(rs) >= total, timeout_s=180
            )
            enriched = await read_topic(
                bootstrap, settings.enriched_topic, until=lambda rs: _distinct(rs) >= total, timeout_s=180
            )
            after_join = (sum(a.saved.values()) - a_saved, sum(a.recalled.values()) - a_recalled)
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)

    assert sum(b.saved.values()) > 0, "the second instance persisted nothing"
    assert sum(b.recalled.values()) > 0, "the second instance recalled nothing"
    assert after_join[0] > 0, "the first instance persisted nothing after the second joined"
    assert after_join[1] > 0, "the first instance recalled nothing after the second joined"
    _assert_in_order(persisted, turns)
    _assert_in_order(enriched, turns)
    counts = Counter(r["id"] for r in rows)
    assert len(counts) == 2 * total
    assert set(counts.values()) == {1}
