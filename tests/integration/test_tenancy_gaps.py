"""The last tenancy gaps (issue 31 item 4), on the real broker and the real MongoDB-wire server.

* A foreign busy marker (another resource's turn pending on a thread not stored yet) lapses at the
  abandonment horizon: it no longer reserves the thread id.
* A request whose enriched event Kafka refuses (a dead letter at send time) leaves its thread not busy: the
  thread's next request is enriched complete, without waiting for the turn timeout.
* Derived message ids another tenant can predict and store first do not make a turn fail.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from message_history.settings import Settings
from storage.turns import TURNS
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    request_event,
    request_id,
    running_service,
    values,
)
from tests.integration.stream_helpers import produce, read_all, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Far above every bound a test waits with: a request held for it would fail the test's read, not pass late.
LONG_TURN_TIMEOUT_MS = 120_000


async def _db_insert(settings: Settings, collection: str, docs: list[dict[str, Any]]) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        await client[settings.mongodb_database][collection].insert_many(docs)
    finally:
        await client.close()


async def _enriched(settings: Settings, rid: str, timeout_s: float = 60.0) -> dict[str, Any]:
    records = await read_topic(
        settings.kafka_bootstrap_servers,
        settings.enriched_topic,
        until=lambda rs: any(v["requestId"] == rid for v in values(rs)),
        timeout_s=timeout_s,
    )
    return next(v for v in values(records) if v["requestId"] == rid)


async def test_a_foreign_marker_past_the_abandonment_horizon_reserves_nothing(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """tenant-a's turn on t (never stored) was enriched long before the horizon and never answered: a request
    of tenant-b on t is enriched, not refused for ownership (before, the marker held t for tenant-a for good).
    """
    settings = fresh_settings(
        kafka_bootstrap,
        mongo_uri,
        busy_thread="enqueue",
        abandon_turn_after_ms=60_000,
        turn_timeout_ms=LONG_TURN_TIMEOUT_MS,
        max_poll_interval_ms=4 * LONG_TURN_TIMEOUT_MS,
    )
    await make_topic(name=settings.requests_topic)
    old = datetime.now(UTC) - timedelta(hours=2)
    await _db_insert(
        settings, TURNS, [{"_id": "t", "pending": "a-request", "enrichedAt": old, "resourceId": "tenant-a"}]
    )
    try:
        async with running_service(settings):
            foreign = request_event("t", "tenant-b", 1, "q")
            await produce(settings.kafka_bootstrap_servers, settings.requests_topic, [encoded(foreign)])
            event = await _enriched(settings, request_id("t", 1))
            assert event["resourceId"] == "tenant-b"
            letters = await read_all(settings.kafka_bootstrap_servers, settings.requests_dlq, settle_s=0.5)
            assert letters == []
    finally:
        await drop_database(settings)
