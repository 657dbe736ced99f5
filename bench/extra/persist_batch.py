"""`python -m bench persist-batch`: one persist batch's wall time in process (MongoDB, no Kafka), by step.

    .venv/bin/python -m bench persist-batch [--turns 30] [--rounds 80] [--message-bytes 1000]

What the persist path's p99 at half capacity queues behind (docs/benchmarks.md): `PersistHandler.handle`
wired as the service wires it (tombstones, busy markers, the batch's reads handed to the write) on the server
in `MONGODB_URI` (a database of its own, dropped at the end), for batches of `--turns` new turns (a user
message and an assistant reply each) on as many existing threads, the batch size the open-loop latency
phase sees. Prints, per batch: the median, p90 and mean wall time, the median CPU per turn of this process
(the client's side alone: decode, decision, the driver, the event loop), the MongoDB commands (command
monitoring) and the median of each storage step (the load's reads, the tombstones, the save, its bulk
writes, the busy markers). Run it in two checkouts one after the other, several times (A/B): the figures are
wall times on a shared machine. Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from pymongo import AsyncMongoClient, monitoring

from consumers.contract import Done, Record
from consumers.persist import PersistHandler
from message_history.app.process import tune_gc
from message_history.settings import Settings
from producers.persisted import PersistedPublisher
from storage.forgetting import MongoForgetting
from storage.mongodb import MongoHistoryStorage
from storage.turns import MongoTurnMarkers

WARM_UP = 2  # batches before the timed ones (connections open, indexes warm)


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.started_count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.started_count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@dataclass(frozen=True)
class _Record:
    key: bytes | None
    value: bytes | None
    topic: str = "agent.responses"
    partition: int = 0
    offset: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


class _Publisher:
    """The outcomes acknowledged at once: no Kafka in the batch's time."""

    async def publish_value(
        self, emit: Any, record: Any, thread_id: str, value: bytes, *, headers: Any
    ) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def _no_emit(*_: Any, **__: Any) -> asyncio.Future[None]:
    raise AssertionError("the bench's publisher sends nothing")  # `_Publisher` ignores its channel


def response_record(thread: str, turn: int, size: int) -> _Record:
    """The bench's turn on `thread`: a user message and an assistant reply of `size` characters each (also
    `persist-steps`' turns)."""

    def message(role: str, n: int) -> dict[str, Any]:
        second = 2 * turn + n
        hours, minutes, seconds = 10 + second // 3600, second // 60 % 60, second % 60
        return {
            "id": f"{thread}-{turn}-{role}",
            "role": role,
            "createdAt": f"2025-03-01T{hours:02d}:{minutes:02d}:{seconds:02d}.000Z",
            "content": {"format": 2, "parts": [{"type": "text", "text": f"{role} {turn} " + "x" * size}]},
        }

    event = {
        "schemaVersion": 1,
        "requestId": f"{thread}-{turn}",
        "threadId": thread,
        "resourceId": "r1",
        "createdAt": "2025-03-01T10:00:00.000Z",
        "input": [message("user", 0)],
        "response": [message("assistant", 1)],
        "finishReason": "stop",
    }
    return _Record(thread.encode(), json.dumps(event).encode())


def _timed(spent: dict[str, list[float]], label: str, call: Callable[..., Awaitable[Any]]) -> Any:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        finally:
            spent.setdefault(label, []).append((time.perf_counter() - started) * 1000)

    return timed


async def run(args: argparse.Namespace) -> dict[str, Any]:
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        os.environ["MONGODB_URI"], event_listeners=[commands]
    )
    db = client[f"bench_persist_batch_{uuid.uuid4().hex[:8]}"]
    spent: dict[str, list[float]] = {}
    try:
        storage = MongoHistoryStorage(db)
        await storage.ensure_indexes()
        forgetting = MongoForgetting(db)
        markers = MongoTurnMarkers(db)
        # each storage step timed where it is called (a step this checkout lacks is not listed)
        for name in ("read_with_copies", "read_for_saves", "save_many", "_record_bulk_write"):
            if hasattr(storage, name):
                setattr(storage, name, _timed(spent, name, getattr(storage, name)))
        forgetting.tombstones = _timed(spent, "tombstones", forgetting.tombstones)  # type: ignore[method-assign]
        markers.answered = _timed(spent, "markers", markers.answered)  # type: ignore[method-assign]
        tune_gc(Settings())  # the collector as the service sets it
        handler = PersistHandler(
            Settings(),
            storage,
            cast(PersistedPublisher, _Publisher()),
            tombstones=forgetting,
            markers=markers,
            save_reads=storage,
        )
        threads = [f"t{n}" for n in range(args.turns)]
        times: list[float] = []
        cpu_us: list[float] = []  # this process's CPU per turn (the client side: models, driver, loop)
        sent: list[int] = []
        for turn in range(WARM_UP + args.rounds):
            records = [response_record(thread, turn, args.message_bytes) for thread in threads]
            before, started, cpu = commands.started_count, time.perf_counter(), time.process_time()
            results = await handler.handle(cast(list[Record], records), _no_emit)
            await asyncio.gather(*(cast(Done, result).sent for result in results))
            if turn >= WARM_UP:
                times.append((time.perf_counter() - started) * 1000)
                cpu_us.append((time.process_time() - cpu) * 1e6 / args.turns)
                sent.append(commands.started_count - before)
            print(f"[persist-batch] {turn + 1}/{WARM_UP + args.rounds}", end="\r", file=sys.stderr)
        print(file=sys.stderr)
        times.sort()
        return {
            "turns": args.turns,
            "rounds": args.rounds,
            "median_ms": round(statistics.median(times), 2),
            "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2),
            "mean_ms": round(statistics.mean(times), 2),
            "cpu_us_per_turn": round(statistics.median(cpu_us), 1),
            "commands_per_batch": statistics.median(sent),
            "step_median_ms": {k: round(statistics.median(v[WARM_UP:] or v), 2) for k, v in spent.items()},
            "load_average": os.getloadavg()[0],
        }
    finally:
        await client.drop_database(db.name)
        await client.close()


def batch_args(
    command: str, doc: str | None, argv: list[str], *, turns: int, rounds: int, rounds_help: str
) -> argparse.Namespace:
    """The options of the persist-batch family of side measurements (`persist-batch`, `persist-steps`,
    `update-command`): turns per batch, rounds, text per message. No turns or no rounds would time nothing:
    a usage error, not an assertion deep in the run."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench {command}", description=doc.split("\n\n")[0] if doc else None
    )
    parser.add_argument("--turns", type=int, default=turns, help="turns per batch, each on its own thread")
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    parser.add_argument("--message-bytes", type=int, default=1000, help="text per message")
    args = parser.parse_args(argv)
    if args.turns < 1 or args.rounds < 1 or args.message_bytes < 0:
        parser.error("--turns and --rounds must be at least 1, --message-bytes not negative")
    return args


def main(argv: list[str]) -> int:
    args = batch_args("persist-batch", __doc__, argv, turns=30, rounds=80, rounds_help="timed batches")
    print(json.dumps(asyncio.run(run(args))))
    return 0
