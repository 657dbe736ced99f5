"""Seeding: every thread's history written straight into MongoDB in @mastra/mongodb's layout (bulk inserts).

The indexes are the service's own (`MongoHistoryStorage.ensure_indexes`: Mastra's plus recall's), created
before the rows, so every line reads and writes the same indexed collections.
"""

from __future__ import annotations

from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from bench.progress import Progress
from bench.workload import Json, Workload, seed_documents
from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage

_CHUNK_DOCS = 5000


async def seed(db: AsyncDatabase[Any], w: Workload) -> dict[str, Any]:
    """Insert `w.threads` threads with `w.history` messages each; returns what was written."""
    await MongoHistoryStorage(db).ensure_indexes()
    progress = Progress("seed MongoDB")
    threads: list[Json] = []
    messages: list[Json] = []
    written = 0
    total = w.threads * (w.history + 1)
    for i in range(w.threads):
        thread, rows = seed_documents(w, i)
        threads.append(thread)
        messages.extend(rows)
        if len(messages) >= _CHUNK_DOCS:
            written += await _flush(db, threads, messages)
            progress.update(written, total)
    written += await _flush(db, threads, messages)
    progress.update(written, total, force=True)
    return {"threads": w.threads, "messages": w.threads * w.history, "docs": written}


async def _flush(db: AsyncDatabase[Any], threads: list[Json], messages: list[Json]) -> int:
    count = len(threads) + len(messages)
    if threads:
        await db[THREADS].insert_many(threads, ordered=False)
    if messages:
        await db[MESSAGES].insert_many(messages, ordered=False)
    threads.clear()
    messages.clear()
    return count
