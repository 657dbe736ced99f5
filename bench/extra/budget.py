"""`python -m bench budget`: recall with a token budget vs without (the recall path's batch work, no Kafka).

    .venv/bin/python -m bench budget [--threads 500] [--history 40] [--message-bytes 1024]
        [--rounds 7] [--budgets 100000,4000]

Seeds `--threads` threads of `--history` messages (alternating user / assistant, text of
`--message-bytes`, a tool call with its result on every other assistant message) on the server in
`MONGODB_URI`, then times what `consumers.recall.RecallHandler` does for one batch of one request per
thread: `PrefetchedHistory.load`, `PrefetchedHistory.recall` per request (decided from the batch's load,
its `CountCache` shared), `flush()`.
Lines: no budget (`lastMessages` 40), then each `maxTokens` (tokens only, no count cap), interleaved round
by round so that load on a shared machine falls on every line alike; recall is read-only, so every round
sees the same history. Prints the median per batch, per request, the ratio to the unbudgeted line, the
messages recalled per request and the page rounds after the first. Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import AsyncMongoClient

from consumers.prefetch import PrefetchedHistory
from message_history.core.budget import TokenBudget, resolve_budget
from message_history.core.memory_options import TurnMemory
from message_history.core.recall_plan import plan_recall
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery, SaveTurn

T0 = datetime(2025, 1, 1, tzinfo=UTC)
WORDS = "lorem ipsum dolor sit amet, consectetur adipiscing elit; sed do eiusmod tempor. "
SEED_CHUNK = 50


def _text(size: int) -> str:
    return (WORDS * (size // len(WORDS) + 1))[:size]


def _thread(index: int, history: int, body: str) -> SaveTurn:
    messages = []
    for i in range(history):
        role = "user" if i % 2 == 0 else "assistant"
        parts: list[dict[str, Any]] = [{"type": "text", "text": body}]
        if i % 4 == 1:
            invocation = {"state": "result", "toolCallId": f"c{index}-{i}", "toolName": "f", "args": {"q": i},
                          "result": {"ok": True}}  # fmt: skip
            parts.append({"type": "tool-invocation", "toolInvocation": invocation})
        messages.append(
            Message.model_validate(
                {
                    "id": f"t{index}-m{i:04d}",
                    "role": role,
                    "createdAt": T0 + timedelta(seconds=i),
                    "content": {"format": 2, "parts": parts},
                }
            )
        )
    return SaveTurn(f"t{index}", "u", messages)


async def _seed(storage: MongoHistoryStorage, threads: int, history: int, size: int) -> None:
    body = _text(size)
    for start in range(0, threads, SEED_CHUNK):
        await storage.save_many(
            [_thread(i, history, body) for i in range(start, min(start + SEED_CHUNK, threads))]
        )
        print(f"seeded {min(start + SEED_CHUNK, threads)}/{threads} threads", file=sys.stderr)


async def _batch(
    storage: MongoHistoryStorage, threads: int, budget: TokenBudget | None
) -> tuple[float, int, int]:
    """One batch: (seconds, messages recalled, page rounds after the first)."""
    incoming = [Message.model_validate({"id": "in", "role": "user", "createdAt": T0 + timedelta(days=1),
                                        "content": "next question?"})]  # fmt: skip
    limit = None if budget is not None else 40
    started = time.perf_counter()
    view = await PrefetchedHistory.load(  # raw: the byte reads the service wires (the unbudgeted pages)
        storage, [RecallQuery(f"t{i}", "u", limit, budget) for i in range(threads)], raw=storage
    )
    memory = TurnMemory(False if budget is not None else 40, budget, read_only=True, retain_full_input=True)
    recalled = 0
    for i in range(threads):
        outcome = await view.recall(plan_recall(f"t{i}", "u", memory, None), incoming, None, read_only=True)
        recalled += outcome.recalled
    await view.flush()
    return time.perf_counter() - started, recalled, view.page_rounds


async def run(args: argparse.Namespace) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGODB_URI"], tz_aware=True)
    db = client[f"bench_budget_{os.getpid()}"]
    storage = MongoHistoryStorage(db)
    await storage.ensure_indexes()
    try:
        await _seed(storage, args.threads, args.history, args.message_bytes)
        lines: list[tuple[str, TokenBudget | None]] = [("no budget (lastMessages 40)", None)]
        for value in args.budgets.split(","):
            lines.append((f"maxTokens {value}", resolve_budget(float(value), None)))
        times: dict[str, list[float]] = {label: [] for label, _ in lines}
        seen: dict[str, tuple[int, int]] = {}
        for r in range(args.rounds):
            for label, budget in lines:
                elapsed, recalled, rounds = await _batch(storage, args.threads, budget)
                times[label].append(elapsed)
                seen[label] = (recalled, rounds)
                print(f"round {r + 1}/{args.rounds} {label}: {elapsed * 1000:.0f} ms", file=sys.stderr)
        base = statistics.median(times[lines[0][0]])
        for label, _ in lines:
            median = statistics.median(times[label])
            recalled, rounds = seen[label]
            print(
                f"{label:30s} {median * 1000:7.0f} ms/batch of {args.threads}"
                f"  {median / args.threads * 1e6:6.0f} µs/request  x{median / base:5.2f}"
                f"  recalled/request {recalled / args.threads:5.1f}  page rounds after the first {rounds}"
            )
    finally:
        await client.drop_database(db.name)
        await client.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=500)
    parser.add_argument("--history", type=int, default=40)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budgets", default="100000,4000", help="comma-separated maxTokens values")
    asyncio.run(run(parser.parse_args(argv)))
    return 0
