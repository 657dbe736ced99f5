"""One record whose own MongoDB read cannot finish within the timeout, on the real server: dead-lettered with
`error.type` `StorageTimeout` after `STORAGE_TIMEOUT_TRIES`, the records around it enriched. Without the guard
(tries never reached) the same record stalls its partition: every record behind it waits for ever.

The slow read is made deterministic by the data: a thread of 400,000 stored 1 KB rows, recalled whole (a
`lastMessages` of 2^53-1 under a row cap raised past it) with a MongoDB timeout of 1 s. On the local
SecantusDB 50,000 such rows took 1.0-1.6 s to read and 200,000 took 11-16 s (measured before the recall read
rows from the reply's bytes, `storage.raw_batches`; since then 150,000 rows were read within the 1 s once in a
full run, so the thread is larger now); a small thread's read takes milliseconds.
The server itself answers a ping meanwhile (a few ms), so the timeouts count against the record.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.settings import Settings
from schemas.dead_letters import parse_dead_letter_headers
from storage.mongodb import MongoHistoryStorage
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    dead_letters,
    drop_database,
    encoded,
    fresh_settings,
    request_event,
    running_service,
    values,
)
from tests.integration.stream_helpers import produce, read_all, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

BIG_ROWS = 400_000
HUGE = 2**53 - 1
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _settings(kafka_bootstrap: str, mongo_uri: str, tries: int) -> Settings:
    return fresh_settings(
        kafka_bootstrap,
        mongo_uri,
        mongodb_timeout_ms=1000,
        storage_timeout_tries=tries,
        max_rows_per_request=10 * BIG_ROWS,  # the cap is not what is tested here: let the read be huge
        retry_initial_backoff_s=0.1,
        retry_max_backoff_s=0.5,
        barrier="off",
        busy_thread="allow",
    )


async def _seed_big_thread(settings: Settings) -> None:
    """`big` (owned by `u`): BIG_ROWS stored rows of ~1 KB, written as @mastra/mongodb stores them, with the
    service's indexes made first (so that its start does not build them over the rows)."""
    seeding = settings.model_copy(update={"mongodb_timeout_ms": 120_000})
    async with MongoHistoryStorage.open(seeding) as storage:
        await storage.threads.insert_one(
            {"id": "big", "resourceId": "u", "title": "", "metadata": {}, "createdAt": T0, "updatedAt": T0}
        )
        content = json.dumps({"format": 2, "parts": [{"type": "text", "text": "z" * 900}]})
        for start in range(0, BIG_ROWS, 5000):
            docs: list[dict[str, Any]] = [
                {
                    "id": f"big-{i:07d}",
                    "thread_id": "big",
                    "resourceId": "u",
                    "role": "user",
                    "type": "v2",
                    "content": content,
                    "createdAt": T0 + timedelta(seconds=i),
                }
                for i in range(start, min(BIG_ROWS, start + 5000))
            ]
            await storage.messages.insert_many(docs, ordered=False)


def _requests() -> list[tuple[bytes, bytes]]:
    """One partition: a small thread's request, the big thread's, then two more small ones (behind it)."""
    big = request_event("big", "u", 1, "everything, please", memory={"lastMessages": HUGE})
    return [
        encoded(request_event("s1", "u", 1, "hi")),
        encoded(big),
        encoded(request_event("s2", "u", 1, "hi")),
        encoded(request_event("s3", "u", 1, "hi")),
    ]


@pytest.fixture
async def seeded(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, request: pytest.FixtureRequest
) -> AsyncIterator[Settings]:
    """The settings of a test whose `STORAGE_TIMEOUT_TRIES` is the parameter, with `big` seeded."""
    tries = request.param
    settings = _settings(kafka_bootstrap, mongo_uri, tries)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    await _seed_big_thread(settings)
    try:
        yield settings
    finally:
        await drop_database(settings)


@pytest.mark.parametrize("seeded", [3], indirect=True)
async def test_a_read_that_keeps_timing_out_is_dead_lettered_as_storage_timeout(seeded: Settings) -> None:
    settings = seeded
    bootstrap = settings.kafka_bootstrap_servers
    async with running_service(settings):
        await produce(bootstrap, settings.requests_topic, _requests())
        enriched = await read_topic(
            bootstrap,
            settings.enriched_topic,
            until=lambda rs: {v["threadId"] for v in values(rs)} >= {"s1", "s2", "s3"},
            timeout_s=150,
        )
        letters = await read_topic(
            bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1, timeout_s=60
        )
    assert "big" not in {v["threadId"] for v in values(enriched)}
    [letter] = letters
    info = parse_dead_letter_headers(letter.headers)
    assert info.error_type == "StorageTimeout"
    assert "3 times" in info.error_message
    assert json.loads(letter.value)["threadId"] == "big"
    assert (info.source_partition, info.source_offset) == (0, 1)
    assert [r.value for r in await dead_letters(settings)] == [letter.value]  # nothing else refused


@pytest.mark.parametrize("seeded", [10**9], indirect=True)
async def test_without_the_guard_the_slow_record_stalls_its_partition(seeded: Settings) -> None:
    """Tries never reached: the record before the slow one is enriched, the slow one is retried for ever
    (its path paused), and the records behind it wait: none is enriched within a bounded wait."""
    settings = seeded
    bootstrap = settings.kafka_bootstrap_servers
    async with running_service(settings):
        await produce(bootstrap, settings.requests_topic, _requests())
        await read_topic(
            bootstrap,
            settings.enriched_topic,
            until=lambda rs: "s1" in {v["threadId"] for v in values(rs)},
            timeout_s=60,
        )
        with pytest.raises(AssertionError, match="condition not met"):
            await read_topic(
                bootstrap,
                settings.enriched_topic,
                until=lambda rs: bool({v["threadId"] for v in values(rs)} & {"s2", "s3", "big"}),
                timeout_s=30,
            )
        assert await read_all(bootstrap, settings.requests_dlq, settle_s=0.5) == []
