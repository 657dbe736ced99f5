"""`bench/sqlite_id_index.py` on the local FerretDB: before it, SQLite scans for the `_id` filter FerretDB
pushes down; after it, SQLite searches an index, and FerretDB still reads and upserts the same documents."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient, UpdateOne

from bench import sqlite_id_index
from bench.procstat import find_servers
from tests import infra

pytestmark = [pytest.mark.integration]


@pytest_asyncio.fixture
async def database(mongo_uri: str) -> AsyncIterator[tuple[Any, Path]]:
    """A fresh database on a FerretDB/SQLite running on this machine (skipped on any other server)."""
    data_dir = sqlite_id_index.sqlite_dir(find_servers(urlsplit(mongo_uri).port).mongo)
    if data_dir is None:
        pytest.skip("needs FerretDB on SQLite running on this machine (the local stack)")
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    db = client[infra.unique_name("t_")]
    try:
        yield db, data_dir
    finally:
        await client.drop_database(db.name)
        await client.close()


def _plan(data_dir: Path, database: str) -> str:
    """SQLite's plan for the query FerretDB 1.24 issues for `{_id: <string>}` on the collection `m`."""
    with sqlite3.connect(data_dir / f"{database}.sqlite") as connection:
        query = "SELECT table_name FROM _ferretdb_collections WHERE name = 'm'"
        (table,) = connection.execute(query).fetchone()
        rows = connection.execute(
            f"EXPLAIN QUERY PLAN SELECT _ferretdb_sjson FROM \"{table}\" WHERE _ferretdb_sjson->'$._id' = ?",
            ('"a"',),
        ).fetchall()
    return " ".join(str(row[-1]) for row in rows)


async def test_the_index_turns_the_id_scan_into_a_search(database: tuple[Any, Path]) -> None:
    db, data_dir = database
    await db.m.insert_many([{"_id": f"m{n}", "n": n} for n in range(50)])
    await db.t.insert_one({"_id": "t0"})
    before = _plan(data_dir, db.name)

    tables = sqlite_id_index.add_id_indexes(data_dir, db.name)
    tables_again = sqlite_id_index.add_id_indexes(data_dir, db.name)  # idempotent

    after = _plan(data_dir, db.name)
    assert before.startswith("SCAN"), before
    assert after.startswith("SEARCH"), after
    assert "__id_pushdown" in after, after
    assert len(tables) == 2
    assert sorted(tables) == sorted(tables_again)
    # FerretDB goes on working on the same rows: a find by _id, an update, an upsert, a duplicate refused.
    assert await db.m.find_one({"_id": "m7"}) == {"_id": "m7", "n": 7}
    result = await db.m.bulk_write(
        [
            UpdateOne({"_id": "m7"}, {"$set": {"n": 70}}, upsert=True),
            UpdateOne({"_id": "new"}, {"$set": {"n": -1}}, upsert=True),
        ],
        ordered=False,
    )
    assert (result.modified_count, result.upserted_count) == (1, 1)
    assert await db.m.find_one({"_id": "m7"}) == {"_id": "m7", "n": 70}
    assert await db.m.count_documents({}) == 51
    with pytest.raises(Exception, match="duplicate key"):
        await db.m.insert_one({"_id": "new"})


def test_no_ferretdb_process_means_no_directory() -> None:
    assert sqlite_id_index.sqlite_dir(None) is None
    assert sqlite_id_index.sqlite_dir(2**22 + 12345) is None  # no such process
    assert sqlite_id_index.add_id_indexes(Path("/nonexistent"), "db") == []
