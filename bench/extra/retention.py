"""`python -m bench retention`: forget and prune throughput (rows/s) on a seeded database.

    eval "$(deploy/local/stack env)"
    .venv/bin/python -m bench retention --messages 100000 --per-thread 100 --per-resource 10

Seeds `--messages` messages in Mastra's layout (threads of `--per-thread`, resources of `--per-resource`
threads) into a fresh database, then times, on that data: `forget_resource` of a tenth of the resources,
`forget_thread` of a tenth of the remaining threads, and one `prune` of everything older than the cut-off
(the rest). Prints one JSON line per step; drops the database at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient

from schemas.commands import ForgetOutcome
from storage.documents import MESSAGES, THREADS
from storage.forgetting import MongoForgetting
from storage.mongodb import MongoHistoryStorage
from storage.pruning import MongoPruner

T0 = datetime(2025, 1, 1, tzinfo=UTC)


async def seed(db: Any, *, messages: int, per_thread: int, per_resource: int) -> tuple[list[str], list[str]]:
    threads = messages // per_thread
    thread_docs: list[dict[str, Any]] = []
    resources: list[str] = []
    for t in range(threads):
        resource = f"r{t // per_resource}"
        if not resources or resources[-1] != resource:
            resources.append(resource)
        at = T0 + timedelta(minutes=t)
        thread_docs.append(
            {"_id": f"t{t}", "id": f"t{t}", "resourceId": resource, "title": "", "metadata": {},
             "createdAt": at, "updatedAt": at + timedelta(seconds=per_thread)}
        )  # fmt: skip
    await db[THREADS].insert_many(thread_docs)
    batch: list[dict[str, Any]] = []
    for t in range(threads):
        for i in range(per_thread):
            mid = f"t{t}-m{i}"
            content = json.dumps({"format": 2, "parts": [{"type": "text", "text": f"message {i} " * 20}]})
            batch.append(
                {"_id": mid, "id": mid, "thread_id": f"t{t}", "resourceId": f"r{t // per_resource}",
                 "role": "user" if i % 2 == 0 else "assistant", "type": "v2", "content": content,
                 "createdAt": T0 + timedelta(minutes=t, seconds=i)}
            )  # fmt: skip
            if len(batch) >= 5000:
                await db[MESSAGES].insert_many(batch)
                batch = []
    if batch:
        await db[MESSAGES].insert_many(batch)
    return resources, [str(d["id"]) for d in thread_docs]


def line(step: str, rows: int, seconds: float, **extra: Any) -> None:
    rate = round(rows / seconds) if seconds > 0 else None
    print(json.dumps({"step": step, "rows": rows, "seconds": round(seconds, 3), "rows_per_s": rate, **extra}))


async def measure(args: argparse.Namespace) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGODB_URI"], tz_aware=True)
    db = client[f"measure_{uuid.uuid4().hex[:10]}"]
    try:
        started = time.perf_counter()
        await MongoHistoryStorage(db).ensure_indexes()
        resources, threads = await seed(
            db, messages=args.messages, per_thread=args.per_thread, per_resource=args.per_resource
        )
        line("seed", args.messages + len(threads), time.perf_counter() - started)

        forgetting = MongoForgetting(db)
        await forgetting.ensure_indexes()
        chosen = resources[: max(1, len(resources) // 10)]
        await _forget_each("forget --resource", chosen, forgetting.forget_resource)
        gone = set(chosen)
        left = [t for t in threads if f"r{int(t[1:]) // args.per_resource}" not in gone]
        await _forget_each("forget --thread", left[: max(1, len(left) // 10)], forgetting.forget_thread)

        pruner = MongoPruner(db, batch_size=args.batch_size)
        started = time.perf_counter()
        progress = await pruner.prune(datetime(2030, 1, 1, tzinfo=UTC))
        rows = progress.messages + progress.threads
        line("prune", rows, time.perf_counter() - started, batches=progress.batches, done=progress.done)
    finally:
        await client.drop_database(db.name)
        await client.close()


async def _forget_each(
    name: str, targets: list[str], forget: Callable[[str], Awaitable[ForgetOutcome]]
) -> None:
    """One forget per target, timed as one line (rows = messages + threads deleted)."""
    started, rows = time.perf_counter(), 0
    for target in targets:
        outcome = await forget(target)
        rows += outcome.deleted_messages + outcome.deleted_threads
    line(name, rows, time.perf_counter() - started, commands=len(targets))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench retention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-thread", type=int, default=100)
    parser.add_argument("--per-resource", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=1000)
    asyncio.run(measure(parser.parse_args(argv)))
    return 0
