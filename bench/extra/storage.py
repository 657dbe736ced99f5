"""`python -m bench storage`: `MongoHistoryStorage` alone: recall latency, batch-recall strategies, persist.

    .venv/bin/python -m bench storage [--threads 10000] [--history 40] [--limit 40]
        [--recall-samples 20] [--batches 100,500] [--batch-reps 3] [--strategies in,concurrent]
        [--persist-batches 3] [--persist-docs 500] [--budget-s 300] [--db NAME] [--keep] [--json FILE]

Against the server in `MONGODB_URI` (the local stack's SecantusDB by default). Phases:

1. seed: a fresh database with `--threads` threads of `--history` messages each (alternating user / assistant,
   one text part of ~200 characters, distinct createdAt), written with `insert_many` in Mastra's layout after
   `ensure_indexes`: the rows `save_many` writes (`_id` = id), inserted directly so that seeding is fast.
2. recall: `list_messages(limit)` of random threads, one at a time: latency p50 / p99.
3. batch recall: `list_messages_many` for `--batches` random threads, with each strategy (`in`: one `$in`
   query; `concurrent`: one query per thread, 32 in flight): batch latency and per-thread cost.
4. persist: `save_many` batches of `--persist-docs` message documents (turns of a user and an assistant
   message appended to distinct existing threads): documents per second.

Every measurement stops at `--budget-s` seconds (a batch still running is cancelled and reported as such), so
a run on a slow server ends. A cancelled command may keep the server busy until it finishes, so persist first
times a 20-document probe and skips full batches that would outlast the budget. Results go to stdout as JSON
(and to `--json`); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from bench.stats import percentile
from schemas.messages import Message
from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery, SaveTurn

T0 = datetime(2025, 1, 1, tzinfo=UTC)
RESOURCE = "bench-user"
TEXT = "The quick brown fox jumps over the lazy dog while the storage benchmark measures recall. " * 2
_SEED_CHUNK = 5_000


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def summary_ms(seconds: list[float]) -> dict[str, float | int]:
    ms = [s * 1000 for s in seconds]
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    if p50 is None or p99 is None:
        raise ValueError("no samples")
    return {
        "samples": len(ms),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "max_ms": round(max(ms), 2),
    }


# --- seeding -----------------------------------------------------------------------------------------------


def thread_id(n: int) -> str:
    return f"bench-thread-{n:06d}"


def seed_rows(n: int, history: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Thread `n` and its messages as @mastra/mongodb stores them."""
    tid = thread_id(n)
    start = T0 + timedelta(seconds=n)
    rows = []
    for i in range(history):
        role = "user" if i % 2 == 0 else "assistant"
        content = {
            "format": 2,
            "parts": [{"type": "text", "text": f"{i}: {TEXT}"}],
            "content": f"{i}: {TEXT}",
        }
        rows.append(
            {
                "_id": f"{tid}-m{i:04d}",
                "id": f"{tid}-m{i:04d}",
                "thread_id": tid,
                "resourceId": RESOURCE,
                "role": role,
                "type": "v2",
                "content": json.dumps(content, separators=(",", ":")),
                "createdAt": start + timedelta(milliseconds=10 * i),
            }
        )
    thread = {
        "_id": tid,
        "id": tid,
        "resourceId": RESOURCE,
        "title": "",
        "metadata": {},
        "createdAt": start,
        "updatedAt": start + timedelta(milliseconds=10 * (history - 1)),
    }
    return thread, rows


async def seed(db: AsyncDatabase[Any], threads: int, history: int) -> float:
    started = time.perf_counter()
    await MongoHistoryStorage(db).ensure_indexes()
    thread_docs: list[dict[str, Any]] = []
    message_docs: list[dict[str, Any]] = []
    for n in range(threads):
        thread, rows = seed_rows(n, history)
        thread_docs.append(thread)
        message_docs.extend(rows)
        if len(message_docs) >= _SEED_CHUNK or n == threads - 1:
            await db[THREADS].insert_many(thread_docs, ordered=False)
            if message_docs:
                await db[MESSAGES].insert_many(message_docs, ordered=False)
            thread_docs.clear()
            message_docs.clear()
            if (n + 1) % 1000 == 0 or n == threads - 1:
                say(f"  seeded {n + 1}/{threads} threads ({time.perf_counter() - started:.0f}s)")
    return time.perf_counter() - started


# --- measuring ---------------------------------------------------------------------------------------------


async def timed_samples(
    make: Callable[[], Awaitable[Any]], count: int, budget_s: float
) -> tuple[list[float], str | None]:
    """Run `make()` up to `count` times within `budget_s`; the durations, and why it stopped early."""
    durations: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(durations) < count:
        left = deadline - time.perf_counter()
        if left <= 0:
            return durations, f"budget of {budget_s:.0f}s spent after {len(durations)} samples"
        started = time.perf_counter()
        try:
            await asyncio.wait_for(make(), timeout=left)
        except TimeoutError:
            return durations, f"one run took longer than the {left:.0f}s left of the budget; cancelled"
        durations.append(time.perf_counter() - started)
    return durations, None


async def bench_recall(
    storage: MongoHistoryStorage, threads: int, limit: int, samples: int, budget_s: float
) -> dict[str, Any]:
    rng = random.Random(1)  # noqa: S311 -- reproducible sampling

    async def one() -> None:
        page = await storage.list_messages(
            thread_id(rng.randrange(threads)), resource_id=RESOURCE, limit=limit
        )
        assert len(page) == limit or limit > len(page) > 0

    durations, stopped = await timed_samples(one, samples, budget_s)
    out: dict[str, Any] = summary_ms(durations) if durations else {"samples": 0}
    return out | ({"stopped": stopped} if stopped else {})


async def bench_batch_recall(
    db: AsyncDatabase[Any], threads: int, limit: int, batch: int, strategy: str, reps: int, budget_s: float
) -> dict[str, Any]:
    storage = MongoHistoryStorage(db, recall_strategy=strategy)  # type: ignore[arg-type]
    rng = random.Random(2)  # noqa: S311 -- reproducible sampling

    async def one() -> None:
        ids = rng.sample(range(threads), batch)
        pages = await storage.list_messages_many([RecallQuery(thread_id(n), RESOURCE, limit) for n in ids])
        assert all(len(page) == limit for page in pages.values())

    durations, stopped = await timed_samples(one, reps, budget_s)
    out: dict[str, Any] = {"strategy": strategy, "batch": batch}
    if durations:
        out |= summary_ms(durations)
        out["per_thread_ms"] = round(statistics.fmean(durations) * 1000 / batch, 3)
    else:
        out["samples"] = 0
    return out | ({"stopped": stopped} if stopped else {})


async def bench_persist(
    storage: MongoHistoryStorage, threads: int, docs: int, batches: int, budget_s: float, run: str
) -> dict[str, Any]:
    rng = random.Random(3)  # noqa: S311 -- reproducible sampling
    turns_per_batch = max(1, docs // 2)
    counter = 0

    def turn(n: int) -> SaveTurn:
        nonlocal counter
        counter += 1
        tid = thread_id(n)
        when = T0 + timedelta(days=1, milliseconds=counter)
        messages = [
            Message.model_validate(
                {
                    "id": f"{run}-{counter}-{role}",
                    "role": role,
                    "createdAt": when,
                    "content": {"format": 2, "parts": [{"type": "text", "text": f"{role}: {TEXT}"}]},
                }
            )
            for role in ("user", "assistant")
        ]
        return SaveTurn(tid, RESOURCE, messages)

    async def write(turns: int) -> None:
        ids = rng.sample(range(threads), min(turns, threads))
        results = await storage.save_many([turn(n) for n in ids])
        assert all(not isinstance(r, Exception) for r in results)

    out: dict[str, Any] = {"docs_per_batch": turns_per_batch * 2}
    # A cancelled bulk write may keep running on the server, so first time a small
    # probe and skip the full batches when they cannot finish within the budget.
    probe_turns = min(10, turns_per_batch)
    started = time.perf_counter()
    await write(probe_turns)
    probe_s = time.perf_counter() - started
    out["probe"] = {"docs": probe_turns * 2, "ms": round(probe_s * 1000, 1)}
    if probe_s * turns_per_batch / probe_turns > budget_s:
        out["samples"] = 0
        out["docs_per_s_from_probe"] = round(probe_turns * 2 / probe_s, 2)
        out["stopped"] = "a full batch would outlast the budget (extrapolated from the probe); not run"
        return out

    async def one() -> None:
        await write(turns_per_batch)

    durations, stopped = await timed_samples(one, batches, budget_s)
    if durations:
        out |= summary_ms(durations)
        out["docs_per_s"] = round(turns_per_batch * 2 / statistics.fmean(durations), 1)
    else:
        out["samples"] = 0
    return out | ({"stopped": stopped} if stopped else {})


# --- main --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench storage", description=__doc__.split("\n\n")[0])
    p.add_argument("--uri", default=os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017"))
    p.add_argument("--db", default=None, help="database name (default: a fresh bench_storage_<pid>)")
    p.add_argument("--keep", action="store_true", help="keep (and reuse, if seeded) the database")
    p.add_argument("--threads", type=int, default=10_000)
    p.add_argument("--history", type=int, default=40)
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--recall-samples", type=int, default=20)
    p.add_argument("--batches", default="100,500", help="batch-recall sizes, comma-separated")
    p.add_argument("--batch-reps", type=int, default=3)
    p.add_argument("--strategies", default="in,concurrent")
    p.add_argument("--persist-batches", type=int, default=3)
    p.add_argument("--persist-docs", type=int, default=500)
    p.add_argument("--budget-s", type=float, default=300.0, help="time budget of each measurement")
    p.add_argument("--json", default=None, help="also write the results to this file")
    return p.parse_args(argv)


async def measure(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    name = args.db or f"bench_storage_{os.getpid()}"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(args.uri, tz_aware=True)
    db = client[name]
    results: dict[str, Any] = {
        "command": " ".join(["python -m bench storage", *(argv if argv is not None else sys.argv[1:])]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "database": name,
        "workload": {"threads": args.threads, "history": args.history, "limit": args.limit},
    }
    try:
        build = await db.command("buildInfo")
        results["server"] = "SecantusDB" if "secantusVersion" in build else "MongoDB"
        results["server_version"] = build.get("version")
        seeded = await db[MESSAGES].estimated_document_count() if args.keep else 0
        if seeded == 0:
            await client.drop_database(name)
            say(f"seeding {args.threads} threads x {args.history} messages into {name}")
            results["seed_s"] = round(await seed(db, args.threads, args.history), 1)
        results["messages_in_collection"] = await db[MESSAGES].estimated_document_count()
        storage = MongoHistoryStorage(db)

        say("recall: list_messages, one thread at a time")
        results["recall"] = await bench_recall(
            storage, args.threads, args.limit, args.recall_samples, args.budget_s
        )
        say(f"  {results['recall']}")

        results["batch_recall"] = []
        for batch in (int(b) for b in args.batches.split(",") if b):
            for strategy in (s for s in args.strategies.split(",") if s):
                say(f"batch recall: {batch} threads, strategy {strategy}")
                row = await bench_batch_recall(
                    db, args.threads, args.limit, batch, strategy, args.batch_reps, args.budget_s
                )
                say(f"  {row}")
                results["batch_recall"].append(row)

        say(f"persist: save_many of {args.persist_docs} documents per batch")
        results["persist"] = await bench_persist(
            storage, args.threads, args.persist_docs, args.persist_batches, args.budget_s, f"p{os.getpid()}"
        )
        say(f"  {results['persist']}")
    finally:
        if not args.keep:
            await client.drop_database(name)
        await client.close()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return results


def main(argv: list[str]) -> int:
    asyncio.run(measure(argv))
    return 0
