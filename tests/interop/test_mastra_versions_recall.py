"""Rows real Mastra versions wrote (tests/data/mastra_versions/) are recalled as Mastra 1.71 recalls them.

Each version's recorded `mastra_threads` / `mastra_messages` documents go into a fresh database on the
MongoDB-wire server as they were stored. Mastra 1.71 (`@mastra/core` 1.71 + `@mastra/mongodb` 1.19, the
pinned tests/interop/mastra-mongodb project) recalls every thread through its `MessageHistory` processor
(tests/interop/mastra-mongodb/recall.mjs: `lastMessages` N, then `MessageList`'s conversion: v1 rows, a
`tool` message folded into the assistant's tool invocation, and all); the service recalls the same threads
through its recall path on the same database (tests/paths.py over `MongoHistoryStorage`). The recalled
messages (`source: "memory"`) must be Mastra's, whole: ids, order, roles, `createdAt`, thread and resource,
`type`, and content (parts and every other content field). The one difference by design: the event tags
each message with `source` (docs/events.md), which Mastra's list does not have.

The corpus is re-recorded with tests/interop/record_mastra_rows.py
(docs/fuzzing.md#the-mastra-version-corpus).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.asynchronous.mongo_client import AsyncMongoClient

from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from tests.infra import unique_name
from tests.interop.test_mastra_mongodb_interop import HERE, NODE_TIMEOUT_S, _node
from tests.mastra_versions import Corpus, labels, load
from tests.paths import Paths, request, user

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

Db = AsyncDatabase[dict[str, Any]]
LIMITS = (1, 2, 3, None)  # lastMessages; None: every message (Mastra's `false`, ours a limit above the count)
ALL = 1000
BUDGETS = ((40, 10), (120, 40), (100_000, 0))  # (maxTokens, atMaxRemoveTokens)


def _mastra_recall(uri: str, db_name: str, queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result = subprocess.run(
        [_node(), "recall.mjs", db_name],
        cwd=HERE,
        input=json.dumps(queries).encode(),
        capture_output=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
        env={**os.environ, "MONGODB_URI": uri},
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    out: list[dict[str, Any]] = json.loads(result.stdout)
    return out


def _seen(message: dict[str, Any]) -> dict[str, Any]:
    """The message as compared: all of it but the event's own `source` tag."""
    return {k: v for k, v in message.items() if k != "source"}


async def _insert(db: Db, corpus: Corpus) -> None:
    await db[THREADS].insert_many(corpus.threads)
    await db[MESSAGES].insert_many(corpus.messages)


@pytest.mark.parametrize("label", labels())
async def test_the_service_recalls_what_mastra_1_71_recalls(label: str, mongo_uri: str, mongo_db: Db) -> None:
    """Every thread of the version, at several `lastMessages`: the service's recalled messages are Mastra
    1.71's, message for message."""
    _node()
    corpus = load(label)
    await _insert(mongo_db, corpus)
    queries = [
        {"threadId": t["id"], "resourceId": t["resourceId"], "lastMessages": n}
        for t in corpus.threads
        for n in LIMITS
    ]
    theirs = _mastra_recall(mongo_uri, mongo_db.name, queries)

    paths = Paths(storage=MongoHistoryStorage(mongo_db))
    for i, query in enumerate(queries):
        limit = query["lastMessages"] or ALL
        incoming = user(f"incoming-{i}", "next question", 10**8)  # after every stored row
        batch = await paths.recall(
            request(
                query["threadId"], [incoming], resource=query["resourceId"], memory={"lastMessages": limit}
            )
        )
        event = batch.event(0)
        ours = [m for m in event["messages"] if m["source"] == "memory"]
        expected = [_seen(m) for m in theirs[i]["messages"]]
        assert [_seen(m) for m in ours] == expected, f"{label} {query}"
        assert event["history"]["recalled"] == len(expected)


@pytest.mark.parametrize("label", labels())
async def test_with_a_token_budget_the_service_recalls_what_mastra_1_71_recalls(
    label: str, mongo_uri: str, mongo_db: Db, mongo_client: AsyncMongoClient[dict[str, Any]]
) -> None:
    """The same with Memory's token-limited recall (MessageHistory's token limit, then the memory-only
    limiter that trims and advances `thread.metadata.memoryTokenLimiter`): each side on its own copy of the
    rows, the same queries in the same order, so each side's stored boundaries evolve on their own. The
    recalled messages and the trimmed ids must be Mastra's."""
    _node()
    corpus = load(label)
    theirs_db = mongo_client[unique_name("t_")]
    try:
        await _insert(mongo_db, corpus)
        await _insert(theirs_db, load(label))
        queries: list[dict[str, Any]] = []
        for t in corpus.threads:
            for budget, remove in BUDGETS:
                i = len(queries)
                incoming = user(f"incoming-{i}", "next question", 10**8)
                query = {"threadId": t["id"], "resourceId": t["resourceId"], "lastMessages": None}
                queries.append({**query, "maxTokens": budget, "atMaxRemoveTokens": remove, "input": incoming})
        theirs = _mastra_recall(mongo_uri, theirs_db.name, queries)
        paths = Paths(storage=MongoHistoryStorage(mongo_db))
        for i, query in enumerate(queries):
            memory = {
                "lastMessages": ALL,
                "maxTokens": query["maxTokens"],
                "atMaxRemoveTokens": query["atMaxRemoveTokens"],
            }
            thread, resource = query["threadId"], query["resourceId"]
            batch = await paths.recall(request(thread, [query["input"]], resource=resource, memory=memory))
            event = batch.event(0)
            ours = [m for m in event["messages"] if m["source"] == "memory"]
            assert [_seen(m) for m in ours] == [_seen(m) for m in theirs[i]["messages"]], f"{label} {query}"
            assert sorted(event["history"].get("trimmed") or []) == sorted(theirs[i]["trimmed"]), query
    finally:
        await mongo_client.drop_database(theirs_db.name)
