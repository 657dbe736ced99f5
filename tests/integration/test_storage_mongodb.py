"""`MongoHistoryStorage` on the real MongoDB-wire server: layout, upserts, ownership, round trips, errors."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import warnings
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import bson
import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient, IndexModel, monitoring
from pymongo.asynchronous.database import AsyncDatabase

from message_history.errors import (
    FatalStorageError,
    InvalidInputError,
    MessageIdTakenError,
    StorageUnavailableError,
    ThreadOwnershipError,
)
from message_history.settings import Settings
from schemas.messages import Message
from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from storage.protocol import BatchHistoryStorage, RecallQuery, SaveTurn, Thread
from tests import infra

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def msg(id: str, *, t: int, role: str = "user", text: str | None = None, **extra: Any) -> Message:
    """A format-2 message `t` ms after T0 with one text part."""
    content = {"format": 2, "parts": [{"type": "text", "text": text or f"{role} {id}"}]}
    return Message.model_validate({"id": id, "role": role, "createdAt": at(t), "content": content, **extra})


async def raw(db: Db, collection: str) -> list[dict[str, Any]]:
    """Every document of a collection, `_id` included, in `_id` order."""
    return await db[collection].find({}).sort("_id", 1).to_list()


async def ids(storage: MongoHistoryStorage, thread: str, limit: int | None = None) -> list[str]:
    return [m.id or "" for m in await storage.list_messages(thread, resource_id=None, limit=limit)]


@pytest_asyncio.fixture
async def storage(mongo_db: Db) -> MongoHistoryStorage:
    store = MongoHistoryStorage(mongo_db)
    await store.ensure_indexes()
    return store


class CommandLog(monitoring.CommandListener):
    """Records the name of every command the client sends (PyMongo command monitoring)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in {"endSessions", "hello", "isMaster", "ismaster"}:
            self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest_asyncio.fixture
async def monitored(mongo_uri: str, mongo_db: Db) -> AsyncIterator[tuple[MongoHistoryStorage, CommandLog]]:
    """A storage on its own client whose commands are recorded (indexes made before recording starts)."""
    log = CommandLog()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri, event_listeners=[log])
    try:
        store = MongoHistoryStorage(client[mongo_db.name])
        await store.ensure_indexes()
        log.names.clear()
        yield store, log
    finally:
        await client.close()


# --- layout ------------------------------------------------------------------------------------------------


async def test_documents_have_mastras_shape(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """A saved message and its new thread are stored with exactly @mastra/mongodb's fields and types."""
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=5)])
    [message] = await raw(mongo_db, MESSAGES)
    assert set(message) == {"_id", "id", "thread_id", "resourceId", "role", "type", "content", "createdAt"}
    assert (message["id"], message["thread_id"], message["resourceId"]) == ("m1", "t1", "r1")
    assert message["_id"] == "m1"  # rows we insert are keyed by their id (see `_keyed_bulk_write`)
    assert (message["role"], message["type"]) == ("user", "v2")
    assert json.loads(message["content"]) == {"format": 2, "parts": [{"type": "text", "text": "user m1"}]}
    assert message["createdAt"].replace(tzinfo=UTC) == at(5)
    [thread] = await raw(mongo_db, THREADS)
    assert set(thread) == {"_id", "id", "resourceId", "title", "metadata", "createdAt", "updatedAt"}
    assert (thread["id"], thread["resourceId"], thread["title"], thread["metadata"]) == ("t1", "r1", "", {})
    assert thread["_id"] == "t1"


async def test_storage_satisfies_the_protocol(storage: MongoHistoryStorage) -> None:
    """The class declares `BatchHistoryStorage` (so mypy checks the six operations and their batch forms)."""
    declared: BatchHistoryStorage = storage
    assert BatchHistoryStorage in type(declared).__mro__


async def test_indexes_are_mastras_plus_the_recall_index(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """ensure_indexes creates @mastra/mongodb 1.19's memory indexes under the driver names, plus recall's."""
    await storage.ensure_indexes()  # a second run changes nothing and does not fail
    messages = await mongo_db[MESSAGES].index_information()
    threads = await mongo_db[THREADS].index_information()
    assert {name: (ix["key"], ix.get("unique", False)) for name, ix in messages.items()} == {
        "_id_": ([("_id", 1)], False),
        "id_1": ([("id", 1)], True),
        "thread_id_1_createdAt_1": ([("thread_id", 1), ("createdAt", 1)], False),
        "resourceId_1_createdAt_1": ([("resourceId", 1), ("createdAt", 1)], False),
        "thread_id_1_createdAt_1_id_1": ([("thread_id", 1), ("createdAt", 1), ("id", 1)], False),
    }
    assert {name: (ix["key"], ix.get("unique", False)) for name, ix in threads.items()} == {
        "_id_": ([("_id", 1)], False),
        "id_1": ([("id", 1)], True),
        "resourceId_1_createdAt_-1": ([("resourceId", 1), ("createdAt", -1)], False),
        "resourceId_1_updatedAt_-1": ([("resourceId", 1), ("updatedAt", -1)], False),
    }


async def test_an_index_with_our_keys_under_another_name_is_accepted(mongo_db: Db) -> None:
    """An existing index with the same keys but another name counts as present (no IndexOptionsConflict)."""
    await mongo_db[MESSAGES].create_indexes([IndexModel([("id", 1)], unique=True, name="by_id")])
    await MongoHistoryStorage(mongo_db).ensure_indexes()
    info = await mongo_db[MESSAGES].index_information()
    assert "by_id" in info
    assert "id_1" not in info
    assert "thread_id_1_createdAt_1_id_1" in info


async def test_a_non_unique_id_index_is_fatal(mongo_db: Db) -> None:
    """A non-unique index on `id` cannot serve as the unique one: ensure_indexes raises FatalStorageError."""
    await mongo_db[THREADS].create_indexes([IndexModel([("id", 1)])])
    with pytest.raises(FatalStorageError, match="non-unique"):
        await MongoHistoryStorage(mongo_db).ensure_indexes()


# --- saving ------------------------------------------------------------------------------------------------


async def test_resaving_changes_nothing(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Saving the same turn twice leaves both collections exactly as after the first save."""
    turn = [msg("m1", t=0), msg("m2", t=1, role="assistant")]
    first = await storage.save_messages(thread_id="t1", resource_id="r1", messages=turn)
    before = (await raw(mongo_db, MESSAGES), await raw(mongo_db, THREADS))
    second = await storage.save_messages(thread_id="t1", resource_id="r1", messages=turn)
    assert (await raw(mongo_db, MESSAGES), await raw(mongo_db, THREADS)) == before
    assert first == second
    assert len(before[0]) == 2


async def test_resave_keeps_created_at_and_replaces_content(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A re-saved id keeps the createdAt of its first insert; its content is replaced (upsert by id)."""
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0, text="a")])
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=9_000, text="b")])
    [doc] = await raw(mongo_db, MESSAGES)
    assert doc["createdAt"].replace(tzinfo=UTC) == at(0)
    [stored] = await storage.list_messages("t1", resource_id=None, limit=None)
    assert stored.createdAt == at(0)
    assert stored.content.parts[0].model_dump()["text"] == "b"


async def test_a_missing_thread_is_created_from_message_times(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A new thread gets title '', metadata {}, createdAt = earliest, updatedAt = newest saved createdAt."""
    thread = await storage.save_messages(
        thread_id="t1", resource_id="r1", messages=[msg("m2", t=30), msg("m1", t=10)]
    )
    assert thread == Thread("t1", "r1", "", {}, createdAt=at(10), updatedAt=at(30))
    assert await storage.get_thread("t1") == thread


async def test_existing_title_and_metadata_are_never_rewritten(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A thread Mastra created keeps its title, metadata and createdAt; only updatedAt moves forward."""
    await mongo_db[THREADS].insert_one(
        {
            "id": "t1",
            "resourceId": "r1",
            "title": "Trip",
            "metadata": {"k": [1, 2]},
            "createdAt": at(-5_000),
            "updatedAt": at(-5_000),
        }
    )
    thread = await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
    assert thread == Thread("t1", "r1", "Trip", {"k": [1, 2]}, createdAt=at(-5_000), updatedAt=at(0))
    assert await storage.get_thread("t1") == thread


async def test_updated_at_never_moves_back_on_replay(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Replaying an older turn after a newer one leaves updatedAt at the newest message's time."""
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m2", t=50)])
    snapshot = await raw(mongo_db, THREADS)
    replayed = await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
    assert replayed.updatedAt == at(50)
    assert await raw(mongo_db, THREADS) == snapshot


async def test_ownership_refusal_touches_nothing(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Saving into another resource's thread raises ThreadOwnershipError and changes neither collection."""
    await storage.save_messages(thread_id="t1", resource_id="owner", messages=[msg("m1", t=0)])
    before = (await raw(mongo_db, MESSAGES), await raw(mongo_db, THREADS))
    with pytest.raises(ThreadOwnershipError) as refused:
        await storage.save_messages(
            thread_id="t1", resource_id="intruder", messages=[msg("m1", t=1, text="x"), msg("m9", t=2)]
        )
    assert (refused.value.owner, refused.value.resource_id) == ("owner", "intruder")
    assert (await raw(mongo_db, MESSAGES), await raw(mongo_db, THREADS)) == before


async def test_a_message_without_id_is_refused_before_writing(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A message with no id makes the save an InvalidInputError and nothing is written."""
    no_id = Message.model_validate({"role": "user", "content": {"format": 2, "parts": []}})
    with pytest.raises(InvalidInputError):
        await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0), no_id])
    assert await raw(mongo_db, MESSAGES) == []
    assert await raw(mongo_db, THREADS) == []


async def test_a_resaved_id_in_another_thread_is_refused(storage: MongoHistoryStorage) -> None:
    """Unlike Mastra (which moves the message), saving an existing id into another thread refuses the turn:
    an id never takes a message out of another thread, or another tenant's."""
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
    turn = [msg("m2", t=1), msg("m1", t=0)]
    with pytest.raises(MessageIdTakenError):
        await storage.save_messages(thread_id="t2", resource_id="r1", messages=turn)
    assert await ids(storage, "t1") == ["m1"]
    assert await ids(storage, "t2") == []
    assert await storage.get_thread("t2") is None


async def test_system_rows_are_stored_and_returned(storage: MongoHistoryStorage) -> None:
    """Storage keeps and returns system messages; filtering them out is the rules' job."""
    await storage.save_messages(
        thread_id="t1", resource_id="r1", messages=[msg("s1", t=0, role="system"), msg("u1", t=1)]
    )
    listed = await storage.list_messages("t1", resource_id="r1", limit=None)
    assert [(m.id, m.role) for m in listed] == [("u1", "user"), ("s1", "system")]


async def test_unknown_fields_round_trip(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Unknown top-level, content and part keys come back unchanged; top-level ones sit in `_mh_extra`."""
    original = Message.model_validate(
        {
            "id": "m1",
            "role": "assistant",
            "createdAt": at(0),
            "type": "custom-kind",
            "content": {
                "format": 2,
                "parts": [
                    {"type": "text", "text": "hi", "providerMetadata": {"x": {"y": 1}}},
                    {"type": "data-chart", "data": {"rows": [[1, 2], [3, 4]]}},
                    {"type": "brand-new-part", "payload": "kept"},
                ],
                "metadata": {"a.b": 1},
                "futureContentKey": True,
            },
            "futureTopLevel": {"nested": [[1], [2]], "$odd": "key"},
        }
    )
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[original])
    [back] = await storage.list_messages("t1", resource_id=None, limit=None)
    expected = original.wire() | {"threadId": "t1", "resourceId": "r1"}
    assert back.wire() == expected
    [doc] = await raw(mongo_db, MESSAGES)
    assert doc["type"] == "custom-kind"
    assert json.loads(doc["_mh_extra"]) == {"futureTopLevel": {"nested": [[1], [2]], "$odd": "key"}}


async def test_losing_the_unknown_fields_on_resave_removes_them(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A re-save without the unknown top-level keys leaves no stale `_mh_extra` behind (last save wins)."""
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0, extraKey=1)])
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
    [doc] = await raw(mongo_db, MESSAGES)
    assert "_mh_extra" not in doc


async def test_resaving_a_row_mastra_inserted_falls_back_to_the_id_key(
    monitored: tuple[MongoHistoryStorage, CommandLog], mongo_db: Db
) -> None:
    """A message Mastra inserted (ObjectId `_id`) is updated in place by id, never duplicated."""
    storage, log = monitored
    await mongo_db[THREADS].insert_one(
        {"id": "t1", "resourceId": "r1", "title": "", "metadata": {}, "createdAt": at(0), "updatedAt": at(0)}
    )
    await mongo_db[MESSAGES].insert_one(
        {"id": "m1", "thread_id": "t1", "resourceId": "r1", "role": "user", "type": "v2",
         "content": '{"format":2,"parts":[{"type":"text","text":"old"}]}', "createdAt": at(0)}
    )  # fmt: skip
    log.names.clear()
    thread = await storage.save_messages(
        thread_id="t1", resource_id="r1", messages=[msg("m1", t=7, text="new"), msg("m2", t=8)]
    )
    # threads and message homes, messages by _id, by id, thread
    assert log.names == ["find", "find", "update", "update", "update"]
    assert thread.updatedAt == at(8)
    docs = await raw(mongo_db, MESSAGES)
    assert sorted(d["id"] for d in docs) == ["m1", "m2"]
    [m1] = [d for d in docs if d["id"] == "m1"]
    assert m1["_id"] != "m1"  # still Mastra's row
    assert m1["createdAt"].replace(tzinfo=UTC) == at(0)
    assert json.loads(m1["content"])["parts"][0]["text"] == "new"
    assert len(await raw(mongo_db, THREADS)) == 1


class BlindToThreads(MongoHistoryStorage):
    """Sees no stored thread, as if another writer created it between the ownership read and the write."""

    async def _get_threads(self, thread_ids: Any) -> tuple[dict[str, Thread], dict[str, Any]]:
        return {}, {}


async def test_a_thread_created_meanwhile_by_mastra_is_updated_not_duplicated(mongo_db: Db) -> None:
    """If Mastra creates the thread after our read, our upsert falls back to the id key and only bumps it."""
    storage = BlindToThreads(mongo_db)
    await storage.ensure_indexes()
    await mongo_db[THREADS].insert_one(
        {"id": "t1", "resourceId": "r1", "title": "Mastra's", "metadata": {"a": 1}, "createdAt": at(-9),
         "updatedAt": at(-9)}
    )  # fmt: skip
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=5)])
    [thread] = await raw(mongo_db, THREADS)
    assert (thread["title"], thread["metadata"], thread["createdAt"].replace(tzinfo=UTC)) == (
        "Mastra's",
        {"a": 1},
        at(-9),
    )
    assert thread["updatedAt"].replace(tzinfo=UTC) == at(5)


async def test_resaving_over_a_hundred_stored_messages_completes(
    monitored: tuple[MongoHistoryStorage, CommandLog],
) -> None:
    """Re-saving 120 stored messages completes: one `update` command for the messages, one for the thread."""
    storage, log = monitored
    turn = [msg(f"m{i:03}", t=i) for i in range(120)]
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=turn)
    log.names.clear()
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=turn)  # every op matches
    assert log.names == ["find", "find", "update", "update"]
    assert len(await ids(storage, "t1")) == 120


# --- reading -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "insert_order", [["a", "b", "c"], ["c", "b", "a"]], ids=["ascending-ids", "descending-ids"]
)
async def test_equal_timestamps_are_ordered_by_id(
    storage: MongoHistoryStorage, insert_order: list[str]
) -> None:
    """Messages with one createdAt come newest-first by id, whatever order they were written in."""
    for mid in insert_order:
        await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg(mid, t=100)])
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("z-old", t=0)])
    assert await ids(storage, "t1") == ["c", "b", "a", "z-old"]
    assert await ids(storage, "t1", limit=2) == ["c", "b"]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, ["m4", "m3", "m2", "m1", "m0"]),
        (0, []),
        (1, ["m4"]),
        (3, ["m4", "m3", "m2"]),
        (9, ["m4", "m3", "m2", "m1", "m0"]),
    ],
    ids=["none-is-all", "zero-is-empty", "one", "three", "more-than-stored"],
)
async def test_limit(storage: MongoHistoryStorage, limit: int | None, expected: list[str]) -> None:
    """limit None returns all, 0 returns [] and n returns the newest n, newest first."""
    await storage.save_messages(
        thread_id="t1", resource_id="r1", messages=[msg(f"m{i}", t=i) for i in range(5)]
    )
    assert await ids(storage, "t1", limit=limit) == expected


async def test_negative_limit_and_empty_thread_id_are_invalid(storage: MongoHistoryStorage) -> None:
    """A negative limit or a blank thread id is an InvalidInputError, not an empty page."""
    with pytest.raises(InvalidInputError):
        await storage.list_messages("t1", resource_id=None, limit=-1)
    with pytest.raises(InvalidInputError):
        await storage.list_messages(" ", resource_id=None, limit=5)


async def test_resource_filter(storage: MongoHistoryStorage) -> None:
    """With a resource id, only that resource's rows of the thread are listed."""
    await storage.save_messages(
        thread_id="t1",
        resource_id="r1",
        messages=[msg("mine", t=0), msg("foreign", t=1, resourceId="r2")],
    )
    assert [m.id for m in await storage.list_messages("t1", resource_id="r1", limit=None)] == ["mine"]
    assert [m.id for m in await storage.list_messages("t1", resource_id="r2", limit=None)] == ["foreign"]
    assert await ids(storage, "t1") == ["foreign", "mine"]


async def test_missing_thread(storage: MongoHistoryStorage) -> None:
    """An unknown thread has no row and no messages."""
    assert await storage.get_thread("nope") is None
    assert await storage.list_messages("nope", resource_id=None, limit=40) == []
    assert await storage.get_threads(["nope"]) == {}


@pytest.mark.parametrize(
    ("content", "text"),
    [("plain legacy text", "plain legacy text"), ('"a JSON string"', "a JSON string")],
    ids=["not-json", "json-string"],
)
async def test_legacy_string_content_is_read_as_text(
    storage: MongoHistoryStorage, mongo_db: Db, content: str, text: str
) -> None:
    """A row whose content is not format-2 JSON but text reads as one text part, as Mastra reads it (a v1
    row: Mastra 1.71's conversion does not carry its `type` over)."""
    await mongo_db[MESSAGES].insert_one(
        {"id": "old", "thread_id": "t1", "resourceId": "r1", "role": "user", "type": "v1",
         "content": content, "createdAt": at(0)}
    )  # fmt: skip
    [message] = await storage.list_messages("t1", resource_id="r1", limit=40)
    assert message.type is None
    assert message.content.parts[0].model_dump() == {"type": "text", "text": text}


async def test_unreadable_row_is_skipped_not_an_error(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """A row no Mastra would read (content a JSON number) is left out of the read, the rest is read; it
    used to fail the read with FatalStorageError, which stopped the service (issue 31)."""
    await mongo_db[MESSAGES].insert_many(
        [{"id": "bad", "thread_id": "t1", "resourceId": "r1", "role": "user", "type": "v2",
          "content": "5", "createdAt": at(0)},
         {"id": "good", "thread_id": "t1", "resourceId": "r1", "role": "user", "type": "v2",
          "content": '{"format":2,"parts":[{"type":"text","text":"hi"}]}', "createdAt": at(1)}]
    )  # fmt: skip
    [message] = await storage.list_messages("t1", resource_id=None, limit=40)
    assert message.id == "good"


async def test_threads_written_with_json_string_metadata_are_parsed(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """Legacy thread rows with metadata as a JSON string read as an object (as Mastra's getThreadById)."""
    await mongo_db[THREADS].insert_one(
        {"id": "t1", "resourceId": "r1", "title": "x", "metadata": '{"a": 1}', "createdAt": at(0),
         "updatedAt": at(0)}
    )  # fmt: skip
    thread = await storage.get_thread("t1")
    assert thread is not None
    assert thread.metadata == {"a": 1}


# --- round trips -------------------------------------------------------------------------------------------


async def test_one_find_per_recall(monitored: tuple[MongoHistoryStorage, CommandLog]) -> None:
    """A recall page is one `find` (no count, no getMore) even when the thread is longer than the page."""
    storage, log = monitored
    await storage.save_messages(
        thread_id="t1", resource_id="r1", messages=[msg(f"m{i:03}", t=i) for i in range(150)]
    )
    log.names.clear()
    page = await storage.list_messages("t1", resource_id="r1", limit=120)
    assert len(page) == 120
    assert log.names == ["find"]


async def test_save_is_two_concurrent_finds_and_two_bulk_writes(
    monitored: tuple[MongoHistoryStorage, CommandLog],
) -> None:
    """save_messages costs a threads find and a message-homes find (one round trip), then one threads update
    (creating a new thread, or touching an existing one) and one messages update."""
    storage, log = monitored
    await storage.save_messages(
        thread_id="t1", resource_id="r1", messages=[msg(f"m{i}", t=i) for i in range(20)]
    )
    assert log.names == ["find", "find", "update", "update"]  # new thread: created before its messages
    log.names.clear()
    await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m20", t=20)])
    assert log.names == ["find", "find", "update", "update"]  # existing thread: messages, then the touch


@pytest.mark.parametrize("strategy", ["in", "concurrent"])
async def test_batch_recall_matches_single_recall(mongo_db: Db, strategy: str) -> None:
    """list_messages_many returns, per thread, exactly what list_messages returns, with either strategy."""
    storage = MongoHistoryStorage(mongo_db, recall_strategy=strategy)  # type: ignore[arg-type]
    await storage.ensure_indexes()
    turns = [
        SaveTurn(f"t{n}", "r1", [msg(f"t{n}-m{i}", t=(i // 2) * 10) for i in range(n * 3)])
        for n in range(1, 5)
    ]
    await storage.save_many(turns)
    queries = [
        RecallQuery("t1", "r1", 2),
        RecallQuery("t2", None, None),
        RecallQuery("t3", "r1", 0),
        RecallQuery("t4", "r1", 5),
        RecallQuery("missing", "r1", 40),
    ]
    pages = await storage.list_messages_many(queries)
    assert set(pages) == {"t1", "t2", "t3", "t4", "missing"}
    for q in queries:
        single = await storage.list_messages(q.thread_id, resource_id=q.resource_id, limit=q.limit)
        assert [m.wire() for m in pages[q.thread_id]] == [m.wire() for m in single], q
    assert len(pages["t4"]) == 5


async def test_in_recall_refetches_threads_crowded_out_by_busier_ones(
    monitored: tuple[MongoHistoryStorage, CommandLog],
) -> None:
    """When one busy thread fills the `$in` cap, quieter threads are re-read alone and come back complete."""
    storage, log = monitored
    busy = [msg(f"b{i:03}", t=1_000 + i) for i in range(30)]
    quiet = [msg(f"q{i}", t=i) for i in range(5)]
    await storage.save_many([SaveTurn("busy", "r1", busy), SaveTurn("quiet", "r1", quiet)])
    log.names.clear()
    pages = await storage.list_messages_many([RecallQuery("busy", "r1", 10), RecallQuery("quiet", "r1", 5)])
    assert [m.id for m in pages["busy"]] == [f"b{i:03}" for i in range(29, 19, -1)]
    assert [m.id for m in pages["quiet"]] == ["q4", "q3", "q2", "q1", "q0"]
    assert log.names == ["find", "find"]  # the batch query, then the one crowded-out thread


async def test_batch_recall_of_equal_histories_is_one_find(
    monitored: tuple[MongoHistoryStorage, CommandLog],
) -> None:
    """Recalling many equally long histories with the `$in` strategy is a single `find`."""
    storage, log = monitored
    await storage.save_many(
        [SaveTurn(f"t{n}", "r1", [msg(f"t{n}-{i}", t=i) for i in range(8)]) for n in range(30)]
    )
    log.names.clear()
    pages = await storage.list_messages_many([RecallQuery(f"t{n}", "r1", 8) for n in range(30)])
    assert all(len(page) == 8 for page in pages.values())
    assert log.names == ["find"]


async def test_distinct_pages_per_thread_are_required(storage: MongoHistoryStorage) -> None:
    """Two queries of one thread with different pages are an InvalidInputError; identical ones collapse."""
    same = await storage.list_messages_many([RecallQuery("t1", "r1", 3), RecallQuery("t1", "r1", 3)])
    assert same == {"t1": []}
    with pytest.raises(InvalidInputError):
        await storage.list_messages_many([RecallQuery("t1", "r1", 3), RecallQuery("t1", "r1", 4)])


# --- save_many ---------------------------------------------------------------------------------------------


async def test_save_many_mixes_accepted_and_refused_turns(
    monitored: tuple[MongoHistoryStorage, CommandLog], mongo_db: Db
) -> None:
    """Per turn in order: created, refused (foreign thread), appended to a thread made earlier in the batch"""
    storage, log = monitored
    await storage.save_messages(thread_id="theirs", resource_id="owner", messages=[msg("o1", t=0)])
    log.names.clear()
    results = await storage.save_many(
        [
            SaveTurn("new", "r1", [msg("n1", t=10)]),
            SaveTurn("theirs", "r1", [msg("x1", t=11)]),
            SaveTurn("new", "r1", [msg("n2", t=20)]),
            SaveTurn("new", "r2", [msg("x2", t=30)]),  # the batch's first turn made r1 the owner
            SaveTurn("theirs", "owner", [msg("o2", t=40)]),
        ]
    )
    # threads and message homes; the new thread created; the messages; the existing thread touched
    assert log.names == ["find", "find", "update", "update", "update"]
    assert results[0] == Thread("new", "r1", "", {}, createdAt=at(10), updatedAt=at(10))
    assert isinstance(results[1], ThreadOwnershipError)
    assert results[1].owner == "owner"
    assert results[2] == Thread("new", "r1", "", {}, createdAt=at(10), updatedAt=at(20))
    assert isinstance(results[3], ThreadOwnershipError)
    assert results[3].owner == "r1"
    assert isinstance(results[4], Thread)
    assert results[4].updatedAt == at(40)
    assert await ids(storage, "new") == ["n2", "n1"]
    assert await ids(storage, "theirs") == ["o2", "o1"]
    assert await mongo_db[MESSAGES].count_documents({"id": {"$in": ["x1", "x2"]}}) == 0
    assert await storage.get_threads(["new", "theirs", "none"]) == {
        "new": results[2],
        "theirs": results[4],
    }


async def test_save_many_same_id_twice_keeps_first_created_at_and_last_fields(
    storage: MongoHistoryStorage,
) -> None:
    """An id saved by two turns of one batch ends as two saves in a row would leave it."""
    await storage.save_many(
        [
            SaveTurn("t1", "r1", [msg("m1", t=0, text="first")]),
            SaveTurn("t1", "r1", [msg("m1", t=99, text="second")]),
        ]
    )
    [message] = await storage.list_messages("t1", resource_id=None, limit=None)
    assert message.createdAt == at(0)
    assert message.content.parts[0].model_dump()["text"] == "second"


async def test_save_many_of_nothing_and_of_an_empty_turn(storage: MongoHistoryStorage) -> None:
    """No turns is no work; an empty turn reports an existing thread, and is invalid for a missing one."""
    assert await storage.save_many([]) == []
    thread = await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
    assert await storage.save_many([SaveTurn("t1", "r1", [])]) == [thread]
    with pytest.raises(InvalidInputError):
        await storage.save_many([SaveTurn("t2", "r1", [])])


# --- errors ------------------------------------------------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def socket_leaks_ignored() -> Iterator[None]:
    """Ignore the ResourceWarning of the socket PyMongo leaks when a client closes while its monitor connects.

    PyMongo 4.20's async connect (`pool_shared._async_create_connection`) closes the socket on OSError and
    timeouts but not on cancellation, so closing a client that points at a dead port can drop one open
    socket, whose ResourceWarning the suite turns into an error. Not ours to fix; only these tests see it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


@pytest_asyncio.fixture
async def unreachable() -> AsyncIterator[MongoHistoryStorage]:
    """A storage whose client points at a closed loopback port and gives up server selection after 300 ms."""
    uri = f"mongodb://127.0.0.1:{closed_port()}/?directConnection=true&serverSelectionTimeoutMS=300"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri)
    try:
        yield MongoHistoryStorage(client["x"])
    finally:
        with socket_leaks_ignored():
            await client.close()
            await asyncio.sleep(0.2)


async def test_unreachable_server_is_retriable_on_every_operation(unreachable: MongoHistoryStorage) -> None:
    """Reads and writes against an unreachable server raise StorageUnavailableError (retriable), not []."""
    operations = [
        unreachable.get_thread("t1"),
        unreachable.list_messages("t1", resource_id=None, limit=40),
        unreachable.list_messages_many([RecallQuery("a", None, 5), RecallQuery("b", None, 5)]),
        unreachable.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)]),
        unreachable.ensure_indexes(),
    ]
    for operation in operations:
        with pytest.raises(StorageUnavailableError) as caught:
            await operation
        assert caught.value.retriable
        assert "127.0.0.1" not in str(caught.value)
        del caught  # its frames may hold the socket PyMongo leaks (see socket_leaks_ignored)


async def test_open_fails_fast_when_the_server_is_down() -> None:
    """`open()` pings first: with the server down it raises StorageUnavailableError within the timeout."""
    settings = Settings(MONGODB_URI=f"mongodb://u:secret@127.0.0.1:{closed_port()}/", mongodb_timeout_ms=300)
    with socket_leaks_ignored():
        try:
            async with MongoHistoryStorage.open(settings):
                pytest.fail("open() yielded without a server")
        except StorageUnavailableError as exc:
            message = str(exc)  # keep no reference to the error: its frames hold the leaked socket
        await asyncio.sleep(0.2)
    assert message.startswith("MongoDB unavailable during ping")
    assert "secret" not in message


async def test_open_pings_and_creates_indexes(mongo_uri: str) -> None:
    """`open()` against the live server yields a working storage with its indexes in place."""
    name = infra.unique_name("t_")
    settings = Settings(MONGODB_URI=mongo_uri, MONGODB_DATABASE=name)
    try:
        async with MongoHistoryStorage.open(settings) as storage:
            await storage.save_messages(thread_id="t1", resource_id="r1", messages=[msg("m1", t=0)])
            assert await ids(storage, "t1") == ["m1"]
            assert "thread_id_1_createdAt_1_id_1" in await storage.messages.index_information()
    finally:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
        await client.drop_database(name)
        await client.close()


async def test_save_many_with_the_batch_reads_reads_nothing_again(
    monitored: tuple[MongoHistoryStorage, CommandLog], mongo_db: Db
) -> None:
    """The persist batch reads the threads and homes once (`read_for_saves`, with its other reads); the
    write then plans from them: only the writes go out, and the ownership checks hold as without them."""
    storage, log = monitored
    await storage.save_messages(thread_id="theirs", resource_id="owner", messages=[msg("o1", t=0)])
    turns = [
        SaveTurn("new", "r1", [msg("n1", t=10)]),
        SaveTurn("theirs", "r1", [msg("x1", t=11)]),  # a foreign thread
        SaveTurn("mine", "r1", [msg("o1", t=12)]),  # an id stored in another thread
    ]
    reads = await storage.read_for_saves(["new", "theirs", "mine"], ["n1", "x1", "o1"])
    log.names.clear()
    results = await storage.save_many(turns, reads=reads)
    assert log.names == ["update", "update"]  # the new threads created, the messages; no find
    assert isinstance(results[0], Thread)
    assert isinstance(results[1], ThreadOwnershipError)
    assert isinstance(results[2], MessageIdTakenError)
    assert await mongo_db[MESSAGES].count_documents({"id": {"$in": ["x1"]}}) == 0
    assert await ids(storage, "theirs") == ["o1"]


async def test_save_many_reads_what_the_batch_reads_do_not_cover(
    monitored: tuple[MongoHistoryStorage, CommandLog],
) -> None:
    """An id (or thread) outside the batch's reads is read by the write itself: a plan that proves short
    never weakens the ownership check."""
    storage, log = monitored
    await storage.save_messages(thread_id="theirs", resource_id="owner", messages=[msg("o1", t=0)])
    reads = await storage.read_for_saves(["mine"], [])
    log.names.clear()
    [result] = await storage.save_many([SaveTurn("mine", "r1", [msg("o1", t=12)])], reads=reads)
    assert isinstance(result, MessageIdTakenError)
    assert log.names == ["find"]  # the home of o1 only: the thread was read
    assert await ids(storage, "theirs") == ["o1"]


async def test_a_recall_reply_over_16_mib_under_the_services_timeout(mongo_uri: str, mongo_db: Db) -> None:
    """A batch's recall whose reply passes MongoDB's 16 MiB batch limit, on a client opened as the service
    opens it (client-side timeout, `timeoutMS`): the rows of the second and later batches come back too, and
    the same as `list_messages_many`'s. A raw `getMore` sent through `db.command` failed exactly here
    (PyMongo adds `maxTimeMS` under the timeout; the server refuses it on a getMore), which only the bench's
    500-request batches reached."""
    settings = Settings(MONGODB_URI=mongo_uri, MONGODB_DATABASE=mongo_db.name, mongodb_timeout_ms=60_000)
    threads, per_thread, text = 24, 400, "x" * 1800  # ~19 MB of rows, > 16 MiB in one reply
    async with MongoHistoryStorage.open(settings) as storage:
        for t in range(threads):
            rows = [msg(f"t{t}-m{i:03d}", t=i, text=f"{t}-{i} {text}") for i in range(per_thread)]
            await storage.save_messages(thread_id=f"t{t}", resource_id="r", messages=rows)
        queries = [RecallQuery(f"t{t}", "r", per_thread) for t in range(threads)]
        raw_pages = await storage.recall_raw_many(queries)
        pages = await storage.list_messages_many(queries)
    assert sum(len(b) for page in raw_pages.values() for b in page) > 16 * 1024 * 1024
    for t in range(threads):
        raw_ids = [bson.decode(b)["id"] for b in raw_pages[f"t{t}"]]
        assert raw_ids == [m.id for m in pages[f"t{t}"]]
        assert len(raw_ids) == per_thread
