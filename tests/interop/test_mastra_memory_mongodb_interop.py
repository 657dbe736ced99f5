"""A Mastra app and the service alternating turns on one thread in one MongoDB database, under one budget.

Even turns run Mastra 1.71's Memory input pipeline on `@mastra/mongodb` (tests/interop/mastra-mongodb/
memory_turn.mjs: MessageHistory with the token limit, then the memory-only limiter writing
`thread.metadata.memoryTokenLimiter`), odd turns run ours on `MongoHistoryStorage`; each side reads the
boundary the other wrote. Every turn's context, trimmed ids and stored boundary must equal a run of the whole
conversation by one side alone (ours, in memory, which tests/interop/test_mastra_memory_interop.py checks
against Mastra's own run).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.budget import BOUNDARY_KEY, resolve_budget
from message_history.processor import MessageHistory
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from tests.interop.test_mastra_memory_interop import _one_assistant, _our_turns
from tests.interop.test_mastra_mongodb_interop import HERE, NODE_TIMEOUT_S, _node
from tests.memory_cases import conversation

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

Db = AsyncDatabase[dict[str, Any]]
MAX_TOKENS, AT_MAX = 600, 200


def _mastra_turn(uri: str, db_name: str, turn: list[dict[str, Any]]) -> dict[str, Any]:
    payload = {
        "threadId": "t",
        "resourceId": "r",
        "turn": turn,
        "lastMessages": False,
        "maxTokens": MAX_TOKENS,
        "atMaxRemoveTokens": AT_MAX,
    }
    result = subprocess.run(
        [_node(), "memory_turn.mjs", db_name],
        cwd=HERE,
        input=json.dumps(payload).encode(),
        capture_output=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
        env={**os.environ, "MONGODB_URI": uri},
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    out: dict[str, Any] = json.loads(result.stdout)
    return out


async def test_mastra_and_the_service_alternating_agree_on_the_boundary(mongo_uri: str, mongo_db: Db) -> None:
    """Turn by turn, whichever side runs it: the same context, trimmed ids and stored boundary."""
    _node()
    # one assistant message per turn: Mastra's MessageList folds consecutive assistant input (rules.md#r11)
    turns = [_one_assistant(t) for t in conversation(seed=5, turns=16)]
    budget = resolve_budget(MAX_TOKENS, AT_MAX)
    assert budget is not None
    expected = await _our_turns(turns, last_messages=False, budget=budget, systems=[])
    storage = MongoHistoryStorage(mongo_db)
    await storage.ensure_indexes()
    history = MessageHistory(storage=storage)
    boundaries = []
    trimmed_by: set[str] = set()
    for index, turn in enumerate(turns):
        if index % 2 == 0:
            got = _mastra_turn(mongo_uri, mongo_db.name, turn)
        else:
            messages = [Message.model_validate_json(json.dumps(m)) for m in turn]
            outcome = await history.recall(
                thread_id="t", resource_id="r", incoming=messages[:1], last_messages=False, budget=budget
            )
            await storage.save_messages(thread_id="t", resource_id="r", messages=messages)
            thread = await storage.get_thread("t")
            assert thread is not None
            got = {
                "context": [m.id for m, _ in outcome.context],
                "trimmed": outcome.trimmed,
                "boundary": thread.metadata.get(BOUNDARY_KEY),
            }
        want = expected[index]
        side = "mastra" if index % 2 == 0 else "ours"
        where = f"turn {index} ({side})"
        if got["trimmed"]:
            trimmed_by.add(side)
        assert sorted(got["context"]) == sorted(want["context"]), where
        assert sorted(got["trimmed"]) == sorted(want["trimmed"]), where
        if want["boundary"] is None:
            assert got["boundary"] is None, where
        else:
            assert got["boundary"] is not None, where
            assert {**got["boundary"], "messageIds": sorted(got["boundary"]["messageIds"])} == {
                **want["boundary"],
                "messageIds": sorted(want["boundary"]["messageIds"]),
            }, where
            boundaries.append(got["boundary"]["createdAt"])
    assert len(set(boundaries)) >= 3  # the boundary moved several times...
    assert trimmed_by == {"mastra", "ours"}  # ...written by both sides
