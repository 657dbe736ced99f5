"""`storage.raw_batches.RowsCursor` on the real MongoDB-wire server: the same rows as a plain `find`, in the
same order, through first batches, `getMore`s, limits and skips; a failing query fails as PyMongo's does; and
its fast path is the one taken (a PyMongo upgrade that stops calling the hook fails here)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import OperationFailure

from storage import raw_batches
from storage.raw_batches import RowsCursor
from storage.raw_rows import RAW

pytestmark = pytest.mark.integration


async def _seeded(mongo_db: AsyncDatabase[dict[str, Any]]) -> Any:
    coll = mongo_db.get_collection("rows", codec_options=RAW)
    await coll.insert_many(
        [{"id": f"m{i:03}", "thread_id": f"t{i % 3}", "n": i, "text": "é" * (i * 7)} for i in range(250)]
    )
    return coll


@pytest.mark.parametrize(
    ("query", "batch_size", "limit", "skip"),
    [
        ({}, 0, 0, 0),
        ({}, 7, 0, 0),  # many getMores
        ({}, 7, 20, 0),
        ({"thread_id": {"$in": ["t0", "t2"]}}, 50, 101, 3),
        ({"thread_id": "nobody"}, 0, 0, 0),
    ],
)
async def test_the_rows_of_a_plain_find(
    mongo_db: AsyncDatabase[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    query: dict[str, Any],
    batch_size: int,
    limit: int,
    skip: int,
) -> None:
    coll = await _seeded(mongo_db)
    cut: list[bool] = []
    real_cut = raw_batches.cut_batch

    def counted(payload: bytes) -> Any:
        found = real_cut(payload)
        cut.append(found is not None)
        return found

    monkeypatch.setattr(raw_batches, "cut_batch", counted)

    plain = coll.find(query, {"_id": 0}).sort([("n", -1)]).skip(skip).limit(limit)
    rows = RowsCursor(coll, query, {"_id": 0}).sort([("n", -1)]).skip(skip).limit(limit)
    if batch_size:
        plain, rows = plain.batch_size(batch_size), rows.batch_size(batch_size)
    expected = [bytes(doc.raw) for doc in await plain.to_list()]
    assert await rows.to_list() == expected
    assert cut, "RowsCursor's hook was never called: PyMongo's cursor changed"
    assert all(cut), "a reply of the real server took PyMongo's slow path"


async def test_a_failing_query_fails_as_pymongos(mongo_db: AsyncDatabase[dict[str, Any]]) -> None:
    coll = await _seeded(mongo_db)
    with pytest.raises(OperationFailure):
        await coll.find({"$bogus": 1}).to_list()
    with pytest.raises(OperationFailure):
        await RowsCursor(coll, {"$bogus": 1}).to_list()


async def test_the_slow_path_gives_the_same_rows(
    mongo_db: AsyncDatabase[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply the walk refuses takes PyMongo's unpacking: the same rows, cut from its stream."""
    coll = await _seeded(mongo_db)
    expected = [
        bytes(doc.raw) for doc in await coll.find({}, {"_id": 0}).sort("n", 1).batch_size(30).to_list()
    ]
    monkeypatch.setattr(raw_batches, "cut_batch", lambda payload: None)
    assert await RowsCursor(coll, {}, {"_id": 0}).sort("n", 1).batch_size(30).to_list() == expected
