"""Interop with `@mastra/mongodb` itself: Mastra's store and ours share one database and one history.

`tests/interop/mastra-mongodb/store.mjs` runs Mastra's own `MongoDBStore` (pinned in package.json) against the
test's fresh database on the same server. A thread our storage wrote is listed by Mastra with the same ids,
order and content; a thread Mastra wrote is recalled by ours identically; both index sets coexist whichever
side creates them first.

The Node packages are installed by `deploy/local/stack install --all` (`npm ci`). Without them the tests are
skipped with the reason, except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.rules import build_context
from message_history.errors import ThreadOwnershipError
from message_history.processor import MessageHistory
from schemas.codec import encode
from schemas.events import EnrichedRequest
from schemas.messages import Message, format_timestamp
from schemas.recalled import RecalledRow, encode_enriched
from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery
from tests.infra import skip_or_fail
from tests.memory_cases import random_messages
from tests.recall_docs import request_for
from tests.rule_cases import CONTINUE_CASES, ContinueCase

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(180)]

HERE = Path(__file__).parent / "mastra-mongodb"
NODE_TIMEOUT_S = 120
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
Db = AsyncDatabase[dict[str, Any]]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _node() -> str:
    """The node binary, once @mastra/mongodb is installed; skip (fail under CI) otherwise."""
    node = shutil.which("node")
    reason = None
    if node is None:
        reason = "node is not on PATH"
    elif not (HERE / "node_modules" / "@mastra" / "mongodb").is_dir():
        reason = "tests/interop/mastra-mongodb/node_modules is missing (run `deploy/local/stack install`)"
    if reason is not None:
        skip_or_fail(reason)
    assert node is not None
    return node


class Mastra:
    """Mastra's `MongoDBStore` on one database, through store.mjs."""

    def __init__(self, uri: str, db_name: str) -> None:
        self.node = _node()
        self.uri = uri
        self.db_name = db_name

    def _run(self, *args: str, stdin: Any = None) -> Any:
        result = subprocess.run(
            [self.node, "store.mjs", self.db_name, *args],
            cwd=HERE,
            input=json.dumps(stdin).encode() if stdin is not None else b"",
            capture_output=True,
            timeout=NODE_TIMEOUT_S,
            check=False,
            env={**os.environ, "MONGODB_URI": self.uri},
        )
        assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
        return json.loads(result.stdout)

    def init(self) -> None:
        self._run("init")

    def list_thread(self, thread_id: str, resource_id: str | None = None) -> dict[str, Any]:
        return dict(self._run("list", thread_id, *([resource_id] if resource_id else [])))

    def save(self, messages: list[dict[str, Any]], thread: dict[str, Any] | None = None) -> list[str]:
        return list(self._run("save", stdin={"thread": thread, "messages": messages})["saved"])

    def persist(self, turn: dict[str, Any]) -> dict[str, Any]:
        """Mastra's `processOutputResult` on `turn` (threadId, resourceId, input, response, finishReason)."""
        return dict(self._run("persist", stdin=turn))


@pytest.fixture
def mastra(mongo_uri: str, mongo_db: Db) -> Mastra:
    return Mastra(mongo_uri, mongo_db.name)


@pytest_asyncio.fixture
async def ours(mongo_db: Db) -> MongoHistoryStorage:
    return MongoHistoryStorage(mongo_db)


def conversation(thread: str, resource: str, *, start: float = 0) -> list[Message]:
    """A turn-rich conversation: text, tool call and result, reasoning, file, data and unknown parts."""
    rows: list[dict[str, Any]] = [
        {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "Weather in Oslo?"}],
                                     "content": "Weather in Oslo?"}},
        {"role": "assistant", "content": {"format": 2, "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "reasoning": "need a tool",
             "details": [{"type": "text", "text": "need a tool"}]},
            {"type": "tool-invocation", "toolInvocation": {
                "state": "result", "toolCallId": "c1", "toolName": "weather", "args": {"city": "Oslo"},
                "result": {"tempC": -3}}},
            {"type": "text", "text": "It is -3 °C in Oslo. ❄️"},
        ], "toolInvocations": [{"state": "result", "toolCallId": "c1", "toolName": "weather",
                                "args": {"city": "Oslo"}, "result": {"tempC": -3}}],
            "metadata": {"model": "x", "nested": {"a": [1, 2]}}}},
        {"role": "user", "content": {"format": 2, "parts": [
            {"type": "file", "mimeType": "image/png", "data": "iVBORw0KGgo="},
            {"type": "data-chart", "data": {"series": [1, 2, 3]}},
            {"type": "future-part", "payload": {"kept": True}},
        ]}},
        {"role": "assistant", "content": {"format": 2, "parts": [{"type": "text", "text": "Nice chart."}]}},
    ]  # fmt: skip
    return [
        Message.model_validate(
            {
                "id": f"{thread}-m{i}",
                "threadId": thread,
                "resourceId": resource,
                "createdAt": at(start + i),
                **row,
            }
        )
        for i, row in enumerate(rows)
    ]


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message as Mastra's store returns it (the keys its row has), for comparing both sides."""
    keys = ("id", "role", "createdAt", "threadId", "resourceId", "type", "content")
    return {k: message[k] for k in keys if k in message}


async def test_a_thread_we_wrote_is_listed_by_mastra(ours: MongoHistoryStorage, mastra: Mastra) -> None:
    """Mastra's listMessages / getThreadById give our thread's messages with the same ids, order, content."""
    await ours.ensure_indexes()
    messages = conversation("t-ours", "r1")
    extra = messages[0].model_copy(update={"id": "t-ours-extra", "createdAt": at(10)})
    extra.__pydantic_extra__ = {"customTopLevel": {"x": [[1]]}}
    thread = await ours.save_messages(thread_id="t-ours", resource_id="r1", messages=[*messages, extra])

    listed = mastra.list_thread("t-ours", "r1")
    expected = [comparable(m.wire()) for m in [*messages, extra]]
    assert [comparable(m) for m in listed["messages"]] == expected
    assert listed["total"] == 5
    assert listed["thread"] == {
        "id": "t-ours",
        "resourceId": "r1",
        "title": "",
        "metadata": {},
        "createdAt": format_timestamp(thread.createdAt or T0),
        "updatedAt": format_timestamp(thread.updatedAt or T0),
    }
    assert mastra.list_thread("t-ours", "someone-else")["thread"] is None


async def test_a_thread_mastra_wrote_is_recalled_by_us(ours: MongoHistoryStorage, mastra: Mastra) -> None:
    """Our get_thread / list_messages return what Mastra's saveThread / saveMessages stored, unchanged."""
    mastra.init()
    messages = conversation("t-mastra", "r2", start=100)
    sent = [m.wire() for m in messages]
    thread = {
        "id": "t-mastra", "resourceId": "r2", "title": "Planning", "metadata": {"topic": "weather"},
        "createdAt": format_timestamp(at(99)), "updatedAt": format_timestamp(at(99)),
    }  # fmt: skip
    assert mastra.save(sent, thread) == [m["id"] for m in sent]

    recalled = await ours.list_messages("t-mastra", resource_id="r2", limit=40)
    assert [m.wire() for m in reversed(recalled)] == sent
    stored = await ours.get_thread("t-mastra")
    assert stored is not None
    assert (stored.resourceId, stored.title, stored.metadata) == ("r2", "Planning", {"topic": "weather"})
    assert stored.createdAt == at(99)
    # Mastra's saveMessages sets updatedAt to the wall clock; ours only moves it forward from there.
    later = conversation("t-mastra", "r2", start=200)[:1]
    after = await ours.save_messages(thread_id="t-mastra", resource_id="r2", messages=later)
    assert after.updatedAt == max(stored.updatedAt or T0, at(200))
    assert after.title == "Planning"


async def test_one_thread_written_by_both_sides(ours: MongoHistoryStorage, mastra: Mastra) -> None:
    """Turns saved by Mastra and by us (Mastra's re-saved by us too) form one history both list alike."""
    await ours.ensure_indexes()
    mastra.init()
    turn1, turn2 = conversation("t-both", "r3")[:2], conversation("t-both", "r3", start=50)[2:]
    turn2 = [m.model_copy(update={"id": f"late-{m.id}"}) for m in turn2]
    mastra.save([m.wire() for m in turn1], {
        "id": "t-both", "resourceId": "r3", "title": "t", "metadata": {},
        "createdAt": format_timestamp(T0), "updatedAt": format_timestamp(T0),
    })  # fmt: skip
    await ours.save_messages(thread_id="t-both", resource_id="r3", messages=turn2)
    await ours.save_messages(thread_id="t-both", resource_id="r3", messages=turn1)  # re-save Mastra's rows
    with pytest.raises(ThreadOwnershipError):
        await ours.save_messages(thread_id="t-both", resource_id="intruder", messages=turn2)

    from_mastra = [comparable(m) for m in mastra.list_thread("t-both", "r3")["messages"]]
    from_us = [
        comparable(m.wire())
        for m in reversed(await ours.list_messages("t-both", resource_id=None, limit=None))
    ]
    assert from_mastra == from_us
    assert [m["id"] for m in from_us] == [m.id for m in turn1 + turn2]


async def test_mastra_resaving_our_message_keeps_created_at_and_extras(
    ours: MongoHistoryStorage, mastra: Mastra, mongo_db: Db
) -> None:
    """Mastra's upsert of a message we wrote replaces content, keeps createdAt, leaves `_mh_extra` alone."""
    await ours.ensure_indexes()
    [first] = conversation("t-re", "r4")[:1]
    first.__pydantic_extra__ = {"customTopLevel": 1}
    await ours.save_messages(thread_id="t-re", resource_id="r4", messages=[first])
    changed = first.wire() | {"createdAt": format_timestamp(at(500))}
    changed["content"] = {"format": 2, "parts": [{"type": "text", "text": "edited"}]}
    changed.pop("customTopLevel")
    mastra.save([changed])
    [back] = await ours.list_messages("t-re", resource_id="r4", limit=None)
    assert back.createdAt == first.createdAt
    assert back.content.parts[0].model_dump() == {"type": "text", "text": "edited"}
    assert (back.model_extra or {}) == {"customTopLevel": 1}
    assert await mongo_db[MESSAGES].count_documents({}) == 1


async def _index_set(db: Db) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for collection in (MESSAGES, THREADS):
        for name, info in (await db[collection].index_information()).items():
            found[f"{collection}.{name}"] = {"key": info["key"], "unique": info.get("unique", False)}
    return found


@pytest.mark.parametrize("mastra_first", [True, False], ids=["mastra-init-first", "ours-first"])
async def test_index_creation_coexists_in_either_order(
    ours: MongoHistoryStorage, mastra: Mastra, mongo_db: Db, mastra_first: bool
) -> None:
    """Mastra's init() and our ensure_indexes() both succeed on one database, in either order, twice."""
    if mastra_first:
        mastra.init()
        await ours.ensure_indexes()
    else:
        await ours.ensure_indexes()
        mastra.init()
    first = await _index_set(mongo_db)
    mastra.init()
    await ours.ensure_indexes()
    assert await _index_set(mongo_db) == first
    assert first[f"{MESSAGES}.thread_id_1_createdAt_1_id_1"]["key"] == [
        ("thread_id", 1),
        ("createdAt", 1),
        ("id", 1),
    ]
    assert first[f"{MESSAGES}.id_1"]["unique"] is True
    assert first[f"{THREADS}.id_1"]["unique"] is True
    assert f"{THREADS}.resourceId_1_updatedAt_-1" in first


async def test_rows_mastra_wrote_are_spliced_as_the_model_path_reads_them(
    ours: MongoHistoryStorage, mastra: Mastra
) -> None:
    """The recall fast path over Mastra's own rows (`JSON.stringify`d content): the same enriched bytes as
    the model path, for messages of every part kind (tests/recall_docs.py compares both)."""
    mastra.init()
    sent = random_messages(14, 120)
    for i, message in enumerate(sent):
        message["id"] = f"mx{i:03d}"
        message["threadId"], message["resourceId"] = "t-fast", "r-fast"
    thread = {
        "id": "t-fast", "resourceId": "r-fast", "title": "", "metadata": {},
        "createdAt": format_timestamp(at(0)), "updatedAt": format_timestamp(at(0)),
    }  # fmt: skip
    assert mastra.save(sent, thread) == [m["id"] for m in sent]
    query = RecallQuery("t-fast", "r-fast", None)
    [models] = (await ours.list_messages_many([query])).values()
    [views] = (await ours.recall_rows_many([query])).values()
    assert len(models) == len(views) == len(sent)
    assert sum(1 for v in views if isinstance(v, RecalledRow)) > len(sent) // 2  # Mastra's rows are spliced
    for seed in range(20):
        request = request_for(seed, "t-fast", "r-fast", [m["id"] for m in sent])
        model_context = build_context(models[: 40 + seed], request.messages)
        view_context = build_context(views[: 40 + seed], request.messages)
        recalled = sum(1 for _, source in model_context if source == "memory")
        expected = encode(EnrichedRequest.from_request(request, model_context, recalled=recalled, limit=None))
        assert encode_enriched(request, view_context, recalled=recalled, limit=None) == expected


def _without_part_stamps(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts without the `createdAt` Mastra 1.71 stamps on every part a turn adds (`Date.now()`)."""
    return [{k: v for k, v in p.items() if k != "createdAt"} for p in parts]


def _row(id: str, role: str, thread: str, t: float, parts: list[dict[str, Any]]) -> Message:
    content = {"format": 2, "parts": parts}
    data = {
        "id": id,
        "role": role,
        "createdAt": at(t),
        "threadId": thread,
        "resourceId": "r5",
        "content": content,
    }
    return Message.model_validate(data)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CONTINUE_CASES])
async def test_a_response_folded_into_the_latest_assistant_has_mastras_parts(
    case: ContinueCase, ours: MongoHistoryStorage, mastra: Mastra
) -> None:
    """docs/rules.md#r11 against Mastra's own `processOutputResult`: the same stored thread, the same response
    (a new id, or the stored one's); the latest assistant message Mastra re-saves and ours hold the same
    parts."""
    await ours.ensure_indexes()
    parts_by_side: dict[str, list[dict[str, Any]]] = {}
    for side in ("mastra", "ours"):
        thread = f"t-fold-{side}"
        stored = [
            _row(f"{thread}-u1", "user", thread, 1, [{"type": "text", "text": "Go."}]),
            _row(f"{thread}-a1", "assistant", thread, 2, case.latest),
        ]
        await ours.save_messages(thread_id=thread, resource_id="r5", messages=stored)
        response = _row(f"{thread}-a{1 if case.same_id else 2}", "assistant", thread, 5, case.response)
        if side == "mastra":
            mastra.persist({"threadId": thread, "resourceId": "r5", "recall": 10, "input": [],
                            "response": [response.wire()], "finishReason": "stop"})  # fmt: skip
        else:
            await MessageHistory(storage=ours).persist_turn(
                thread_id=thread, resource_id="r5", input=[], response=[response]
            )
        listed = mastra.list_thread(thread, "r5")["messages"]
        assert [m["id"] for m in listed] == [f"{thread}-u1", f"{thread}-a1"]  # folded: no row of its own
        parts_by_side[side] = _without_part_stamps(listed[1]["content"]["parts"])
    assert parts_by_side["mastra"] == case.merged
    assert parts_by_side["ours"] == parts_by_side["mastra"]
