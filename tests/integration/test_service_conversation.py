"""The service end to end on real Kafka and a real MongoDB-wire server: conversations, replays, duplicates."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    message_id,
    request_event,
    request_id,
    response_event,
    running_service,
    stored_messages,
    stored_threads,
    values,
)
from tests.integration.stream_helpers import (
    Record,
    committed_offsets,
    produce,
    read_all,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

THREADS = ("alpha", "beta", "gamma")
TURNS = 3


def _has_requests(wanted: set[str]) -> Callable[[list[Record]], bool]:
    return lambda records: wanted <= {v["requestId"] for v in values(records)}


def _owner(thread: str) -> str:
    return f"user-{thread}"


async def _settings(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, **overrides: Any
) -> Settings:
    settings = fresh_settings(kafka_bootstrap, mongo_uri, **overrides)
    await make_topic(partitions=2, name=settings.requests_topic)
    await make_topic(partitions=2, name=settings.responses_topic)
    return settings


async def test_multi_turn_conversations_grow_turn_by_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Each turn's enriched context is every earlier turn of that thread (as memory) then the new input."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    expected_memory: dict[str, list[tuple[str, str]]] = {t: [] for t in THREADS}  # (id, text) so far
    try:
        async with running_service(settings):
            for turn in range(1, TURNS + 1):
                requests = [request_event(t, _owner(t), turn, f"{t} question {turn}") for t in THREADS]
                await produce(bootstrap, settings.requests_topic, [encoded(r) for r in requests])
                wanted = {request_id(t, turn) for t in THREADS}
                enriched = await read_topic(
                    bootstrap,
                    settings.enriched_topic,
                    until=_has_requests(wanted),
                )
                by_request = {v["requestId"]: v for v in values(enriched)}
                responses = []
                for thread in THREADS:
                    event = by_request[request_id(thread, turn)]
                    input_id = message_id(thread, _owner(thread), turn, "input")
                    got = [
                        (m["id"], m["content"]["parts"][0]["text"], m["source"]) for m in event["messages"]
                    ]
                    want = [(i, text, "memory") for i, text in expected_memory[thread]]
                    want.append((input_id, f"{thread} question {turn}", "input"))
                    assert got == want, f"turn {turn} of {thread}"
                    assert event["history"] == {
                        "recalled": 2 * (turn - 1),
                        "limit": 40,
                        "complete": True,
                        "waitedMs": event["history"]["waitedMs"],
                    }
                    assert event["eventId"] == event["requestId"]
                    # the worker echoes the whole context back as the turn's input, as a Mastra agent does
                    answer = f"{thread} answer {turn}"
                    responses.append(response_event(thread, _owner(thread), turn, event["messages"], answer))
                    expected_memory[thread] += [
                        (input_id, f"{thread} question {turn}"),
                        (message_id(thread, _owner(thread), turn, "response"), answer),
                    ]
                await produce(bootstrap, settings.responses_topic, [encoded(r) for r in responses])
                persisted = await read_topic(
                    bootstrap,
                    settings.persisted_topic,
                    until=_has_requests(wanted),
                )
                for event in values(persisted):
                    if event["requestId"] in wanted:
                        thread = event["threadId"]
                        assert event["skipped"] is None
                        assert event["savedMessageIds"] == [i for i, _ in expected_memory[thread][-2:]]

        rows = await stored_messages(settings)
        threads = await stored_threads(settings)
    finally:
        await drop_database(settings)
    for thread in THREADS:
        ids = sorted(r["id"] for r in rows if r["thread_id"] == thread)
        assert ids == sorted(i for i, _ in expected_memory[thread])  # recalled copies were not saved again
    assert {t["id"]: t["resourceId"] for t in threads} == {t: _owner(t) for t in THREADS}


async def test_same_response_twice_leaves_history_unchanged(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """A response delivered a second time rewrites nothing: the stored rows and the thread are identical."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    request = request_event("t1", "u1", 1, "hello")
    response = response_event("t1", "u1", 1, request["messages"], "hi")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [encoded(response)])
            await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 1)
            rows_before = await stored_messages(settings)
            threads_before = await stored_threads(settings)
            await produce(bootstrap, settings.responses_topic, [encoded(response)])
            persisted = await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 2)
            rows_after = await stored_messages(settings)
            threads_after = await stored_threads(settings)
    finally:
        await drop_database(settings)
    assert len(rows_before) == 2
    assert sorted(rows_after, key=lambda r: r["id"]) == sorted(rows_before, key=lambda r: r["id"])
    assert threads_after == threads_before
    first, second = values(persisted)
    assert first["savedMessageIds"] == second["savedMessageIds"]
    assert first["threadUpdatedAt"] == second["threadUpdatedAt"]


async def test_same_request_twice_gives_the_same_enriched_event(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """A request delivered twice yields byte-identical enriched events, headers included."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    turn1 = request_event("t1", "u1", 1, "hello")
    history = response_event("t1", "u1", 1, turn1["messages"], "hi")
    turn2 = request_event("t1", "u1", 2, "and now?")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [encoded(history)])
            await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 1)
            await produce(
                bootstrap,
                settings.requests_topic,
                [encoded(turn2), encoded(turn2)],
                headers=[("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
            )
            enriched = await read_topic(bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 2)
        letters = await read_all(bootstrap, settings.requests_dlq, settle_s=0.5)
    finally:
        await drop_database(settings)
    first, second = enriched
    assert first.value == second.value
    assert first.key == second.key == b"t1"
    assert list(first.headers) == list(second.headers)
    assert ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01") in list(first.headers)
    assert values([first])[0]["history"]["recalled"] == 2
    assert letters == []


async def test_only_recall_leaves_the_persist_path_alone(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """`run --only recall` enriches requests and neither reads nor commits the responses topic."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    request = request_event("t1", "u1", 1, "hello")
    try:
        async with running_service(settings, only="recall"):
            await produce(
                bootstrap, settings.responses_topic, [encoded(response_event("t1", "u1", 1, [], "x"))]
            )
            await produce(bootstrap, settings.requests_topic, [encoded(request)])
            enriched = await read_topic(bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 1)
            await _wait_committed_total(settings, settings.requests_topic, 1)
        persisted = await read_all(bootstrap, settings.persisted_topic, settle_s=0.5)
        committed = await committed_offsets(bootstrap, settings.group_id, settings.responses_topic)
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)
    assert values(enriched)[0]["requestId"] == request["requestId"]
    assert persisted == []
    assert committed == {}
    assert rows == []


async def _wait_committed_total(settings: Settings, topic: str, total: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (
        sum((await committed_offsets(settings.kafka_bootstrap_servers, settings.group_id, topic)).values())
        < total
    ):
        assert time.monotonic() < deadline, f"{topic}: fewer than {total} records committed"
        await asyncio.sleep(0.2)
