"""Shared fixtures: real Kafka and MongoDB endpoints (see tests/infra.py), and fresh names per test.

Session: `kafka_bootstrap`, `mongo_uri`.
Per test: `mongo_client` (AsyncMongoClient, closed after), `mongo_db` (fresh database `t_<hex>`, dropped
after), `topic` (fresh name; auto-created with one partition on first use), `group_id` (fresh consumer group),
`make_topic` (creates topics with N partitions and deletes them after).
Hypothesis: the `ci` profile (derandomized) under `CI` truthy, else `dev` (tests/hypothesis_profiles.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import settings
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from tests import hypothesis_profiles, infra, zones

MakeTopic = Callable[..., Awaitable[str]]

# Before any test module is imported: a test's `@settings` take their unset values from the loaded profile.
# `--hypothesis-profile` on the command line, loaded later, still wins.
hypothesis_profiles.register()
settings.load_profile(hypothesis_profiles.profile_for(os.environ))
# Dates in the process's zone (resource scope's `<other-conversation>` blocks): the suite runs in UTC.
zones.pin_utc()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker (env, else Docker, else fail under CI / skip)."""
    yield from infra.endpoint(infra.KAFKA_ENV, "Kafka", infra.kafka_container)


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    """URI of a real MongoDB-wire server (env, else Docker, else fail under CI / skip)."""
    yield from infra.endpoint(infra.MONGO_ENV, "MongoDB", infra.mongo_container)


@pytest_asyncio.fixture
async def mongo_client(mongo_uri: str) -> AsyncIterator[AsyncMongoClient[dict[str, Any]]]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    try:
        yield client
    finally:
        await client.close()


@pytest_asyncio.fixture
async def mongo_db(
    mongo_client: AsyncMongoClient[dict[str, Any]],
) -> AsyncIterator[AsyncDatabase[dict[str, Any]]]:
    name = infra.unique_name("t_")
    try:
        yield mongo_client[name]
    finally:
        await mongo_client.drop_database(name)


@pytest.fixture(scope="session")
def _topics_to_delete() -> Iterator[list[str]]:
    """Topic names handed out this session, deleted at the end from a long-lived broker (the local stack):
    thousands of leftover one-partition topics would slow it down run after run."""
    names: list[str] = []
    yield names
    bootstrap = os.environ.get(infra.KAFKA_ENV, "").strip()
    if names and bootstrap:  # a Docker broker goes away with its container
        # Its own thread and loop: asyncio.run here would disturb pytest-asyncio's event-loop bookkeeping.
        cleaner = threading.Thread(target=_delete_topics, args=(bootstrap, names), daemon=True)
        cleaner.start()
        cleaner.join(timeout=30)


def _delete_topics(bootstrap: str, names: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
        await admin.start()
        try:
            for start in range(0, len(names), 200):  # names never produced to are refused one by one: fine
                await admin.delete_topics(names[start : start + 200], timeout_ms=10_000)
        finally:
            await admin.close()

    with contextlib.suppress(Exception):  # best effort: cleanup must never fail the session
        asyncio.run(delete())


@pytest.fixture
def topic(_topics_to_delete: list[str]) -> str:
    name = infra.unique_name("t-")
    _topics_to_delete.append(name)
    return name


@pytest.fixture
def group_id() -> str:
    return infra.unique_name("g-")


@pytest_asyncio.fixture
async def make_topic(kafka_bootstrap: str) -> AsyncIterator[MakeTopic]:
    """`await make_topic(partitions=1, name=None) -> name`: the topic exists with every leader elected."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=30_000)
    await admin.start()
    created: list[str] = []

    async def make(partitions: int = 1, name: str | None = None) -> str:
        name = name or infra.unique_name("t-")
        response = await admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=30_000)
        for topic_name, code, *message in response.topic_errors:
            if code != 0:
                raise AssertionError(f"create topic {topic_name!r} failed: error {code} {message}")
        created.append(name)
        async with asyncio.timeout(30):
            while True:  # the broker's metadata lags the controller by a moment
                described = await admin.describe_topics([name])
                partitions_seen = [p for t in described if t["topic"] == name for p in t["partitions"]]
                if len(partitions_seen) == partitions and all(p["leader"] >= 0 for p in partitions_seen):
                    return name
                await asyncio.sleep(0.1)

    try:
        yield make
    finally:
        if created:
            # Deleting keeps a long-lived local broker small; a failure here must not fail the test.
            with contextlib.suppress(Exception):
                await admin.delete_topics(created, timeout_ms=10_000)
        await admin.close()
