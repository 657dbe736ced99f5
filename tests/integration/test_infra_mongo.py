"""The MongoDB-wire server of the suite supports what the store relies on, through PyMongo's async API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import ASCENDING, DESCENDING, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)  # BSON dates keep milliseconds


def naive(moment: datetime) -> datetime:
    """PyMongo returns naive UTC datetimes unless the client asks for tz-aware ones."""
    return moment.astimezone(UTC).replace(tzinfo=None)


async def test_unique_index_refuses_a_duplicate_insert(mongo_db: Db) -> None:
    """With a unique index on `id`, inserting an id again raises DuplicateKeyError and stores nothing."""
    messages = mongo_db["messages"]
    await messages.create_index([("id", ASCENDING)], unique=True, name="id_unique")
    await messages.insert_one({"id": "m1", "text": "first"})
    with pytest.raises(DuplicateKeyError):
        await messages.insert_one({"id": "m1", "text": "second"})
    assert [doc["text"] async for doc in messages.find({"id": "m1"})] == ["first"]
    index_info = await messages.index_information()
    assert index_info["id_unique"].get("unique") is True


async def test_bulk_upsert_writes_set_on_insert_fields_only_once(mongo_db: Db) -> None:
    """A replayed bulk upsert by id updates `$set` fields but keeps the first write's `$setOnInsert` value."""
    messages = mongo_db["messages"]
    await messages.create_index([("id", ASCENDING)], unique=True)

    def batch(text: str, created: datetime) -> list[UpdateOne]:
        return [
            UpdateOne(
                {"id": message_id},
                {"$set": {"text": f"{text}-{message_id}"}, "$setOnInsert": {"createdAt": created}},
                upsert=True,
            )
            for message_id in ("a", "b")
        ]

    first = await messages.bulk_write(batch("v1", T0), ordered=True)
    again = await messages.bulk_write(batch("v2", T0 + timedelta(hours=1)), ordered=True)

    assert (first.upserted_count, first.matched_count) == (2, 0)
    assert (again.upserted_count, again.matched_count) == (0, 2)
    stored = {doc["id"]: doc async for doc in messages.find({}, {"_id": 0})}
    assert stored == {
        "a": {"id": "a", "text": "v2-a", "createdAt": naive(T0)},
        "b": {"id": "b", "text": "v2-b", "createdAt": naive(T0)},
    }


async def test_max_on_a_date_only_moves_forward(mongo_db: Db) -> None:
    """`$max` on `updatedAt` ignores an older date and takes a newer one."""
    threads = mongo_db["threads"]
    await threads.insert_one({"id": "t1", "updatedAt": T0})

    await threads.update_one({"id": "t1"}, {"$max": {"updatedAt": T0 - timedelta(minutes=5)}})
    after_older = await threads.find_one({"id": "t1"})
    await threads.update_one({"id": "t1"}, {"$max": {"updatedAt": T0 + timedelta(minutes=5)}})
    after_newer = await threads.find_one({"id": "t1"})

    assert after_older is not None
    assert after_older["updatedAt"] == naive(T0)
    assert after_newer is not None
    assert after_newer["updatedAt"] == naive(T0 + timedelta(minutes=5))


async def test_sorted_find_with_limit_breaks_ties_by_id(mongo_db: Db) -> None:
    """A find sorted by (createdAt desc, id desc) with a limit returns the newest documents, ties by id."""
    messages = mongo_db["messages"]
    await messages.create_index([("thread_id", ASCENDING), ("createdAt", DESCENDING), ("id", DESCENDING)])
    rows = [
        ("m1", T0),
        ("m2", T0 + timedelta(milliseconds=1)),
        ("m4", T0 + timedelta(milliseconds=2)),  # m3 and m4 share a timestamp: id decides
        ("m3", T0 + timedelta(milliseconds=2)),
        ("m5", T0 + timedelta(milliseconds=3)),
    ]
    await messages.insert_many([{"id": i, "thread_id": "t1", "createdAt": at} for i, at in rows])
    await messages.insert_one({"id": "other", "thread_id": "t2", "createdAt": T0 + timedelta(days=1)})

    cursor = messages.find({"thread_id": "t1"}).sort([("createdAt", DESCENDING), ("id", DESCENDING)]).limit(3)
    assert [doc["id"] async for doc in cursor] == ["m5", "m4", "m3"]
