"""Busy-thread markers on the real MongoDB-wire server: forget removes them with the thread, prune removes the
ones that no longer matter, and neither takes away a marker a waiting request still needs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.turn_rules import marker_horizons
from message_history.errors import StorageUnavailableError
from storage import forgetting as forgetting_module
from storage.forgetting import MongoForgetting
from storage.pruning import MongoPruner
from storage.turn_expiry import _expire, _written_before, expire_markers
from storage.turns import TURNS, MongoTurnMarkers
from tests import infra

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NOW = datetime.now(UTC).replace(microsecond=0)
CUTOFF = NOW - timedelta(days=90)


@pytest_asyncio.fixture
async def db(mongo_uri: str) -> AsyncIterator[AsyncDatabase[dict[str, Any]]]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri, tz_aware=True)
    name = infra.unique_name("expiry_").replace("-", "_")
    try:
        yield client[name]
    finally:
        await client.drop_database(name)
        await client.close()


async def _threads(db: AsyncDatabase[dict[str, Any]], *ids: str, resource: str = "u") -> None:
    """Thread rows with a recent `updatedAt` (so prune keeps them)."""
    rows = [{"id": i, "resourceId": resource, "createdAt": NOW, "updatedAt": NOW} for i in ids]
    await db["mastra_threads"].insert_many(rows)


async def _markers(db: AsyncDatabase[dict[str, Any]]) -> set[str]:
    return {str(d["_id"]) for d in await db[TURNS].find({}, {"_id": 1}).to_list()}


def _marker(
    thread: str, *, pending: str | None, answered: list[str], at: datetime, answered_at: Any = None
) -> dict[str, Any]:
    return {
        "_id": thread,
        "pending": pending,
        "enrichedAt": at,
        "answered": answered,
        "answeredAt": at if answered_at is None else answered_at,
    }


async def test_forget_removes_the_markers_of_what_it_forgets(db: AsyncDatabase[dict[str, Any]]) -> None:
    """Forgetting a thread or a resource deletes those threads' markers (busy or not), no other."""
    markers = MongoTurnMarkers(db)
    try:
        await _threads(db, "t1", "t2", resource="alice")
        await _threads(db, "t3", resource="bob")
        for thread in ("t1", "t2", "t3", "unsaved"):
            await markers.mark(thread, f"{thread}-r1")
        await markers.answered({"t2": ["t2-r1"]})
        forgetting = MongoForgetting(db)

        await forgetting.forget_thread("t1", dry_run=True)
        assert await _markers(db) == {"t1", "t2", "t3", "unsaved"}  # a dry run deletes nothing
        await forgetting.forget_thread("t1")
        assert await _markers(db) == {"t2", "t3", "unsaved"}
        await forgetting.forget_thread("unsaved")  # a thread never saved has a marker all the same
        assert await _markers(db) == {"t2", "t3"}
        await forgetting.forget_resource("alice")
        assert await _markers(db) == {"t3"}
    finally:
        await markers.close()


async def test_forgetting_a_resource_removes_the_markers_of_its_threads_never_saved(
    db: AsyncDatabase[dict[str, Any]],
) -> None:
    """A thread whose turns were enriched but never saved (no `mastra_threads` row) is found through the
    resource its marker names; another resource's marker, and a marker written before markers named their
    resource, stay (the latter is left to prune, or `forget --thread`)."""
    markers = MongoTurnMarkers(db)
    try:
        await markers.mark("unsaved", "u-r1", resource_id="alice")
        await markers.mark("theirs", "b-r1", resource_id="bob")
        await db[TURNS].insert_one(_marker("legacy", pending="l-r1", answered=[], at=NOW))
        await MongoForgetting(db).forget_resource("alice")
        assert await _markers(db) == {"theirs", "legacy"}
    finally:
        await markers.close()


async def test_a_resource_forget_interrupted_before_its_threads_went_is_completed_by_a_second_run(
    db: AsyncDatabase[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The markers go before the thread rows: a forget stopped by an outage while deleting the markers still
    finds the thread ids on its second run (they were found from the thread rows, which are not gone yet), so
    the markers do not outlive the forget."""
    markers = MongoTurnMarkers(db)
    try:
        await _threads(db, "t1", "t2", resource="alice")
        for thread in ("t1", "t2"):
            await markers.mark(thread, f"{thread}-r1")
        forgetting = MongoForgetting(db)
        real = forgetting_module.delete_by_keys

        async def outage_at_markers(collection: Any, keys: Any, what: str) -> int:
            if what == "forget the threads' markers":
                raise StorageUnavailableError("MongoDB went away")
            return await real(collection, keys, what)

        monkeypatch.setattr(forgetting_module, "delete_by_keys", outage_at_markers)
        with pytest.raises(StorageUnavailableError):
            await forgetting.forget_resource("alice")
        monkeypatch.setattr(forgetting_module, "delete_by_keys", real)
        await forgetting.forget_resource("alice")
        assert await _markers(db) == set()
        assert await db["mastra_threads"].count_documents({}) == 0
    finally:
        await markers.close()


async def test_prune_removes_the_markers_that_no_longer_matter(db: AsyncDatabase[dict[str, Any]]) -> None:
    """Old markers go, busy or not; markers of gone threads go after the grace unless a turn is pending;
    the dry run counts what the run deletes; a second run deletes nothing."""
    day = timedelta(days=1)
    await _threads(db, "old-idle", "old-busy", "recent", "mixed")
    await db[TURNS].insert_many(
        [
            _marker("old-idle", pending=None, answered=["a"], at=CUTOFF - 10 * day),  # stale: goes
            _marker("old-busy", pending="b", answered=[], at=CUTOFF - 10 * day),  # stale: goes
            _marker("recent", pending=None, answered=["c"], at=NOW - 2 * day),  # thread kept: kept
            _marker("gone-idle", pending=None, answered=["d"], at=NOW - 2 * day),  # gone: goes
            _marker("gone-answered", pending="e", answered=["e"], at=NOW - 2 * day),  # gone, not busy: goes
            _marker("gone-busy", pending="f", answered=[], at=NOW - 2 * day),  # a pending turn: kept
            _marker("gone-fresh", pending=None, answered=["g"], at=NOW - timedelta(hours=1)),  # grace: kept
            _marker("first-turn", pending="h", answered=[], at=NOW - timedelta(minutes=1)),  # kept
            _marker(
                "mixed", pending=None, answered=["i"], at=CUTOFF - 10 * day, answered_at=NOW
            ),  # newest write
        ]
    )
    pruner = MongoPruner(db, batch_size=2, turn_timeout_s=60)
    _, _, would = await pruner.count(CUTOFF, now=NOW)
    assert await _markers(db) >= {"old-idle", "gone-idle"}  # counting deletes nothing

    progress = await pruner.prune(CUTOFF, now=NOW)
    assert progress.done
    assert await _markers(db) == {"recent", "gone-busy", "gone-fresh", "first-turn", "mixed"}
    assert progress.markers == would == 4
    again = await pruner.prune(CUTOFF, now=NOW)
    assert (again.done, again.markers) == (True, 0)


async def test_a_recent_cutoff_leaves_a_waited_on_marker_alone(db: AsyncDatabase[dict[str, Any]]) -> None:
    """`prune --before <now>` while a request waits on a first turn (no thread row yet): the marker stays and
    the wait ends on the answer; the same prune a grace later removes it, and the wait would end empty."""
    markers = MongoTurnMarkers(db, poll_s=0.02)
    try:
        await markers.mark("t", "r1")
        waiting = asyncio.create_task(markers.wait_answered("t", "r1", timeout_s=60))
        pruner = MongoPruner(db, turn_timeout_s=60)
        progress = await pruner.prune(datetime.now(UTC))
        assert progress.markers == 0
        assert await _markers(db) == {"t"}
        await markers.answered({"t": ["r1"]})
        after = await asyncio.wait_for(waiting, 30)
        assert after is not None  # released by the answer, not by the marker's removal
        assert after.pending is None

        # without the grace (as if a day had passed) the same markers go: a waiter would end empty-handed
        await markers.mark("t", "r2")
        waiting = asyncio.create_task(markers.wait_answered("t", "r2", timeout_s=60))
        later = await pruner.prune(datetime.now(UTC), now=datetime.now(UTC) + timedelta(days=2))
        assert later.markers == 1
        assert await asyncio.wait_for(waiting, 30) is None  # ends: history.complete false, as a timeout
    finally:
        await markers.close()


async def test_a_marker_written_between_the_read_and_the_delete_is_kept(
    db: AsyncDatabase[dict[str, Any]],
) -> None:
    """Prune reads a gone thread's old idle marker, a new turn marks the thread, then prune deletes: the
    delete's age condition no longer matches, so the new turn's marker stays."""
    await db[TURNS].insert_one(_marker("t", pending=None, answered=["old"], at=NOW - timedelta(days=2)))
    horizons = marker_horizons(CUTOFF, NOW, 60)
    chunk = await db[TURNS].find(_written_before(horizons.gone_before)).to_list()
    assert [d["_id"] for d in chunk] == ["t"]
    writer = MongoTurnMarkers(db)
    try:
        await writer.mark("t", "new")
    finally:
        await writer.close()
    assert await _expire(db, chunk, horizons, _written_before(horizons.gone_before), dry_run=False) == 0
    assert (await db[TURNS].find_one({"_id": "t"}) or {}).get("pending") == "new"
    # the guard is what kept it: the same chunk deleted without the age condition is gone
    assert await _expire(db, chunk, horizons, {}, dry_run=False) == 1


async def test_an_interrupted_marker_pass_resumes(db: AsyncDatabase[dict[str, Any]]) -> None:
    """A halt after the first batch leaves the rest; the next pass removes them."""
    old = CUTOFF - timedelta(days=1)
    await db[TURNS].insert_many([_marker(f"t{i}", pending=None, answered=[], at=old) for i in range(5)])
    horizons = marker_horizons(CUTOFF, NOW, 60)
    removed, done = await expire_markers(db, horizons, batch_size=2, halted=lambda: True)
    assert (removed, done) == (2, False)
    removed, done = await expire_markers(db, horizons, batch_size=2)
    assert (removed, done) == (3, True)
    assert await _markers(db) == set()
