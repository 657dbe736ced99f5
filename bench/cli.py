"""`python -m bench`: the benchmark, run from the repository root against the local stack's endpoints.

`python -m bench [FLAGS]` runs the lines (`bench.run`); `python -m bench SIDE [FLAGS]` runs one of the side
measurements of `SIDE` (`bench/extra/`), each with its own `--help`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import secrets
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench import coordination, targets
from bench.context import MIN_LATENCY_RATE, REPO, Budget, parse_env
from bench.run import ALL_LINES, Options, run
from bench.scale import render_scale, run_scale
from bench.stats import ratios, render_table
from bench.threads_scale import render as render_threads_scale
from bench.threads_scale import run_threads_scale
from bench.workload import Workload

# name -> (module, what it measures): measurements that are not lines of one run (another workload, or one
# component alone); `python -m bench NAME --help` gives each one's flags
SIDE: Final[dict[str, tuple[str, str]]] = {
    "storage": (
        "bench.extra.storage",
        "MongoHistoryStorage alone: recall latency, $in vs concurrent",
    ),
    "codec": ("bench.extra.codec", "the event codec alone: decode + encode of a 40-message EnrichedRequest"),
    "rows": ("bench.extra.rows", "the recall row codec alone: raw replies to rows' bytes, native vs Python"),
    "budget": ("bench.extra.budget", "recall with a token budget vs without, in process (no Kafka)"),
    "observational": (
        "bench.extra.observational",
        "tokens per request with Observational Memory vs lastMessages vs a token budget; OM's work per turn",
    ),
    "recall-cap": (
        "bench.extra.recall_cap",
        "one request's recall of n stored 1 KB rows (the row cap)",
    ),
    "replay": ("bench.extra.replay", "message-history replay vs the live persist path on one topic"),
    "retention": ("bench.extra.retention", "forget and prune throughput on a seeded database"),
    "steps": (
        "bench.extra.steps",
        "where an idle recall's and persist's milliseconds go, per step (fetch, MongoDB commands, produce)",
    ),
    "persist-batch": (
        "bench.extra.persist_batch",
        "one persist batch's wall time in process (MongoDB, no Kafka), per storage step",
    ),
    "persist-steps": (
        "bench.extra.persist_steps",
        "a persist turn's pure steps alone (decode, decision, plan, BSON, outcome), CPU per turn, no I/O",
    ),
    "update-command": (
        "bench.extra.update_command",
        "a persist batch's writes by the driver's bulk_write and as one update command, CPU per statement",
    ),
    "failover": (
        "bench.extra.failover",
        "one of three instances SIGKILLed under fast turns: send-to-answer of its threads and the others'",
    ),
}

# --quick: a small workload and short budgets for CI smoke runs (under two minutes on the local stack)
QUICK = {
    "threads": 120,
    "history": 6,
    "message_bytes": 512,
    "batch": 20,
    "partitions": 2,
    "line_seconds": 8.0,
    "latency_events": 20,
    "latency_seconds": 3.0,
    "mastra_concurrency": 8,
    "idle_turns": 10,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Both paths against the physical limit (B1/B2/B3), a naive baseline and Mastra itself, "
        "on one workload in one run. Progress on stderr; the table on stdout; JSON in --out.",
        epilog="side measurements, each `python -m bench NAME [--help]`: "
        + "; ".join(f"{name}: {what}" for name, (_, what) in SIDE.items()),
    )
    p.add_argument("--quick", action="store_true", help="small workload and budgets, for CI smoke runs")
    p.add_argument("--threads", type=int, default=10_000, help="threads, and events per line (%(default)s)")
    p.add_argument("--history", type=int, default=40, help="stored messages per thread (%(default)s)")
    p.add_argument("--message-bytes", type=int, default=1024, help="text per message (%(default)s)")
    p.add_argument("--batch", type=int, default=500, help="records per batch, every line (%(default)s)")
    p.add_argument("--partitions", type=int, default=6, help="partitions per topic (%(default)s)")
    p.add_argument(
        "--lines",
        default=",".join(ALL_LINES),
        help="comma-separated subset of: " + ", ".join(ALL_LINES),
    )
    p.add_argument("--line-seconds", type=float, default=300.0, help="time budget per line (%(default)s)")
    p.add_argument("--latency-events", type=int, default=1000, help="events timed per line (%(default)s)")
    p.add_argument("--latency-seconds", type=float, default=20.0, help="latency phase length (%(default)s)")
    p.add_argument(
        "--latency-rate",
        type=float,
        metavar="R",
        help="time every Kafka line's latency (the service, B1, naive and contract-stream lines) at R "
        "events/s, not at half its own measured throughput (tails at equal load: a cheaper line is otherwise "
        "timed at a higher rate)",
    )
    p.add_argument("--mastra-concurrency", type=int, default=32, help="turns in flight in Node (%(default)s)")
    p.add_argument("--idle-turns", type=int, default=300, help="turns timed by the idle line (%(default)s)")
    p.add_argument("--soak", type=int, metavar="N", help="memory flatness: run one path for N events instead")
    p.add_argument("--soak-path", choices=["recall", "persist"], default="recall")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where results go")
    p.add_argument("--keep", action="store_true", help="keep the topics and the benchmark database")
    p.add_argument("--profile", action="store_true", help="py-spy the service's lines (needs py-spy)")
    p.add_argument(
        "--watch",
        action="store_true",
        help="run the service lines under bench.stepwatch: each latency event split into fetch, MongoDB, "
        "produce and read (details.tail: the slowest 5%% against all); costs the service a little",
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds of every line; each keeps its median")
    p.add_argument(
        "--service-env",
        default="image",
        help="the service processes' runtime environment: `image` (what deploy/Dockerfile sets), `none`, "
        "or K=V,K=V (an A/B of allocator settings) (%(default)s)",
    )
    p.add_argument(
        "--scale",
        metavar="SIZES",
        help="recall latency as history grows: comma-separated stored-message counts, a run each "
        "(e.g. 10000,100000,1000000); lines service_recall and b2_recall_queries",
    )
    p.add_argument(
        "--instances",
        metavar="COUNTS",
        help="the cost of coordination: CPU per event of each path's service line at n instances on one "
        "consumer group, for each n (e.g. 1,2,3); replaces the lines",
    )
    p.add_argument(
        "--threads-scale",
        metavar="COUNTS",
        help="the paths' cost as threads grow: comma-separated thread counts, a run each (e.g. 3000,30000); "
        "each path's B1, raw MongoDB and service lines, their floor ratios and p99",
    )
    return p


def _rate(rate: float | None) -> float | None:
    """`--latency-rate`: a finite number of events per second, at least `MIN_LATENCY_RATE` (the floor the
    default rate has too: a slower phase would wait minutes for its few events), or None (half each
    line's own throughput)."""
    if rate is None:
        return None
    if not math.isfinite(rate) or rate < MIN_LATENCY_RATE:
        raise SystemExit(f"--latency-rate must be at least {MIN_LATENCY_RATE} events per second: {rate}")
    return rate


def _counts(text: str | None) -> tuple[int, ...]:
    """`1,2,3` -> (1, 2, 3); thousands separators (`_`) allowed; sorted, no repeats."""
    if not text:
        return ()
    counts = sorted({int(item.strip().replace("_", "")) for item in text.split(",") if item.strip()})
    if any(c < 1 for c in counts):
        raise SystemExit(f"counts must be positive: {text}")
    return tuple(counts)


def options_from(args: argparse.Namespace, argv: Sequence[str]) -> Options:
    values = vars(args)
    lines = [name.strip() for name in str(values["lines"]).split(",") if name.strip()]
    unknown = sorted(set(lines) - set(ALL_LINES))
    if unknown:
        raise SystemExit(f"unknown lines: {', '.join(unknown)}")
    workload = Workload(
        threads=values["threads"],
        history=values["history"],
        message_bytes=values["message_bytes"],
        batch=values["batch"],
        partitions=values["partitions"],
        run_id=secrets.token_hex(3),
    )
    budget = Budget(
        line_seconds=values["line_seconds"],
        latency_events=values["latency_events"],
        latency_seconds=values["latency_seconds"],
        latency_rate=_rate(values.get("latency_rate")),
        mastra_concurrency=values["mastra_concurrency"],
        idle_turns=values["idle_turns"],
    )
    return Options(
        workload=workload,
        budget=budget,
        lines=lines,
        out_dir=args.out,
        command=shlex.join(["python", "-m", "bench", *argv]),
        soak_events=args.soak,
        soak_path=args.soak_path,
        keep=args.keep,
        profile=args.profile,
        watch=args.watch,
        repeat=max(1, args.repeat),
        service_env=parse_env(args.service_env),
        instances=_counts(args.instances),
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SIDE:
        module = importlib.import_module(SIDE[argv[0]][0])
        return int(module.main(argv[1:]))
    args = parser().parse_args(argv)
    if args.quick:  # --quick changes the defaults; flags given explicitly still win
        quick = parser()
        quick.set_defaults(**QUICK)
        args = quick.parse_args(argv)
    options = options_from(args, argv)
    if args.scale:
        sizes = [int(size.replace("_", "")) for size in args.scale.split(",") if size.strip()]
        scale, scale_path = asyncio.run(run_scale(options, sizes))
        print(render_scale(scale))
        print(f"\nresults: {scale_path}")
        return 130 if any(row["interrupted"] for row in scale["sizes"]) else 0
    if args.threads_scale:
        grown, grown_path = asyncio.run(run_threads_scale(options, _counts(args.threads_scale)))
        print(render_threads_scale(grown))
        print(f"\nresults: {grown_path}")
        return 130 if grown["interrupted"] else 0
    record, path, lines = asyncio.run(run(options))
    load = record["environment"].get("load_average") or {}
    if record.get("coordination"):  # its lines only: no ratio or target of a run applies
        print(render_table(lines, {}).split("\n\n")[0])
        print("\n" + coordination.render(record["coordination"]))
        print(f"\nload average (1 min) during the run: {targets.load_summary(load)}")
        print(f"\nresults: {path}")
        return 1 if any(line.error for line in lines.values()) else 0
    if lines:
        print(render_table(lines, ratios(lines)))
    if record.get("soak"):
        soak = {k: v for k, v in record["soak"].items() if k != "series"}
        print("soak:", ", ".join(f"{k}={v}" for k, v in soak.items()))
    print("\n" + targets.render(targets.evaluate(record["ratios"], record.get("soak")), record.get("soak")))
    if load:
        print(f"\nload average (1 min) during the run: {targets.load_summary(load)}")
    if lines:
        print("\n" + targets.render_score(record["ratios"], record["lines"]))
        print("\n" + targets.render_contract(record["ratios"], record["lines"]))
    print(f"\nresults: {path}")
    if record["environment"].get("interrupted"):
        return 130
    return 1 if any(line.error for line in lines.values()) else 0
