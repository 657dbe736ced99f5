"""Observational Memory on the real broker and the MongoDB-wire server: the settings, topics, long turns and
row reads the OM integration tests share (`test_observational_stream.py`, `test_observational_faults.py`,
`test_observer_worker_faults.py`, `test_replay_observe.py`), so each says only what it tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient

from message_history.settings import Settings
from schemas.observational import ObserveRequest, decode_work
from storage.observational import OBSERVATIONAL
from tests.conftest import MakeTopic
from tests.integration.service_harness import encoded, fresh_settings, response_event, text_message
from tests.integration.stream_helpers import Record, read_topic

WORDS = "the traveller asked about trains from Lyon to Turin and the cheapest days to go in spring "


def om_settings(kafka_bootstrap: str, mongo_uri: str, **extra: Any) -> Settings:
    """Fresh settings with OM on, a threshold four of `om_turn`'s turns pass, and no barrier or busy-thread
    wait (the tests produce a thread's turns at once); `extra` replaces or adds to them."""
    values: dict[str, Any] = {
        "observational_memory": True,
        "observation_message_tokens": 1000,
        "barrier": "off",
        "busy_thread": "allow",
    }
    return fresh_settings(kafka_bootstrap, mongo_uri, **{**values, **extra})


async def om_topics(settings: Settings, make_topic: MakeTopic) -> None:
    """The service's input topics and OM's two, one partition each."""
    for topic in (
        settings.requests_topic,
        settings.responses_topic,
        settings.observe_requests_topic,
        settings.observe_results_topic,
    ):
        await make_topic(partitions=1, name=topic)


def om_turn(thread: str, owner: str, turn: int, *, tagged: bool = False) -> tuple[bytes, bytes]:
    """A saved turn of about 250 OM tokens: a long question and a long answer. `tagged`: the question's text
    and id name the thread (several threads' turns in one topic)."""
    tag, qid = (f"{thread} ", f"{thread}-q{turn}") if tagged else ("", f"q{turn}")
    question = text_message("user", f"{tag}turn {turn}: {WORDS * 4}", id=qid)
    event = response_event(
        thread, owner, turn, [{**question, "source": "input"}], f"answer {turn}: {WORDS * 4}"
    )
    return encoded(event)


def observe_work(records: list[Record]) -> list[ObserveRequest]:
    """The ObserveRequests among the work records (ReflectRequests left out)."""
    found = [decode_work(r.value) for r in records]
    return [w for w in found if isinstance(w, ObserveRequest)]


def has_work(count: int) -> Callable[[list[Record]], bool]:
    """`read_topic`'s `until`: at least `count` ObserveRequests read."""
    return lambda records: len(observe_work(records)) >= count


async def sent_work(settings: Settings, count: int, *, committed: bool = False) -> list[ObserveRequest]:
    """The ObserveRequests sent so far, once there are `count`; `committed`: read `read_committed` (exactly
    once, the work goes out in a transaction)."""
    records = await read_topic(
        settings.kafka_bootstrap_servers,
        settings.observe_requests_topic,
        until=has_work(count),
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    return observe_work(records)


async def om_service_settings(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, **extra: Any
) -> Settings:
    """`om_settings`, their topics made (`om_topics`)."""
    settings = om_settings(kafka_bootstrap, mongo_uri, **extra)
    await om_topics(settings, make_topic)
    return settings


async def answer_text(value: str) -> str:
    """An observer function's answer, fixed."""
    return value


async def om_rows(settings: Settings) -> list[dict[str, Any]]:
    """Every `mastra_observational_memory` row of `settings`' database, without MongoDB's `_id`."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        return await client[settings.mongodb_database][OBSERVATIONAL].find({}, {"_id": 0}).to_list()
    finally:
        await client.close()


async def the_row(settings: Settings) -> dict[str, Any]:
    """The one row (a single thread, never reflected); fails if there are more or none."""
    rows = await om_rows(settings)
    assert len(rows) == 1, rows
    return rows[0]


async def om_row_when(
    settings: Settings, ready: Callable[[dict[str, Any]], bool], timeout_s: float = 60.0
) -> dict[str, Any]:
    """The thread's one row once `ready(row)` holds (polled); fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await om_rows(settings)
        if len(rows) == 1 and ready(rows[0]):
            return rows[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"the row never got there: {rows}")
        await asyncio.sleep(0.2)


async def age_claim(settings: Settings) -> None:
    """The claim as if `OBSERVATION_TIMEOUT_S` had passed since it was made (its times moved back)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    past = datetime.now(UTC) - timedelta(seconds=settings.observation_timeout_s + 60)
    try:
        await client[settings.mongodb_database][OBSERVATIONAL].update_many(
            {}, {"$set": {"_mh_claimed_at": past, "updatedAt": past}}
        )
    finally:
        await client.close()
