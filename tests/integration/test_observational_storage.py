"""`storage/observational.py` on the real MongoDB-wire server (a fresh database per test).

* The documents are `@mastra/mongodb` 1.19's: `initializeObservationalMemory`'s fields and defaults,
  `updateActiveObservations`' changes, `createReflectionGeneration`'s new generation.
* Once in flight: a claim holds the row; a second claim waits; a claim older than the timeout (a crashed or
  slow observer, or a flag a Mastra app left set) is taken again. Results apply once: a late, repeated or
  superseded answer writes nothing.
* Forget erases every generation; rows of any shape are skipped and counted, never a crash.

"Later" is a `now` argument, never a wait: no test depends on time passing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidBSON
from pymongo.asynchronous.database import AsyncDatabase

from message_history import metrics
from message_history.errors import UnreadableRowError
from storage.observational import (
    CLAIM_TIMEOUT,
    OBSERVATIONAL,
    Claim,
    MongoObservationalStore,
    ObservationUpdate,
    lookup_key,
    record_from_doc,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
LATER = T0 + CLAIM_TIMEOUT + timedelta(seconds=1)
MASTRA_INITIAL_FIELDS = {
    "id", "lookupKey", "scope", "resourceId", "threadId", "activeObservations",
    "activeObservationsPendingUpdate", "originType", "config", "generationCount", "lastObservedAt",
    "lastReflectionAt", "pendingMessageTokens", "totalTokensObserved", "observationTokenCount", "isObserving",
    "isReflecting", "isBufferingObservation",
    "isBufferingReflection", "lastBufferedAtTokens", "lastBufferedAtTime", "observedTimezone", "createdAt",
    "updatedAt",
}  # fmt: skip


async def _store(db: Db) -> MongoObservationalStore:
    store = MongoObservationalStore(db)
    await store.ensure_indexes()
    return store


async def _apply(
    store: MongoObservationalStore, claim: Claim, text: str, tokens: int, ids: list[str], now: datetime = T0
) -> bool:
    return await store.apply_observation(claim, ObservationUpdate(text, tokens, T0, ids), now)


async def _raw(db: Db, key: str) -> list[dict[str, Any]]:
    return await db[OBSERVATIONAL].find({"lookupKey": key}, {"_id": 0}).sort("generationCount", 1).to_list()


async def test_initialize_writes_mastras_document(mongo_db: Db) -> None:
    """Generation 0 with exactly the fields `initializeObservationalMemory` writes; again: the same row."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t1", resource_id="r1", config={"a": 1}, now=T0)
    again = await store.initialize(
        scope="thread", thread_id="t1", resource_id="r1", config={"a": 2}, now=LATER
    )
    assert again.id == record.id
    [doc] = await _raw(mongo_db, "thread:t1")
    assert set(doc) == MASTRA_INITIAL_FIELDS
    assert doc["generationCount"] == 0
    assert doc["activeObservations"] == ""
    assert doc["originType"] == "initial"
    assert (doc["isObserving"], doc["isReflecting"], doc["config"]) == (False, False, {"a": 1})
    assert await store.get("t1", "r1") == record
    assert lookup_key(None, "r1") == "resource:r1"


async def test_one_claim_at_a_time_and_a_stale_one_is_taken_again(mongo_db: Db) -> None:
    """A live claim refuses a second; past the timeout the claim is taken again with a new cycle, and only
    the newest claim's result applies (the slow observer's late answer writes nothing)."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    first = await store.claim(record, "observe", T0)
    assert first is not None
    assert await store.claim(record, "observe", T0 + timedelta(seconds=30)) is None
    second = await store.claim(record, "observe", LATER)
    assert second is not None
    assert second.cycle == first.cycle + 1
    assert not await _apply(store, first, "late", 7, ["m1"], LATER)
    assert await _apply(store, second, "* obs", 7, ["m1"], LATER)
    got = await store.get("t", "r")
    assert got is not None
    assert (got.active_observations, got.is_observing, got.observation_token_count) == ("* obs", False, 7)
    assert got.observed_message_ids == ("m1",)
    assert got.last_observed_at == T0


async def test_a_result_applies_once(mongo_db: Db) -> None:
    """The same answer twice: the second matches nothing; `totalTokensObserved` grew once (`$inc`)."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    claim = await store.claim(record, "observe", T0)
    assert claim is not None
    assert await _apply(store, claim, "x", 5, [])
    assert not await _apply(store, claim, "x", 5, [])
    [doc] = await _raw(mongo_db, "thread:t")
    assert (doc["totalTokensObserved"], doc["pendingMessageTokens"], doc["isObserving"]) == (5, 0, False)


async def test_a_flag_a_mastra_app_left_set_holds_until_its_update_is_stale(mongo_db: Db) -> None:
    """A Mastra `setObservingFlag(true)` has no claim time: its `updatedAt` stands in for it."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    await mongo_db[OBSERVATIONAL].update_one(
        {"id": record.id}, {"$set": {"isObserving": True, "updatedAt": T0}}
    )
    assert await store.claim(record, "observe", T0 + timedelta(minutes=1)) is None
    assert await store.claim(record, "observe", LATER) is not None


async def test_release_frees_the_row(mongo_db: Db) -> None:
    """A claim given back clears the flag at once; the next claim need not wait for the timeout."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    claim = await store.claim(record, "observe", T0)
    assert claim is not None
    assert await store.release(claim, T0)
    assert await store.claim(record, "observe", T0) is not None


async def test_reflection_starts_the_next_generation_once(mongo_db: Db) -> None:
    """`createReflectionGeneration`: generation g + 1, `originType: reflection`, the totals carried; a second
    answer to the same claim inserts nothing."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={"k": 1}, now=T0)
    observe = await store.claim(record, "observe", T0)
    assert observe is not None
    await store.apply_observation(observe, ObservationUpdate("long log", 50, T0, ["m"]), T0)
    current = await store.get("t", "r")
    assert current is not None
    claim = await store.claim(current, "reflect", T0)
    assert claim is not None
    assert await store.claim(current, "reflect", T0) is None
    reflected = await store.apply_reflection(claim, reflection="short", token_count=3, now=LATER)
    assert reflected is not None
    assert await store.apply_reflection(claim, reflection="again", token_count=9, now=LATER) is None
    docs = await _raw(mongo_db, "thread:t")
    assert [d["generationCount"] for d in docs] == [0, 1]
    new = docs[1]
    assert (new["originType"], new["activeObservations"], new["observationTokenCount"]) == (
        "reflection",
        "short",
        3,
    )
    assert (new["totalTokensObserved"], new["config"], new["isReflecting"]) == (50, {"k": 1}, False)
    assert new["lastReflectionAt"] is not None
    assert docs[0]["isReflecting"] is False
    newest = await store.get("t", "r")
    assert newest is not None
    assert (newest.generation, newest.active_observations) == (1, "short")
    assert len(await store.history("t", "r")) == 2


async def test_claim_outcome_says_what_a_replay_waits_for(mongo_db: Db) -> None:
    """`held` while the claim (or its re-take after the timeout: the same work) holds; an observation
    `settled` once applied or released; a reflection `reflected` only once its next generation exists."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    first = await store.claim(record, "observe", T0)
    assert first is not None
    assert await store.claim_outcome(first) == "held"
    again = await store.claim(record, "observe", LATER)  # timed out, taken again (cycle + 1)
    assert again is not None
    assert await store.claim_outcome(first) == "held"  # its work re-sent: still to wait for
    assert await _apply(store, again, "x", 50, ["m"], LATER)
    assert await store.claim_outcome(first) == await store.claim_outcome(again) == "settled"

    current = await store.get("t", "r")
    assert current is not None
    reflect = await store.claim(current, "reflect", LATER)
    assert reflect is not None
    assert await store.claim_outcome(reflect) == "held"
    await mongo_db[OBSERVATIONAL].update_one({"id": reflect.record_id}, {"$set": {"isReflecting": False}})
    assert await store.claim_outcome(reflect) == "settled"  # settled, no next generation (yet)
    await mongo_db[OBSERVATIONAL].update_one({"id": reflect.record_id}, {"$set": {"isReflecting": True}})
    assert await store.apply_reflection(reflect, reflection="short", token_count=3, now=LATER) is not None
    assert await store.claim_outcome(reflect) == "reflected"
    assert await store.claim_outcome(Claim("gone", 0, 1, "observe")) == "settled"  # forgotten


async def test_claim_outcome_reads_a_hand_written_row_as_data_not_a_query(mongo_db: Db) -> None:
    """A row's `lookupKey` is looked up only when it is a string (an object there would be a query operator
    matching another thread's next generation), and a `true` cycle is no cycle."""
    store = await _store(mongo_db)
    record = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    other = await store.initialize(scope="thread", thread_id="o", resource_id="r", config={}, now=T0)
    reflect = await store.claim(record, "reflect", T0)
    assert reflect is not None
    # another thread's next generation: what an operator in t's lookupKey would find
    await mongo_db[OBSERVATIONAL].insert_one(
        {"id": "o-next", "lookupKey": other.lookup_key, "generationCount": reflect.generation + 1}
    )
    rows = mongo_db[OBSERVATIONAL]
    await rows.update_one(
        {"id": reflect.record_id}, {"$set": {"isReflecting": False, "lookupKey": {"$ne": None}}}
    )
    assert await store.claim_outcome(reflect) == "settled"  # not "reflected" through o's row
    await rows.update_one({"id": reflect.record_id}, {"$set": {"isReflecting": True, "_mh_cycle": True}})
    assert await store.claim_outcome(Claim(reflect.record_id, reflect.generation, 1, "reflect")) == "settled"


async def test_forget_erases_every_generation(mongo_db: Db) -> None:
    """`clearObservationalMemory` for a thread; forgetting a resource takes its row and its threads'."""
    store = await _store(mongo_db)
    for thread in ("a", "b"):
        await store.initialize(scope="thread", thread_id=thread, resource_id="r", config={}, now=T0)
    await store.initialize(scope="resource", thread_id=None, resource_id="r", config={}, now=T0)
    await store.initialize(scope="thread", thread_id="c", resource_id="other", config={}, now=T0)
    assert await store.clear("a", "r") == 1
    assert await store.get("a", "r") is None
    assert await store.clear_resource("r") == 2
    assert await mongo_db[OBSERVATIONAL].distinct("lookupKey") == ["thread:c"]


async def test_the_forget_commands_erase_observations(mongo_db: Db) -> None:
    """`message-history forget` (and the commands path) erase the thread's, then the resource's rows."""
    from storage.forgetting import MongoForgetting  # noqa: PLC0415

    store = await _store(mongo_db)
    for thread in ("a", "b"):
        await store.initialize(scope="thread", thread_id=thread, resource_id="r", config={}, now=T0)
    await store.initialize(scope="resource", thread_id=None, resource_id="r", config={}, now=T0)
    await store.initialize(scope="thread", thread_id="c", resource_id="other", config={}, now=T0)
    forgetting = MongoForgetting(mongo_db)
    await forgetting.forget_thread("a")
    assert sorted(await mongo_db[OBSERVATIONAL].distinct("lookupKey")) == [
        "resource:r",
        "thread:b",
        "thread:c",
    ]
    await forgetting.forget_resource("r")
    assert await mongo_db[OBSERVATIONAL].distinct("lookupKey") == ["thread:c"]


def _counted(reason: str) -> float:
    value: float = metrics.UNREADABLE_ROWS.labels(
        path="other", collection=OBSERVATIONAL, reason=reason
    )._value.get()
    return value


ODD_ROWS: list[dict[str, Any]] = [
    {"activeObservations": 42},
    {"generationCount": "two"},
    {"observedMessageIds": "m1"},
    {"id": None},
    {"lastObservedAt": "yesterday"},
    {"observationTokenCount": float("nan")},
    {"generationCount": 1.5},  # a fraction in a key: truncated, no conditional write would ever match it
    {"_mh_cycle": 2.5},
]


@pytest.mark.parametrize("odd", ODD_ROWS, ids=lambda d: next(iter(d)))
async def test_unreadable_rows_are_skipped_and_counted(mongo_db: Db, odd: dict[str, Any]) -> None:
    """A newer generation no Mastra would read: skipped and counted, the readable one below it returned.
    Without the guard the row itself is refused (`record_from_doc` raises): the read would fail."""
    store = await _store(mongo_db)
    good = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    row = {
        "id": "odd",
        "lookupKey": "thread:t",
        "threadId": "t",
        "resourceId": "r",
        "generationCount": 5,
        **odd,
    }
    await mongo_db[OBSERVATIONAL].insert_one(dict(row))
    with pytest.raises(UnreadableRowError):
        record_from_doc(row)
    before = _counted("om")
    got = await store.get("t", "r")
    assert got is not None
    assert got.id == good.id
    assert _counted("om") == before + 1
    assert [r.id for r in await store.history("t", "r")] == [good.id]


async def test_undecodable_rows_are_skipped_and_counted(mongo_db: Db) -> None:
    """A date Python cannot hold (year 20000): the driver would fail the whole reply; read row by row, only
    that row is skipped."""
    store = await _store(mongo_db)
    good = await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)
    far = DatetimeMS(568_971_820_800_000)
    await mongo_db[OBSERVATIONAL].insert_one(
        {"id": "far", "lookupKey": "thread:t", "generationCount": 3, "updatedAt": far}
    )
    with pytest.raises(InvalidBSON):
        await mongo_db[OBSERVATIONAL].find({"lookupKey": "thread:t"}).to_list()
    before = _counted("createdAt")
    got = await store.get("t", "r")
    assert got is not None
    assert got.id == good.id
    assert _counted("createdAt") == before + 1


async def test_writes_meeting_an_undecodable_row_refuse_that_row(mongo_db: Db) -> None:
    """The rows a write returns are decoded alone too: one with a date Python cannot hold is that row's
    `UnreadableRowError` (a dead letter), never the driver's `InvalidBSON`, which `storage_errors` turns into
    a fatal storage error for the whole service."""
    store = await _store(mongo_db)
    far = DatetimeMS(568_971_820_800_000)
    await mongo_db[OBSERVATIONAL].insert_one(
        {"id": "far", "lookupKey": "thread:t", "generationCount": 0, "lastReflectionAt": far}
    )
    with pytest.raises(UnreadableRowError):
        await store.initialize(scope="thread", thread_id="t", resource_id="r", config={}, now=T0)

    record = await store.initialize(scope="thread", thread_id="u", resource_id="r", config={}, now=T0)
    claim = await store.claim(record, "reflect", T0)
    assert claim is not None
    await mongo_db[OBSERVATIONAL].update_one({"id": record.id}, {"$set": {"metadata": {"at": far}}})
    with pytest.raises(UnreadableRowError):
        await store.apply_reflection(claim, reflection="short", token_count=3, now=T0)
    assert await mongo_db[OBSERVATIONAL].count_documents({"lookupKey": "thread:u"}) == 1
