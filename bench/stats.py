"""Figures of one benchmark run: per-line results, the ratios between lines, the table. Pure, no I/O.

A line's throughput is events per wall-clock second over its measured window; its cost is the CPU seconds of
the process doing the work (the service, the pass-through, the naive loop, the Mongo worker or Node) per
1,000 events, and `events_per_cpu_s` is the same figure inverted ("events/s per core"). The servers' CPU
(MongoDB-wire server, Kafka broker) is reported beside it when their processes could be found: on a shared
machine it also contains whatever else used them meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

# name -> (label, path): the lines of one run, in table order
LINES: Final[dict[str, tuple[str, str]]] = {
    "b1_recall": ("B1 Kafka pass-through, enriched-size records", "recall"),
    "b2_recall_queries": ("B2 MongoDB batched recall queries, raw driver (RawBSONDocument)", "recall"),
    "b2_recall_models": ("B2 with our models (PrefetchedHistory.load: rows -> Message)", "recall"),
    "b4_recall_contract": ("B4 the contract's floor: B2 raw + busy markers' find + busy marks", "recall"),
    "service_recall": ("service recall path (request -> enriched)", "recall"),
    "service_recall_unguarded": ("service recall path, barrier off, busy-thread allow", "recall"),
    "service_recall_barrier_only": ("service recall path, barrier on, busy-thread allow", "recall"),
    "service_recall_eos": ("service recall path, exactly-once (transactions)", "recall"),
    "naive_recall": ("naive recall (await each find/send/commit)", "recall"),
    "contract_recall_stream": ("B1's forwarder + the contract's MongoDB trips per batch, recall", "recall"),
    "mastra_recall": ("Mastra MessageHistory.processInput (Node, same database)", "recall"),
    "b1_persist": ("B1 Kafka pass-through, response-size records", "persist"),
    "b3_bulk_upserts": ("B3 MongoDB batched bulk upserts, raw driver (prebuilt operations)", "persist"),
    "b3_save_many": ("B3 with our models (save_many of Messages)", "persist"),
    "b4_persist_contract": ("B4 the contract's floor: homes + threads + tombstones, then 2 bulks", "persist"),
    "service_persist": ("service persist path (response -> persisted)", "persist"),
    "service_persist_unguarded": ("service persist path, busy-thread allow (no markers)", "persist"),
    "service_persist_eos": ("service persist path, exactly-once (transactions)", "persist"),
    "naive_persist": ("naive persist (await each save/send/commit)", "persist"),
    "contract_persist_stream": (
        "B1's forwarder + the contract's MongoDB trips per batch, persist",
        "persist",
    ),
    "mastra_persist": ("Mastra MessageHistory.processOutputResult (Node, same database)", "persist"),
    "mastra_memory": ("Mastra MessageHistory, whole turn on its InMemoryStore (Node, no database)", "turn"),
    "idle_service_recall": ("idle, one turn at a time: service request -> enriched", "recall"),
    "idle_forwarder_recall": ("idle, interleaved: bare forwarder, enriched-size record", "recall"),
    "idle_service_persist": ("idle, one turn at a time: service response -> persisted", "persist"),
    "idle_forwarder_persist": ("idle, interleaved: bare forwarder, response-size record", "persist"),
    "idle_contract_recall": ("idle, interleaved: forwarder + the contract's MongoDB trips, recall", "recall"),
    "idle_contract_persist": (
        "idle, interleaved: forwarder + the contract's MongoDB trips, persist",
        "persist",
    ),
}

RATIOS: Final[dict[str, str]] = {
    "recall_cpu_vs_b1": "service recall CPU per event / B1's (recall-sized)",
    "persist_cpu_vs_b1": "service persist CPU per event / B1's (response-sized)",
    "recall_cpu_vs_floor": "service recall CPU per event / its floor, B1 + B2 raw  (target <= 1.5)",
    "persist_cpu_vs_floor": "service persist CPU per event / its floor, B1 + B3 raw  (target <= 2)",
    "recall_vs_limit": "service recall / min(B1, B2 raw)  (target >= 0.85)",
    "persist_vs_limit": "service persist / min(B1, B3 raw)  (target >= 0.85)",
    "recall_vs_limit_models": "service recall / min(B1, B2 with our models)",
    "persist_vs_limit_models": "service persist / min(B1, B3 with our models)",
    "recall_p99_vs_b1": "service recall p99 / B1 recall p99, each at half its capacity  (target <= 2)",
    "persist_p99_vs_b1": "service persist p99 / B1 persist p99, each at half its capacity  (target <= 2)",
    "recall_service_vs_naive": "service recall / naive recall  (target >= 10)",
    "persist_service_vs_naive": "service persist / naive persist  (target >= 10)",
    "turn_service_vs_naive": "service / naive, whole turn (recall + persist)",
    "turn_service_vs_mastra_memory_per_core": "service turns per CPU s / mastra_memory's  (target >= 1.25)",
    "recall_service_vs_mastra_per_core": "service recall / Mastra processInput, events per CPU second",
    "persist_service_vs_mastra_per_core": "service persist / Mastra processOutputResult, per CPU second",
    "turn_service_vs_mastra_per_core": "service / Mastra on the database, turns per CPU s  (target >= 3)",
    "recall_service_vs_mastra_wall": "service recall / Mastra processInput, events per second",
    "persist_service_vs_mastra_wall": "service persist / Mastra processOutputResult, events per second",
    "recall_turn_guards_cost": "service recall / the same, barrier off + busy allow",
    "recall_barrier_cost": "service recall, barrier only / barrier off (target >= 0.95)",
    "persist_turn_guards_cost": "service persist / the same without busy markers",
    "recall_idle_p50_vs_forwarder": "idle recall p50 / the interleaved forwarder's  (target <= 1.5)",
    "persist_idle_p50_vs_forwarder": "idle persist p50 / the interleaved forwarder's  (target <= 1.5)",
    "recall_idle_p99_vs_forwarder": "idle recall p99 / the interleaved forwarder's",
    "persist_idle_p99_vs_forwarder": "idle persist p99 / the interleaved forwarder's",
    "recall_cpu_vs_contract_floor": "service recall CPU per event / the contract's floor, B1 + B4 raw",
    "persist_cpu_vs_contract_floor": "service persist CPU per event / the contract's floor, B1 + B4 raw",
    "recall_contract_floor_vs_floor": "recall: the contract's floor / the issue's, (B1 + B4) / (B1 + B2)",
    "persist_contract_floor_vs_floor": "persist: the contract's floor / the issue's, (B1 + B4) / (B1 + B3)",
    "recall_idle_p50_vs_contract": "idle recall p50 / the forwarder with the contract's trips'",
    "persist_idle_p50_vs_contract": "idle persist p50 / the forwarder with the contract's trips'",
    "recall_idle_contract_vs_forwarder": "idle recall: the forwarder with the contract's trips / bare, p50",
    "persist_idle_contract_vs_forwarder": "idle persist: the forwarder with the contract's trips / bare, p50",
    "recall_contract_stream_p99_vs_b1": "recall: the contract stream's p99 / B1's, each at half capacity",
    "persist_contract_stream_p99_vs_b1": "persist: the contract stream's p99 / B1's, each at half capacity",
    "recall_p99_vs_contract_stream": "service recall p99 / the contract stream's, each at half capacity",
    "persist_p99_vs_contract_stream": "service persist p99 / the contract stream's, each at half capacity",
    "recall_cpu_vs_contract_stream": "service recall CPU per event / the contract stream's",
    "persist_cpu_vs_contract_stream": "service persist CPU per event / the contract stream's",
    "recall_contract_stream_cpu_vs_floor": "recall: the contract stream's CPU per event / B1 + B2 raw",
    "persist_contract_stream_cpu_vs_floor": "persist: the contract stream's CPU per event / B1 + B3 raw",
    "recall_eos_throughput": "service recall exactly-once / at-least-once, events/s  (target >= 0.85)",
    "persist_eos_throughput": "service persist exactly-once / at-least-once, events/s  (target >= 0.85)",
    "recall_eos_cpu": "service recall exactly-once / at-least-once, CPU per event",
    "persist_eos_cpu": "service persist exactly-once / at-least-once, CPU per event",
    "recall_eos_p99": "service recall exactly-once / at-least-once, p99 at half capacity",
    "persist_eos_p99": "service persist exactly-once / at-least-once, p99 at half capacity",
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0..100) by linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class LineResult:
    """What one line measured. `latencies_ms`: per event (or per batch for the MongoDB lines)."""

    name: str
    events: int
    wall_s: float
    cpu_s: float | None
    peak_rss_bytes: int | None
    latencies_ms: list[float] = field(default_factory=list)
    latency_kind: str = ""
    server_cpu_s: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def events_per_s(self) -> float | None:
        return self.events / self.wall_s if self.events and self.wall_s > 0 else None

    @property
    def events_per_cpu_s(self) -> float | None:
        return self.events / self.cpu_s if self.events and self.cpu_s else None

    @property
    def cpu_s_per_1k(self) -> float | None:
        return 1000 * self.cpu_s / self.events if self.events and self.cpu_s is not None else None

    def to_json(self) -> dict[str, Any]:
        label, path = LINES.get(self.name, (self.name, ""))
        out: dict[str, Any] = {
            "label": label,
            "path": path,
            "events": self.events,
            "wall_s": _round(self.wall_s),
            "events_per_s": _round(self.events_per_s),
            "latency_ms": {
                "p50": _round(percentile(self.latencies_ms, 50)),
                "p95": _round(percentile(self.latencies_ms, 95)),
                "p99": _round(percentile(self.latencies_ms, 99)),
                "samples": len(self.latencies_ms),
                "kind": self.latency_kind,
            },
            "cpu_s": _round(self.cpu_s),
            "cpu_s_per_1k_events": _round(self.cpu_s_per_1k),
            "events_per_cpu_s": _round(self.events_per_cpu_s),
            "peak_rss_mb": _round(self.peak_rss_bytes / 2**20 if self.peak_rss_bytes else None),
            "server_cpu_s_per_1k_events": {
                k: _round(1000 * v / self.events) for k, v in self.server_cpu_s.items() if self.events
            },
            "details": self.details,
        }
        if self.error:
            out["error"] = self.error
        return out


def median_round(results: Sequence[LineResult]) -> LineResult:
    """Of one line's rounds, the one with the median throughput (the lower one of an even count), with
    every round's throughput and CPU cost noted in its details."""
    ordered = sorted(results, key=lambda r: r.events_per_s or 0.0)
    chosen = ordered[(len(ordered) - 1) // 2]
    if len(results) > 1:
        chosen.details["rounds"] = [
            {"events_per_s": _round(r.events_per_s), "cpu_s_per_1k_events": _round(r.cpu_s_per_1k)}
            for r in results
        ]
    return chosen


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None:
        return None
    return float(f"{value:.{digits}g}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _turn_rate(recall: float | None, persist: float | None) -> float | None:
    """Whole turns per second when a turn costs one recall event and one persist event (harmonic sum)."""
    if not recall or not persist:
        return None
    return 1 / (1 / recall + 1 / persist)


def ratios(lines: Mapping[str, LineResult]) -> dict[str, float | None]:
    """The run's ratios (None where a line is missing or measured nothing)."""

    def eps(name: str) -> float | None:
        line = lines.get(name)
        return line.events_per_s if line else None

    def per_core(name: str) -> float | None:
        line = lines.get(name)
        return line.events_per_cpu_s if line else None

    def lowest(*names: str) -> float | None:
        values = [v for v in (eps(n) for n in names) if v is not None]
        return min(values) if len(values) == len(names) else None

    def cpu(name: str) -> float | None:
        line = lines.get(name)
        return line.cpu_s_per_1k if line else None

    def pct(name: str, q: float) -> float | None:
        line = lines.get(name)
        return percentile(line.latencies_ms, q) if line and line.events else None

    def floor(*names: str) -> float | None:
        values = [cpu(n) for n in names]
        return sum(v for v in values if v is not None) if all(v is not None for v in values) else None

    out = {
        "recall_cpu_vs_b1": _ratio(cpu("service_recall"), cpu("b1_recall")),
        "persist_cpu_vs_b1": _ratio(cpu("service_persist"), cpu("b1_persist")),
        "recall_cpu_vs_floor": _ratio(cpu("service_recall"), floor("b1_recall", "b2_recall_queries")),
        "persist_cpu_vs_floor": _ratio(cpu("service_persist"), floor("b1_persist", "b3_bulk_upserts")),
        "recall_vs_limit": _ratio(eps("service_recall"), lowest("b1_recall", "b2_recall_queries")),
        "persist_vs_limit": _ratio(eps("service_persist"), lowest("b1_persist", "b3_bulk_upserts")),
        "recall_vs_limit_models": _ratio(eps("service_recall"), lowest("b1_recall", "b2_recall_models")),
        "persist_vs_limit_models": _ratio(eps("service_persist"), lowest("b1_persist", "b3_save_many")),
        "recall_p99_vs_b1": _ratio(pct("service_recall", 99), pct("b1_recall", 99)),
        "persist_p99_vs_b1": _ratio(pct("service_persist", 99), pct("b1_persist", 99)),
        "recall_service_vs_naive": _ratio(eps("service_recall"), eps("naive_recall")),
        "persist_service_vs_naive": _ratio(eps("service_persist"), eps("naive_persist")),
        "turn_service_vs_naive": _ratio(
            _turn_rate(eps("service_recall"), eps("service_persist")),
            _turn_rate(eps("naive_recall"), eps("naive_persist")),
        ),
        "turn_service_vs_mastra_memory_per_core": _ratio(
            _turn_rate(per_core("service_recall"), per_core("service_persist")), per_core("mastra_memory")
        ),
        "recall_service_vs_mastra_per_core": _ratio(per_core("service_recall"), per_core("mastra_recall")),
        "persist_service_vs_mastra_per_core": _ratio(per_core("service_persist"), per_core("mastra_persist")),
        "turn_service_vs_mastra_per_core": _ratio(
            _turn_rate(per_core("service_recall"), per_core("service_persist")),
            _turn_rate(per_core("mastra_recall"), per_core("mastra_persist")),
        ),
        "recall_service_vs_mastra_wall": _ratio(eps("service_recall"), eps("mastra_recall")),
        "persist_service_vs_mastra_wall": _ratio(eps("service_persist"), eps("mastra_persist")),
        "recall_turn_guards_cost": _ratio(eps("service_recall"), eps("service_recall_unguarded")),
        "recall_barrier_cost": _ratio(eps("service_recall_barrier_only"), eps("service_recall_unguarded")),
        "persist_turn_guards_cost": _ratio(eps("service_persist"), eps("service_persist_unguarded")),
        "recall_eos_throughput": _ratio(eps("service_recall_eos"), eps("service_recall")),
        "persist_eos_throughput": _ratio(eps("service_persist_eos"), eps("service_persist")),
        "recall_eos_cpu": _ratio(cpu("service_recall_eos"), cpu("service_recall")),
        "persist_eos_cpu": _ratio(cpu("service_persist_eos"), cpu("service_persist")),
        "recall_eos_p99": _ratio(pct("service_recall_eos", 99), pct("service_recall", 99)),
        "persist_eos_p99": _ratio(pct("service_persist_eos", 99), pct("service_persist", 99)),
    }
    for path in ("recall", "persist"):
        for q in (50, 99):
            service, forwarder = pct(f"idle_service_{path}", q), pct(f"idle_forwarder_{path}", q)
            out[f"{path}_idle_p{q}_vs_forwarder"] = _ratio(service, forwarder)
    # the contract's floor (issue 33): B4 in place of B2 / B3, the forwarder that makes the contract's trips
    for path, issue_floor in (("recall", "b2_recall_queries"), ("persist", "b3_bulk_upserts")):
        contract = floor(f"b1_{path}", f"b4_{path}_contract")
        out[f"{path}_cpu_vs_contract_floor"] = _ratio(cpu(f"service_{path}"), contract)
        out[f"{path}_contract_floor_vs_floor"] = _ratio(contract, floor(f"b1_{path}", issue_floor))
        service, trips = pct(f"idle_service_{path}", 50), pct(f"idle_contract_{path}", 50)
        out[f"{path}_idle_p50_vs_contract"] = _ratio(service, trips)
        out[f"{path}_idle_contract_vs_forwarder"] = _ratio(trips, pct(f"idle_forwarder_{path}", 50))
        # ... and as a stream line: B1's forwarder making the contract's trips per batch, at half its capacity
        stream = f"contract_{path}_stream"
        out[f"{path}_contract_stream_p99_vs_b1"] = _ratio(pct(stream, 99), pct(f"b1_{path}", 99))
        out[f"{path}_p99_vs_contract_stream"] = _ratio(pct(f"service_{path}", 99), pct(stream, 99))
        out[f"{path}_cpu_vs_contract_stream"] = _ratio(cpu(f"service_{path}"), cpu(stream))
        out[f"{path}_contract_stream_cpu_vs_floor"] = _ratio(cpu(stream), floor(f"b1_{path}", issue_floor))
    return {k: _round(v) for k, v in out.items()}


# --- the table -----------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


_HEADER: Final = (
    "line",
    "events",
    "events/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "CPU s/1k",
    "ev/CPU-s",
    "peak RSS MB",
    "mongo CPU s/1k",
    "kafka CPU s/1k",
)


def render_table(lines: Mapping[str, LineResult], ratio_values: Mapping[str, float | None]) -> str:
    """A plain-text table of every line, then the ratios; readable in a terminal and in Markdown."""
    rows = [list(_HEADER)]
    for name in [*LINES, *(n for n in lines if n not in LINES)]:
        line = lines.get(name)
        if line is None:
            continue
        per_k = {k: 1000 * v / line.events for k, v in line.server_cpu_s.items()} if line.events else {}
        rows.append(
            [
                name + (" (FAILED)" if line.error else ""),
                str(line.events),
                _fmt(line.events_per_s),
                _fmt(percentile(line.latencies_ms, 50)),
                _fmt(percentile(line.latencies_ms, 95)),
                _fmt(percentile(line.latencies_ms, 99)),
                _fmt(line.cpu_s_per_1k),
                _fmt(line.events_per_cpu_s),
                _fmt(line.peak_rss_bytes / 2**20 if line.peak_rss_bytes else None),
                _fmt(per_k.get("mongo")),
                _fmt(per_k.get("kafka")),
            ]
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(_HEADER))]
    text = ["| " + " | ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)) + " |" for row in rows]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    text.append("")
    width = max(len(v) for v in RATIOS.values())
    for key, label in RATIOS.items():
        value = ratio_values.get(key)
        text.append(f"{label.ljust(width)}  {_fmt(value) if value is not None else '-'}")
    return "\n".join(text)
