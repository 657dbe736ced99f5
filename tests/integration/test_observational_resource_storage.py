"""Resource scope's storage (`storage/observational_resource.py`) on the real MongoDB-wire server: a
resource's threads and cursors, its unobserved messages across them (one page, its own only), the cursors
written where Mastra keeps them, and hostile rows skipped or refused, never a crash."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from message_history import metrics
from message_history.core.observation_resource import unobserved_by_thread
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.observational import MongoObservationalStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def _save(storage: MongoHistoryStorage, thread: str, resource: str, *minutes: int) -> None:
    messages = [
        Message.model_validate(
            {
                "id": f"{thread}-{m}",
                "role": "user",
                "createdAt": _iso(T0 + timedelta(minutes=m)),
                "threadId": thread,
                "resourceId": resource,
                "content": {"format": 2, "parts": [{"type": "text", "text": f"message {m}"}]},
            }
        )
        for m in minutes
    ]
    await storage.save_messages(thread_id=thread, resource_id=resource, messages=messages)


async def _fixture(db: Db) -> tuple[MongoHistoryStorage, MongoObservationalStore]:
    storage = MongoHistoryStorage(db)
    await _save(storage, "a", "r1", 1, 3, 5)
    await _save(storage, "b", "r1", 2, 4)
    await _save(storage, "x", "r2", 6)  # another resource's thread: never in r1's work
    store = MongoObservationalStore(db)
    await store.ensure_indexes()
    return storage, store


async def test_each_thread_is_read_from_its_own_cursor(mongo_db: Db) -> None:
    _, store = await _fixture(mongo_db)
    cursors = await store.resource_cursors("r1", 100)
    assert cursors == {"a": None, "b": None}
    written = await store.write_cursors("r1", [("a", T0 + timedelta(minutes=3), {"currentTask": "t"})], T0)
    assert written == 1
    thread = await mongo_db["mastra_threads"].find_one({"id": "a"})
    assert thread is not None
    assert thread["metadata"]["mastra"]["om"] == {
        "lastObservedAt": "2025-01-01T12:03:00.000Z",
        "currentTask": "t",
    }
    cursors = await store.resource_cursors("r1", 100)
    assert cursors == {"a": T0 + timedelta(minutes=3), "b": None}
    messages = await store.resource_messages("r1", cursors, 100)
    assert [m["id"] for m in messages] == [
        "a-1",
        "b-2",
        "a-3",
        "b-4",
        "a-5",
    ]  # b has no cursor: all, oldest first
    by_thread = unobserved_by_thread(messages, cursors, frozenset())
    assert {t: [m["id"] for m in ms] for t, ms in by_thread.items()} == {"a": ["a-5"], "b": ["b-2", "b-4"]}
    # every thread with a cursor: read from the oldest one on
    await store.write_cursors("r1", [("b", T0 + timedelta(minutes=2), {})], T0)
    cursors = await store.resource_cursors("r1", 100)
    assert [m["id"] for m in await store.resource_messages("r1", cursors, 100)] == ["a-3", "b-4", "a-5"]


async def test_one_page_the_newest(mongo_db: Db) -> None:
    _, store = await _fixture(mongo_db)
    cursors = await store.resource_cursors("r1", 100)
    assert [m["id"] for m in await store.resource_messages("r1", cursors, 2)] == ["b-4", "a-5"]
    assert len(await store.resource_cursors("r1", 1)) == 1


async def test_another_resources_thread_is_neither_read_nor_written(mongo_db: Db) -> None:
    """A cursor map naming r2's thread (a forged result) reads none of its messages and writes nothing."""
    _, store = await _fixture(mongo_db)
    assert await store.resource_messages("r1", {"x": None}, 100) == []
    # a row naming another owner inside r1's thread (written around the service): not r1's work
    await mongo_db["mastra_messages"].update_one({"id": "a-1"}, {"$set": {"resourceId": "r2"}})
    assert "a-1" not in [m["id"] for m in await store.resource_messages("r1", {"a": None}, 100)]
    assert await store.write_cursors("r1", [("x", T0, {})], T0) == 0
    thread = await mongo_db["mastra_threads"].find_one({"id": "x"})
    assert thread is not None
    assert "mastra" not in (thread.get("metadata") or {})


def _unreadable_messages() -> float:
    return sum(
        sample.value
        for family in metrics.UNREADABLE_ROWS.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("collection") == "mastra_messages"
    )


async def test_hostile_rows_are_skipped_or_refused_never_a_crash(mongo_db: Db) -> None:
    _, store = await _fixture(mongo_db)
    # a thread whose metadata.mastra is a string: its cursor cannot be set there (Mongo refuses the path)
    await mongo_db["mastra_threads"].update_one({"id": "b"}, {"$set": {"metadata": {"mastra": "odd"}}})
    # a message row no Mastra would read (its content a number)
    await mongo_db["mastra_messages"].update_one({"id": "a-3"}, {"$set": {"content": 7}})
    before = _unreadable_messages()
    cursors = await store.resource_cursors("r1", 100)
    assert cursors == {"a": None, "b": None}  # b's odd metadata: no cursor
    ids = [m["id"] for m in await store.resource_messages("r1", cursors, 100)]
    assert "a-3" not in ids
    assert ids == ["a-1", "b-2", "b-4", "a-5"]
    assert _unreadable_messages() == before + 1  # skipped and counted
    written = await store.write_cursors("r1", [("b", T0, {}), ("a", T0 + timedelta(minutes=1), {})], T0)
    assert written == 1  # a's written, b's refused and logged


async def test_the_title_is_written_once_unless_pinned_or_renamed_meanwhile(mongo_db: Db) -> None:
    """`write_titles` is conditional on the title and the pin as `hint_rows` read them, and on the owner:
    written again it matches nothing (the title already moved), a pin or a rename made between the read and
    the write wins, and another resource's thread is neither read nor written."""
    _, store = await _fixture(mongo_db)
    threads = mongo_db["mastra_threads"]
    await threads.update_many({}, {"$set": {"title": "Old"}})
    reads = await store.hint_rows("r1", ["a", "b", "x"])
    assert set(reads) == {"a", "b"}  # x is r2's
    assert (reads["a"].title, reads["a"].extracted) == ("Old", None)
    assert await store.write_titles("r1", [("a", "Trip to Lyon", reads["a"].title)], T0) == 1
    assert await store.write_titles("r1", [("a", "Trip to Lyon", reads["a"].title)], T0) == 0  # idempotent
    # a pin (Mastra's `session.thread.rename()`) between the read and the write: the title stays
    await threads.update_one({"id": "b"}, {"$set": {"metadata.titlePinned": True}})
    assert await store.write_titles("r1", [("b", "Trip to Lyon", reads["b"].title)], T0) == 0
    assert await store.write_titles("r1", [("x", "Trip to Lyon", "Old")], T0) == 0  # another owner's
    titles = {t["id"]: t["title"] async for t in threads.find({}, {"id": 1, "title": 1})}
    assert titles == {"a": "Trip to Lyon", "b": "Old", "x": "Old"}


async def test_hints_the_answer_lacks_are_null_and_extracted_merges(mongo_db: Db) -> None:
    """`write_cursors` sets a None hint to null (Mastra's `undefined` through @mastra/mongodb) and merges
    `extracted` key by key into an existing object (`core.observation_hints.om_hints`)."""
    _, store = await _fixture(mongo_db)
    first = {"threadTitle": "Lyon", "currentTask": None, "extracted": {"mood": "calm", "topic": "trains"}}
    assert await store.write_cursors("r1", [("a", None, first)], T0) == 1
    reads = await store.hint_rows("r1", ["a"])
    assert reads["a"].extracted == {"mood": "calm", "topic": "trains"}
    assert await store.write_cursors(
        "r1", [("a", None, {"threadTitle": None, "extracted.mood": "tense"})], T0
    )
    thread = await mongo_db["mastra_threads"].find_one({"id": "a"})
    assert thread is not None
    assert thread["metadata"]["mastra"]["om"] == {
        "threadTitle": None,
        "currentTask": None,
        "extracted": {"mood": "tense", "topic": "trains"},
    }
