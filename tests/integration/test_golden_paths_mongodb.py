"""The golden outputs (tests/golden.py) over the MongoDB storage: the recall and persist paths give the same
bytes against the real server as over the in-memory storage they were recorded on (the server-side routes,
e.g. the recall's raw-row fast path, are where the issue-25 rewrite goes native)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from tests.golden import first_difference, load, run_case_async, summary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


async def test_every_case_gives_the_recorded_bytes_over_mongodb(
    mongo_db: AsyncDatabase[dict[str, Any]],
) -> None:
    storage = MongoHistoryStorage(mongo_db)
    await storage.ensure_indexes()
    entries = load()
    differing: list[tuple[str, str]] = []
    for entry in entries:
        await mongo_db[THREADS].delete_many({})
        await mongo_db[MESSAGES].delete_many({})
        found = first_difference(entry["output"], await run_case_async(entry["case"], storage))
        if found is not None:
            differing.append((entry["case"]["id"], found))
    assert not differing, summary(differing, len(entries))
