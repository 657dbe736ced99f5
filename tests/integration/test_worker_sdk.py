"""The worker SDK end to end: the service in-process plus an `AgentWorker`, on real Kafka and MongoDB-wire.

A client sends each turn's request and waits for its `HistoryPersisted` before the next, as a real client
does. The worker's handler sees the recalled history grow, a handler that raises becomes a failed turn that
saves nothing, a duplicated enriched event is answered once, and SIGTERM stops the worker, offsets committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from message_history.settings import Settings
from schemas.ids import Kind
from schemas.messages import format_timestamp
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    encoded,
    fresh_settings,
    message_id,
    request_event,
    request_id,
    running_service,
    stored_messages,
    values,
)
from tests.integration.stream_helpers import Record, committed_offsets, produce, read_all, read_topic
from worker import AgentWorker, Reply, RetryLater, Turn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TURNS = 3
KINDS: tuple[Kind, ...] = ("input", "response")
WAIT_S = 90.0


async def _settings(kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic) -> Settings:
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    for name in (settings.requests_topic, settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=2, name=name)
    return settings


def _now() -> str:
    return format_timestamp(datetime.now(UTC))


async def _wait_until(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.1)


class Recorder:
    """A handler that records what it saw and answers with the number of messages it remembers."""

    def __init__(self, fail_on: set[str] | None = None, limit_on: set[str] | None = None) -> None:
        self.turns: list[Turn] = []
        self.fail_on = fail_on or set()
        self.limit_on = limit_on or set()  # rate-limited on their first attempt

    async def __call__(self, turn: Turn) -> Reply | str:
        self.turns.append(turn)
        if turn.request_id in self.fail_on:
            raise RuntimeError("the model is down")
        if turn.request_id in self.limit_on:
            self.limit_on.discard(turn.request_id)
            raise RetryLater("429 Too Many Requests", after_s=0.2)
        return f"{turn.thread_id}: I remember {len(turn.memory)} messages"


async def _worker(settings: Settings, handler: Recorder, **options: Any) -> AgentWorker:
    options.setdefault("handle_signals", False)
    return AgentWorker.from_settings(handler, settings, group_id=f"{settings.group_id}-agent", **options)


@contextlib.asynccontextmanager
async def _run_worker(worker: AgentWorker) -> AsyncIterator[asyncio.Task[Any]]:
    async with worker:
        task = asyncio.create_task(worker.run())
        try:
            yield task
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)


async def _turn(settings: Settings, thread: str, turn: int) -> dict[str, Any]:
    """Send `turn` of `thread` and return its HistoryPersisted (the client's wait)."""
    bootstrap = settings.kafka_bootstrap_servers
    request = request_event(thread, "u", turn, f"q{turn}", createdAt=_now())  # as a live client stamps it
    await produce(bootstrap, settings.requests_topic, [encoded(request)])
    rid = request_id(thread, turn)
    persisted = await read_topic(
        bootstrap,
        settings.persisted_topic,
        until=lambda records: rid in {v["requestId"] for v in values(records)},
        timeout_s=WAIT_S,
    )
    return next(v for v in values(persisted) if v["requestId"] == rid)


def _by_request(records: list[Record]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for value in values(records):
        out.setdefault(value["requestId"], []).append(value)
    return out


async def test_conversation_through_service_and_sdk_worker(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Turn by turn the handler is given every earlier turn as memory; the history stored is the dialogue."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    handler = Recorder()
    threads = ("t-ada", "t-bob")
    async with running_service(settings):
        worker = await _worker(settings, handler)
        async with _run_worker(worker):
            for turn in range(1, TURNS + 1):
                for thread in threads:
                    persisted = await _turn(settings, thread, turn)
                    assert persisted["skipped"] is None
                    assert persisted["savedMessageIds"] == [
                        message_id(thread, "u", turn, "input"),
                        message_id(thread, "u", turn, "response"),
                    ]

    seen = {(t.thread_id, t.request_id): t for t in handler.turns}
    for thread in threads:
        for turn in range(1, TURNS + 1):
            got = seen[(thread, request_id(thread, turn))]
            assert got.history.recalled == 2 * (turn - 1)
            assert [m.id for m in got.memory] == [
                message_id(thread, "u", k, kind) for k in range(1, turn) for kind in KINDS
            ]
            assert [m.id for m in got.input] == [message_id(thread, "u", turn, "input")]
            assert got.metadata is None
    # the responses carry the context as the worker saw it, recalled messages tagged so they are not re-saved
    responses = _by_request(await read_all(kafka_bootstrap, settings.responses_topic, settle_s=0.5))
    last = responses[request_id("t-ada", TURNS)][0]
    assert [m["source"] for m in last["input"]] == ["memory"] * (2 * (TURNS - 1)) + ["input"]
    assert last["finishReason"] == "stop"
    assert (last["threadId"], last["resourceId"]) == ("t-ada", "u")
    stored = sorted(await stored_messages(settings), key=lambda m: (m["thread_id"], m["createdAt"], m["id"]))
    for thread in threads:
        rows = [m for m in stored if m["thread_id"] == thread]
        assert [m["id"] for m in rows] == [
            message_id(thread, "u", k, kind) for k in range(1, TURNS + 1) for kind in KINDS
        ]
        answers = [json.loads(m["content"])["parts"][0]["text"] for m in rows if m["role"] == "assistant"]
        assert answers == [f"{thread}: I remember {2 * k} messages" for k in range(TURNS)]
    assert worker.stats.answered == TURNS * len(threads)


async def test_a_handler_that_raises_is_a_failed_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The failed turn is answered with finishReason "error", skipped as failed-turn, and saves nothing."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    thread = "t-fail"
    handler = Recorder(fail_on={request_id(thread, 2)})
    async with running_service(settings):
        worker = await _worker(settings, handler)
        async with _run_worker(worker):
            assert (await _turn(settings, thread, 1))["skipped"] is None
            failed = await _turn(settings, thread, 2)
            third = await _turn(settings, thread, 3)

    assert failed["skipped"] == "failed-turn"
    assert failed["savedMessageIds"] == []
    assert third["skipped"] is None
    assert worker.stats.failed == 1
    response = _by_request(await read_all(kafka_bootstrap, settings.responses_topic, settle_s=0.5))[
        request_id(thread, 2)
    ]
    assert [(r["finishReason"], r["response"]) for r in response] == [("error", [])]
    # nothing orphaned: turn 2's user message was never saved, so turn 3 recalls only turn 1
    assert [m.id for m in handler.turns[-1].memory] == [
        message_id(thread, "u", 1, "input"),
        message_id(thread, "u", 1, "response"),
    ]
    stored_ids = {m["id"] for m in await stored_messages(settings)}
    assert not {message_id(thread, "u", 2, kind) for kind in ("input", "response")} & stored_ids
    assert len(stored_ids) == 4


async def test_a_rate_limited_turn_is_retried_and_saved_not_failed(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The handler raises RetryLater (a provider's 429) on a turn's first attempt: the worker backs off and
    calls it again for the same turn, which is answered and saved, the user's message with it (a failed
    turn would save nothing of it); the next turn recalls it."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    thread = "t-limit"
    handler = Recorder(limit_on={request_id(thread, 1)})
    async with running_service(settings):
        worker = await _worker(settings, handler)
        async with _run_worker(worker):
            limited = await _turn(settings, thread, 1)
            second = await _turn(settings, thread, 2)

    assert limited["skipped"] is None
    assert limited["savedMessageIds"] == [
        message_id(thread, "u", 1, "input"),
        message_id(thread, "u", 1, "response"),
    ]
    assert [t.request_id for t in handler.turns] == [request_id(thread, 1)] * 2 + [request_id(thread, 2)]
    assert (worker.stats.answered, worker.stats.failed, worker.stats.retried) == (2, 0, 1)
    responses = _by_request(await read_all(kafka_bootstrap, settings.responses_topic, settle_s=0.5))
    assert [r["finishReason"] for r in responses[request_id(thread, 1)]] == ["stop"]
    assert second["skipped"] is None
    assert [m.id for m in handler.turns[-1].memory] == [
        message_id(thread, "u", 1, "input"),
        message_id(thread, "u", 1, "response"),
    ]


async def test_a_duplicate_enriched_event_is_answered_once(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The same request twice: two enriched events with one eventId; the worker answers the first only."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    thread = "t-dup"
    rid = request_id(thread, 1)
    handler = Recorder()
    async with running_service(settings):
        worker = await _worker(settings, handler)
        async with _run_worker(worker):
            twice = encoded(request_event(thread, "u", 1, "hello"))
            await produce(bootstrap, settings.requests_topic, [twice, twice])
            enriched = await read_topic(
                bootstrap,
                settings.enriched_topic,
                until=lambda records: len(_by_request(records).get(rid, [])) == 2,
                timeout_s=WAIT_S,
            )
            assert {v["eventId"] for v in values(enriched)} == {rid}
            await _wait_until(lambda: worker.stats.duplicates == 1, "the worker to drop the second copy")

    assert worker.stats.answered == 1
    assert [t.request_id for t in handler.turns] == [rid]
    responses = _by_request(await read_all(bootstrap, settings.responses_topic, settle_s=1.0))
    assert len(responses[rid]) == 1


async def test_sigterm_stops_the_worker_with_its_offsets_committed(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """With signal handling on, SIGTERM ends `run()`; every answered enriched record is committed."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic)
    handler = Recorder()
    group = f"{settings.group_id}-agent"
    async with running_service(settings):
        worker = await _worker(settings, handler, handle_signals=True)
        async with worker:
            task = asyncio.create_task(worker.run())
            await _turn(settings, "t-term", 1)
            await _turn(settings, "t-other", 1)
            os.kill(os.getpid(), signal.SIGTERM)
            stats = await asyncio.wait_for(task, 30)
    assert stats.answered == 2
    enriched = await read_all(kafka_bootstrap, settings.enriched_topic, settle_s=0.2)
    ends: dict[int, int] = {}
    for record in enriched:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    assert await committed_offsets(kafka_bootstrap, group, settings.enriched_topic) == ends
