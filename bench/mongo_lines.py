"""B2 and B3: the MongoDB work of each path alone, batch after batch, with the service's own storage code.

* B2 (recall): per batch of `batch` threads, what the recall path's prefetch does: `get_threads` and
  `list_messages_many` issued together (`PrefetchedHistory.load`), documents decoded into `Message`s.
* B3 (persist): per batch of `batch` turns, the persist path's write: one `save_many` (its ownership `find`,
  then the unordered bulk upserts of the messages and of the threads), for the same two messages per turn
  the service saves.

One batch at a time, as the service's loop does per path. Latency samples are whole batch round trips.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from pymongo import AsyncMongoClient

from bench.processes import END, START
from bench.procstat import peak_rss_bytes
from bench.progress import Progress
from bench.workload import Workload, turn_message
from consumers.prefetch import PrefetchedHistory
from message_history.settings import Settings
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery, SaveTurn
from storage.sequential import as_batch_storage


async def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run B2 (`config["kind"] == "b2"`) or B3 for `config["events"]` events or `config["seconds"]`."""
    settings = Settings()
    w = Workload(**config["workload"])
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        settings.mongodb_uri.get_secret_value(), tz_aware=True
    )
    storage = as_batch_storage(MongoHistoryStorage(client[config["db"]]))
    events, seconds, kind = config["events"], config["seconds"], config["kind"]
    latencies: list[float] = []
    done = 0
    recalled = 0
    wall = cpu = 0.0
    progress = Progress(kind.upper())
    print(START, file=sys.stderr, flush=True)
    try:
        while done < events and wall < seconds:
            indexes = range(done, min(done + w.batch, events))
            # inputs are built outside the timed part: only the MongoDB work and its decoding count
            queries = [RecallQuery(w.thread_id(i), w.resource_id(i), w.history) for i in indexes]
            turns = [_turn(w, i, config["turn"]) for i in indexes] if kind == "b3" else []
            t0, c0 = time.perf_counter(), time.process_time()
            if kind == "b2":
                history = await PrefetchedHistory.load(storage, queries)
            else:
                await storage.save_many(turns)
            elapsed = time.perf_counter() - t0
            wall, cpu = wall + elapsed, cpu + time.process_time() - c0
            latencies.append(elapsed * 1000)
            done += len(indexes)
            progress.update(done, events)
            if kind == "b2":
                for query in queries:  # answered from the prefetch: no query, a check that it recalled
                    page = await history.list_messages(
                        query.thread_id, resource_id=query.resource_id, limit=query.limit
                    )
                    recalled += len(page)
    finally:
        print(END, file=sys.stderr, flush=True)
        await client.close()
    return {
        "events": done,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_bytes": peak_rss_bytes(os.getpid()),
        "latencies_ms": latencies,
        "details": {"batches": len(latencies), "batch": w.batch, "recalled_messages": recalled},
    }


def _turn(w: Workload, i: int, turn: int) -> SaveTurn:
    messages = [Message.model_validate(turn_message(w, i, turn, role=role)) for role in ("user", "assistant")]
    return SaveTurn(thread_id=w.thread_id(i), resource_id=w.resource_id(i), messages=messages)
