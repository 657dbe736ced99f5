"""`message-history topics --partitions N` on the real broker: every topic the service uses, idempotent, and
the commands path's topics only when that path runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from message_history.app import topics as topics_app
from message_history.app.topics import ensure_topics, service_topics
from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.service_harness import fresh_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest_asyncio.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def _drop(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    existing = set(await admin.list_topics())
    names = [t for t in service_topics(settings) if t in existing]
    if names:
        await admin.delete_topics(names)


async def test_creates_every_topic_the_service_uses_and_says_which_existed(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, admin: AIOKafkaAdminClient
) -> None:
    """The commands, forgotten and commands dead-letter topics are created beside the path topics; a topic
    that existed is reported as existing; a second run creates nothing."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=2, name=settings.requests_topic)
    try:
        first = await ensure_topics(settings, partitions=2, replication=1)
        second = await ensure_topics(settings, partitions=2, replication=1)
        on_broker = set(await admin.list_topics())
    finally:
        await _drop(admin, settings)
    commands = {settings.commands_topic, settings.forgotten_topic, settings.commands_dlq}
    assert commands <= set(first.created), first.lines()
    assert set(first.created) == set(service_topics(settings)) - {settings.requests_topic}
    assert set(service_topics(settings)) <= on_broker
    assert first.problems == []
    assert set(first.counts.values()) == {2}
    assert f"{settings.requests_topic}: exists, 2 partitions" in first.lines()
    assert f"{settings.commands_dlq}: created, 2 partitions" in first.lines()
    assert second.created == []
    assert second.problems == []
    assert all(": exists, 2 partitions" in line for line in second.lines()), second.lines()


async def test_no_commands_topics_when_the_commands_path_is_off(
    kafka_bootstrap: str, mongo_uri: str, admin: AIOKafkaAdminClient
) -> None:
    """With `MESSAGE_HISTORY_COMMANDS_TOPIC` empty (as in the service) the commands topics are left out."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, commands_topic="")
    try:
        report = await ensure_topics(settings, partitions=1, replication=1)
        on_broker = set(await admin.list_topics())
    finally:
        await _drop(admin, settings)
    assert len(report.created) == 9  # the six of recall and persist, the three of Observational Memory
    assert settings.forgotten_topic not in report.counts
    assert settings.forgotten_topic not in on_broker
    assert settings.commands_dlq not in on_broker  # ".dlq" of the empty name


async def test_the_command_prints_created_and_existing(
    kafka_bootstrap: str,
    mongo_uri: str,
    admin: AIOKafkaAdminClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`main` prints one line per topic, `created` then `exists` on the second run; exit code 0 (in a thread:
    it runs its own event loop)."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    monkeypatch.setattr(topics_app, "Settings", lambda: settings)
    try:
        assert await asyncio.to_thread(topics_app.main, partitions=1, replication=1) == 0
        first = capsys.readouterr().out.splitlines()
        assert await asyncio.to_thread(topics_app.main, partitions=1, replication=1) == 0
        second = capsys.readouterr().out.splitlines()
    finally:
        await _drop(admin, settings)
    assert first == [f"{t}: created, 1 partitions" for t in service_topics(settings)]
    assert second == [f"{t}: exists, 1 partitions" for t in service_topics(settings)]


async def test_a_refused_creation_is_an_error_not_a_wait(
    kafka_bootstrap: str, mongo_uri: str, admin: AIOKafkaAdminClient
) -> None:
    """A replication factor the cluster cannot give (one broker here) fails at once with the broker's error,
    instead of waiting for topics that will never appear."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    try:
        with pytest.raises(KafkaError, match="create topic") as refused:
            await ensure_topics(settings, partitions=1, replication=3)
        # every topic's refusal, in the broker's words (here: more replicas than brokers)
        assert str(refused.value).count("'") >= 2 * len(service_topics(settings))
        assert "eplication factor" in str(refused.value)
    finally:
        await _drop(admin, settings)
