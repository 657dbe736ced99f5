"""The analysis of `bench.stepwatch` traces, for `python -m bench steps` and `--watch`. Pure, no I/O but
`read_trace`. What each segment is: `bench.steps`."""

from __future__ import annotations

import bisect
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from bench.progress import log

STEPS: Final = ("service_recall", "forwarder_recall", "service_persist", "forwarder_persist")
SEGMENTS: Final = ("kafka_in", "before_db", "db_wall", "other", "ack", "kafka_out", "total")


def read_trace(path: Path) -> list[dict[str, Any]]:
    """A trace's events (JSON lines); none when the file is missing."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _merged(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _numbered(commands: Sequence[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """`("2: update mastra_threads", seconds)` per command: the number is its trip (a run of overlapping
    commands, from 1); within a trip in name order, so the same work reads the same whoever went first."""
    groups = _merged([(e["t0"], e["t0"] + e["dt"]) for e in commands])

    def trip(e: Mapping[str, Any]) -> int:
        return next(n for n, (start, end) in enumerate(groups, 1) if start <= e["t0"] <= end)

    named = sorted((trip(e), f"{e['cmd']} {e['coll']}".strip(), float(e["dt"])) for e in commands)
    return [(f"{n}: {name}", dt) for n, name, dt in named]


def step_segments(
    sent: float, read: float, until: float, events: Sequence[Mapping[str, Any]], seq: int
) -> dict[str, Any] | None:
    """One step's segments (seconds) from the process's trace `events`: the record `seq` was sent at `sent`
    and its output read at `read`; `until` ends the step's window (the next step's send). None when the
    process's trace lacks the record's fetch or its output. Pure."""
    fetched = next((e["t"] for e in events if e["k"] == "in" and e["seq"] == seq), None)
    handed = next((e for e in events if e["k"] == "send" and e["seq"] == seq), None)
    if fetched is None or handed is None:
        return None
    out_at = float(handed["t"])
    acked = next((e["t"] for e in events if e["k"] == "ack" and e["seq"] == seq), None)
    mongo = [e for e in events if e["k"] == "mongo" and fetched <= e["t0"] < until]
    on_path = [e for e in mongo if e["t0"] < out_at]
    after = [e for e in mongo if e["t0"] >= out_at]
    groups = _merged([(e["t0"], e["t0"] + e["dt"]) for e in on_path])
    db_wall = sum(end - start for start, end in groups)
    first_db = groups[0][0] if groups else out_at
    commits = [e for e in events if e["k"] == "commit" and fetched <= e["t0"] < until]
    return {
        "kafka_in": fetched - sent,
        "before_db": first_db - fetched,
        "db_wall": db_wall,
        "other": (out_at - first_db) - db_wall,  # kafka in + before db + db wall + other + kafka out = total
        "ack": (acked - out_at) if acked is not None else None,
        "kafka_out": read - out_at,
        "total": read - sent,
        "db_trips": len(groups),
        "db_on_path": _numbered(on_path),
        "db_after": _numbered(after),
        "commits_after": len(commits),
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _commands(rows: Sequence[Sequence[tuple[str, float]]]) -> dict[str, Any]:
    """The commonest command sequence among `rows`, how many steps had it, and each command's median ms."""
    if not rows:
        return {"sequence": [], "share": 0.0}
    shapes = Counter(tuple(name for name, _ in row) for row in rows)
    shape, count = shapes.most_common(1)[0]
    same = [row for row in rows if tuple(name for name, _ in row) == shape]
    medians = [round(statistics.median(row[i][1] for row in same) * 1000, 3) for i in range(len(shape))]
    return {
        "sequence": [{"command": name, "ms": ms} for name, ms in zip(shape, medians, strict=True)],
        "share": round(count / len(rows), 3),
    }


def summarize_steps(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One step kind's segments: means (ms; they add up to the mean total, except `ack`, a part of
    `kafka_out`) and medians (`_p50_ms`); its db trips, and its commands before / after the output."""
    out: dict[str, Any] = {"steps": len(rows)}
    for segment in SEGMENTS:
        present = [row[segment] for row in rows if row[segment] is not None]
        mean = statistics.fmean(present) if present else None
        median = _median(present)
        out[f"{segment}_ms"] = None if mean is None else round(mean * 1000, 3)
        out[f"{segment}_p50_ms"] = None if median is None else round(median * 1000, 3)
    out["db_trips"] = _median([row["db_trips"] for row in rows])
    out["db_before_output"] = _commands([row["db_on_path"] for row in rows])
    out["db_after_output"] = _commands([row["db_after"] for row in rows])
    return out


def render(summary: Mapping[str, Any]) -> str:
    """The steps as Markdown: a row per step kind, its segments' means (which add up to the total; `ack` is
    part of `kafka out`) and its median total; then each one's commands."""
    steps = summary["steps"]
    head = ["step", "turns", *(f"{s.replace('_', ' ')} ms" for s in SEGMENTS), "p50 total ms", "db trips"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g}"

    for name in STEPS:
        figures = steps.get(name)
        if not figures:
            continue
        cells = [name, str(figures["steps"]), *(fmt(figures[f"{s}_ms"]) for s in SEGMENTS)]
        rows.append(
            "| " + " | ".join([*cells, fmt(figures["total_p50_ms"]), fmt(figures["db_trips"])]) + " |"
        )
    for name in ("service_recall", "service_persist"):
        figures = steps.get(name)
        if not figures:
            continue
        for when in ("db_before_output", "db_after_output"):
            seq = figures[when]
            label = when.replace("_", " ").replace("db ", "MongoDB ")
            rows.append(f"- {name}, {label} ({seq['share']:.0%} of the turns): {_trips(seq['sequence'])}")
    spans = summary.get("spans_ms") or {}
    if spans:
        listed = ", ".join(f"{k} {v['mean_ms']:.2f} / {v['p50_ms']:.2f}" for k, v in spans.items())
        rows.append(f"- the service's spans, ms (mean / p50): {listed}")
    stages = summary.get("stage_ms_per_turn") or {}
    if stages:
        rows.append("- the service's stage histograms, ms per turn (mean): " + json.dumps(stages))
    return "\n".join(rows)


def _trips(sequence: Sequence[Mapping[str, Any]]) -> str:
    """`[find a 1.0 ms + find b 2.0 ms], then [update c 0.5 ms]`: commands that overlapped in brackets."""
    trips: dict[str, list[str]] = {}
    for command in sequence:
        number, _, name = str(command["command"]).partition(": ")
        trips.setdefault(number, []).append(f"{name or number} {command['ms']:.2f} ms")
    return ", then ".join(f"[{' + '.join(names)}]" for names in trips.values()) or "none"


TAIL_SEGMENTS: Final = ("kafka_in", "behind_batch", "service", "db_wall", "ack", "kafka_out", "total")


def tail(
    sent: Mapping[int, float], read: Mapping[int, float], events: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A latency phase's events split by a watched process's trace (`bench.stepwatch`): per event, harness
    send -> fetched (`kafka_in`), fetched -> output handed to the producer (`service`; `db_wall` of it in
    MongoDB commands, `db_trips` runs of them), -> acknowledged (`ack`), -> read by the harness
    (`kafka_out`); `fetched_with` records in the same fetch; `behind_batch`, the part of `kafka_in` after
    the send during which the batch fetched before it was still being worked (until its last output was
    handed over): the wait behind the previous batch. Medians (ms) over every event and over the
    slowest 5% (by total), so a p99 shows which segment grows. Pure."""
    fetched = {e["seq"]: e["t"] for e in events if e["k"] == "in"}
    handed = {e["seq"]: e["t"] for e in events if e["k"] == "send"}
    acked = {e["seq"]: e["t"] for e in events if e["k"] == "ack"}
    together = Counter(fetched.values())
    batch_end: dict[float, float] = {}  # a fetch's time -> when its last output was handed to the producer
    for seq, at in fetched.items():
        if seq in handed:
            batch_end[at] = max(batch_end.get(at, 0.0), handed[seq])
    fetches = sorted(batch_end)
    mongo = sorted((e["t0"], e["t0"] + e["dt"]) for e in events if e["k"] == "mongo")
    starts = [m[0] for m in mongo]
    rows = []
    for seq, at in sent.items():
        if seq not in read or seq not in fetched or seq not in handed:
            continue
        begin, end = fetched[seq], handed[seq]
        inside = mongo[bisect.bisect_left(starts, begin) : bisect.bisect_left(starts, end)]
        groups = _merged(inside)
        previous = bisect.bisect_left(fetches, begin) - 1
        behind = batch_end[fetches[previous]] - at if previous >= 0 else 0.0
        rows.append(
            {
                "kafka_in": begin - at,
                "behind_batch": min(max(0.0, behind), begin - at),
                "service": end - begin,
                "db_wall": sum(b - a for a, b in groups),
                "db_trips": len(groups),
                "ack": acked[seq] - end if seq in acked else None,
                "kafka_out": read[seq] - end,
                "total": read[seq] - at,
                "fetched_with": together[begin],
            }
        )
    if not rows:
        return {"events": 0}
    slow = sorted(rows, key=lambda r: float(r["total"]))[-max(1, len(rows) // 20) :]

    def medians(group: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key in TAIL_SEGMENTS:
            value = _median([r[key] for r in group])
            out[f"{key}_ms"] = None if value is None else round(value * 1000, 2)
        out["db_trips"] = _median([r["db_trips"] for r in group])
        out["fetched_with"] = _median([r["fetched_with"] for r in group])
        return out

    return {"events": len(rows), "all": medians(rows), "slowest_5pct": medians(slow) | {"events": len(slow)}}


def analyse(
    timeline: Sequence[Mapping[str, Any]], events: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, Any]:
    """Each timed step's segments from its process's trace, summarized per step kind. Pure."""
    per_step: dict[str, list[dict[str, Any]]] = {name: [] for name in STEPS}
    for k, step in enumerate(timeline):
        until = timeline[k + 1]["sent"] if k + 1 < len(timeline) else step["read"] + 1.0
        who = "service" if step["name"].startswith("service") else "forwarder"
        row = step_segments(step["sent"], step["read"], until, events.get(who, ()), step["seq"])
        if row is not None:
            per_step[step["name"]].append(row)
    missing = len(timeline) - sum(len(rows) for rows in per_step.values())
    if missing:
        log(f"steps: {missing} of {len(timeline)} steps had no fetch or output in their process's trace")
    return {
        "steps": {name: summarize_steps(rows) for name, rows in per_step.items() if rows},
        "unmatched_steps": missing,
        "spans_ms": span_durations(events.get("service", ()), timeline[0]["sent"] if timeline else 0.0),
    }


def span_durations(events: Sequence[Mapping[str, Any]], since: float) -> dict[str, dict[str, float]]:
    """The service's OpenTelemetry spans (`--spans`) started from `since`, per name: count, mean and
    median duration in ms (a record span ends when its output is acknowledged). Pure."""
    by_name: dict[str, list[float]] = {}
    for e in events:
        if e["k"] == "span" and e["t0"] >= since and e["t1"] >= e["t0"]:
            by_name.setdefault(str(e["name"]), []).append(e["t1"] - e["t0"])
    return {
        name: {
            "count": len(values),
            "mean_ms": round(statistics.fmean(values) * 1000, 3),
            "p50_ms": round(statistics.median(values) * 1000, 3),
        }
        for name, values in sorted(by_name.items())
    }
