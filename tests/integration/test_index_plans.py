"""Index proof: the queries the storage really sends are index scans on whatever server `MONGODB_URI` names.

Each test runs a storage call, captures the exact `find` / `update` commands PyMongo sent (command monitoring)
and asks the server to `explain` them with `executionStats`. It asserts:

* the plan reads an index (no `COLLSCAN`), the one recall is meant to use;
* the order comes from the index: no blocking `SORT` stage (a `SORT_MERGE` of index scans is fine);
* the keys and documents examined stay close to what is returned, on a collection where a scan would read
  thousands of rows more.

Run it against your own MongoDB or Atlas cluster, with any user that may create and drop a database:

    MONGODB_URI='mongodb+srv://user:pass@cluster.example.net/' .venv/bin/python -m pytest \
        tests/integration/test_index_plans.py -p no:cacheprovider

It creates a fresh database `t_<hex>`, seeds about 12,000 messages, and drops it at the end.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from bson import ObjectId
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.observation_resource import unobserved_by_thread
from schemas.messages import Message
from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from storage.observational import OBSERVATIONAL, MongoObservationalStore
from storage.protocol import RecallQuery, SaveTurn
from tests import infra

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 1, 1, tzinfo=UTC)
THREADS_SEEDED = 200
PER_THREAD = 60  # 12,000 messages: a scan examines that many, an index walk about what it returns
RECALL_LIMIT = 40
# Keys the server may examine beyond what it returns: bounds checks and the next key past a range.
SLACK = 3
_CAPTURED = frozenset({"find", "update"})
_SESSION_FIELDS = ("lsid", "$db", "$clusterTime", "txnNumber", "$readPreference", "autocommit")


@dataclass
class Captured(monitoring.CommandListener):
    """Every `find` and `update` command the client sent, as sent."""

    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in _CAPTURED:
            self.commands.append((event.command_name, copy.deepcopy(dict(event.command))))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        return None

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        return None

    def take(self, name: str) -> list[dict[str, Any]]:
        taken = [command for kind, command in self.commands if kind == name]
        self.commands.clear()
        return taken


@dataclass(frozen=True)
class Plan:
    """What `explain` said about one command."""

    stages: list[dict[str, Any]]  # winning plan, outermost first
    keys_examined: int
    docs_examined: int
    returned: int

    @property
    def names(self) -> list[str]:
        return [str(stage.get("stage", "")).upper() for stage in self.stages]

    def index_names(self) -> set[str]:
        return {str(stage["indexName"]) for stage in self.stages if "indexName" in stage}

    def describe(self) -> str:
        return (
            f"stages {self.names}, indexes {sorted(self.index_names())}, keys examined {self.keys_examined}, "
            f"docs examined {self.docs_examined}, returned {self.returned}"
        )


def _walk(stage: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield stage
    if isinstance(stage.get("inputStage"), dict):
        yield from _walk(stage["inputStage"])
    for child in stage.get("inputStages", ()) or ():
        yield from _walk(child)


async def explain(db: Db, command: dict[str, Any]) -> Plan:
    body = {key: value for key, value in command.items() if key not in _SESSION_FIELDS}
    reply = await db.command({"explain": body, "verbosity": "executionStats"})
    winning = reply["queryPlanner"]["winningPlan"]
    winning = winning.get("queryPlan", winning)  # the slot-based engine nests the plan one level down
    stats = reply.get("executionStats", {})
    return Plan(
        stages=list(_walk(winning)),
        keys_examined=int(stats.get("totalKeysExamined", 0)),
        docs_examined=int(stats.get("totalDocsExamined", 0)),
        returned=int(stats.get("nReturned", 0)),
    )


def assert_index_walk(plan: Plan, *, index: str | None, returned: int) -> None:
    """An index read (the given one when named), ordered by the index, examining about what it returns."""
    names = plan.names
    assert "COLLSCAN" not in names, f"collection scan: {plan.describe()}"
    assert "SORT" not in names, f"blocking sort (the index does not give the order): {plan.describe()}"
    index_reads = [n for n in names if "IXSCAN" in n or n == "IDHACK" or n.startswith("EXPRESS")]
    assert index_reads, f"no index scan: {plan.describe()}"
    if index is not None and plan.index_names():
        assert index in plan.index_names(), f"expected index {index!r}: {plan.describe()}"
    assert plan.returned == returned, plan.describe()
    # A merge of index scans reads one key ahead in each scan it merges.
    ahead = SLACK + len(index_reads)
    assert plan.keys_examined <= returned + ahead, f"examined too many keys: {plan.describe()}"
    assert plan.docs_examined <= returned + SLACK, f"examined too many documents: {plan.describe()}"


def message(thread: int, index: int) -> Message:
    return Message.model_validate(
        {
            "id": f"t{thread:03}-m{index:03}",
            "role": "user" if index % 2 == 0 else "assistant",
            "createdAt": T0 + timedelta(seconds=thread, milliseconds=index),
            "content": {"format": 2, "parts": [{"type": "text", "text": f"message {index} of {thread}"}]},
        }
    )


@pytest_asyncio.fixture
async def seeded(mongo_uri: str) -> AsyncIterator[tuple[MongoHistoryStorage, Captured]]:
    """A fresh database with 200 threads of 60 messages, written by the storage itself, plus one thread and
    message inserted as Mastra inserts them (ObjectId `_id`); and a client that captures its commands."""
    captured = Captured()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_uri, tz_aware=True, event_listeners=[captured]
    )
    name = infra.unique_name("t_")
    try:
        storage = MongoHistoryStorage(client[name])
        await storage.ensure_indexes()
        turns = [
            SaveTurn(f"thread-{t:03}", "user-1", [message(t, i) for i in range(PER_THREAD)])
            for t in range(THREADS_SEEDED)
        ]
        for start in range(0, len(turns), 50):
            await storage.save_many(turns[start : start + 50])
        await client[name][THREADS].insert_one(
            {"_id": ObjectId(), "id": "mastra-thread", "resourceId": "user-1", "title": "", "metadata": {},
             "createdAt": T0, "updatedAt": T0}
        )  # fmt: skip
        await client[name][MESSAGES].insert_one(
            {"_id": ObjectId(), "id": "mastra-message", "thread_id": "mastra-thread", "resourceId": "user-1",
             "role": "user", "type": "v2", "content": '{"format":2,"parts":[{"type":"text","text":"hi"}]}',
             "createdAt": T0}
        )  # fmt: skip
        captured.commands.clear()
        yield storage, captured
    finally:
        await client.drop_database(name)
        await client.close()


async def test_recall_of_one_thread_walks_the_recall_index_backwards(
    seeded: tuple[MongoHistoryStorage, Captured],
) -> None:
    """`list_messages(limit 40)`: the newest 40 of 60 rows straight from `thread_id_1_createdAt_1_id_1`."""
    storage, captured = seeded
    page = await storage.list_messages("thread-007", resource_id="user-1", limit=RECALL_LIMIT)
    assert len(page) == RECALL_LIMIT
    [find] = captured.take("find")
    plan = await explain(storage.db, find)
    assert_index_walk(plan, index="thread_id_1_createdAt_1_id_1", returned=RECALL_LIMIT)


async def test_batched_recall_merges_index_scans_in_order(
    seeded: tuple[MongoHistoryStorage, Captured],
) -> None:
    """`list_messages_many` for 20 threads: one `$in` query, per-thread index scans merged in sort order."""
    storage, captured = seeded
    threads = [f"thread-{t:03}" for t in range(0, 200, 10)]
    pages = await storage.list_messages_many(
        [RecallQuery(thread_id=t, resource_id="user-1", limit=RECALL_LIMIT) for t in threads]
    )
    assert all(len(page) == RECALL_LIMIT for page in pages.values())
    merged, *refills = captured.take("find")
    assert "$in" in merged["filter"]["thread_id"], merged
    plan = await explain(storage.db, merged)
    cap = len(threads) * RECALL_LIMIT + 1  # what the storage asks for (see `_recall_in`)
    # The merge reads the newest rows across the threads in order and stops at the cap.
    assert_index_walk(plan, index="thread_id_1_createdAt_1_id_1", returned=cap)
    # Threads crowded out of the cap by newer ones are read again one by one: each an index walk too.
    for refill in refills:
        assert_index_walk(
            await explain(storage.db, refill), index="thread_id_1_createdAt_1_id_1", returned=RECALL_LIMIT
        )


async def test_thread_lookups_use_the_unique_id_index(seeded: tuple[MongoHistoryStorage, Captured]) -> None:
    """`get_threads` for 20 threads: one `$in` on `id_1`, 20 keys for 20 threads."""
    storage, captured = seeded
    wanted = [f"thread-{t:03}" for t in range(20)]
    found = await storage.get_threads(wanted)
    assert sorted(found) == wanted
    [find] = captured.take("find")
    assert_index_walk(await explain(storage.db, find), index="id_1", returned=len(wanted))


async def test_every_upsert_of_a_save_is_a_point_lookup(seeded: tuple[MongoHistoryStorage, Captured]) -> None:
    """Re-saving a turn over stored rows, and one over Mastra's rows: each upsert examines at most one key."""
    storage, captured = seeded
    await storage.save_many(
        [
            SaveTurn("thread-003", "user-1", [message(3, i) for i in range(PER_THREAD - 5, PER_THREAD + 5)]),
            SaveTurn("mastra-thread", "user-1", [Message.model_validate(
                {"id": "mastra-message", "role": "user", "createdAt": T0,
                 "content": {"format": 2, "parts": [{"type": "text", "text": "hi again"}]}}
            )]),
        ]
    )  # fmt: skip
    updates = captured.take("update")
    statements = [
        {**command, "updates": [statement]} for command in updates for statement in command["updates"]
    ]
    assert len(statements) >= 12  # 11 messages and 2 threads, some twice (the fallback keyed by `id`)
    for statement in statements:
        plan = await explain(storage.db, statement)
        names = plan.names
        where = f"{statement['updates'][0]['q']}: {plan.describe()}"
        assert "COLLSCAN" not in names, where
        assert plan.keys_examined <= 1, where
        assert plan.docs_examined <= 1, where


async def test_the_proof_fails_when_the_recall_index_is_missing(
    seeded: tuple[MongoHistoryStorage, Captured],
) -> None:
    """Without the thread indexes the same recall query is a scan and a blocking sort: the check says so."""
    storage, captured = seeded
    await storage.messages.drop_index("thread_id_1_createdAt_1_id_1")
    await storage.messages.drop_index("thread_id_1_createdAt_1")
    await storage.list_messages("thread-007", resource_id="user-1", limit=RECALL_LIMIT)
    [find] = captured.take("find")
    plan = await explain(storage.db, find)
    with pytest.raises(AssertionError, match=r"collection scan|blocking sort|examined too many"):
        assert_index_walk(plan, index="thread_id_1_createdAt_1_id_1", returned=RECALL_LIMIT)


async def test_the_stale_claim_sweep_walks_the_claim_time_index(mongo_uri: str) -> None:
    """`stale_claims`: 3,000 Observational Memory rows, 2,990 settled (claim time null) or still young, 10
    whose claim is past the cutoff: the sweep's page reads those 10 from `_mh_claimed_at_1`, oldest first."""

    captured = Captured()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_uri, tz_aware=True, event_listeners=[captured]
    )
    name = infra.unique_name("t_")
    try:
        store = MongoObservationalStore(client[name])
        await store.ensure_indexes()
        cutoff = T0 + timedelta(hours=1)

        def row(n: int) -> dict[str, Any]:
            claimed = n % 300 == 0  # 10 stale claims, the rest settled or young
            at = T0 + timedelta(seconds=n) if claimed else (None if n % 2 else cutoff + timedelta(seconds=n))
            return {"id": f"om-{n}", "lookupKey": f"thread:t{n}", "threadId": f"t{n}", "resourceId": "u",
                    "scope": "thread", "generationCount": 0, "isObserving": at is not None,
                    "_mh_cycle": 1, "_mh_claimed_at": at}  # fmt: skip

        await client[name][OBSERVATIONAL].insert_many([row(n) for n in range(3000)])
        captured.commands.clear()
        stale = await store.stale_claims(cutoff, 100)
        assert [r.id for r in stale] == [f"om-{n}" for n in range(0, 3000, 300)]
        [find] = captured.take("find")
        assert_index_walk(await explain(client[name], find), index="_mh_claimed_at_1", returned=10)
    finally:
        await client.drop_database(name)
        await client.close()


async def test_a_resources_unobserved_messages_walk_the_thread_index(
    seeded: tuple[MongoHistoryStorage, Captured],
) -> None:
    """Resource scope's read (`storage.observational_resource`): the resource's threads from
    `resourceId_1_updatedAt_-1`, then one page of their messages from the oldest cursor on, the threads'
    index ranges merged newest first: about what it returns, not the resource's 12,000 messages; the page
    full, the rows it cut off (threads whose cursor is older than its oldest row) in one more query, an `$or`
    of those threads' exact ranges, each a forward index walk; each thread's own cursor applied after."""
    storage, captured = seeded
    store = MongoObservationalStore(storage.db)
    cursors = await store.resource_cursors("user-1", 5)
    assert len(cursors) == 5
    [threads] = captured.take("find")
    assert_index_walk(await explain(storage.db, threads), index="resourceId_1_updatedAt_-1", returned=5)
    past = {t: T0 + timedelta(seconds=int(t.split("-")[1]), milliseconds=50) for t in cursors}
    messages = await store.resource_messages("user-1", past, 100)
    page, cut_off = captured.take("find")
    assert_index_walk(await explain(storage.db, page), index="thread_id_1_createdAt_1_id_1", returned=100)
    plan = await explain(storage.db, cut_off)
    assert 0 < plan.returned <= 100
    assert_index_walk(plan, index=None, returned=plan.returned)
    unobserved = unobserved_by_thread(messages, past, frozenset())
    assert len(unobserved) == 5
    assert {len(rows) for rows in unobserved.values()} == {PER_THREAD - 51}  # each from its own cursor


async def test_a_resources_thread_pages_walk_the_page_index(
    seeded: tuple[MongoHistoryStorage, Captured],
) -> None:
    """Resource scope's thread pages (`resource_threads`): 201 threads of one owner, 100 of them sharing one
    `updatedAt` (as an observation's cursor writes leave them); a page after a thread among the ties reads
    the rest of the ties, then the older threads, each an exact range of the service's
    `resourceId_1_updatedAt_-1_id_-1`: about what it returns, never the owner's other threads."""
    storage, captured = seeded
    store = MongoObservationalStore(storage.db)
    await store.ensure_indexes()
    tied = [f"thread-{t:03}" for t in range(0, THREADS_SEEDED, 2)]
    at = T0 + timedelta(days=1)
    await storage.db[THREADS].update_many({"id": {"$in": tied}}, {"$set": {"updatedAt": at}})
    captured.commands.clear()
    page = await store.resource_threads("user-1", 30, (at, "thread-020"))
    assert sorted(page.cursors)[:10] == tied[:10]  # thread-000 .. thread-018: the ties after thread-020
    assert len(page.cursors) == 30
    ties, older = captured.take("find")
    index = "resourceId_1_updatedAt_-1_id_-1"
    assert_index_walk(await explain(storage.db, ties), index=index, returned=10)
    assert_index_walk(await explain(storage.db, older), index=index, returned=20)


async def test_the_thread_hints_message_cursor_read_is_point_lookups(
    seeded: tuple[MongoHistoryStorage, Captured],
) -> None:
    """The observed messages' places (`storage.observed_stamps`): one `find` by the observed ids on the
    unique `id` index, projected on the three fields a cursor needs; the threads and the owner filter the
    rows found, they do not widen the read."""
    storage, captured = seeded
    store = MongoObservationalStore(storage.db)
    ids = [f"t{t:03}-m{i:03}" for t in (5, 6) for i in range(20)]
    stamps = await store.message_stamps(ids, ["thread-005", "thread-006"], "user-1")
    assert len(stamps) == 40
    [find] = captured.take("find")
    assert find["projection"] == {"_id": 0, "id": 1, "thread_id": 1, "createdAt": 1}
    assert_index_walk(await explain(storage.db, find), index="id_1", returned=40)
