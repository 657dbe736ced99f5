"""Forgetting one thread of a resource with resource-scoped Observational Memory, on the real MongoDB-wire
server (`storage/observational_forget.py`, through `MongoForgetting.forget_thread`): the thread's sections,
observed ids and cursor leave the `resource:<id>` row (and Mastra's buffered fields), the count is counted
again, an observation in flight is answered stale, a racing apply never brings the thread back, and a log
whose thread part cannot be separated (reflected, malformed, unreadable) is cleared with the other threads'
cursors, so they are observed again from scratch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

import storage.observational_forget as om_forget
from message_history import metrics
from message_history.core.observation_forget import thread_open_tag
from message_history.core.observation_resource import ThreadObservations, merge_thread_observations
from message_history.core.om_tokens import count_observations
from schemas.messages import Message
from storage.forgetting import MongoForgetting
from storage.mongodb import MongoHistoryStorage
from storage.observational import Claim, MongoObservationalStore, ObservationUpdate
from storage.observational_rows import OBSERVATIONAL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
ODD = 'a"<x>'  # a thread id with a quote and angle brackets: matched verbatim
KEY = "resource:r1"


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


async def _save(storage: MongoHistoryStorage, thread: str, *minutes: int) -> None:
    messages = [
        Message.model_validate(
            {
                "id": f"{thread}-{m}",
                "role": "user",
                "createdAt": _iso(_at(m)),
                "threadId": thread,
                "resourceId": "r1",
                "content": {"format": 2, "parts": [{"type": "text", "text": f"message {m}"}]},
            }
        )
        for m in minutes
    ]
    await storage.save_messages(thread_id=thread, resource_id="r1", messages=messages)


async def _observe(
    store: MongoObservationalStore, threads: dict[str, list[int]], *, apply: bool = True
) -> tuple[Claim, ObservationUpdate, list[tuple[str, datetime, dict[str, str]]]]:
    """One resource cycle as the observed path applies it: claim, merge, apply, cursors."""
    row = await store.get(None, "r1")
    assert row is not None
    claim = await store.claim(row, "observe", _at(30))
    assert claim is not None
    parts = [
        ThreadObservations(t, f"Date: Jan 1, 2025\n* {t} said {minutes}", _at(max(minutes)))
        for t, minutes in threads.items()
    ]
    log = merge_thread_observations(row.active_observations, parts)
    ids = [*row.observed_message_ids, *(f"{t}-{m}" for t, minutes in threads.items() for m in minutes)]
    update = ObservationUpdate(log, count_observations(log), max(p.last_observed_at for p in parts), ids)
    cursors = [(p.thread_id, p.last_observed_at, {"currentTask": f"{p.thread_id}'s task"}) for p in parts]
    if apply:
        assert await store.apply_observation(claim, update, _at(30))
        await store.write_cursors("r1", cursors, _at(30))
    return claim, update, cursors


async def _fixture(db: Db) -> MongoObservationalStore:
    storage = MongoHistoryStorage(db)
    await _save(storage, ODD, 1, 3)
    await _save(storage, "b", 2, 4)
    store = MongoObservationalStore(db)
    await store.ensure_indexes()
    await store.initialize(scope="resource", thread_id=None, resource_id="r1", config={}, now=T0)
    await _observe(store, {ODD: [1, 3], "b": [2, 4]})
    return store


async def _row(db: Db) -> dict[str, Any]:
    row = await db[OBSERVATIONAL].find_one({"lookupKey": KEY}, sort=[("generationCount", -1)])
    assert row is not None
    return row


async def _thread(db: Db, thread: str) -> dict[str, Any] | None:
    return await db["mastra_threads"].find_one({"id": thread})


async def test_forgetting_a_thread_erases_its_part_of_the_resource_log(mongo_db: Db) -> None:
    await _fixture(mongo_db)
    before = await _row(mongo_db)
    assert thread_open_tag(ODD) in before["activeObservations"]
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    row = await _row(mongo_db)
    log = row["activeObservations"]
    assert thread_open_tag(ODD) not in log
    assert "said [1, 3]" not in log
    assert log == '<thread id="b">\nDate: Jan 1, 2025\n* b said [2, 4]\n</thread>'
    assert row["observedMessageIds"] == ["b-2", "b-4"]
    assert row["observationTokenCount"] == count_observations(log)
    assert row["lastObservedAt"].replace(tzinfo=UTC) == _at(4)  # b's cursor: the forgotten one's was 3
    assert row["_mh_cycle"] == before["_mh_cycle"] + 1
    assert await _thread(mongo_db, ODD) is None  # the cursor went with the thread
    other = await _thread(mongo_db, "b")
    assert other is not None
    assert other["metadata"]["mastra"]["om"]["lastObservedAt"] == _iso(_at(4))  # untouched


async def test_the_newest_thread_forgotten_moves_the_rows_time_back(mongo_db: Db) -> None:
    await _fixture(mongo_db)
    await MongoForgetting(mongo_db).forget_thread("b", resource_id="r1")
    row = await _row(mongo_db)
    assert row["lastObservedAt"].replace(tzinfo=UTC) == _at(3)
    assert thread_open_tag("b") not in row["activeObservations"]
    assert row["observedMessageIds"] == [f"{ODD}-1", f"{ODD}-3"]


async def test_an_observation_in_flight_is_answered_stale(mongo_db: Db) -> None:
    """The guard: the forget bumps the row's claim cycle; without it the late answer, whose work held the
    forgotten thread's messages, is applied and its section is back in the log."""
    store = await _fixture(mongo_db)
    storage = MongoHistoryStorage(mongo_db)
    await _save(storage, ODD, 5)
    await _save(storage, "b", 6)
    claim, update, _ = await _observe(store, {ODD: [5], "b": [6]}, apply=False)  # in flight
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    assert not await store.apply_observation(claim, update, _at(40))  # the late answer: stale
    row = await _row(mongo_db)
    assert thread_open_tag(ODD) not in row["activeObservations"]
    assert row["isObserving"] is False
    assert not any(i.startswith(ODD) for i in row["observedMessageIds"])
    # the next claim starts afresh and applies
    await _observe(store, {"b": [6]})
    assert "b said [6]" in (await _row(mongo_db))["activeObservations"]


async def test_a_late_answer_stays_stale_when_a_mastra_app_sets_the_flag_again(mongo_db: Db) -> None:
    """The cycle bump: clearing the flag alone is not enough, a Mastra app on the same database sets
    `isObserving` again with its own write (no claim cycle); without the bump the late answer matches."""
    store = await _fixture(mongo_db)
    storage = MongoHistoryStorage(mongo_db)
    await _save(storage, ODD, 5)
    claim, update, _ = await _observe(store, {ODD: [5]}, apply=False)
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    await mongo_db[OBSERVATIONAL].update_one({"lookupKey": KEY}, {"$set": {"isObserving": True}})
    assert not await store.apply_observation(claim, update, _at(40))
    assert thread_open_tag(ODD) not in (await _row(mongo_db))["activeObservations"]


async def test_a_reflection_in_flight_is_answered_stale(mongo_db: Db) -> None:
    """A reflection claimed before the forget read the log with the thread's section: its answer starts no
    next generation (the claim cleared, the cycle bumped)."""
    store = await _fixture(mongo_db)
    row = await store.get(None, "r1")
    assert row is not None
    claim = await store.claim(row, "reflect", _at(31))
    assert claim is not None
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    reflection = "* everyone, condensed, the forgotten one too"
    assert await store.apply_reflection(claim, reflection=reflection, token_count=9, now=_at(40)) is None
    assert await mongo_db[OBSERVATIONAL].count_documents({"lookupKey": KEY}) == 1
    assert (await _row(mongo_db))["isReflecting"] is False


async def test_an_apply_racing_the_forget_never_brings_the_thread_back(
    mongo_db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An observation applied between the forget's read and its write: the conditional write matches
    nothing, the row is read again, and both the thread's new section goes and the other thread's new
    observations stay (an unconditional write would drop them, and could keep a section read too late)."""
    store = await _fixture(mongo_db)
    storage = MongoHistoryStorage(mongo_db)
    await _save(storage, ODD, 5)
    await _save(storage, "b", 6)
    claim, update, cursors = await _observe(store, {ODD: [5], "b": [6]}, apply=False)
    real = om_forget._missing
    raced: list[int] = []

    async def racing(db: Any, ids: list[Any]) -> frozenset[str]:
        found = await real(db, ids)
        if not raced:  # after the forget read the row, before it writes
            raced.append(1)
            assert await store.apply_observation(claim, update, _at(40))
            await store.write_cursors("r1", cursors, _at(40))
        return found

    monkeypatch.setattr(om_forget, "_missing", racing)
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    row = await _row(mongo_db)
    assert raced
    assert thread_open_tag(ODD) not in row["activeObservations"]
    assert "b said [6]" in row["activeObservations"]
    assert row["observedMessageIds"] == ["b-2", "b-4", "b-6"]
    assert row["observationTokenCount"] == count_observations(row["activeObservations"])


async def _cleared(db: Db) -> None:
    """The resource's log gone and every thread of it to be observed again from scratch."""
    assert await db[OBSERVATIONAL].count_documents({"lookupKey": KEY}) == 0
    other = await _thread(db, "b")
    assert other is not None
    assert "om" not in other["metadata"].get("mastra", {})
    cursors = await MongoObservationalStore(db).resource_cursors("r1", 100)
    assert cursors == {"b": None}


async def test_a_reflected_log_is_cleared_and_the_others_observed_again(mongo_db: Db) -> None:
    store = await _fixture(mongo_db)
    row = await store.get(None, "r1")
    assert row is not None
    claim = await store.claim(row, "reflect", _at(31))
    assert claim is not None
    reflection = "* a user with a quote and a b talked"  # merged: no section to take out
    assert await store.apply_reflection(claim, reflection=reflection, token_count=9, now=_at(31))
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    await _cleared(mongo_db)


async def test_a_thread_observed_only_after_the_reflection_is_separable(mongo_db: Db) -> None:
    storage = MongoHistoryStorage(mongo_db)
    await _save(storage, "b", 2, 4)
    await _save(storage, "c", 50)
    store = MongoObservationalStore(mongo_db)
    await store.ensure_indexes()
    await store.initialize(scope="resource", thread_id=None, resource_id="r1", config={}, now=T0)
    await _observe(store, {"b": [2, 4]})
    row = await store.get(None, "r1")
    assert row is not None
    claim = await store.claim(row, "reflect", _at(31))
    assert claim is not None
    await store.apply_reflection(claim, reflection="* b talked", token_count=3, now=_at(31))
    await _observe(store, {"c": [50]})
    await MongoForgetting(mongo_db).forget_thread("c", resource_id="r1")
    row_after = await _row(mongo_db)
    assert row_after["generationCount"] == 1
    assert row_after["activeObservations"] == "* b talked"


@pytest.mark.parametrize(
    "log",
    [
        pytest.param(f'<thread id="{ODD}">\n* never closed', id="unclosed"),
        pytest.param("* rewritten by hand, no sections", id="no-section"),
    ],
)
async def test_a_log_whose_thread_part_cannot_be_told_apart_is_cleared(mongo_db: Db, log: str) -> None:
    await _fixture(mongo_db)
    await mongo_db[OBSERVATIONAL].update_one({"lookupKey": KEY}, {"$set": {"activeObservations": log}})
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    await _cleared(mongo_db)


def _unreadable() -> float:
    return sum(
        sample.value
        for family in metrics.UNREADABLE_ROWS.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("collection") == OBSERVATIONAL
    )


async def test_an_unreadable_row_is_counted_and_cleared_never_a_crash(mongo_db: Db) -> None:
    await _fixture(mongo_db)
    await mongo_db[OBSERVATIONAL].update_one({"lookupKey": KEY}, {"$set": {"observationTokenCount": "lots"}})
    before = _unreadable()
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    assert _unreadable() == before + 1
    await _cleared(mongo_db)


async def test_mastras_buffered_fields_lose_the_thread(mongo_db: Db) -> None:
    await _fixture(mongo_db)
    section = f'<thread id="{ODD}">\n* buffered\n</thread>'
    other = '<thread id="b">\n* b buffered\n</thread>'
    chunks = [
        {"id": "c1", "observations": section, "messageIds": [f"{ODD}-3"], "tokenCount": 5},
        {
            "id": "c2",
            "observations": f"{section}\n\n{other}",
            "messageIds": [f"{ODD}-3", "b-4"],
            "tokenCount": 9,
        },
        {"id": "c3", "observations": "* unattributed", "messageIds": [f"{ODD}-1"], "tokenCount": 3},
        {"id": "c4", "observations": other, "messageIds": ["b-4"], "tokenCount": 4},
    ]
    await mongo_db[OBSERVATIONAL].update_one(
        {"lookupKey": KEY},
        {
            "$set": {
                "activeObservationsPendingUpdate": f"{section}\n\n{other}",
                "bufferedObservationChunks": chunks,
                "bufferedReflection": "* everyone, condensed",
                "bufferedReflectionTokens": 4,
                "pendingMessageTokens": 120,
            }
        },
    )
    await MongoForgetting(mongo_db).forget_thread(ODD, resource_id="r1")
    row = await _row(mongo_db)
    assert row["activeObservationsPendingUpdate"] == other
    assert [c["id"] for c in row["bufferedObservationChunks"]] == ["c2", "c4"]
    assert row["bufferedObservationChunks"][0]["observations"] == other
    assert row["bufferedObservationChunks"][0]["messageIds"] == ["b-4"]
    assert row["bufferedObservationChunks"][0]["tokenCount"] == count_observations(other)
    assert row["bufferedReflection"] is None
    assert row["bufferedReflectionTokens"] is None
    assert row["pendingMessageTokens"] == 0
    assert ODD not in str(row)


async def test_forgetting_again_or_a_never_observed_thread_changes_nothing_else(mongo_db: Db) -> None:
    storage = MongoHistoryStorage(mongo_db)
    await _fixture(mongo_db)
    await _save(storage, "quiet", 9)  # never observed
    forgetting = MongoForgetting(mongo_db)
    await forgetting.forget_thread(ODD, resource_id="r1")
    once = await _row(mongo_db)
    await forgetting.forget_thread(ODD, resource_id="r1")
    await forgetting.forget_thread("quiet", resource_id="r1")
    again = await _row(mongo_db)
    assert again["activeObservations"] == once["activeObservations"]
    assert again["observedMessageIds"] == once["observedMessageIds"]
    assert again["_mh_cycle"] == once["_mh_cycle"]  # no claim in flight: no write
