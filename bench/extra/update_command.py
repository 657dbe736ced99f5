"""`python -m bench update-command`: a persist batch's writes through the driver's bulk and as one command.

    .venv/bin/python -m bench update-command [--turns 500] [--rounds 15] [--message-bytes 1000]

The statements are those `save_many` writes for `persist-batch`'s turns (each turn's two messages, new rows,
and its thread's `updatedAt`), planned once. Each round writes them into fresh collections twice, alternated
in one process: through PyMongo's `bulk_write` (an `UpdateOne` per statement, as the storage wrote before
`storage.update_command`) and through `update_statements` (one `update` command). The CPU of this process
(`time.process_time`, the server's is not in it) per statement is reported for each, best and median of the
rounds, so the two compare on one machine at one moment.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from pymongo import AsyncMongoClient

from bench.extra.persist_batch import batch_args, response_record
from bench.extra.persist_steps import saved_turns
from consumers.persist import _write_of
from message_history.app.process import tune_gc
from message_history.settings import Settings
from schemas.codec import decode_response
from storage.protocol import Thread
from storage.save_plan import plan_saves
from storage.update_command import Statement, as_operation, update_statements


def statements(turns: int, message_bytes: int, tag: str) -> tuple[list[Statement], list[Statement]]:
    """The messages' and the threads' statements of one batch (ids made unique by `tag`)."""
    raws = [response_record(f"{tag}t{n}", 3, message_bytes).value or b"" for n in range(turns)]
    events = [decode_response(raw) for raw in raws]
    at = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
    stored = {
        e.threadId: Thread(e.threadId, e.resourceId, "", {}, createdAt=at, updatedAt=at) for e in events
    }
    saves = saved_turns(events, [_write_of(e) for e in events])
    _, plan = plan_saves(saves, stored, now=datetime.now(UTC))
    messages = [w.op() for w in plan.messages.values()]
    threads = [w.op(t) for t, w in plan.threads.items()]
    return messages, threads


async def _run(turns: int, rounds: int, message_bytes: int) -> dict[str, Any]:
    tune_gc(Settings())
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(os.environ["MONGODB_URI"])
    db = client[f"bench_update_command_{uuid.uuid4().hex[:8]}"]
    spent: dict[str, list[float]] = {"bulk_write": [], "update_command": []}
    written = {"bulk_write": 0, "update_command": 0}
    count = 0
    try:
        await db.command("ping")

        async def driver(coll: str, ops: list[Statement]) -> None:
            await db[coll].bulk_write([as_operation(s) for s in ops], ordered=False)

        async def lean(coll: str, ops: list[Statement]) -> None:
            await update_statements(db[coll], ops, ordered=False)

        ways: list[tuple[str, Callable[[str, list[Statement]], Awaitable[None]]]] = [
            ("bulk_write", driver),
            ("update_command", lean),
        ]
        for n in range(rounds):
            for name, write in ways if n % 2 == 0 else ways[::-1]:
                messages, threads = statements(turns, message_bytes, f"{name}{n}-")
                count = len(messages) + len(threads)
                started = time.process_time()
                # as save_many issues them: the two bulks together
                await asyncio.gather(write(f"m_{name}", messages), write(f"t_{name}", threads))
                spent[name].append((time.process_time() - started) * 1e6 / count)
                written[name] += len(messages)
            print(f"[update-command] round {n + 1}/{rounds}", file=sys.stderr)
        for name, expected in written.items():  # both ways wrote every message: the same work timed
            stored = await db[f"m_{name}"].count_documents({})
            if stored != expected:
                raise RuntimeError(f"{name} stored {stored} messages of {expected}")
    finally:
        await client.drop_database(db.name)
        await client.close()
    return {
        "turns": turns,
        "rounds": rounds,
        "message_bytes": message_bytes,
        "statements_per_batch": count,
        "messages_stored": written,
        "cpu_us_per_statement": {
            name: {"best": round(min(v), 2), "median": round(statistics.median(v), 2)}
            for name, v in spent.items()
        },
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str]) -> int:
    args = batch_args(
        "update-command",
        __doc__,
        argv,
        turns=500,
        rounds=15,
        rounds_help="batches written each way, alternated",
    )
    print(json.dumps(asyncio.run(_run(args.turns, args.rounds, args.message_bytes))))
    return 0
