"""A Kafka broker that goes away mid-stream and comes back: the service waits, then loses and repeats nothing.

The broker is a private one (tests/integration/private_kafka.py), so stopping it disturbs no other test. It is
stopped with SIGTERM while a wave of events sits in it unread and started again on the same ports and data
after about ten seconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from message_history.app.health import Health
from tests.integration.private_kafka import PrivateKafka
from tests.integration.service_harness import (
    dead_letters,
    drop_database,
    fresh_settings,
    read_request_ids,
    running_service,
    stored_messages,
    values,
    wave,
)
from tests.integration.stream_helpers import produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

OUTAGE_S = 10.0
THREADS = [f"th{i}" for i in range(6)]


async def _make_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1) for name in names], timeout_ms=30_000)
    finally:
        await admin.close()


async def test_kafka_outage_is_waited_out_without_loss_or_duplicates(
    private_kafka: PrivateKafka, mongo_uri: str, tmp_path: Path
) -> None:
    """The broker stopped ~10 s with a wave unread: afterwards every turn is stored once, every request
    enriched, nothing dead-lettered, and the service, never restarted, stops cleanly."""
    settings = fresh_settings(private_kafka.bootstrap, mongo_uri, retry_max_backoff_s=1.0)
    bootstrap = private_kafka.bootstrap
    await _make_topics(bootstrap, [settings.requests_topic, settings.responses_topic])
    total_turns = 9
    health = Health()
    async with running_service(settings, health=health) as service:
        requests, responses = wave(THREADS, range(1, 4))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= len(responses))

        # A wave lands in the broker, which then goes away before (or while) the service handles it.
        requests, responses = wave(THREADS, range(4, 7))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        await asyncio.to_thread(private_kafka.stop)
        await asyncio.sleep(OUTAGE_S)
        assert not service.done(), "the service gave up during the outage"
        await asyncio.to_thread(private_kafka.start)

        requests, responses = wave(THREADS, range(7, total_turns + 1))
        await produce(bootstrap, settings.responses_topic, responses)
        await produce(bootstrap, settings.requests_topic, requests)
        want = len(THREADS) * total_turns
        persisted = await read_request_ids(bootstrap, settings.persisted_topic, want, timeout_s=180)
        enriched = await read_request_ids(bootstrap, settings.enriched_topic, want, timeout_s=180)
    rows = await stored_messages(settings)
    letters = await dead_letters(settings)
    await drop_database(settings)

    assert letters == []
    counts = Counter(r["id"] for r in rows)
    assert len(counts) == 2 * want  # one user and one assistant message per turn
    assert set(counts.values()) == {1}
    expected = {f"{t}-turn{n}" for t in THREADS for n in range(1, total_turns + 1)}
    assert {v["requestId"] for v in values(persisted)} == expected
    assert {v["requestId"] for v in values(enriched)} == expected
    # Whatever a recall saw (the paths run independently, so a late recall may see later turns too), it saw
    # each stored message once, oldest first; a redelivered event is the same event, so every copy must pass.
    for event in values(enriched):
        recalled = [m for m in event["messages"] if m["source"] == "memory"]
        ids = [m["id"] for m in recalled]
        assert len(ids) == len(set(ids)), event["requestId"]
        assert len(ids) == event["history"]["recalled"], event["requestId"]
        assert set(ids) <= set(counts), event["requestId"]
        assert ids == [m["id"] for m in sorted(recalled, key=lambda m: (m["createdAt"], m["id"]))]
