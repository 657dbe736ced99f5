"""The last tenancy gaps (issue 31 item 4), on the real broker and the real MongoDB-wire server.

* A foreign busy marker (another resource's turn pending on a thread not stored yet) lapses at the
  abandonment horizon: it no longer reserves the thread id.
* A request whose enriched event Kafka refuses (a dead letter at send time) leaves its thread not busy: the
  thread's next request is enriched complete, without waiting for the turn timeout.
* Derived message ids another tenant can predict and store first do not make a turn fail.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import SecretStr
from pymongo import AsyncMongoClient, monitoring

from message_history import metrics
from message_history.app.forget import add_forget_arguments, run_forget
from message_history.errors import ForgetRefusedError, StorageUnavailableError
from message_history.settings import Settings
from schemas.commands import ForgetOutcome
from schemas.dead_letters import parse_dead_letter_headers
from storage.forgetting import TOMBSTONES, MongoForgetting
from storage.message_id_keys import message_id_keys
from storage.turns import TURNS
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    request_event,
    request_id,
    response_event,
    running_service,
    text_message,
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


async def test_a_dead_letter_at_send_time_leaves_its_thread_not_busy(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """t holds 600 kB of history; its turn 2 (600 kB of input) is enriched over Kafka's 1 MiB record limit
    and dead-lettered when sent. Turn 3 on t, small, is then enriched complete and without a wait (before, the
    busy mark of turn 2 stayed: turn 3 waited the whole turn timeout and went out `complete: false`)."""
    settings = fresh_settings(
        kafka_bootstrap,
        mongo_uri,
        busy_thread="enqueue",
        turn_timeout_ms=LONG_TURN_TIMEOUT_MS,
        max_poll_interval_ms=4 * LONG_TURN_TIMEOUT_MS,
    )
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(name=settings.requests_topic)
    await make_topic(name=settings.responses_topic)
    history = [text_message("user", "h" * 200_000, id=f"h{i}") for i in range(3)]
    try:
        async with running_service(settings):
            await produce(
                bootstrap, settings.responses_topic, [encoded(response_event("t", "u", 1, history, "ok"))]
            )
            await read_topic(bootstrap, settings.persisted_topic, until=bool)
            await produce(
                bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 2, "y" * 600_000))]
            )
            [letter] = await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1)
            await produce(bootstrap, settings.requests_topic, [encoded(request_event("t", "u", 3, "small"))])
            # far below the turn timeout: a request held by the stale mark would not be out by then
            third = await _enriched(settings, request_id("t", 3), timeout_s=LONG_TURN_TIMEOUT_MS / 4000)
    finally:
        await drop_database(settings)
    assert parse_dead_letter_headers(letter.headers).error_type == "MessageSizeTooLargeError"
    assert third["history"]["complete"] is True


async def test_the_deployment_key_is_made_once_and_shared(kafka_bootstrap: str, mongo_uri: str) -> None:
    """Without a configured key, instances starting at once agree on one key, kept in MongoDB (so a restart
    finds it); a configured key wins, the previous ones follow it."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    db = client[settings.mongodb_database]
    try:
        racing = await asyncio.gather(*(message_id_keys(db, settings) for _ in range(4)))
        assert len({keys for keys in racing}) == 1
        [(key,)] = {keys for keys in racing}
        assert len(key) == 32
        assert await message_id_keys(db, settings) == (key,)  # a restart
        configured = settings.model_copy(
            update={"message_id_key": SecretStr("mine"), "message_id_previous_keys": SecretStr("a, b")}
        )
        assert await message_id_keys(db, configured) == (b"mine", b"a", b"b")
    finally:
        await client.drop_database(settings.mongodb_database)
        await client.close()


# --- owner-scoped forget of a thread with no owner recorded ------------------------------------------------


def _row(mid: str, thread: str, resource: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": mid,
        "id": mid,
        "thread_id": thread,
        "role": "user",
        "type": "v2",
        "content": '{"format":2,"parts":[{"type":"text","text":"x"}]}',
        "createdAt": datetime(2025, 1, 1, tzinfo=UTC),
    }
    if resource is not None:
        doc["resourceId"] = resource
    return doc


async def _ids(settings: Settings, collection: str) -> set[str]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        return {str(d["_id"]) for d in await client[settings.mongodb_database][collection].find().to_list()}
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("thread_row", "others"),
    [
        pytest.param({"id": "t", "title": "", "metadata": {}}, "a", id="row-without-owner-others-messages"),
        pytest.param({"id": "t", "resourceId": "", "title": ""}, "a", id="row-with-empty-owner"),
        pytest.param(None, "a", id="no-row-others-messages"),
        pytest.param(None, None, id="no-row-a-message-without-resource"),
        pytest.param(None, "pending", id="no-row-another-resources-pending-turn"),
    ],
)
async def test_an_owner_scoped_forget_refuses_a_thread_holding_others_history(
    kafka_bootstrap: str, mongo_uri: str, thread_row: dict[str, Any] | None, others: str | None
) -> None:
    """ForgetThread(t, resourceId=b) where t has no owner recorded and holds history that is not b's: refused
    with a reason saying why and what to do, nothing deleted (before: every message of t was deleted, a's
    included)."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    rows = [_row("b-1", "t", "b")]
    if others != "pending":
        rows.append(_row("a-1", "t", others))
    await _db_insert(settings, "mastra_messages", rows)
    if thread_row is not None:
        await _db_insert(settings, "mastra_threads", [thread_row])
    if others == "pending":
        marker = {"_id": "t", "pending": "a-req", "enrichedAt": datetime.now(UTC), "resourceId": "a"}
        await _db_insert(settings, TURNS, [marker])
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        forgetting = MongoForgetting(client[settings.mongodb_database])
        for dry_run in (True, False):
            with pytest.raises(ForgetRefusedError) as refused:
                await forgetting.forget_thread("t", resource_id="b", dry_run=dry_run)
            assert "ForgetResource" in str(refused.value)
            assert "'a'" not in str(refused.value)
        assert await _ids(settings, "mastra_messages") == {r["_id"] for r in rows}
        assert await _ids(settings, TOMBSTONES) == set()
    finally:
        await client.drop_database(settings.mongodb_database)
        await client.close()


@pytest.mark.parametrize("thread_row", [True, False], ids=["row-without-owner", "no-row"])
async def test_an_owner_scoped_forget_of_an_unowned_thread_holding_only_its_history_forgets_it(
    kafka_bootstrap: str, mongo_uri: str, thread_row: bool
) -> None:
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await _db_insert(settings, "mastra_messages", [_row("b-1", "t", "b"), _row("b-2", "t", "b")])
    if thread_row:
        await _db_insert(settings, "mastra_threads", [{"_id": "t", "id": "t", "title": ""}])
    await _db_insert(settings, TURNS, [{"_id": "t", "pending": None, "resourceId": "b"}])
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        forgetting = MongoForgetting(client[settings.mongodb_database])
        outcome = await forgetting.forget_thread("t", resource_id="b")
        assert (outcome.deleted_messages, outcome.deleted_threads) == (2, int(thread_row))
        assert await _ids(settings, "mastra_messages") == set()
        assert await _ids(settings, TURNS) == set()
        assert await _ids(settings, TOMBSTONES) == {"thread:t"}
        again = await forgetting.forget_thread("t", resource_id="b")  # idempotent: counts zero
        assert (again.deleted_messages, again.deleted_threads) == (0, 0)
    finally:
        await client.drop_database(settings.mongodb_database)
        await client.close()


async def test_an_owner_scoped_forget_command_on_an_unowned_thread_is_a_dead_letter_saying_why(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """On the commands path: the refusal is the command's dead letter (`ForgetRefusedError`); a's message
    stays."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(name=settings.commands_topic)
    await _db_insert(settings, "mastra_messages", [_row("b-1", "t", "b"), _row("a-1", "t", "a")])
    await _db_insert(settings, "mastra_threads", [{"_id": "t", "id": "t", "title": ""}])
    forget = {
        "schemaVersion": 1,
        "command": "ForgetThread",
        "requestId": "c-1",
        "createdAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "threadId": "t",
        "resourceId": "b",
    }
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.commands_topic, [(b"t", json.dumps(forget).encode())])
            [letter] = await read_topic(bootstrap, settings.commands_dlq, until=lambda rs: len(rs) >= 1)
        assert parse_dead_letter_headers(letter.headers).error_type == "ForgetRefusedError"
        assert await _ids(settings, "mastra_messages") == {"a-1", "b-1"}
    finally:
        await drop_database(settings)


# --- forget in bounded chunks, with progress ---------------------------------------------------------------

CHUNK = 7
THREADS, PER_THREAD = 40, 5


async def _seed_resource(settings: Settings) -> None:
    """alice: 40 threads of 5 messages, 3 messages in bob's thread, 2 markers of threads never saved; bob: 1
    thread of 2 messages of his own."""
    threads = [{"_id": f"a{i}", "id": f"a{i}", "resourceId": "alice", "title": ""} for i in range(THREADS)]
    threads.append({"_id": "b0", "id": "b0", "resourceId": "bob", "title": ""})
    rows = [_row(f"a{i}-{j}", f"a{i}", "alice") for i in range(THREADS) for j in range(PER_THREAD)]
    rows += [_row(f"ab-{j}", "b0", "alice") for j in range(3)] + [
        _row(f"b-{j}", "b0", "bob") for j in range(2)
    ]
    await _db_insert(settings, "mastra_threads", threads)
    await _db_insert(settings, "mastra_messages", rows)
    await _db_insert(
        settings, TURNS, [{"_id": f"new{i}", "pending": "r", "resourceId": "alice"} for i in range(2)]
    )


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append({"name": event.command_name, **event.command})

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_a_large_forget_runs_in_bounded_chunks_and_an_interrupted_one_completes_when_run_again(
    kafka_bootstrap: str, mongo_uri: str
) -> None:
    """ForgetResource of 40 threads and 203 messages with chunks of 7: every find reads at most 7 rows and
    every delete names at most 7 (each step bounded, whatever the resource's size), progress is told after
    each chunk; stopped by an outage part-way, running it again deletes the rest, and together the two runs
    deleted everything of alice and nothing of bob."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await _seed_resource(settings)
    listener = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        settings.mongodb_uri.get_secret_value(), event_listeners=[listener]
    )
    try:
        forgetting = MongoForgetting(
            client[settings.mongodb_database], chunk_size=CHUNK, operation_timeout_s=60
        )
        told: list[tuple[int, int]] = []

        def outage_after_five(outcome: ForgetOutcome) -> None:
            told.append((outcome.deleted_messages, outcome.deleted_threads))
            if len(told) == 5:
                raise StorageUnavailableError("MongoDB went away")

        with pytest.raises(StorageUnavailableError):
            await forgetting.forget_resource("alice", progress=outage_after_five)
        first = told[-1]
        assert 0 < first[0] < THREADS * PER_THREAD
        rest: list[tuple[int, int]] = []
        outcome = await forgetting.forget_resource(
            "alice", progress=lambda o: rest.append((o.deleted_messages, o.deleted_threads))
        )
        assert len(rest) > THREADS // CHUNK  # told after every chunk
        assert rest == sorted(rest)  # the counts only grow
        assert outcome.deleted_messages + first[0] == THREADS * PER_THREAD + 3
        assert outcome.deleted_threads + first[1] == THREADS
        assert await _ids(settings, "mastra_messages") == {"b-0", "b-1"}
        assert await _ids(settings, "mastra_threads") == {"b0"}
        assert await _ids(settings, TURNS) == set()
        again = await forgetting.forget_resource("alice")
        assert (again.deleted_messages, again.deleted_threads) == (0, 0)
    finally:
        await client.drop_database(settings.mongodb_database)
        await client.close()
    finds = [
        c
        for c in listener.commands
        if c["name"] == "find" and c["find"] in ("mastra_messages", "mastra_threads")
    ]
    deletes = [d for c in listener.commands if c["name"] == "delete" for d in c["deletes"]]
    assert finds
    assert all(0 < c.get("limit", 0) <= CHUNK for c in finds if "filter" in c and "_id" not in c["filter"])
    assert all(len(d["q"]["_id"]["$in"]) <= CHUNK for d in deletes if "_id" in d["q"])


async def test_a_large_forget_resource_command_answers_with_every_count_and_shows_progress(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    """The same resource forgotten through the commands path of the running service, chunks of 7: one answer
    with every count, the deleted rows counted by the metric as they go, a progress line logged."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, forget_chunk_size=CHUNK)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(name=settings.commands_topic)
    await _seed_resource(settings)
    forget = {
        "schemaVersion": 1,
        "command": "ForgetResource",
        "requestId": "c-1",
        "createdAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "resourceId": "alice",
    }
    deleted = metrics.FORGET_DELETED.labels(what="messages")
    before = deleted._value.get()
    caplog.set_level(logging.INFO, logger="consumers.commands")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.commands_topic, [(b"alice", json.dumps(forget).encode())])
            [answer] = await read_topic(bootstrap, settings.forgotten_topic, until=lambda rs: len(rs) >= 1)
        assert await _ids(settings, "mastra_messages") == {"b-0", "b-1"}
    finally:
        await drop_database(settings)
    event = json.loads(answer.value or b"{}")
    assert (event["deletedMessages"], event["deletedThreads"]) == (THREADS * PER_THREAD + 3, THREADS)
    assert len(event["threadIds"]) == THREADS
    assert deleted._value.get() - before == THREADS * PER_THREAD + 3
    assert any(r.getMessage() == "forget in progress" for r in caplog.records)


async def test_the_forget_command_line_shows_its_progress_on_stderr(
    kafka_bootstrap: str, mongo_uri: str
) -> None:
    """`message-history forget --resource` in chunks of 7: progress on stderr, the JSON answer on stdout."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, forget_chunk_size=CHUNK)
    await _seed_resource(settings)
    parser = argparse.ArgumentParser()
    add_forget_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    try:
        code = await run_forget(settings, parser.parse_args(["--resource", "alice"]), out=out, err=err)
    finally:
        await drop_database(settings)
    assert code == 0, err.getvalue()
    assert json.loads(out.getvalue())["deletedMessages"] == THREADS * PER_THREAD + 3
    assert "forget resource 'alice':" in err.getvalue()
    assert "deleted so far" in err.getvalue()
