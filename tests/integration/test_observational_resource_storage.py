"""Resource scope's storage (`storage/observational_resource.py`) on the real MongoDB-wire server: a
resource's threads and cursors, its unobserved messages across them (one page, its own only), the cursors
written where Mastra keeps them, and hostile rows skipped or refused, never a crash."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from consumers.observe_work import ResourceRows, resource_unobserved
from message_history import metrics
from message_history.core.observation_resource import max_created_at, unobserved_by_thread
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.observational import MongoObservationalStore
from storage.observational_resource import Position, ThreadPage

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


async def test_one_page_the_newest_then_what_it_cut_off(mongo_db: Db) -> None:
    """The newest 2 (b-4, a-5) fill the page, so up to 2 of the rows it cut off are read too, each thread's
    oldest first: a's two; a keeps only those (its a-5 is read once they are observed: none skipped)."""
    _, store = await _fixture(mongo_db)
    cursors = await store.resource_cursors("r1", 100)
    assert [m["id"] for m in await store.resource_messages("r1", cursors, 2)] == ["a-1", "a-3", "b-4"]
    assert [m["id"] for m in await store.resource_messages("r1", cursors, 5)] == [
        "a-1",
        "b-2",
        "a-3",
        "b-4",
        "a-5",
    ]
    assert len(await store.resource_cursors("r1", 1)) == 1


async def test_a_threads_old_messages_behind_anothers_observed_ones_are_read(mongo_db: Db) -> None:
    """Thread a's one unobserved message (minute 1) is older than 6 of b's, all observed (b's cursor past
    them): the page of the newest 5 from a's cursor on holds only b's, so before the cut-off read a's
    message was never read while that stayed so (b's rows only grow): it starved. Now it is read."""
    storage = MongoHistoryStorage(mongo_db)
    await _save(storage, "a", "r1", 1)
    await _save(storage, "b", "r1", 2, 3, 4, 5, 6, 7)
    store = MongoObservationalStore(mongo_db)
    cursors: dict[str, datetime | None] = {"a": T0, "b": T0 + timedelta(minutes=7)}
    old_page = (
        await mongo_db["mastra_messages"]
        .find({"thread_id": {"$in": ["a", "b"]}, "createdAt": {"$gt": T0}})
        .sort([("createdAt", -1), ("id", -1)])
        .limit(5)
        .to_list()
    )
    assert "a-1" not in [m["id"] for m in old_page]  # the page alone: a's message never in it
    messages = await store.resource_messages("r1", cursors, 5)
    assert unobserved_by_thread(messages, cursors, frozenset()) == {"a": [messages[0]]}
    assert messages[0]["id"] == "a-1"
    # rounds of observation reading 2 rows a record: each thread's rows in order, none skipped
    await _save(storage, "c", "r1", 8, 9, 10, 11)
    cursors = {"a": T0 + timedelta(minutes=1), "b": T0 + timedelta(minutes=7), "c": None}
    observed: list[str] = []
    for _ in range(4):
        by_thread = unobserved_by_thread(
            await store.resource_messages("r1", cursors, 2), cursors, frozenset()
        )
        for thread, rows in by_thread.items():
            observed += [m["id"] for m in rows]
            cursors[thread] = max_created_at(rows)
    assert observed == ["c-8", "c-9", "c-10", "c-11"]


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


# --- the resource's threads past the page (MAX_ROWS_PER_REQUEST) --------------------------------------------


class _Forgetful:
    """The store, without keeping where the next thread page starts: every read is the newest page, as
    the resource's reads were before the pages moved on (the starvation this guards against)."""

    def __init__(self, store: MongoObservationalStore) -> None:
        self._store = store

    async def resource_cursors(self, resource_id: str, max_threads: int) -> dict[str, datetime | None]:
        return await self._store.resource_cursors(resource_id, max_threads)

    async def resource_messages(
        self, resource_id: str, cursors: Mapping[str, datetime | None], limit: int
    ) -> list[dict[str, Any]]:
        return await self._store.resource_messages(resource_id, cursors, limit)

    async def resource_threads(
        self, resource_id: str, limit: int, after: Position | None, *, include: str | None = None
    ) -> ThreadPage:
        return await self._store.resource_threads(resource_id, limit, after, include=include)

    async def keep_threads_after(self, record_id: str, after: Position | None) -> None:
        return None


async def _many_threads(
    db: Db, resource: str, count: int, *, same_time: bool = False
) -> MongoObservationalStore:
    """`count` threads of `resource`, one message each, thread `t<i>` updated at minute `i` (all at one
    time with `same_time`), and threads of another owner updated in between."""
    storage = MongoHistoryStorage(db)
    for i in range(count):
        await _save(storage, f"{resource}-t{i}", resource, i)
        await _save(storage, f"other-t{i}", "other", i)
        for thread in (f"{resource}-t{i}", f"other-t{i}"):
            at = T0 if same_time else T0 + timedelta(minutes=i, seconds=30 if thread.startswith("o") else 0)
            await db["mastra_threads"].update_one({"id": thread}, {"$set": {"updatedAt": at}})
    store = MongoObservationalStore(db)
    await store.ensure_indexes()
    await store.initialize(scope="resource", thread_id=None, resource_id=resource, config={}, now=T0)
    return store


async def _observe_rounds(
    rows: ResourceRows, store: MongoObservationalStore, resource: str, rounds: int, cap: int
) -> list[set[str]]:
    """`rounds` persist records of the resource, each observing every unobserved message it reads (a
    threshold of one token): the threads each one observed. The cursors' writes move the observed threads
    to the front, as a real observation does."""
    seen: list[set[str]] = []
    for n in range(rounds):
        record = await store.get(None, resource)
        assert record is not None
        by_thread = await resource_unobserved(rows, record, cap)
        cursors: list[tuple[str, datetime, Mapping[str, object]]] = [
            (thread, max_created_at(messages) or T0, {}) for thread, messages in by_thread.items()
        ]
        await store.write_cursors(resource, cursors, T0 + timedelta(hours=1, minutes=n))
        seen.append(set(by_thread))
    return seen


async def test_every_thread_past_the_page_is_observed_within_a_round_of_pages(mongo_db: Db) -> None:
    """8 threads, 3 a page: every thread's message is read and observed within ceil(8 / 3) = 3 records,
    each record reading at most 3 threads, none of another owner; the forgetful store (each record the
    newest page, as before) never reaches the 5 older threads: their messages starve."""
    store = await _many_threads(mongo_db, "r1", 8)
    seen = await _observe_rounds(store, store, "r1", 3, 3)
    assert [len(s) for s in seen] == [3, 3, 2]
    assert set().union(*seen) == {f"r1-t{i}" for i in range(8)}
    assert seen[0] == {"r1-t7", "r1-t6", "r1-t5"}  # the newest first
    record = await store.get(None, "r1")
    assert record is not None
    assert await resource_unobserved(store, record, 3) == {}  # nothing left anywhere

    starved = await _many_threads(mongo_db, "r2", 8)
    seen = await _observe_rounds(_Forgetful(starved), starved, "r2", 6, 3)
    assert set().union(*seen) == {"r2-t7", "r2-t6", "r2-t5"}  # t0..t4 never read, however many records


async def test_threads_updated_at_one_time_are_paged_by_id(mongo_db: Db) -> None:
    """An observation's cursor writes give its threads one `updatedAt`: 7 such threads, 3 a page, are read
    by id in 3 pages (the third wraps round to the newest), none twice before every one was read."""
    store = await _many_threads(mongo_db, "r1", 7, same_time=True)
    after: Position | None = None
    pages: list[list[str]] = []
    for _ in range(3):
        page = await store.resource_threads("r1", 3, after)
        pages.append(sorted(page.cursors))
        after = page.after
    assert pages[0] == ["r1-t4", "r1-t5", "r1-t6"]
    assert pages[1] == ["r1-t1", "r1-t2", "r1-t3"]
    assert pages[2] == ["r1-t0", "r1-t5", "r1-t6"]  # the end, then round again from the newest
    assert after == (T0, "r1-t5")


async def test_the_thread_that_spoke_is_read_with_any_page(mongo_db: Db) -> None:
    """The persist path's page also holds the thread whose turn it saves (`include`), if the resource's
    (another owner's thread named there is not read); a page holding every thread starts from the newest
    again (no position kept)."""
    store = await _many_threads(mongo_db, "r1", 5)
    page = await store.resource_threads("r1", 2, None, include="r1-t0")
    assert set(page.cursors) == {"r1-t4", "r1-t3", "r1-t0"}
    assert page.after is not None
    assert page.after[1] == "r1-t3"
    page = await store.resource_threads("r1", 2, None, include="other-t0")
    assert set(page.cursors) == {"r1-t4", "r1-t3"}
    page = await store.resource_threads("r1", 6, None)
    assert len(page.cursors) == 5
    assert page.after is None
    page = await store.resource_threads("r1", 5, None)
    assert page.after == (T0, "r1-t0")  # a full page: more may follow
    page = await store.resource_threads("r1", 5, page.after)  # none did: round again, all 5
    assert len(page.cursors) == 5
    assert page.after == (T0, "r1-t0")


async def test_the_next_page_is_kept_on_the_resources_row(mongo_db: Db) -> None:
    """`keep_threads_after` writes the position the row reads back; None removes it; an odd value there
    (a hand's) is no position, never an unreadable row."""
    store = await _many_threads(mongo_db, "r1", 2)
    record = await store.get(None, "r1")
    assert record is not None
    assert record.threads_after is None
    await store.keep_threads_after(record.id, (T0, "r1-t1"))
    record = await store.get(None, "r1")
    assert record is not None
    assert record.threads_after == (T0, "r1-t1")
    await store.keep_threads_after(record.id, None)
    record = await store.get(None, "r1")
    assert record is not None
    assert record.threads_after is None
    await mongo_db["mastra_observational_memory"].update_one(
        {"id": record.id}, {"$set": {"_mh_threads_after": "odd"}}
    )
    record = await store.get(None, "r1")
    assert record is not None
    assert record.threads_after is None


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
