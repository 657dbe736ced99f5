"""`storage.update_command.update_statements` against the driver's `bulk_write`, on the real server.

The same statements go through both into two fresh collections of one database: the rows written, the
result (`bulk_api_result`) and the `BulkWriteError`'s details (codes, indexes, the failed statement) must be
the same. A bulk too large for one command is shown to be refused as one command, then written by the
fallback.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DocumentTooLarge

from storage.update_command import LEAN_BYTES, LEAN_STATEMENTS, Statement, as_operation, update_statements
from tests import infra

Db = AsyncDatabase[dict[str, Any]]
AT = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def _upsert(key: str, text: str, *, by: str = "_id") -> Statement:
    return {
        "q": {by: key},
        "u": {"$set": {"id": key, "content": text}, "$setOnInsert": {"createdAt": AT}},
        "upsert": True,
    }


async def _pair(db: Db) -> tuple[Any, Any]:
    """Two collections alike: a unique `id` index (as `mastra_messages` has)."""
    lean, driver = db[infra.unique_name("lean_")], db[infra.unique_name("driver_")]
    for collection in (lean, driver):
        await collection.create_index([("id", ASCENDING)], unique=True)
    return lean, driver


async def _outcome(collection: Any, statements: list[Statement], *, lean: bool, ordered: bool) -> Any:
    """The result's counts and upserted indexes, or the error's details (without `op`'s identity)."""
    try:
        if lean:
            result = await update_statements(collection, statements, ordered=ordered)
        else:
            result = await collection.bulk_write([as_operation(s) for s in statements], ordered=ordered)
    except BulkWriteError as exc:
        details = exc.details
        return (
            "error",
            [(e["index"], e["code"], e["op"]["q"]) for e in details["writeErrors"]],
            sorted(u["index"] for u in details["upserted"]),
            details["nUpserted"],
            details["nMatched"],
        )
    api = result.bulk_api_result
    return (
        "ok",
        sorted(result.upserted_ids or {}),
        api["nUpserted"],
        api["nMatched"],
        api["nModified"],
        result.acknowledged,
    )


def _commands_of(collection: Any) -> list[dict[str, Any]]:
    """The commands sent through the collection's database from now on (a spy on `command`)."""
    seen: list[dict[str, Any]] = []
    original = collection.database.command

    async def command(spec: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(spec)
        return await original(spec, *args, **kwargs)

    collection.database.command = command
    return seen


async def _rows(collection: Any) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in doc.items() if k != "_id" or isinstance(v, str)}
        for doc in await collection.find({}, sort=[("id", ASCENDING)]).to_list()
    ]


async def test_new_rows_updates_and_no_ops_are_reported_alike(mongo_db: Db) -> None:
    lean, driver = await _pair(mongo_db)
    statements = [_upsert(f"m{n}", "x" * n) for n in range(5)]
    for collection, is_lean in ((lean, True), (driver, False)):
        first = await _outcome(collection, statements, lean=is_lean, ordered=False)
        assert first == ("ok", [0, 1, 2, 3, 4], 5, 0, 0, True)
    again = [*statements[:2], _upsert("m2", "changed"), _upsert("m9", "new")]
    assert await _outcome(lean, again, lean=True, ordered=False) == await _outcome(
        driver, again, lean=False, ordered=False
    )
    assert await _rows(lean) == await _rows(driver)


@pytest.mark.parametrize("ordered", [False, True])
async def test_a_unique_index_collision_is_the_same_bulk_write_error(mongo_db: Db, ordered: bool) -> None:
    """A row keyed by another `_id` (Mastra's ObjectId rows) makes the `_id`-keyed upsert collide with the
    unique `id` index: the same codes, indexes and failed statements; ordered stops there, unordered goes
    on."""
    lean, driver = await _pair(mongo_db)
    for collection in (lean, driver):
        await collection.insert_one({"id": "taken", "content": "Mastra's"})
    statements = [_upsert("a", "1"), _upsert("taken", "2"), _upsert("b", "3")]
    got = await _outcome(lean, statements, lean=True, ordered=ordered)
    assert got[0] == "error"
    assert got == await _outcome(driver, statements, lean=False, ordered=ordered)
    assert got[1][0][:2] == (1, 11000)
    assert await _rows(lean) == await _rows(driver)


async def test_a_bulk_too_large_for_one_command_is_written_by_the_drivers_bulk(mongo_db: Db) -> None:
    """Two 9 MB statements: as one command the driver refuses them before sending (`DocumentTooLarge`);
    `update_statements` then hands them to `bulk_write`, which splits them. Both rows are written."""
    lean, _ = await _pair(mongo_db)
    big = [_upsert("big-1", "a" * 9_000_000), _upsert("big-2", "b" * 9_000_000)]
    with pytest.raises(DocumentTooLarge):
        await mongo_db.command({"update": lean.name, "updates": big, "ordered": False})
    # the caller's estimate says small (as multi-byte text would): the refusal still routes it right
    result = await update_statements(lean, big, ordered=False, approx_bytes=0)
    assert sorted(result.upserted_ids or {}) == [0, 1]
    assert await lean.count_documents({}) == 2


async def test_a_bulk_the_caller_calls_large_goes_to_the_drivers_bulk_at_once(mongo_db: Db) -> None:
    lean, _ = await _pair(mongo_db)
    seen = _commands_of(lean)
    small = [_upsert("s", "x")]
    await update_statements(lean, small, ordered=False, approx_bytes=LEAN_BYTES + 1)
    assert seen == []  # not offered as one command
    await update_statements(lean, small, ordered=False, approx_bytes=LEAN_BYTES)
    assert len(seen) == 1


async def test_more_statements_than_one_command_takes_go_to_the_drivers_bulk(mongo_db: Db) -> None:
    """A batch of many tiny messages: over `LEAN_STATEMENTS` the driver's bulk writes them (it splits by the
    server's `maxWriteBatchSize`). MongoDB refuses a command of more than that whole ("Write batch sizes must
    be between 1 and 100000"), so without the guard such a batch would fail on every retry. SecantusDB 0.5
    takes one (tried by hand), so the refusal cannot be shown here: only the routing is."""
    lean, _ = await _pair(mongo_db)
    hello = await mongo_db.client.admin.command("hello")
    assert int(hello.get("maxWriteBatchSize", 100_000)) >= LEAN_STATEMENTS  # below what the server takes
    seen = _commands_of(lean)
    many = [_upsert(f"k{n}", "") for n in range(LEAN_STATEMENTS + 1)]
    result = await update_statements(lean, many, ordered=False)
    assert seen == []
    assert len(result.upserted_ids or {}) == LEAN_STATEMENTS + 1
    await update_statements(lean, many[:LEAN_STATEMENTS], ordered=False)
    assert len(seen) == 1


async def test_no_statements_is_refused(mongo_db: Db) -> None:
    lean, _ = await _pair(mongo_db)
    with pytest.raises(ValueError, match="no update statements"):
        await update_statements(lean, [], ordered=False)


_KEYS = st.sampled_from(["a", "b", "c", "taken"])
_STATEMENTS = st.lists(
    st.tuples(_KEYS, st.text(max_size=5), st.sampled_from(["_id", "id"]), st.booleans()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_STATEMENTS, ordered=st.booleans())
async def test_random_bulks_end_alike(
    mongo_db: Db, drawn: list[tuple[str, str, str, bool]], ordered: bool
) -> None:
    """Random upserts and updates, by `_id` or by `id`, over a row Mastra inserted: the same outcome and
    rows."""
    lean, driver = await _pair(mongo_db)
    for collection in (lean, driver):
        await collection.insert_one({"id": "taken", "content": "Mastra's"})
    statements = [{**_upsert(key, text, by=by), "upsert": upsert} for key, text, by, upsert in drawn]
    got = await _outcome(lean, statements, lean=True, ordered=ordered)
    assert got == await _outcome(driver, statements, lean=False, ordered=ordered)
    assert await _rows(lean) == await _rows(driver)
    await lean.drop()
    await driver.drop()
