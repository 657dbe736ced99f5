"""`python -m bench --scale 10000,100000,1000000`: recall latency as the stored history grows.

For each size, a run of its own on a fresh benchmark database holding that many stored messages
(`size // history` threads of `history` messages), measuring two lines side by side:

* `service_recall`: end to end, request sent -> enriched event read, p50/p99 at half the measured capacity;
* `b2_recall_queries`: the recall path's MongoDB round trip per batch (its two finds, replies undecoded:
  the server's index walk and the wire, without our decoding; until issue 14 it decoded into messages).

The goal it checks is flatness: p50/p99 at the largest size within 2x of the smallest, and the end-to-end p99
at the largest size. Each size's full record is written as usual; the scale table and JSON go beside them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.progress import log
from bench.run import Options, run
from bench.stats import LineResult, percentile

SCALE_LINES = ("service_recall", "b2_recall_queries")


def _figures(line: LineResult | None) -> dict[str, float | None]:
    if line is None:
        return {"p50_ms": None, "p99_ms": None, "events_per_s": None}
    return {
        "p50_ms": percentile(line.latencies_ms, 50),
        "p99_ms": percentile(line.latencies_ms, 99),
        "events_per_s": line.events_per_s,
    }


async def run_scale(options: Options, sizes: Sequence[int]) -> tuple[dict[str, Any], Path]:
    """One run per size (smallest first); returns the scale record and where it was written."""
    rows: list[dict[str, Any]] = []
    for size in sorted(sizes):
        threads = max(1, size // max(1, options.workload.history))
        workload = dataclasses.replace(options.workload, threads=threads)
        log(f"=== scale: {size:,} stored messages ({threads:,} threads x {workload.history})")
        sized = dataclasses.replace(options, workload=workload, lines=SCALE_LINES)
        record, path, lines = await run(sized)
        rows.append(
            {
                "stored_messages": threads * workload.history,
                "threads": threads,
                "record": path.name,  # beside this file
                "end_to_end": _figures(lines.get("service_recall")),
                "per_batch": _figures(lines.get("b2_recall_queries")),
                "interrupted": bool(record["environment"].get("interrupted")),
            }
        )
        if rows[-1]["interrupted"]:
            break
    scale = {"command": options.command, "sizes": rows, "flatness": _flatness(rows)}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.out_dir / f"{stamp}-scale.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(scale, indent=2) + "\n")
    return scale, path


def _flatness(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Largest size's figure / smallest size's, per latency figure (goal: <= 2)."""
    if len(rows) < 2:
        return {}
    first, last = rows[0], rows[-1]
    out: dict[str, float | None] = {}
    for kind in ("end_to_end", "per_batch"):
        for figure in ("p50_ms", "p99_ms"):
            low, high = first[kind][figure], last[kind][figure]
            out[f"{kind}.{figure}"] = round(high / low, 2) if low and high is not None else None
    return out


def render_scale(scale: dict[str, Any]) -> str:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:,.2f}"

    head = "| stored messages | threads | e2e p50 ms | e2e p99 ms | recall/s | batch p50 ms | batch p99 ms |"
    out = [head, "|---|---|---|---|---|---|---|"]
    for row in scale["sizes"]:
        e2e, batch = row["end_to_end"], row["per_batch"]
        out.append(
            f"| {row['stored_messages']:,} | {row['threads']:,} | {fmt(e2e['p50_ms'])} "
            f"| {fmt(e2e['p99_ms'])} | {fmt(e2e['events_per_s'])} | {fmt(batch['p50_ms'])} "
            f"| {fmt(batch['p99_ms'])} |"
        )
    flat = ", ".join(f"{k} x{v}" for k, v in scale["flatness"].items())
    return "\n".join(out) + (f"\nlargest / smallest: {flat}" if flat else "")
