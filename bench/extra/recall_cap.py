"""`python -m bench recall-cap`: how long one request's recall of n stored 1 KB rows takes (the row cap).

    .venv/bin/python -m bench recall-cap [--rows 1000,5000,10000,20000,50000] [--text 900] [--reps 3]

Against the server in `MONGODB_URI` (the local stack's SecantusDB by default): one thread of max(`--rows`)
rows of ~1 KB (one text part of `--text` characters, Mastra's layout, inserted directly after
`ensure_indexes`), then per n, `--reps` times, the two reads the recall path makes for one request of n rows:
the plain route (`recall_raw_many`, the rows' bytes, then `plain_rows`) and the model route (`list_messages`,
as a token-budgeted or echo-filtered recall reads). Prints min-max seconds per n and route, to compare with
`MESSAGE_HISTORY_MONGODB_TIMEOUT_MS` (`MESSAGE_HISTORY_MAX_ROWS_PER_REQUEST` should keep a recall well inside
it). The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from message_history.settings import Settings
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery

_T0 = datetime(2025, 1, 1, tzinfo=UTC)


async def _seed(storage: MongoHistoryStorage, rows: int, text: int) -> None:
    await storage.threads.insert_one(
        {"id": "t", "resourceId": "r", "title": "", "metadata": {}, "createdAt": _T0, "updatedAt": _T0}
    )
    content = json.dumps({"format": 2, "parts": [{"type": "text", "text": "x" * text}]})
    for start in range(0, rows, 5000):
        docs: list[dict[str, Any]] = [
            {
                "_id": f"m{i:07d}",
                "id": f"m{i:07d}",
                "thread_id": "t",
                "resourceId": "r",
                "role": "user" if i % 2 else "assistant",
                "type": "v2",
                "content": content,
                "createdAt": _T0 + timedelta(seconds=i),
            }
            for i in range(start, min(rows, start + 5000))
        ]
        await storage.messages.insert_many(docs, ordered=False)


async def measure(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench recall-cap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000,5000,10000,20000,50000", help="comma-separated row counts")
    parser.add_argument("--text", type=int, default=900, help="characters of text per row (default 900)")
    parser.add_argument("--reps", type=int, default=3, help="reads per row count and route (default 3)")
    args = parser.parse_args(argv)
    counts = sorted(int(n) for n in args.rows.split(","))
    settings = Settings(mongodb_database=f"bench_cap_{uuid.uuid4().hex[:8]}", mongodb_timeout_ms=600_000)
    results: dict[str, Any] = {"timeout_ms_default": Settings().mongodb_timeout_ms, "rows": {}}
    async with MongoHistoryStorage.open(settings) as storage:
        try:
            await _seed(storage, counts[-1], args.text)
            for n in counts:
                plain: list[float] = []
                models: list[float] = []
                for _ in range(args.reps):
                    started = time.perf_counter()
                    pages = await storage.recall_raw_many([RecallQuery("t", "r", n)])
                    assert len(storage.plain_rows(pages["t"])) == n
                    plain.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    assert len(await storage.list_messages("t", resource_id="r", limit=n)) == n
                    models.append(time.perf_counter() - started)
                results["rows"][n] = {
                    "plain_s": [min(plain), max(plain)],
                    "models_s": [min(models), max(models)],
                }
                print(
                    f"rows={n:>7}  plain {min(plain):.3f}-{max(plain):.3f}s  "
                    f"models {min(models):.3f}-{max(models):.3f}s",
                    flush=True,
                )
        finally:
            await storage.db.client.drop_database(settings.mongodb_database)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    print(json.dumps(asyncio.run(measure(argv))))
    return 0
