"""The anchor lines: Mastra's `MessageHistory` in Node (`bench/mastra/bench.mjs`), on the same turns.

`mastra_recall` / `mastra_persist`: `processInput` / `processOutputResult` over `@mastra/mongodb` on the same
database as the service. `mastra_memory`: the whole turn (one recall, one save) on Mastra's `InMemoryStore`
seeded with the same history, no database: the library's own cost per turn, the per-core anchor.

Node and the pinned packages come from `bench/mastra/` (`npm ci` there; the harness runs it once when
`node_modules` is missing). The CPU figure is the Node process's own (user + system), so "per core" compares
like with like: the service's process against Mastra's, neither counting the database server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from bench import processes
from bench.context import REPO, RunContext
from bench.progress import log
from bench.stats import LineResult
from bench.workload import Workload, stored_messages, turn_message

MASTRA_DIR = REPO / "bench" / "mastra"
WARMUP_TURNS = 300  # one per thread at most, so a warm-up turn never repeats an id
WARMUP_SECONDS = 5.0


def ensure_installed() -> str | None:
    """None when Node and the pinned packages are ready; else why the anchor cannot run."""
    if shutil.which("node") is None:
        return "node is not installed"
    if (MASTRA_DIR / "node_modules" / "@mastra" / "core").is_dir():
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (needed once: npm ci in bench/mastra)"
    log("installing the pinned Mastra packages (npm ci in bench/mastra)")
    done = subprocess.run(  # noqa: S603 -- a fixed command
        [npm, "ci", "--no-audit", "--no-fund"], cwd=MASTRA_DIR, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return f"npm ci failed: {done.stderr.strip()[-500:]}"
    return None


def _write_turns(path: Path, w: Workload, indexes: range, turn_of: int | None = None) -> None:
    with path.open("w") as out:
        for i in indexes:
            k = i % w.threads
            turn = turn_of if turn_of is not None else 0
            turn += i // w.threads  # wrapping around the threads moves on to a later turn: ids stay new
            row = {
                "threadId": w.thread_id(k),
                "resourceId": w.resource_id(k),
                "input": turn_message(w, k, turn, role="user"),
                "response": turn_message(w, k, turn, role="assistant"),
            }
            out.write(json.dumps(row, separators=(",", ":")) + "\n")


def _write_history(path: Path, w: Workload) -> None:
    with path.open("w") as out:
        for i in range(w.threads):
            messages = stored_messages(w, i)
            row = {"threadId": w.thread_id(i), "resourceId": w.resource_id(i), "messages": messages}
            out.write(json.dumps(row, separators=(",", ":")) + "\n")


async def run_anchor(ctx: RunContext, path: str, *, events: int, turn: int) -> LineResult:
    """`path` is "recall" (processInput), "persist" (processOutputResult) or "memory" (the whole turn on the
    in-memory store; one event is one turn). Up to `WARMUP_TURNS` turns (a fresh turn, ids of their own) run
    first, unmeasured, for at most `WARMUP_SECONDS`: Node's JIT warms up as the service's lines do."""
    name = f"mastra_{path}"
    result = LineResult(name, 0, 0.0, None, None, latency_kind="per turn, one at a time, in process")
    problem = ensure_installed()
    if problem is not None:
        result.error = problem
        log(f"{name} skipped: {problem}")
        return result
    w, budget = ctx.workload, ctx.budget
    work = ctx.log_dir / name
    work.mkdir(parents=True, exist_ok=True)
    _write_turns(work / "turns.jsonl", w, range(events), turn)
    latency_count = max(3, budget.latency_events)
    _write_turns(work / "latency.jsonl", w, range(latency_count), ctx.turns.fresh())
    _write_turns(work / "warmup.jsonl", w, range(min(WARMUP_TURNS, w.threads)), ctx.turns.fresh())
    config = {
        "mongoUri": ctx.settings.mongodb_uri.get_secret_value(),
        "dbName": ctx.db,
        "lastMessages": w.history,
        "concurrency": budget.mastra_concurrency,
        "seconds": budget.line_seconds,
        "turnsFile": str(work / "turns.jsonl"),
        "latencyTurnsFile": str(work / "latency.jsonl"),
        "latencySeconds": budget.latency_seconds,
        "warmupTurnsFile": str(work / "warmup.jsonl"),
        "warmupSeconds": WARMUP_SECONDS,
    }
    if path == "memory":
        _write_history(work / "history.jsonl", w)
        config["historyFile"] = str(work / "history.jsonl")
    (work / "config.json").write_text(json.dumps(config))
    try:
        raw, server_cpu = await processes.run_to_end(
            ["node", str(MASTRA_DIR / "bench.mjs"), path, str(work / "config.json")],
            env=ctx.child_env(),
            log=ctx.log_dir / f"{name}.log",
            servers=ctx.servers,
            timeout_s=budget.line_seconds + 600,
            cwd=MASTRA_DIR,
        )
    except Exception as exc:  # noqa: BLE001 -- the other lines' figures must survive
        result.error = f"{type(exc).__name__}: {exc}"
        log(f"{name} failed: {result.error}")
        return result
    result.events = int(raw["events"])
    result.wall_s = float(raw["wall_s"])
    result.cpu_s = float(raw["cpu_s"])
    result.peak_rss_bytes = int(raw["peak_rss_bytes"])
    result.latencies_ms = [float(v) for v in raw["latencies_ms"]]
    result.server_cpu_s = server_cpu
    result.details = dict(raw.get("details", {}))
    result.details["completed"] = result.events >= events
    return result
