"""`message_history_turns` on the real MongoDB-wire server: marks, answers in either order, waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient

from message_history.core.turn_rules import busy_decision, is_busy
from storage.turns import TURNS, MongoTurnMarkers
from tests import infra

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


M = TypeVar("M", bound=MongoTurnMarkers)


@contextlib.asynccontextmanager
async def fresh_markers(mongo_uri: str, kind: type[M]) -> AsyncIterator[M]:
    """`kind` of markers on a database of its own (polling every 20 ms), dropped afterwards."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri, tz_aware=True)
    name = infra.unique_name("turns_").replace("-", "_")
    store = kind(client[name], poll_s=0.02)
    try:
        yield store
    finally:
        await store.close()
        await client.drop_database(name)
        await client.close()


@pytest_asyncio.fixture(params=["pipeline", "plain"])
async def markers(mongo_uri: str, request: pytest.FixtureRequest) -> AsyncIterator[MongoTurnMarkers]:
    """Markers on a fresh database, with pipeline updates or the plain two-update form."""
    async with fresh_markers(mongo_uri, MongoTurnMarkers) as store:
        store._pipelines = request.param == "pipeline"
        yield store


async def test_an_answer_clears_its_pending_turn(markers: MongoTurnMarkers) -> None:
    """Mark r1, answer r1: the thread is idle and remembers r1 as answered."""
    await markers.mark("t", "r1")
    assert is_busy((await markers.get_many(["t"]))["t"])
    await markers.answered({"t": ["r1"]})
    marker = (await markers.get_many(["t"]))["t"]
    assert marker.pending is None
    assert marker.answered == ("r1",)


async def test_an_answer_that_lands_before_its_mark_leaves_the_thread_idle(markers: MongoTurnMarkers) -> None:
    """The worker answered before the mark was written: the late mark does not make the thread busy."""
    await markers.answered({"t": ["r1"]})
    await markers.mark("t", "r1")
    marker = (await markers.get_many(["t"]))["t"]
    assert marker.pending == "r1"
    assert busy_decision(marker, "r2", "enqueue") == "go"


async def test_an_older_answer_does_not_clear_a_newer_pending_turn(markers: MongoTurnMarkers) -> None:
    """r2 went out after a timeout on r1; r1's late answer leaves r2 pending."""
    await markers.mark("t", "r2")
    await markers.answered({"t": ["r1"]})
    marker = (await markers.get_many(["t"]))["t"]
    assert marker.pending == "r2"
    assert busy_decision(marker, "r3", "enqueue") == "wait"


async def test_a_wait_ends_at_the_answer_or_at_the_timeout(markers: MongoTurnMarkers) -> None:
    """`wait_answered` returns the marker once the turn is answered, None when the time runs out."""
    await markers.mark("a", "a1")
    await markers.mark("b", "b1")
    waiting = asyncio.ensure_future(markers.wait_answered("a", "a1", timeout_s=10))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await markers.answered({"a": ["a1"]})
    after = await waiting
    assert after is not None
    assert after.pending is None
    assert await markers.wait_answered("b", "b1", timeout_s=0.2) is None


async def test_concurrent_marks_share_one_write_and_live_beside_mastras_collections(
    markers: MongoTurnMarkers,
) -> None:
    """Marks submitted together go out as one bulk write, into a collection Mastra does not have."""
    before = markers._marks.flushes
    await asyncio.gather(*(markers.mark(f"t{i}", f"r{i}") for i in range(20)))
    assert markers._marks.flushes == before + 1
    assert len(await markers.get_many([f"t{i}" for i in range(20)])) == 20
    names = await markers.collection.database.list_collection_names()
    assert names == [TURNS]


async def test_an_answer_for_a_forgotten_thread_never_creates_its_marker(markers: MongoTurnMarkers) -> None:
    """`existing_only` (threads forgotten meanwhile): a marker still there is cleared, none is created, and
    the other threads of the same write keep their upsert."""
    await markers.mark("kept", "k1")
    await markers.answered({"gone": ["g1"], "kept": ["k1"], "new": ["n1"]}, existing_only={"gone", "kept"})
    found = await markers.get_many(["gone", "kept", "new"])
    assert sorted(found) == ["kept", "new"]
    assert (found["kept"].pending, found["kept"].answered) == (None, ("k1",))
    assert found["new"].answered == ("n1",)
