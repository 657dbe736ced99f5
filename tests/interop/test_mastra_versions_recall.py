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

from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from tests.interop.test_mastra_mongodb_interop import HERE, NODE_TIMEOUT_S, _node
from tests.mastra_versions import Corpus, labels, load
from tests.paths import Paths, request, user

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

Db = AsyncDatabase[dict[str, Any]]
LIMITS = (1, 2, 3, None)  # lastMessages; None: every message (Mastra's `false`, ours a limit above the count)
ALL = 1000


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
