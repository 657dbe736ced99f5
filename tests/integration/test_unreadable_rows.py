"""Stored rows are input (issue 31): rows the service did not write, inserted straight into the real server,
on both paths (tests/paths.py: the handlers without a broker, over `MongoHistoryStorage`).

* Recall: a thread holding a row no Mastra would read is enriched with the rest of its thread and says so
  (`history.skipped`); the other threads of the same batch are untouched; both recall routes (the reply's
  bytes, the models) agree. A v1 row (`role: "tool"`, array content) is not skipped: it is read as Mastra
  1.71 reads it.
* Persist: a turn whose own stored copy is such a row is a dead letter naming the row; the batch's other
  turns are saved.
* Writes MongoDB refuses for one document (a collection validator: code 121) are that record's dead letter.
* Without the guards: the driver's decoding of a reply fails for the whole reply, and the old mapping made it
  `FatalStorageError` (the loop's systemic stop).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidBSON
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from message_history import metrics
from message_history.app.health import Health
from message_history.errors import DocumentRefusedError, FatalStorageError, UnreadableRowError
from schemas.dead_letters import parse_dead_letter_headers
from storage.documents import MESSAGES, THREADS
from storage.errors import to_storage_error
from storage.forgetting import MongoForgetting
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery
from storage.pruning import MongoPruner
from tests.conftest import MakeTopic
from tests.integration.livez_prober import assert_all_answered, free_port, probing
from tests.integration.service_harness import (
    encoded,
    fresh_settings,
    read_request_ids,
    request_event,
    response_event,
    running_service,
    values,
)
from tests.integration.stream_helpers import produce, read_topic, wait_committed
from tests.paths import RESOURCE, Paths, assistant, request, response, user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
TEXT = json.dumps({"format": 2, "parts": [{"type": "text", "text": "odd"}]}, separators=(",", ":"))


def odd(thread: str, **fields: Any) -> dict[str, Any]:
    """A stored row of `thread` with `fields` changed (`...`: left out)."""
    doc: dict[str, Any] = {
        "id": f"{thread}-odd",
        "thread_id": thread,
        "resourceId": RESOURCE,
        "role": "user",
        "type": "v2",
        "createdAt": T0 + timedelta(seconds=5),
        "content": TEXT,
    }
    for key, value in fields.items():
        if value is ...:
            doc.pop(key)
        else:
            doc[key] = value
    return doc


# (name, the row's changes, the reason class it is counted under)
SHAPES: list[tuple[str, dict[str, Any], str]] = [
    ("role missing", {"role": ...}, "role"),
    ("role unknown", {"role": "bot"}, "role"),
    ("content a JSON number", {"content": "5"}, "content"),
    ("content a BSON number", {"content": 5}, "content"),
    ("parts not a list", {"content": '{"format":2,"parts":{"a":1}}'}, "content"),
    ("lone surrogate", {"content": '{"format":2,"parts":[{"type":"text","text":"\\ud83d"}]}'}, "text"),
    ("id an int", {"id": 12345}, "id"),
    ("id missing", {"id": ...}, "id"),
    ("type 5", {"type": 5}, "type"),
    ("createdAt yesterday", {"createdAt": "yesterday"}, "createdAt"),
    ("createdAt null", {"createdAt": None}, "createdAt"),
    ("createdAt missing", {"createdAt": ...}, "createdAt"),
    ("createdAt in year 20000", {"createdAt": DatetimeMS(568_971_820_800_000)}, "createdAt"),
    ("content nested past JSON's limit", {"content": "[" * 3000 + "]" * 3000}, "nesting"),
]


@pytest_asyncio.fixture
async def storage(mongo_db: Db) -> AsyncIterator[MongoHistoryStorage]:
    storage = MongoHistoryStorage(mongo_db)
    await storage.ensure_indexes()
    yield storage


async def _seed(paths: Paths, *threads: str) -> None:
    """Two readable turns on each thread, written by the service."""
    for n, thread in enumerate(threads):
        batch = await paths.persist(
            response(
                thread,
                input=[user(f"{thread}-u", "hello", 1 + n)],
                output=[assistant(f"{thread}-a", "hi", 2 + n)],
                seconds=10 + n,
            )
        )
        assert not batch.dead


def _skipped(reason: str) -> float:
    value: float = metrics.UNREADABLE_ROWS.labels(
        path="recall", collection=MESSAGES, reason=reason
    )._value.get()
    return value


@pytest.mark.parametrize(("changes", "reason"), [(c, r) for _, c, r in SHAPES], ids=[n for n, _, _ in SHAPES])
@pytest.mark.parametrize("fast", [True, False], ids=["bytes", "models"])
async def test_recall_skips_the_row_and_recalls_the_rest(
    storage: MongoHistoryStorage, mongo_db: Db, changes: dict[str, Any], reason: str, fast: bool
) -> None:
    paths = Paths(storage=storage)
    paths.recall_handler.fast_recall = fast
    await _seed(paths, "bad", "good")
    await mongo_db[MESSAGES].insert_one(odd("bad", **changes))
    before = _skipped(reason)

    batch = await paths.recall(
        request("bad", [user("bad-q", "again?", 100)]), request("good", [user("good-q", "again?", 100)])
    )

    bad, good = batch.event(0), batch.event(1)
    assert [m["id"] for m in bad["messages"]] == ["bad-u", "bad-a", "bad-q"]
    assert bad["history"]["recalled"] == 2
    assert bad["history"]["skipped"] == 1
    assert [m["id"] for m in good["messages"]] == ["good-u", "good-a", "good-q"]
    assert "skipped" not in good["history"]  # absent = 0: other threads of the batch are untouched
    assert _skipped(reason) == before + 1


async def test_a_row_nested_as_deep_as_the_server_stores_is_read(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """Content stored as a sub-document nested 170 levels deep (the server refuses past 180; the decoder
    reads that deep, its own limit is tests/unit/test_unreadable.py's) is read, the batch goes on."""
    paths = Paths(storage=storage)
    await _seed(paths, "bad", "good")
    deep: dict[str, Any] = {}
    for _ in range(160):
        deep = {"a": deep}
    content = {"format": 2, "parts": [{"type": "data-deep", "data": deep}]}
    await mongo_db[MESSAGES].insert_one(odd("bad", content=content))
    batch = await paths.recall(
        request("bad", [user("bad-q", "?", 100)]), request("good", [user("g", "?", 100)])
    )
    assert batch.event(0)["history"]["recalled"] == 3
    assert batch.event(1)["history"]["recalled"] == 2


async def test_v1_rows_are_read_as_mastra_reads_them(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Mastra 0.x's v1 rows (a tool call, its `role: "tool"` result, array content) are recalled, converted
    as Mastra 1.71's MessageList converts them: nothing skipped."""
    paths = Paths(storage=storage)
    call = [{"type": "tool-call", "toolCallId": "c1", "toolName": "weather", "args": {"city": "Oslo"}}]
    result = [{"type": "tool-result", "toolCallId": "c1", "toolName": "weather", "result": {"c": 3}}]
    await mongo_db[MESSAGES].insert_many(
        [
            {"id": "v1-u", "thread_id": "v1", "resourceId": RESOURCE, "role": "user", "type": "text",
             "content": "weather?", "createdAt": T0},
            {"id": "v1-c", "thread_id": "v1", "resourceId": RESOURCE, "role": "assistant",
             "type": "tool-call", "content": json.dumps(call), "createdAt": T0 + timedelta(seconds=1)},
            {"id": "v1-r", "thread_id": "v1", "resourceId": RESOURCE, "role": "tool",
             "type": "tool-result", "content": json.dumps(result), "createdAt": T0 + timedelta(seconds=2)},
        ]
    )  # fmt: skip
    batch = await paths.recall(request("v1", [user("v1-q", "and now?", 100)]))
    event = batch.event(0)
    assert "skipped" not in event["history"]
    memory = [m for m in event["messages"] if m["source"] == "memory"]
    assert [(m["id"], m["role"]) for m in memory] == [
        ("v1-u", "user"),
        ("v1-c", "assistant"),
        ("v1-r", "assistant"),
    ]
    assert memory[0]["content"] == {
        "format": 2,
        "parts": [{"type": "text", "text": "weather?"}],
        "content": "weather?",
    }
    assert memory[2]["content"]["parts"] == [
        {
            "type": "tool-invocation",
            "toolInvocation": {
                "state": "result",
                "toolCallId": "c1",
                "toolName": "weather",
                "result": {"c": 3},
                "args": {},
            },
        }
    ]
    assert all("type" not in m for m in memory)  # a v1 row's `type` is not carried over (as Mastra)


async def test_persist_refuses_the_turn_whose_own_copy_is_unreadable(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """The turn writes an id whose stored row no Mastra would read: that one record is a dead letter naming
    the row (collection, id, thread, what is wrong); the batch's other turn is saved; the row is untouched."""
    paths = Paths(storage=storage)
    await _seed(paths, "bad", "good")
    await mongo_db[MESSAGES].insert_one(odd("bad", id="bad-x", createdAt="yesterday"))
    batch = await paths.persist(
        response("bad", input=[user("bad-y", "q", 50)], output=[assistant("bad-x", "a", 51)], seconds=60),
        response("good", input=[user("good-y", "q", 50)], output=[assistant("good-x", "a", 51)], seconds=60),
    )
    error = batch.dead[0]
    assert isinstance(error, UnreadableRowError)
    assert not error.retriable
    for named in ("mastra_messages", "'bad-x'", "'bad'", "createdAt"):
        assert named in str(error)
    assert batch.event(1)["savedMessageIds"] == ["good-y", "good-x"]
    stored = await mongo_db[MESSAGES].find_one({"id": "bad-x"})
    assert stored is not None
    assert stored["createdAt"] == "yesterday"  # not written over
    assert await mongo_db[MESSAGES].find_one({"id": "bad-y"}) is None  # nothing of the refused turn


async def test_a_row_of_another_thread_the_codec_refuses_still_holds_its_id(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """Issue 33: the batch's one find by id reads the stored copies and the ids' homes together. A row of
    another thread that no Mastra would read (a date out of range: the whole row refused) is still the
    home of its id: the turn saving that id in its own thread is refused (`MessageIdTakenError`), the row
    is untouched; it is not the turn's unreadable copy (no `UnreadableRowError`), the batch's other turn is
    saved."""
    paths = Paths(storage=storage)
    await _seed(paths, "mine", "good")
    await mongo_db[MESSAGES].insert_one(odd("other", id="held", createdAt=DatetimeMS(568_971_820_800_000)))
    batch = await paths.persist(
        response("mine", input=[user("mine-y", "q", 50)], output=[assistant("held", "a", 51)], seconds=60),
        response("good", input=[user("good-y", "q", 50)], output=[assistant("good-x", "a", 51)], seconds=60),
    )
    assert type(batch.dead[0]).__name__ == "MessageIdTakenError"
    assert batch.event(1)["savedMessageIds"] == ["good-y", "good-x"]
    stored = await mongo_db[MESSAGES].find_one({"id": "held"}, {"_id": 0, "thread_id": 1})
    assert stored == {"thread_id": "other"}
    assert await mongo_db[MESSAGES].find_one({"id": "mine-y"}) is None


async def test_a_document_mongodb_refuses_is_the_records_dead_letter(mongo_db: Db) -> None:
    """A collection validator refuses one turn's message (code 121): that record is a dead letter, the batch's
    other turn is written (it used to be FatalStorageError: the loop stopped)."""
    await mongo_db.create_collection(
        MESSAGES,
        validator={
            "$jsonSchema": {"not": {"properties": {"id": {"enum": ["refused-a"]}}, "required": ["id"]}}
        },
    )
    storage = MongoHistoryStorage(mongo_db)
    await storage.ensure_indexes()
    probe = await _refuses(mongo_db)
    if not probe:
        pytest.skip("this server does not enforce collection validators")
    paths = Paths(storage=storage)
    batch = await paths.persist(
        response("t-bad", input=[user("refused-u", "q", 1)], output=[assistant("refused-a", "a", 2)]),
        response("t-good", input=[user("ok-u", "q", 1)], output=[assistant("ok-a", "a", 2)]),
    )
    error = batch.dead[0]
    assert isinstance(error, DocumentRefusedError)
    assert "121" in str(error)
    assert "'refused-a'" in str(error)
    assert batch.event(1)["savedMessageIds"] == ["ok-u", "ok-a"]
    assert await mongo_db[MESSAGES].find_one({"id": "ok-a"}) is not None


async def _refuses(db: Db) -> bool:
    try:
        await db[MESSAGES].insert_one({"id": "refused-a"})
    except Exception:
        return True
    await db[MESSAGES].delete_one({"id": "refused-a"})
    return False


async def test_an_unreadable_thread_row_still_guards_its_owner(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A thread row with an out-of-range date (the driver cannot decode it) is read leniently for its owner:
    another resource is still refused, the owner is enriched."""
    await mongo_db[THREADS].insert_one(
        {"id": "th", "resourceId": RESOURCE, "title": "", "metadata": {},
         "createdAt": DatetimeMS(568_971_820_800_000), "updatedAt": DatetimeMS(568_971_820_800_000)}
    )  # fmt: skip
    paths = Paths(storage=storage)
    batch = await paths.recall(
        request("th", [user("q1", "?", 100)]),
        request("th", [user("q2", "?", 101)], resource="intruder", seconds=1001),
    )
    assert batch.event(0)["history"]["recalled"] == 0
    assert type(batch.dead[1]).__name__ == "ThreadOwnershipError"


async def test_without_row_by_row_decoding_one_row_fails_the_reply(mongo_db: Db) -> None:
    """The guard's reason: the driver decodes a reply whole, so one undecodable row fails every thread of a
    batch's `$in` read, and the old mapping made that systemic (`FatalStorageError`)."""
    await mongo_db[MESSAGES].insert_many([odd("a"), odd("b", createdAt=DatetimeMS(568_971_820_800_000))])
    with pytest.raises(InvalidBSON) as caught:
        await mongo_db.get_collection(MESSAGES).find({"thread_id": {"$in": ["a", "b"]}}).to_list()
    assert isinstance(to_storage_error(caught.value, "list_messages_many"), FatalStorageError)
    storage = MongoHistoryStorage(mongo_db)
    read = await storage.list_messages_many([RecallQuery("a", None, 10), RecallQuery("b", None, 10)])
    assert [m.id for m in read["a"]] == ["a-odd"]
    assert read["b"] == []


# --- forget and prune ------------------------------------------------------------------------------------

FAR = DatetimeMS(568_971_820_800_000)  # year 20000: stored by the server, refused by Python's `datetime`


def _other(collection: str, reason: str = "createdAt") -> float:
    counter = metrics.UNREADABLE_ROWS.labels(path="other", collection=collection, reason=reason)
    value: float = counter._value.get()
    return value


async def _seed_refused(storage: MongoHistoryStorage, mongo_db: Db, thread: str) -> None:
    """`thread`'s readable turn, a row whose `id` cannot be decoded, one whose `_id` cannot, one whose
    `createdAt` cannot (not projected by the finds: never decoded)."""
    await _seed(Paths(storage=storage), thread)
    await mongo_db[MESSAGES].insert_many(
        [
            odd(thread, id=FAR),
            odd(thread, _id=FAR, id=f"{thread}-far-key"),
            odd(thread, id=f"{thread}-far-date", createdAt=FAR),
        ]
    )


async def test_forget_deletes_the_rows_the_codec_refuses(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """A thread's rows whose `id` or `_id` the codec refuses are counted and forgotten with the rest, by their
    `_id` (before: the strict read of the find raised, `FatalStorageError`, the forget failed and the
    commands path stopped)."""
    await _seed_refused(storage, mongo_db, "fth")
    with pytest.raises(InvalidBSON):
        await mongo_db[MESSAGES].find({"thread_id": "fth"}, {"_id": 1, "id": 1}).to_list()
    before = _other(MESSAGES)
    forgetting = MongoForgetting(mongo_db, chunk_size=2)
    dry = await forgetting.forget_thread("fth", dry_run=True)
    assert dry.deleted_messages == 5
    outcome = await forgetting.forget_thread("fth")
    assert outcome.deleted_messages == 5
    assert await mongo_db[MESSAGES].count_documents({"thread_id": "fth"}) == 0
    assert await mongo_db[THREADS].count_documents({"id": "fth"}) == 0
    assert _other(MESSAGES) > before


async def test_forget_resource_deletes_the_rows_the_codec_refuses(
    storage: MongoHistoryStorage, mongo_db: Db
) -> None:
    """A resource's thread row and message rows the codec refuses are forgotten with the rest."""
    await _seed_refused(storage, mongo_db, "frs")
    await mongo_db[THREADS].insert_one(
        {"_id": FAR, "id": "frs-far", "resourceId": RESOURCE, "createdAt": FAR, "updatedAt": FAR}
    )
    before = _other(THREADS)
    outcome = await MongoForgetting(mongo_db, chunk_size=2).forget_resource(RESOURCE)
    assert outcome.deleted_threads == 2
    assert outcome.deleted_messages == 5
    assert await mongo_db[MESSAGES].count_documents({"resourceId": RESOURCE}) == 0
    assert await mongo_db[THREADS].count_documents({"resourceId": RESOURCE}) == 0
    assert _other(THREADS) == before + 1


async def test_prune_deletes_the_rows_the_codec_refuses(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Old rows whose `_id` or `id` the codec refuses are pruned with the rest, by their `_id`; a stale thread
    row the codec refuses is counted and kept (its emptiness cannot be looked up), and the prune finishes
    (before: `FatalStorageError`, the periodic prune stopped the service)."""
    await mongo_db[MESSAGES].insert_many(
        [odd("pr", id=f"pr-{n}") for n in range(3)] + [odd("pr", _id=FAR, id="pr-far"), odd("pr", id=FAR)]
    )
    await mongo_db[THREADS].insert_one({"id": FAR, "resourceId": RESOURCE, "createdAt": T0, "updatedAt": T0})
    with pytest.raises(InvalidBSON):
        await mongo_db[MESSAGES].find({"thread_id": "pr"}, {"_id": 1}).to_list()
    before = _other(THREADS)
    progress = await MongoPruner(mongo_db, batch_size=2).prune(T0 + timedelta(days=1))
    assert progress.done
    assert progress.messages == 5
    assert await mongo_db[MESSAGES].count_documents({"thread_id": "pr"}) == 0
    assert await mongo_db[THREADS].count_documents({}) == 1  # the refused thread, kept
    assert _other(THREADS) == before + 1


# --- the running service -------------------------------------------------------------------------------


async def test_the_service_stays_up_and_ready_on_unreadable_rows(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Every shape of SHAPES stored beside the history of one thread each, requests for all of them and for
    clean threads in one wave: every request is enriched (the odd rows skipped and said), the turn whose own
    copy is unreadable is the only dead letter, offsets are committed, and the service stays up and ready
    (before, the first of these rows stopped it with exit 1, and every restart again); `/livez` answers every
    probe throughout (tests/integration/livez_prober.py)."""
    port = free_port()
    settings = fresh_settings(kafka_bootstrap, mongo_uri, http_port=port)
    bootstrap = settings.kafka_bootstrap_servers
    for topic in (settings.requests_topic, settings.responses_topic):
        await make_topic(partitions=1, name=topic)
    odd_threads = [f"odd-{n}" for n in range(len(SHAPES))]
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    db = client[settings.mongodb_database]
    try:
        await db[MESSAGES].insert_many(
            [odd(thread, **changes) for thread, (_, changes, _) in zip(odd_threads, SHAPES, strict=True)]
        )
        await db[MESSAGES].insert_one(odd("own", id="own-x", createdAt="yesterday"))
        threads = [*odd_threads, "clean-1", "clean-2"]
        requests = [encoded(request_event(t, RESOURCE, 1, "q")) for t in threads]
        own = response_event("own", RESOURCE, 1, [], "a")
        own["response"][0]["id"] = "own-x"
        responses = [encoded(own), encoded(response_event("clean-1", RESOURCE, 1, [], "a"))]
        health = Health()
        async with running_service(settings, health=health) as service:
            with probing(port, "the unreadable rows test") as probes:
                await produce(bootstrap, settings.requests_topic, requests)
                await produce(bootstrap, settings.responses_topic, responses)
                enriched = await read_request_ids(bootstrap, settings.enriched_topic, len(threads))
                persisted = await read_request_ids(bootstrap, settings.persisted_topic, 1)
                letters = await read_topic(bootstrap, settings.responses_dlq, until=lambda rs: len(rs) >= 1)
                await wait_committed(
                    bootstrap, settings.group_id, settings.requests_topic, {0: len(requests)}
                )
                await wait_committed(
                    bootstrap, settings.group_id, settings.responses_topic, {0: len(responses)}
                )
                assert not service.done(), "the service stopped on a stored row"
                ready, reasons = health.readiness()
                assert ready, reasons
            assert_all_answered(probes)
    finally:
        await client.drop_database(settings.mongodb_database)
        await client.close()

    history = {v["threadId"]: v["history"] for v in values(enriched)}
    assert {t: history[t].get("skipped", 0) for t in odd_threads} == dict.fromkeys(odd_threads, 1)
    assert "skipped" not in history["clean-1"]
    assert [v["threadId"] for v in values(persisted)] == ["clean-1"]
    [letter] = letters
    headers = parse_dead_letter_headers(letter.headers)
    assert headers.error_type == "UnreadableRowError"
    assert "'own-x'" in headers.error_message
    assert "createdAt" in headers.error_message


async def test_a_budgeted_recall_pages_past_a_skipped_row(storage: MongoHistoryStorage, mongo_db: Db) -> None:
    """Under a token budget, a thread whose newest page holds a skipped row is paged on: its first page came
    back a row short, which must not read as the end of the history (it did: 40 of 60 rows recalled)."""
    rows = [
        odd("long", id=f"long-{n:02d}", createdAt=T0 + timedelta(seconds=n), content=TEXT) for n in range(60)
    ]
    newest = odd("long", id="long-odd", content="5", createdAt=T0 + timedelta(seconds=70))
    await mongo_db[MESSAGES].insert_many([*rows, newest])
    paths = Paths(storage=storage)
    batch = await paths.recall(
        request("long", [user("long-q", "?", 100)], memory={"maxTokens": 1_000_000, "lastMessages": 100})
    )
    history = batch.event(0)["history"]
    assert history["recalled"] == 60
    assert history["skipped"] == 1
