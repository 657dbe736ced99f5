"""`python -m bench --threads-scale 3000,30000`: the paths' cost as the number of threads grows (10x).

For each thread count, a run of its own on a fresh benchmark database of that many threads of `--history`
messages, with every line that the floor ratios need, side by side: `b1_recall`, `b2_recall_queries`,
`service_recall`, `b1_persist`, `b3_bulk_upserts`, `service_persist` (each line moves one event per thread).
Per size: each path's CPU per event, its ratio to its floor (B1 + B2 raw, B1 + B3 raw) and its p99 at half
capacity; then the largest size's figure over the smallest's (flat = 1.0). Each size's full record is
written as usual; this summary goes beside them as `<timestamp>-threads-scale.json`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.progress import log
from bench.run import Options, run
from bench.stats import LineResult, percentile, ratios

THREADS_SCALE_LINES = (
    "b1_recall",
    "b2_recall_queries",
    "service_recall",
    "b1_persist",
    "b3_bulk_upserts",
    "service_persist",
)
FIGURES = (
    "recall_cpu_ms",
    "recall_cpu_vs_floor",
    "recall_p99_ms",
    "persist_cpu_ms",
    "persist_cpu_vs_floor",
    "persist_p99_ms",
)


def size_row(threads: int, lines: Mapping[str, LineResult]) -> dict[str, Any]:
    """One size's figures from its lines. Pure."""

    def cpu_ms(name: str) -> float | None:
        line = lines.get(name)
        return line.cpu_s_per_1k if line is not None and not line.error else None

    def p99(name: str) -> float | None:
        line = lines.get(name)
        return percentile(line.latencies_ms, 99) if line is not None and not line.error else None

    values = ratios(lines)
    return {
        "threads": threads,
        "recall_cpu_ms": cpu_ms("service_recall"),
        "recall_cpu_vs_floor": values["recall_cpu_vs_floor"],
        "recall_p99_ms": p99("service_recall"),
        "persist_cpu_ms": cpu_ms("service_persist"),
        "persist_cpu_vs_floor": values["persist_cpu_vs_floor"],
        "persist_p99_ms": p99("service_persist"),
        "completed": all(bool(line.details.get("completed", True)) for line in lines.values()),
    }


def growth(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The largest size's figure / the smallest's, per figure (flat = 1.0). Pure."""
    if len(rows) < 2:
        return {}
    first, last = rows[0], rows[-1]
    out: dict[str, float | None] = {}
    for figure in FIGURES:
        low, high = first.get(figure), last.get(figure)
        out[figure] = round(high / low, 2) if low and high is not None else None
    return out


async def run_threads_scale(options: Options, sizes: Sequence[int]) -> tuple[dict[str, Any], Path]:
    rows: list[dict[str, Any]] = []
    records: list[str] = []
    interrupted = False
    for threads in sorted(sizes):
        log(f"=== threads scale: {threads:,} threads x {options.workload.history} messages")
        sized = dataclasses.replace(
            options,
            workload=dataclasses.replace(options.workload, threads=threads),
            lines=THREADS_SCALE_LINES,
        )
        record, path, lines = await run(sized)
        rows.append(size_row(threads, lines) | {"load_average": record["environment"].get("load_average")})
        records.append(path.name)
        if record["environment"].get("interrupted"):
            interrupted = True
            break
    summary = {
        "command": options.command,
        "sizes": rows,
        "records": records,
        "largest_over_smallest": growth(rows),
        "interrupted": interrupted,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.out_dir / f"{stamp}-threads-scale.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary, path


def render(summary: Mapping[str, Any]) -> str:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3g}"

    out = [
        "threads scale: each path's CPU per event, its floor ratio, p99 at half capacity, per thread count",
        "| threads | recall CPU-ms | recall / floor | recall p99 ms | persist CPU-ms | persist / floor "
        "| persist p99 ms | load (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["sizes"]:
        load = (row.get("load_average") or {}).get("max")
        cells = [f"{row['threads']:,}", *(fmt(row[f]) for f in FIGURES), fmt(load)]
        out.append("| " + " | ".join(cells) + " |")
    grown = summary.get("largest_over_smallest") or {}
    if grown:
        out.append("largest / smallest: " + ", ".join(f"{k} x{fmt(v)}" for k, v in grown.items()))
    return "\n".join(out)
