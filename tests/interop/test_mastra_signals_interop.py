"""Transient signals: a Mastra 1.71 app on `@mastra/mongodb` and this service leave the same rows.

Mastra's side is its own `MessageHistory` output step on its own `MongoDBStore`
(tests/interop/mastra-mongodb/store.mjs `persist`); ours is `MessageHistory.persist_turn` on
`MongoHistoryStorage`, in a second database on the same server. Mastra's `listMessages` must list the same
rows from both, turn by turn: transient signals left out of input and response, a turn of nothing else
creating no thread, a failed turn whose only output is one still saving its input (docs/rules.md#r7, #r8).
Token-budgeted recall over a thread holding a stored transient signal skips it on both sides
(memory_turn.mjs).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.budget import resolve_budget
from message_history.processor import MessageHistory
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from tests import infra
from tests.interop.test_mastra_memory_mongodb_interop import _mastra_turn
from tests.interop.test_mastra_mongodb_interop import Mastra, _node, at, comparable

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(180)]

Db = AsyncDatabase[dict[str, Any]]
RESOURCE = "r"
TRANSIENT = {"signal": {"type": "reactive", "tagName": "system-reminder", "transient": True}}
KEPT = {"signal": {"type": "notification", "tagName": "notification"}}


def _message(id: str, role: str, seconds: float, *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    content: dict[str, Any] = {"format": 2, "parts": [{"type": "text", "text": f"{role} {id}"}]}
    created = at(seconds).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if metadata is not None:
        # a signal as Mastra's own MessageList writes it: its times in `metadata.signal`
        signal = {**metadata["signal"], "createdAt": created, "acceptedAt": created}
        content["metadata"] = {**metadata, "signal": signal}
    return {"id": id, "role": role, "createdAt": created, "content": content}


def _cases() -> list[dict[str, Any]]:
    """Turns on threads of their own: (thread, input, response, finishReason)."""
    return [
        {
            "threadId": "t-mixed",
            "input": [
                _message("u1", "user", 1),
                _message("in-transient", "signal", 2, metadata=TRANSIENT),
                _message("in-kept", "signal", 3, metadata=KEPT),
            ],
            "response": [
                _message("out-transient", "signal", 4, metadata=TRANSIENT),
                _message("a1", "assistant", 5),
                _message("out-string-true", "signal", 6, metadata={"signal": {"transient": "true"}}),
            ],
            "finishReason": "stop",
        },
        {
            "threadId": "t-only",
            "input": [],
            "response": [_message("only-transient", "signal", 4, metadata=TRANSIENT)],
            "finishReason": "stop",
        },
        {
            "threadId": "t-failed",
            "input": [_message("u3", "user", 1)],
            "response": [_message("failed-transient", "signal", 4, metadata=TRANSIENT)],
            "finishReason": "error",
        },
    ]


@pytest_asyncio.fixture
async def ours_db(mongo_client: AsyncMongoClient[dict[str, Any]]) -> AsyncIterator[Db]:
    """A second fresh database on the same server: message ids are unique per database."""
    name = infra.unique_name("t_")
    try:
        yield mongo_client[name]
    finally:
        await mongo_client.drop_database(name)


def _row(message: dict[str, Any]) -> dict[str, Any]:
    """`comparable(message)` without the parts' `createdAt`: Mastra's MessageList stamps the wall clock on
    every part it is given, which a worker's messages carry already and which says nothing about signals."""
    row = comparable(message)
    parts = [{k: v for k, v in part.items() if k != "createdAt"} for part in row["content"]["parts"]]
    return {**row, "content": {**row["content"], "parts": parts}}


def _models(messages: list[dict[str, Any]]) -> list[Message]:
    return [Message.model_validate_json(json.dumps(m)) for m in messages]


async def test_a_turn_with_transient_signals_leaves_mastras_rows(
    mongo_uri: str, mongo_db: Db, ours_db: Db
) -> None:
    """Mastra lists the same rows (and thread or none) from its own save and ours, case by case."""
    _node()
    storage = MongoHistoryStorage(ours_db)
    await storage.ensure_indexes()
    history = MessageHistory(storage=storage)
    mastra, listing = Mastra(mongo_uri, mongo_db.name), Mastra(mongo_uri, ours_db.name)
    for case in _cases():
        thread_id = case["threadId"]
        theirs = mastra.persist({**case, "resourceId": RESOURCE})
        outcome = await history.persist_turn(
            thread_id=thread_id,
            resource_id=RESOURCE,
            input=_models(case["input"]),
            response=_models(case["response"]),
            finish_reason=case["finishReason"],
        )
        mine = listing.list_thread(thread_id)
        assert [_row(m) for m in mine["messages"]] == [_row(m) for m in theirs["messages"]], thread_id
        assert outcome.saved_ids == [m["id"] for m in theirs["messages"]], thread_id
        assert (mine["thread"] is None) is (theirs["thread"] is None), thread_id
        assert outcome.skipped == (None if theirs["messages"] else "nothing-to-save"), thread_id
    # the cases do exercise both outcomes
    assert outcome.saved_ids == ["u3"]


async def test_token_limited_recall_skips_a_stored_transient_signal_on_both_sides(
    mongo_uri: str, mongo_db: Db, ours_db: Db
) -> None:
    """Over the same stored rows (one a transient signal), Mastra's budgeted recall and ours load the same."""
    _node()
    stored = [
        _message("h1", "user", 1),
        _message("h2", "signal", 2, metadata=TRANSIENT),
        _message("h3", "assistant", 3),
    ]
    for db in (mongo_db, ours_db):
        rows = _models([{**m, "threadId": "t", "resourceId": "r"} for m in stored])
        await MongoHistoryStorage(db).save_messages(thread_id="t", resource_id="r", messages=rows)
    turn = [{**_message("h4", "user", 10), "threadId": "t", "resourceId": "r"}]
    theirs = _mastra_turn(mongo_uri, mongo_db.name, turn)
    budget = resolve_budget(600, 200)  # what _mastra_turn asks Mastra for
    outcome = await MessageHistory(storage=MongoHistoryStorage(ours_db)).recall(
        thread_id="t", resource_id="r", incoming=_models(turn), last_messages=False, budget=budget
    )
    assert sorted(m.id or "" for m, _ in outcome.context) == sorted(theirs["context"]) == ["h1", "h3", "h4"]
