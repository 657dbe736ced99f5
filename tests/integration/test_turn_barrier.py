"""A request never misses the turn answered before it: the turn barrier and busy-thread policy, end to end.

Real Kafka, real MongoDB-wire server, the service in-process. The scenarios of issue 15: a fast worker and a
fast user, 50 threads x 5 turns; with the barrier off (and policy allow) the race shows, with them on no
enriched request lacks an earlier turn of its thread, on one instance and on two in one group.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from message_history import metrics
from message_history.app.service import Path, run_service
from message_history.app.topics import ensure_topics, service_topics
from message_history.errors import StartupError
from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    dead_letters,
    drop_database,
    encoded,
    fresh_settings,
    message_id,
    request_event,
    request_id,
    response_event,
    running_service,
    values,
)
from tests.integration.stream_helpers import committed_offsets, produce, read_all, read_topic
from tests.integration.test_service_group import _wait_members
from tests.integration.turn_scenarios import UserMode, run_conversations

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

THREADS = [f"c{i:02d}" for i in range(50)]
TURNS = 5
PARTITIONS = 4


async def _settings(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    *,
    responses_partitions: int = PARTITIONS,
    **overrides: Any,
) -> Settings:
    settings = fresh_settings(kafka_bootstrap, mongo_uri, **overrides)
    await make_topic(partitions=PARTITIONS, name=settings.requests_topic)
    await make_topic(partitions=responses_partitions, name=settings.responses_topic)
    await make_topic(partitions=PARTITIONS, name=settings.enriched_topic)
    return settings


@pytest.mark.parametrize(
    ("mode", "barrier", "busy"),
    [
        pytest.param("after-answer", "off", "allow", id="after-answer-barrier-off-shows-the-race"),
        pytest.param("after-answer", "on", "allow", id="after-answer-barrier-on"),
        pytest.param("while-answering", "off", "allow", id="while-answering-off-shows-the-race"),
        pytest.param("while-answering", "on", "enqueue", id="while-answering-enqueue"),
    ],
)
async def test_every_request_sees_every_earlier_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, mode: UserMode, barrier: str, busy: str
) -> None:
    """With the barrier (and enqueue, while answering) no request lacks an earlier turn; off, some do."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, barrier=barrier, busy_thread=busy)
    try:
        async with running_service(settings):
            seen = await run_conversations(settings, THREADS, TURNS, mode)
    finally:
        await drop_database(settings)
    misses = seen.misses(THREADS, TURNS)
    total = len(THREADS) * (TURNS - 1)
    if barrier == "off":
        assert misses, "with the barrier off the race did not show: this test could not catch it"
        print(f"\n{mode}, barrier off: {len(misses)} of {total} requests missed an earlier turn")
    else:
        assert misses == [], f"{len(misses)} of {total} requests missed an earlier turn: {misses[:5]}"
        assert seen.incomplete() == []
        print(f"\n{mode}, barrier on, busy {busy}: {_distribution(seen.waited_ms())}")


SPLIT: tuple[Path | None, Path | None] = ("recall", "persist")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["after-answer", "while-answering"])
@pytest.mark.parametrize(
    ("topology", "barrier"),
    [
        pytest.param((None, None), "on", id="both-paths-each"),
        # recall on one instance, persist on the other: progress comes only from the committed offsets
        pytest.param(SPLIT, "on", id="recall-here-persist-there"),
        pytest.param(SPLIT, "off", id="recall-here-persist-there-off-shows-the-race"),
    ],
)
async def test_two_instances_in_one_group_miss_nothing(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    mode: UserMode,
    topology: tuple[Path | None, Path | None],
    barrier: str,
) -> None:
    """Two instances share the partitions; the barrier reads the other's progress from committed offsets."""
    busy = "enqueue" if barrier == "on" else "allow"
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, barrier=barrier, busy_thread=busy)
    members = sum(1 if only else 2 for only in topology)
    try:
        async with contextlib.AsyncExitStack() as stack:
            for only in topology:
                await stack.enter_async_context(running_service(settings, only=only))
            await _wait_members(settings.kafka_bootstrap_servers, settings.group_id, members)
            seen = await run_conversations(settings, THREADS, TURNS, mode)
    finally:
        await drop_database(settings)
    misses = seen.misses(THREADS, TURNS)
    if barrier == "off":
        assert misses, "with the barrier off the race did not show: this test could not catch it"
        return
    assert misses == [], f"{len(misses)} requests missed an earlier turn: {misses[:5]}"
    assert seen.incomplete() == []


def _distribution(waits: list[int]) -> str:
    """waitedMs over every enriched request: how many waited, and percentiles (for the bench notes)."""

    def at(q: float) -> int:
        return waits[min(len(waits) - 1, int(len(waits) * q))]

    waited = sum(1 for w in waits if w > 0)
    percentiles = f"p50={at(0.5)} p90={at(0.9)} p99={at(0.99)} max={waits[-1]}"
    return f"{waited}/{len(waits)} waited; waitedMs {percentiles}"


async def _enriched(settings: Settings, rid: str, copies: int = 1) -> list[dict[str, Any]]:
    records = await read_topic(
        settings.kafka_bootstrap_servers,
        settings.enriched_topic,
        until=lambda rs: sum(v["requestId"] == rid for v in values(rs)) >= copies,
    )
    return [v for v in values(records) if v["requestId"] == rid]


def _memory_ids(event: dict[str, Any]) -> set[str]:
    return {m["id"] for m in event["messages"] if m["source"] == "memory"}


async def test_a_response_that_never_comes_releases_the_next_request_after_the_timeout(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Turn 1 is never answered: turn 2 goes out after the timeout, marked `complete: false`."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, turn_timeout_ms=1500)
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 1, "q1"))])
            [first] = await _enriched(settings, request_id("t", 1))
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 2, "q2"))])
            [second] = await _enriched(settings, request_id("t", 2))
    finally:
        await drop_database(settings)
    assert first["history"] == {"recalled": 0, "limit": 40, "complete": True, "waitedMs": 0}
    assert second["history"]["complete"] is False
    assert second["history"]["waitedMs"] > 0
    assert _memory_ids(second) == set()  # a turn is saved with its answer: turn 1 left nothing


async def test_the_busy_marker_survives_a_restart_and_a_redelivery_does_not_wait_on_itself(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Turn 1 enriched, service restarted: turn 2 still waits for turn 1's answer; turn 1 again goes now."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, turn_timeout_ms=14_000)
    bootstrap = settings.kafka_bootstrap_servers
    first_request = request_event("t", "u", 1, "q1")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, [encoded(first_request)])
            [first] = await _enriched(settings, request_id("t", 1))
        async with running_service(settings):
            # a redelivered copy of the pending turn: must not wait for its own answer (14 s)
            await produce(bootstrap, settings.requests_topic, [encoded(first_request)])
            again = (await _enriched(settings, request_id("t", 1), copies=2))[1]
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 2, "q2"))])
            await asyncio.sleep(1.0)  # without a marker that survived, turn 2 would go out now, unanswered
            answer = response_event("t", "u", 1, first["messages"], "a1")
            await produce(bootstrap, settings.responses_topic, [encoded(answer)])
            [second] = await _enriched(settings, request_id("t", 2))
    finally:
        await drop_database(settings)
    assert again["history"]["complete"] is True
    assert again["history"]["waitedMs"] == 0
    assert second["history"]["complete"] is True
    assert second["history"]["waitedMs"] > 0
    assert message_id("t", "u", 1, "response") in _memory_ids(second)


async def test_reject_sends_a_request_on_a_busy_thread_to_the_dead_letter_topic(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Policy reject: turn 2 before turn 1's answer is a dead letter `ThreadBusyError`; others go on."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, busy_thread="reject")
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 1, "q1"))])
            await _enriched(settings, request_id("t", 1))
            await produce(
                bootstrap,
                settings.requests_topic,
                [encoded(request_event("t", "u", 2, "q2")), encoded(request_event("other", "u", 1, "q"))],
            )
            await _enriched(settings, request_id("other", 1))
            letters = await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1)
    finally:
        await drop_database(settings)
    [letter] = letters
    headers = {k: v.decode() for k, v in letter.headers}
    assert headers["error.type"] == "ThreadBusyError"
    assert headers["error.message"].startswith("thread-busy:")
    assert values([letter])[0]["requestId"] == request_id("t", 2)
    assert len(await dead_letters(settings)) == 1  # nothing else refused


async def test_reject_lets_a_thread_go_on_once_its_unanswered_turn_is_abandoned(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Policy reject, a worker that never answers turn 1: once turn 1 is older than
    `MESSAGE_HISTORY_ABANDON_TURN_AFTER_MS` (1 s here), turn 2 is enriched, not refused; without the
    horizon every later request of the thread was a dead letter (the test above shows the refusal)."""
    settings = await _settings(
        kafka_bootstrap, mongo_uri, make_topic, busy_thread="reject", abandon_turn_after_ms=1000
    )
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 1, "q1"))])
            await _enriched(settings, request_id("t", 1))
            await asyncio.sleep(1.5)  # turn 1 stays unanswered past the horizon
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 2, "q2"))])
            [second] = await _enriched(settings, request_id("t", 2))
        letters = await dead_letters(settings)
    finally:
        await drop_database(settings)
    assert second["requestId"] == request_id("t", 2)
    assert letters == []


@pytest.mark.parametrize("barrier", ["on", "off"])
async def test_unequal_partition_counts_refuse_to_start_with_the_barrier_on(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, barrier: str
) -> None:
    """Requests on 4 partitions, responses on 2: with the barrier on the service refuses, saying the fix."""
    settings = await _settings(
        kafka_bootstrap, mongo_uri, make_topic, responses_partitions=2, barrier=barrier
    )
    stop = asyncio.Event()
    try:
        if barrier == "on":
            with pytest.raises(StartupError, match=r"same number of partitions .*4 and 2.*BARRIER=off"):
                await run_service(settings, stop=stop)
        else:
            async with running_service(settings):
                await produce(
                    settings.kafka_bootstrap_servers,
                    settings.requests_topic,
                    [encoded(request_event("t", "u", 1, "q1"))],
                )
                await _enriched(settings, request_id("t", 1))
    finally:
        await drop_database(settings)


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s}s")
        await asyncio.sleep(0.05)


async def test_a_stop_while_a_request_waits_drains_at_once_and_leaves_it_for_the_next_owner(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopping ends a busy-thread wait: no batch is abandoned, the request is not committed, and the next
    run recalls it once the answer came."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, turn_timeout_ms=14_000)
    bootstrap = settings.kafka_bootstrap_servers
    waits = metrics.TURN_WAITS.labels(reason="busy-thread")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 1, "q1"))])
            [first] = await _enriched(settings, request_id("t", 1))
            before = waits._value.get()
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 2, "q2"))])
            await _until(lambda: waits._value.get() > before, "turn 2 never started waiting")
        # the wait (14 s) is longer than the drain share of the grace (9 s): only an interrupted wait is clean
        assert "in-flight batch abandoned at shutdown" not in caplog.text
        emitted = {v["requestId"] for v in values(await read_all(bootstrap, settings.enriched_topic))}
        assert emitted == {request_id("t", 1)}
        committed = await committed_offsets(bootstrap, settings.group_id, settings.requests_topic)
        assert sum(committed.values()) == 1  # turn 1 only: turn 2 is left for the next owner

        async with running_service(settings):
            answer = response_event("t", "u", 1, first["messages"], "a1")
            await produce(bootstrap, settings.responses_topic, [encoded(answer)])
            [second] = await _enriched(settings, request_id("t", 2))
    finally:
        await drop_database(settings)
    assert second["history"]["complete"] is True
    assert message_id("t", "u", 1, "response") in _memory_ids(second)


async def test_the_topics_command_creates_equal_counts_and_refuses_unequal_ones(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """`message-history topics --partitions 3` creates every topic with 3; unequal input topics fail."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    try:
        report = await ensure_topics(settings, partitions=3, replication=1)
        counts, problems = report.counts, report.problems
    finally:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(service_topics(settings))
        finally:
            await admin.close()
    assert problems == []
    assert set(counts.values()) == {3}
    assert set(counts) == set(service_topics(settings))

    unequal = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=4, name=unequal.requests_topic)
    await make_topic(partitions=2, name=unequal.responses_topic)
    report = await ensure_topics(unequal, partitions=None, replication=1)
    counts, problems = report.counts, report.problems
    assert counts[unequal.requests_topic] == 4
    assert counts[unequal.enriched_topic] is None  # nothing created without --partitions
    assert len(problems) == 1
    assert "4 partitions" in problems[0]
    assert "BARRIER=off" in problems[0]
