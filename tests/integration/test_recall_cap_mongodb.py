"""The row cap on the recall path over the real server: the bytes route (a plain page decided on the rows'
bytes, MongoDB only) and the model route cut at the cap and say `history.truncated`, as the in-memory paths
do (tests/unit/test_paths_recall_cap.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from storage.mongodb import MongoHistoryStorage
from tests.paths import request as request_event
from tests.paths import user
from tests.unit.test_paths_recall_cap import CAP, HUGE, seeded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize(
    ("turns", "memory", "recalled", "truncated"),
    [
        pytest.param(60, {"lastMessages": HUGE}, CAP, True, id="plain-route-longer-thread"),
        pytest.param(50, {"lastMessages": HUGE}, CAP, False, id="plain-route-exactly-the-cap"),
        pytest.param(60, {"lastMessages": HUGE, "maxTokens": 10_000_000}, CAP, True, id="token-budget-pages"),
    ],
)
async def test_the_cap_over_mongodb(
    mongo_db: AsyncDatabase[dict[str, Any]],
    turns: int,
    memory: dict[str, Any],
    recalled: int,
    truncated: bool,
) -> None:
    storage = MongoHistoryStorage(mongo_db)
    await storage.ensure_indexes()
    paths = await seeded(turns, storage=storage)
    batch = await paths.recall(
        request_event("t1", [user("in", "next?", 100_000)], memory=memory, request_id="q")
    )
    event = batch.event(0)
    memory_ids = [m["id"] for m in event["messages"] if m["source"] == "memory"]
    every = [f"{kind}{i}" for i in range(turns) for kind in ("u", "a")]
    assert event["history"].get("truncated", False) is truncated
    assert len(memory_ids) <= recalled
    assert memory_ids == every[len(every) - len(memory_ids) :]  # the newest rows, oldest first
    if "maxTokens" not in memory:
        assert len(memory_ids) == recalled
