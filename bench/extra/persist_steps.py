"""`python -m bench persist-steps`: a persist turn's pure steps alone, CPU per turn, in process (no I/O).

    .venv/bin/python -m bench persist-steps [--turns 500] [--rounds 7] [--message-bytes 1000]

The turns are `persist-batch`'s (a user message and an assistant reply of `--message-bytes` each, on threads
that exist). Each step runs over the batch of `--turns` as the persist path runs it, on the outputs of the
step before, and its best round's CPU (`time.process_time`, the collector as the service sets it) is divided
by the turns: the response's decode (`decode_response`), what the turn saves (`select_for_persistence` and
the turn's write, `consumers.persist._write_of`), the batch's plan (`plan_saves` against the stored threads:
the messages' fields, the content's JSON), the plan's update operations, their BSON (the update statements
the driver encodes, not its command framing), each turn's busy-marker update, and its outcome event
(`persisted_value`). Their sum is what our code spends on a turn before the driver, the event loop and the
clients: docs/benchmarks.md ("where a persist turn's CPU goes") sets it against the floor.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import bson

from bench.extra.persist_batch import batch_args, response_record
from consumers.persist import _write_of
from message_history.app.process import tune_gc
from message_history.core.persist_plan import TurnWrite
from message_history.core.rules import SkipReason
from message_history.settings import Settings
from schemas.codec import decode_response, persisted_value
from schemas.events import AgentResponse
from storage.protocol import SaveTurn, Thread
from storage.save_plan import plan_saves
from storage.turns import _answered_pipeline
from storage.update_command import Statement

T = TypeVar("T")


def _best(rounds: int, step: Callable[[], T]) -> tuple[float, T]:
    """The step's least CPU over `rounds` runs (seconds), and its last result."""
    best = float("inf")
    result: T | None = None
    for _ in range(rounds):
        started = time.process_time()
        result = step()
        best = min(best, time.process_time() - started)
    assert result is not None
    return best, result


def saved_turns(events: Sequence[AgentResponse], writes: Sequence[TurnWrite | SkipReason]) -> list[SaveTurn]:
    """What `save_many` is handed for the turns that write (`consumers.persist._write_of`'s writes)."""
    return [
        SaveTurn(w.thread_id, e.resourceId, w.messages)
        for w, e in zip(writes, events, strict=True)
        if isinstance(w, TurnWrite)
    ]


def run(turns: int, rounds: int, message_bytes: int) -> dict[str, Any]:
    """Each step's CPU per turn (us) over `turns` turns, the best of `rounds`; and their sum."""
    tune_gc(Settings())
    raws = [response_record(f"t{n}", 3, message_bytes).value or b"" for n in range(turns)]
    at = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
    stored = {f"t{n}": Thread(f"t{n}", "r1", "", {}, createdAt=at, updatedAt=at) for n in range(turns)}
    now = datetime.now(UTC)
    spent: dict[str, float] = {}

    spent["decode"], events = _best(rounds, lambda: [decode_response(raw) for raw in raws])
    spent["select"], writes = _best(rounds, lambda: [_write_of(event) for event in events])
    saves = saved_turns(events, writes)
    spent["plan"], (_, plan) = _best(rounds, lambda: plan_saves(saves, stored, now=now))

    def ops() -> list[Statement]:
        return [w.op() for w in plan.messages.values()] + [w.op(t) for t, w in plan.threads.items()]

    spent["ops"], updates = _best(rounds, ops)
    spent["bson"], _ = _best(rounds, lambda: [bson.encode(op) for op in updates])

    def markers() -> list[Any]:
        return [_answered_pipeline(e.threadId, [e.requestId], now) for e in events]

    def outcomes() -> list[bytes]:
        return [
            persisted_value(
                e, saved_ids=[m.id or "" for m in e.response], skipped=None, thread_updated_at=now
            )
            for e in events
        ]

    spent["marker_op"], _ = _best(rounds, markers)
    spent["outcome"], _ = _best(rounds, outcomes)
    per_turn = {step: round(seconds * 1e6 / turns, 2) for step, seconds in spent.items()}
    return {
        "turns": turns,
        "rounds": rounds,
        "message_bytes": message_bytes,
        "saved_turns": len(saves),
        "writes": len(updates),
        "cpu_us_per_turn": per_turn,
        "sum_us_per_turn": round(sum(per_turn.values()), 2),
    }


def main(argv: list[str]) -> int:
    args = batch_args(
        "persist-steps",
        __doc__,
        argv,
        turns=500,
        rounds=7,
        rounds_help="runs of each step; the least CPU is kept",
    )
    print(json.dumps(run(args.turns, args.rounds, args.message_bytes)))
    print("[persist-steps] done", file=sys.stderr)
    return 0
