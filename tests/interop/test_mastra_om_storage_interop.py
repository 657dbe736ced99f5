"""Interop with `@mastra/mongodb` 1.19's Observational Memory storage, both ways, on one database.

`tests/interop/mastra-om/om_store.mjs` runs Mastra's own `MongoDBStore` against the test's fresh database:

* a record Mastra's OM writes (initialize, observe, reflect, a flag left set) is read by
  `storage/observational.py` field for field, and a flag Mastra left is claimable only once stale;
* a record the service writes (initialize, claim, apply, reflect) is read by Mastra's
  `getObservationalMemory` / `getObservationalMemoryHistory` as Mastra's own;
* both index sets coexist whichever side creates them first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from consumers.contract import Refused
from consumers.observe_results import ObserveResultsHandler
from message_history.core.observation_resource import ThreadObservations, merge_thread_observations
from schemas.limits import Limits
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.observational import CLAIM_TIMEOUT, OBSERVATIONAL, MongoObservationalStore, ObservationUpdate
from tests.infra import skip_or_fail
from tests.om_cases import NODE_DIR
from tests.paths import FakeRecord, no_emit

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(180)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def _mastra(uri: str, db: str, *args: str, stdin: Any = None) -> Any:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@mastra" / "mongodb").is_dir():
        skip_or_fail("node or tests/interop/mastra-om/node_modules is missing (npm ci there)")
    assert node is not None
    done = subprocess.run(
        [node, "om_store.mjs", db, *args],
        cwd=NODE_DIR,
        input=json.dumps(stdin).encode() if stdin is not None else b"",
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "MONGODB_URI": uri},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return json.loads(done.stdout)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def test_a_record_mastra_wrote_is_read_by_the_service(mongo_uri: str, mongo_db: Db) -> None:
    """Mastra's initialize, observe and reflect: the service reads the newest generation as Mastra does."""
    _mastra(mongo_uri, mongo_db.name, "init")
    written = _mastra(
        mongo_uri,
        mongo_db.name,
        "write",
        stdin={
            "threadId": "t1",
            "resourceId": "r1",
            "observations": "* 🔴 (09:00) User prefers tea",
            "tokenCount": 12,
            "lastObservedAt": _iso(T0),
            "observedMessageIds": ["m1", "m2"],
            "reflection": "* tea",
            "reflectionTokens": 3,
        },
    )["record"]
    store = MongoObservationalStore(mongo_db)
    await store.ensure_indexes()  # on top of Mastra's: the same keys, no conflict
    record = await store.get("t1", "r1")
    assert record is not None
    assert record.id == written["id"]
    assert (record.generation, record.origin_type, record.active_observations) == (1, "reflection", "* tea")
    assert (record.observation_token_count, record.total_tokens_observed) == (3, 12)
    assert record.last_observed_at == T0
    assert record.config == {"from": "mastra"}
    assert record.lookup_key == "thread:t1"
    history = await store.history("t1", "r1")
    assert [(h.generation, h.active_observations, h.observed_message_ids) for h in history] == [
        (1, "* tea", ()),
        (0, "* 🔴 (09:00) User prefers tea", ("m1", "m2")),
    ]


async def test_a_flag_mastra_left_set_is_claimed_only_once_stale(mongo_uri: str, mongo_db: Db) -> None:
    """`setObservingFlag(true)` from a Mastra app that then crashed: held until its `updatedAt` is stale."""
    written = _mastra(
        mongo_uri,
        mongo_db.name,
        "write",
        stdin={"threadId": "t2", "resourceId": "r1", "observations": "x", "tokenCount": 1,
               "lastObservedAt": _iso(T0), "observedMessageIds": [], "observing": True},
    )["record"]  # fmt: skip
    assert written["isObserving"] is True
    store = MongoObservationalStore(mongo_db)
    record = await store.get("t2", "r1")
    assert record is not None
    assert record.is_observing
    now = datetime.now(UTC)
    assert await store.claim(record, "observe", now) is None
    assert await store.claim(record, "observe", now + CLAIM_TIMEOUT + timedelta(seconds=1)) is not None


async def test_a_record_the_service_wrote_is_read_by_mastra(mongo_uri: str, mongo_db: Db) -> None:
    """The service's initialize, claimed observation and reflection, as Mastra's own reads return them."""
    store = MongoObservationalStore(mongo_db)
    await store.ensure_indexes()
    _mastra(mongo_uri, mongo_db.name, "init")  # Mastra's indexes on top of ours
    record = await store.initialize(scope="thread", thread_id="t3", resource_id="r3", config={"k": 1}, now=T0)
    claim = await store.claim(record, "observe", T0)
    assert claim is not None
    assert await store.apply_observation(claim, ObservationUpdate("* obs", 9, T0, ["a"]), T0)
    current = await store.get("t3", "r3")
    assert current is not None
    reflect = await store.claim(current, "reflect", T0)
    assert reflect is not None
    assert await store.apply_reflection(reflect, reflection="* short", token_count=2, now=T0) is not None
    read = _mastra(mongo_uri, mongo_db.name, "read", "t3", "r3")
    mastra = read["record"]
    assert mastra["generationCount"] == 1
    assert (mastra["originType"], mastra["activeObservations"], mastra["observationTokenCount"]) == (
        "reflection",
        "* short",
        2,
    )
    assert (mastra["isObserving"], mastra["isReflecting"], mastra["totalTokensObserved"]) == (False, False, 9)
    assert (mastra["scope"], mastra["threadId"], mastra["resourceId"], mastra["config"]) == (
        "thread",
        "t3",
        "r3",
        {"k": 1},
    )
    assert mastra["lastObservedAt"] == _iso(T0)
    first = read["history"][1]
    assert (first["activeObservations"], first["observedMessageIds"], first["pendingMessageTokens"]) == (
        "* obs",
        ["a"],
        0,
    )
    assert await mongo_db[OBSERVATIONAL].count_documents({}) == 2


async def test_a_resource_row_the_service_wrote_is_read_by_mastra(mongo_uri: str, mongo_db: Db) -> None:
    """Resource scope: the service's `resource:<id>` row (threadId null, the log in `<thread>` sections) is
    Mastra's `getObservationalMemory(null, resourceId)`; the cursor the service writes into a thread's
    metadata is Mastra's `getThreadOMMetadata(thread.metadata).lastObservedAt`."""
    store = MongoObservationalStore(mongo_db)
    await store.ensure_indexes()
    _mastra(mongo_uri, mongo_db.name, "init")
    _mastra(
        mongo_uri, mongo_db.name, "write-thread-om", stdin={"threadId": "t5", "resourceId": "r5", "om": {}}
    )
    record = await store.initialize(scope="resource", thread_id=None, resource_id="r5", config={}, now=T0)
    claim = await store.claim(record, "observe", T0)
    assert claim is not None
    log = merge_thread_observations("", [ThreadObservations("t5", "Date: Mar 1, 2025\n* tea", T0)])
    assert await store.apply_observation(claim, ObservationUpdate(log, 9, T0, ["m1"]), T0)
    cursor = {"createdAt": _iso(T0), "id": "m1"}
    hints = {"currentTask": "brew", "threadTitle": "Tea", "lastObservedMessageCursor": cursor}
    assert await store.write_cursors("r5", [("t5", T0, hints)], T0) == 1
    mastra = _mastra(mongo_uri, mongo_db.name, "read", "-", "r5")["record"]
    assert (mastra["scope"], mastra["threadId"], mastra["resourceId"]) == ("resource", None, "r5")
    assert mastra["activeObservations"] == '<thread id="t5">\nDate: Mar 1, 2025\n* tea\n</thread>'
    assert mastra["lastObservedAt"] == _iso(T0)
    om = _mastra(mongo_uri, mongo_db.name, "thread-om", "t5")["om"]
    assert om == {"lastObservedAt": _iso(T0), **hints}


async def test_the_hints_the_observed_path_writes_are_mastras(mongo_uri: str, mongo_db: Db) -> None:
    """Thread scope: the keys the observed path sets (`write_cursors` without a cursor, dotted under
    `mastra.om`, the owner in the filter) are Mastra's `getThreadOMMetadata` fields (`threadTitle`,
    `lastObservedMessageCursor` as `{createdAt, id}`), beside a hint Mastra set before, which stays."""
    _mastra(
        mongo_uri,
        mongo_db.name,
        "write-thread-om",
        stdin={"threadId": "t6", "resourceId": "r6", "om": {"suggestedResponse": "ask"}},
    )
    cursor = {"createdAt": _iso(T0), "id": "m2"}
    update = {"currentTask": "brew", "threadTitle": "Tea time", "lastObservedMessageCursor": cursor}
    store = MongoObservationalStore(mongo_db)
    assert await store.write_cursors("another", [("t6", None, update)], T0) == 0  # not the owner
    assert await store.write_cursors("r6", [("t6", None, update)], T0) == 1
    om = _mastra(mongo_uri, mongo_db.name, "thread-om", "t6")["om"]
    assert om == {"suggestedResponse": "ask", **update}


async def test_a_resource_row_mastra_wrote_is_read_by_the_service(mongo_uri: str, mongo_db: Db) -> None:
    """Mastra's resource-scoped row and a thread cursor it set (`setThreadOMMetadata`): the service reads
    the row under `resource:<id>` and the thread's cursor as its own."""
    written = _mastra(
        mongo_uri,
        mongo_db.name,
        "write",
        stdin={"threadId": None, "resourceId": "r6", "scope": "resource",
               "observations": '<thread id="t6">\n* coffee\n</thread>', "tokenCount": 5,
               "lastObservedAt": _iso(T0), "observedMessageIds": ["m9"]},
    )["record"]  # fmt: skip
    _mastra(
        mongo_uri,
        mongo_db.name,
        "write-thread-om",
        stdin={"threadId": "t6", "resourceId": "r6", "om": {"lastObservedAt": _iso(T0)}},
    )
    store = MongoObservationalStore(mongo_db)
    record = await store.get(None, "r6")
    assert record is not None
    assert record.id == written["id"]
    assert (record.lookup_key, record.scope, record.thread_id) == ("resource:r6", "resource", None)
    assert record.active_observations == '<thread id="t6">\n* coffee\n</thread>'
    assert record.observed_message_ids == ("m9",)
    assert await store.resource_cursors("r6", 10) == {"t6": T0}


async def test_a_resource_row_the_service_reflected_is_read_by_mastra(mongo_uri: str, mongo_db: Db) -> None:
    """Resource scope's reflection, as Mastra's `createReflectionGeneration` makes it on the resource's row:
    generation 1 under `resource:<id>` (threadId null), the Reflector's text as given (here one thread's
    section kept, a fact consolidated outside), its tokens, generation 0's `lastObservedAt` and
    `totalTokensObserved`, no observed ids; each thread's cursor in its metadata untouched."""
    store = MongoObservationalStore(mongo_db)
    await store.ensure_indexes()
    _mastra(mongo_uri, mongo_db.name, "init")
    for thread in ("t7", "t8"):
        _mastra(
            mongo_uri,
            mongo_db.name,
            "write-thread-om",
            stdin={"threadId": thread, "resourceId": "r7", "om": {}},
        )
    record = await store.initialize(scope="resource", thread_id=None, resource_id="r7", config={}, now=T0)
    claim = await store.claim(record, "observe", T0)
    assert claim is not None
    log = merge_thread_observations(
        "",
        [
            ThreadObservations("t7", "Date: Mar 1, 2025\n* tea\n* likes TypeScript", T0),
            ThreadObservations("t8", "Date: Mar 1, 2025\n* coffee\n* likes TypeScript", T0),
        ],
    )
    assert await store.apply_observation(claim, ObservationUpdate(log, 30, T0, ["m1", "m2"]), T0)
    assert await store.write_cursors("r7", [("t7", T0, {}), ("t8", T0, {})], T0) == 2
    current = await store.get(None, "r7")
    assert current is not None
    reflect = await store.claim(current, "reflect", T0)
    assert reflect is not None
    reflection = 'Date: Mar 1, 2025\n* likes TypeScript\n<thread id="t7">\n* tea\n</thread>\n* coffee'
    later = T0 + timedelta(minutes=5)
    assert await store.apply_reflection(reflect, reflection=reflection, token_count=12, now=later) is not None
    read = _mastra(mongo_uri, mongo_db.name, "read", "-", "r7")
    mastra = read["record"]
    assert (mastra["scope"], mastra["threadId"], mastra["resourceId"]) == ("resource", None, "r7")
    assert (mastra["generationCount"], mastra["originType"]) == (1, "reflection")
    assert (mastra["activeObservations"], mastra["observationTokenCount"]) == (reflection, 12)
    assert (mastra["lastObservedAt"], mastra["totalTokensObserved"]) == (_iso(T0), 30)
    assert not mastra.get("observedMessageIds")
    assert (mastra["isObserving"], mastra["isReflecting"]) == (False, False)
    assert [r["generationCount"] for r in read["history"]] == [1, 0]
    for thread in ("t7", "t8"):  # the cursors stay where the observation left them
        assert _mastra(mongo_uri, mongo_db.name, "thread-om", thread)["om"] == {"lastObservedAt": _iso(T0)}


# Each case: the thread as it was (title, metadata) and the Observer's answer, parsed (as Mastra's parser
# leaves it: trimmed, empty ones absent). Mastra's persist and the observed path each write one copy.
PERSIST_CASES: list[tuple[str, str | None, dict[str, Any], dict[str, Any]]] = [
    ("fresh", "", {}, {"threadTitle": "Trip to Lyon", "currentTask": "book the train",
                       "extractedValues": {"mood": "calm"}}),
    ("no-title", None, {"k": 1}, {"threadTitle": "Trip to Lyon", "suggestedContinuation": "ask"}),
    ("pinned", "Mine", {"titlePinned": True, "mastra": {"om": {
        "currentTask": "old", "suggestedResponse": "old s", "threadTitle": "old t",
        "extracted": {"topic": "trains", "mood": "tense"}}}},
     {"threadTitle": "New title", "extractedValues": {"mood": "calm", "empty": ""}}),
    ("same-title", " Lyon ", {"titlePinned": False}, {"threadTitle": "Lyon"}),
    ("short", "Old", {}, {"threadTitle": "Ly", "currentTask": "t"}),
    ("no-hints", "Old", {"mastra": {"om": {"currentTask": "old", "extracted": {"a": 1}}}}, {}),
]  # fmt: skip


@pytest.mark.parametrize("scope", ["thread", "resource"])
@pytest.mark.parametrize(
    ("case", "title", "metadata", "processed"), PERSIST_CASES, ids=[c[0] for c in PERSIST_CASES]
)
async def test_an_observed_threads_row_is_as_mastras_persist_leaves_it(
    mongo_uri: str,
    mongo_db: Db,
    case: str,
    title: str | None,
    metadata: dict[str, Any],
    processed: dict[str, Any],
    scope: str,
) -> None:
    """Issue 35: the thread row after the observed path applies an answer equals the row after Mastra's own
    `SyncObservationStrategy.persist` (`ResourceScopedObservationStrategy.persist` with resource scope)
    writes the same answer through `@mastra/mongodb` (`patchThread`): the title set unless pinned, too short
    or the same; a hint the answer lacks `null` (the Node driver stores Mastra's `undefined` so); `extracted`
    merged. Applied twice, the service's row does not change."""
    storage = MongoHistoryStorage(mongo_db)
    observed = Message.model_validate(
        {"id": "m1", "role": "user", "createdAt": _iso(T0), "threadId": "service", "resourceId": "r7",
         "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]}}
    )  # fmt: skip
    await storage.save_messages(thread_id="service", resource_id="r7", messages=[observed])
    threads = mongo_db["mastra_threads"]
    for thread in ("mastra", "service"):  # the same row for both, as the case has it
        row: dict[str, Any] = {"id": thread, "resourceId": "r7", "metadata": metadata, "createdAt": T0}
        row = {**row, "updatedAt": T0, **({"title": title} if title is not None else {})}
        await threads.replace_one({"id": thread}, row, upsert=True)
    # Mastra's getLastObservedMessageCursor of what it observed, and the thread's cursor (resource scope)
    cursor = {"createdAt": _iso(T0), "id": "m1"}
    processed = {**processed, "lastObservedMessageCursor": cursor, "lastObservedAt": _iso(T0)}
    mastra_input = {"threadId": "mastra", "scope": scope, "processed": processed}
    _mastra(mongo_uri, mongo_db.name, "persist-thread-om", stdin=mastra_input)
    store = MongoObservationalStore(mongo_db)
    handler = ObserveResultsHandler(rows=store, limits=Limits())
    answer = {
        "threadTitle": processed.get("threadTitle"),
        "currentTask": processed.get("currentTask"),
        "suggestedResponse": processed.get("suggestedContinuation"),
        "extracted": processed.get("extractedValues"),
    }
    seen = []
    for _ in range(2):
        await _observe(store, handler, scope, "service", "r7", answer)
        seen.append(await threads.find_one({"id": "service"}, {"_id": 0, "id": 0}))
    mastra = await threads.find_one({"id": "mastra"}, {"_id": 0, "id": 0})
    assert mastra is not None
    for service in seen:
        assert service is not None
        # both move `updatedAt`: Mastra to its now, the service forward to its own
        assert service["updatedAt"] > T0.replace(tzinfo=None)
        assert {k: v for k, v in service.items() if k != "updatedAt"} == {
            k: v for k, v in mastra.items() if k != "updatedAt"
        }


async def _observe(
    store: MongoObservationalStore,
    handler: ObserveResultsHandler,
    scope: str,
    thread: str,
    resource: str,
    answer: dict[str, Any],
) -> None:
    """One observation of `thread` (`m1` observed; with resource scope, of the resource's row, the thread's
    hints in `threads`) claimed and answered through the observed path."""
    key = thread if scope == "thread" else None
    row = await store.get(key, resource)
    if row is None:
        row = await store.initialize(
            scope="thread" if scope == "thread" else "resource",
            thread_id=key,
            resource_id=resource,
            config={},
            now=T0,
        )
    claim = await store.claim(row, "observe", datetime.now(UTC))
    assert claim is not None
    hints = {k: v for k, v in answer.items() if v is not None}
    result: dict[str, Any] = {
        "type": "ObserveResult", "schemaVersion": 1, "requestId": "q", "createdAt": _iso(T0),
        "scope": scope, "threadId": key, "resourceId": resource, "recordId": claim.record_id,
        "generation": claim.generation, "cycle": claim.cycle, "observations": "* obs",
        "observedMessageIds": ["m1"], "lastObservedAt": _iso(T0),
    }  # fmt: skip
    if scope == "thread":
        result.update(hints)
    else:
        entry = {"threadId": thread, "observations": "* obs", "lastObservedAt": _iso(T0), **hints}
        result["threads"] = [entry]
    record = FakeRecord("od", 0, 0, (key or resource).encode(), json.dumps(result).encode())
    [done] = await handler.handle([record], no_emit)
    assert not isinstance(done, Refused), done
