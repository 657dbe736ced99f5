"""`python -m bench --instances 1,2,3`: the cost of coordination, CPU per event at n service instances.

For each path and each n, the path's service line (`message-history run --only PATH`, the defaults) runs as n
processes on one consumer group over the same backlog of `--threads` events (`--partitions` partitions shared
among them); the window opens once the group is stable with all n members and each is warmed up. The figure
is the instances' summed CPU seconds per event, and its ratio to one instance's: the coordination's cost
(group membership, heartbeats, commits, the barrier's offset look-ups, idle polls of each member), which must
stay flat. Pure here: the lines run in `bench.run`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.stats import LineResult, percentile


def line_name(path: str, n: int) -> str:
    return f"service_{path}_x{n}"


def summarize(lines: Mapping[str, LineResult], counts: Sequence[int]) -> dict[str, Any]:
    """Per path and n: events/s, CPU-ms per event, p99 at half capacity, and CPU per event / the smallest
    n's (the flatness figure)."""
    out: dict[str, Any] = {}
    for path in ("recall", "persist"):
        rows = []
        base: float | None = None
        for n in sorted(counts):
            line = lines.get(line_name(path, n))
            cpu = line.cpu_s_per_1k if line is not None and not line.error else None
            if base is None and cpu:
                base = cpu
            rows.append(
                {
                    "instances": n,
                    "events": line.events if line else 0,
                    "events_per_s": _r(line.events_per_s if line else None),
                    "cpu_ms_per_event": _r(cpu),
                    "p99_ms": _r(percentile(line.latencies_ms, 99) if line else None),
                    "cpu_vs_first": _r(cpu / base if cpu is not None and base else None),
                    "error": line.error if line else "not run",
                }
            )
        out[path] = rows
    return out


def _r(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def render(summary: Mapping[str, Any]) -> str:
    """The coordination line as Markdown: one row per n, both paths side by side."""
    rows = [
        "coordination: CPU per event at n service instances on one consumer group (flat = 1.0)",
        "| instances | recall CPU-ms/event | recall vs first | recall events/s "
        "| persist CPU-ms/event | persist vs first | persist events/s |",
        "|---|---|---|---|---|---|---|",
    ]
    recall, persist = summary.get("recall", []), summary.get("persist", [])
    for r, p in zip(recall, persist, strict=False):
        cells = [str(r["instances"])]
        for row in (r, p):
            cells += [_fmt(row["cpu_ms_per_event"]), _fmt(row["cpu_vs_first"]), _fmt(row["events_per_s"])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"
