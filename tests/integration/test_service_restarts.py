"""The service as a real process: killed mid-batch it loses nothing; on SIGTERM it repeats nothing."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    ServiceProcess,
    drop_database,
    first_occurrences,
    fresh_settings,
    owned_turns,
    request_id,
    start_service,
    stored_messages,
    values,
)
from tests.integration.stream_helpers import Record, committed_offsets, produce, read_all, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

THREADS = [f"th{i:02d}" for i in range(8)]


def _distinct_requests(records: list[Record]) -> set[str]:
    return {v["requestId"] for v in values(records)}


def _assert_thread_order(records: list[Record], turns: int) -> None:
    """Per thread, the first delivery of each turn comes in turn order (what a deduplicating worker sees)."""
    by_thread: dict[str, list[str]] = defaultdict(list)
    for event in values(records):
        by_thread[event["threadId"]].append(event["requestId"])
    assert set(by_thread) == set(THREADS)
    for thread, ids in by_thread.items():
        assert first_occurrences(ids) == [request_id(thread, n) for n in range(1, turns + 1)], thread


async def _make_topics(settings: Settings, make_topic: MakeTopic) -> None:
    await make_topic(partitions=2, name=settings.requests_topic)
    await make_topic(partitions=2, name=settings.responses_topic)


async def test_sigkill_mid_batch_then_restart_loses_nothing(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path, service: list[ServiceProcess]
) -> None:
    """SIGKILL mid-stream, then restart: every response stored once, every request enriched, in order."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, max_batch_records=25)
    bootstrap = settings.kafka_bootstrap_servers
    await _make_topics(settings, make_topic)
    turns = 20
    requests, responses = owned_turns(THREADS, turns)
    # The second half of the responses arrives only after the kill: on a fast server the first instance could
    # otherwise finish everything before the kill lands, and the restart would have nothing to prove.
    half = len(responses) // 2
    await produce(bootstrap, settings.responses_topic, responses[:half])
    await produce(bootstrap, settings.requests_topic, requests)

    first = start_service(settings, tmp_path, service, "first")
    try:
        await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= len(responses) // 4)
        first.signal(signal.SIGKILL)
        assert await first.wait(10) == -signal.SIGKILL
        done_before = len(await read_all(bootstrap, settings.persisted_topic, settle_s=0.2))
        assert done_before < len(responses), "the kill came too late to test anything"
        await produce(bootstrap, settings.responses_topic, responses[half:])

        second = start_service(settings, tmp_path, service, "second")
        persisted = await read_topic(
            bootstrap,
            settings.persisted_topic,
            until=lambda rs: len(_distinct_requests(rs)) >= len(responses),
            timeout_s=180,
        )
        enriched = await read_topic(
            bootstrap,
            settings.enriched_topic,
            until=lambda rs: len(_distinct_requests(rs)) >= len(requests),
            timeout_s=180,
        )
        second.signal(signal.SIGTERM)
        assert await second.wait(settings.shutdown_grace_s + 5) == 0, second.log()[-3000:]
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)

    counts = Counter(r["id"] for r in rows)
    assert len(counts) == 2 * len(responses)
    assert set(counts.values()) == {1}  # upserts by id: a replayed turn is not stored twice
    _assert_thread_order(persisted, turns)
    _assert_thread_order(enriched, turns)


async def test_sigterm_exits_zero_commits_and_nothing_is_reprocessed(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path, service: list[ServiceProcess]
) -> None:
    """SIGTERM mid-stream: exit 0 within the grace, offsets committed; the restart emits every event once."""
    # With the turn barrier the recall path waits for the persist path's backlog (every response is written
    # before the requests), so persist gets the CPU alone and finishes before the stop lands. This test is
    # about the stop; test_turn_barrier.py stops the service while requests wait.
    settings = fresh_settings(
        kafka_bootstrap, mongo_uri, max_batch_records=25, barrier="off", busy_thread="allow"
    )
    bootstrap = settings.kafka_bootstrap_servers
    await _make_topics(settings, make_topic)
    turns = 20
    requests, responses = owned_turns(THREADS, turns)
    # The second halves of the requests and of the responses arrive while the service is down (on a fast
    # server the first instance could otherwise finish every response before the stop lands).
    half = len(requests) // 2
    await produce(bootstrap, settings.responses_topic, responses[:half])
    await produce(bootstrap, settings.requests_topic, requests[:half])

    try:
        first = start_service(settings, tmp_path, service, "first")
        await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= len(responses) // 4)
        first.signal(signal.SIGTERM)
        assert await first.wait(settings.shutdown_grace_s) == 0, first.log()[-3000:]
        enriched_before = await read_all(bootstrap, settings.enriched_topic, settle_s=0.2)
        persisted_before = await read_all(bootstrap, settings.persisted_topic, settle_s=0.2)
        # everything emitted before the stop is committed: the group's offsets count exactly those inputs
        committed_requests = await committed_offsets(bootstrap, settings.group_id, settings.requests_topic)
        committed_responses = await committed_offsets(bootstrap, settings.group_id, settings.responses_topic)
        assert sum(committed_requests.values()) == len(enriched_before)
        assert sum(committed_responses.values()) == len(persisted_before)
        assert len(persisted_before) < len(responses), "the stop came too late to test anything"
        await produce(bootstrap, settings.requests_topic, requests[half:])
        await produce(bootstrap, settings.responses_topic, responses[half:])

        second = start_service(settings, tmp_path, service, "second")
        enriched = await read_topic(
            bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= len(requests), timeout_s=180
        )
        persisted = await read_topic(
            bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= len(responses), timeout_s=180
        )
        second.signal(signal.SIGTERM)
        assert await second.wait(settings.shutdown_grace_s) == 0, second.log()[-3000:]
        enriched = await read_all(bootstrap, settings.enriched_topic, settle_s=0.5)
        persisted = await read_all(bootstrap, settings.persisted_topic, settle_s=0.5)
    finally:
        await drop_database(settings)

    # nothing reprocessed: every request enriched exactly once, every response reported exactly once
    assert Counter(v["requestId"] for v in values(enriched)) == Counter(
        {request_id(t, n): 1 for t in THREADS for n in range(1, turns + 1)}
    )
    assert len(persisted) == len(responses)
    assert len(_distinct_requests(persisted)) == len(responses)
    _assert_thread_order(enriched, turns)
