"""The targets (issues 14 and 25) against one run's figures: each with its value and a verdict. Pure, no I/O.

The targets are the benchmark's, never timed tests: a run on a loaded machine can miss them; the recorded run
in `docs/benchmarks.md` is the one that counts. A target whose figure was not measured (its lines were not
selected, or failed, or no soak ran) is reported as not measured, neither passed nor failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Goal:
    """`value` (a ratio's or the soak's key) must be at most (`at_most`) or at least `bound`."""

    key: str
    label: str
    bound: float
    at_most: bool
    source: str = "ratios"  # or "soak"


GOALS: Final[tuple[Goal, ...]] = (
    # issue 25 replaced issue 14's three bounds below the physical floor (recall <= 2x B1, persist <= 3x B1,
    # 3x the in-memory anchor): a path cannot cost less than Kafka plus the driver doing its queries
    Goal("recall_cpu_vs_floor", "recall: service CPU per event / its floor (B1 + B2 raw)", 1.5, at_most=True),
    Goal("persist_cpu_vs_floor", "persist: service CPU per event / its floor (B1 + B3 raw)", 2.0, True),
    Goal("turn_service_vs_mastra_memory_per_core", "turns per CPU s: service / mastra_memory", 1.25, False),
    Goal("turn_service_vs_mastra_per_core", "turns per CPU s: service / Mastra on the database", 3.0, False),
    Goal("recall_vs_limit", "recall / min(B1, B2 raw), events per second", 0.85, at_most=False),
    Goal("persist_vs_limit", "persist / min(B1, B3 raw), events per second", 0.85, at_most=False),
    Goal("recall_idle_p50_vs_forwarder", "idle, one turn at a time: recall p50 / forwarder's", 1.5, True),
    Goal("persist_idle_p50_vs_forwarder", "idle, one turn at a time: persist p50 / forwarder's", 1.5, True),
    Goal("recall_p99_vs_b1", "recall p99 at half capacity / B1's", 2.0, at_most=True),
    Goal("persist_p99_vs_b1", "persist p99 at half capacity / B1's", 2.0, at_most=True),
    Goal("rss_end_over_10pct", "soak: RSS at the end / after 10% of the events", 1.05, True, source="soak"),
)


@dataclass(frozen=True)
class Outcome:
    goal: Goal
    value: float | None

    @property
    def passed(self) -> bool | None:
        """True / False against the bound; None when the figure was not measured."""
        if self.value is None:
            return None
        return self.value <= self.goal.bound if self.goal.at_most else self.value >= self.goal.bound

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.goal.label,
            "value": self.value,
            "target": f"{'<=' if self.goal.at_most else '>='} {self.goal.bound:g}",
            "passed": self.passed,
        }


def evaluate(ratios: Mapping[str, float | None], soak: Mapping[str, Any] | None = None) -> list[Outcome]:
    """Every goal with its figure from the run's ratios or its soak summary (`bench.soak.summarize`)."""
    out = []
    for goal in GOALS:
        figures: Mapping[str, Any] = ratios if goal.source == "ratios" else (soak or {})
        value = figures.get(goal.key)
        out.append(Outcome(goal, float(value) if value is not None else None))
    return out


def render(outcomes: Sequence[Outcome], soak: Mapping[str, Any] | None = None) -> str:
    """The targets as text: one row each, its value, its bound, PASS / FAIL / not measured."""
    width = max(len(o.goal.label) for o in outcomes)
    rows = ["targets (issues 14 and 25):"]
    for o in outcomes:
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[o.passed]
        value = f"{o.value:.3g}" if o.value is not None else "-"
        bound = f"{'<=' if o.goal.at_most else '>='} {o.goal.bound:g}"
        note = ""
        if o.goal.source == "soak" and soak:
            note = f"  ({soak.get('path')} path, {soak.get('events'):,} events)"
        rows.append(f"  {o.goal.label.ljust(width)}  {value:>7}  {bound:<7}  {verdict}{note}")
    return "\n".join(rows)


# --- issue 33: the seven figures of its table, each a ratio of lines measured side by side in one run -------


@dataclass(frozen=True)
class Score:
    """One row of issue 33's table: a target's key, the figure the issue started from, how it is made."""

    key: str
    label: str
    issue_now: float  # the issue's "now" column (main `46cb75e`, a quiet machine)
    parts: str  # which lines' figures make the ratio: `parts_of` renders them from the run's lines


SCORE: Final[tuple[Score, ...]] = (
    Score(
        "recall_cpu_vs_floor",
        "recall CPU per event / (B1 + B2 raw)",
        1.96,
        "cpu:service_recall/b1_recall+b2_recall_queries",
    ),
    Score(
        "persist_cpu_vs_floor",
        "persist CPU per event / (B1 + B3 raw)",
        3.54,
        "cpu:service_persist/b1_persist+b3_bulk_upserts",
    ),
    Score(
        "turn_service_vs_mastra_memory_per_core",
        "turns per CPU s / Mastra in memory",
        0.95,
        "turn:mastra_memory",
    ),
    Score(
        "turn_service_vs_mastra_per_core",
        "turns per CPU s / Mastra on the database",
        2.62,
        "turn:mastra_recall+mastra_persist",
    ),
    Score(
        "recall_idle_p50_vs_forwarder",
        "idle recall p50 / bare forwarder",
        2.16,
        "p50:idle_service_recall/idle_forwarder_recall",
    ),
    Score(
        "persist_idle_p50_vs_forwarder",
        "idle persist p50 / bare forwarder",
        3.00,
        "p50:idle_service_persist/idle_forwarder_persist",
    ),
    Score("persist_p99_vs_b1", "persist p99 at half capacity / B1's", 7.06, "p99:service_persist/b1_persist"),
)
"""Issue 33's seven targets, in its table's order; their bounds are `GOALS`'."""


def _goal(key: str) -> Goal:
    return next(g for g in GOALS if g.key == key)


def _line_figure(lines: Mapping[str, Mapping[str, Any]], name: str, figure: str) -> float | None:
    line = lines.get(name) or {}
    latency = line.get("latency_ms") or {}
    value = line.get("cpu_s_per_1k_events") if figure == "cpu" else latency.get(figure)
    return float(value) if isinstance(value, int | float) else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def parts_of(score: Score, lines: Mapping[str, Mapping[str, Any]]) -> str:
    """The figures behind a ratio, from the record's lines (their JSON): `0.887 ms vs 0.279 + 0.172`. Pure."""
    kind, spec = score.parts.split(":", 1)
    if kind == "turn":  # CPU ms per turn: the service's recall + persist event against the anchor's
        service = [_line_figure(lines, n, "cpu") for n in ("service_recall", "service_persist")]
        anchor = [_line_figure(lines, n, "cpu") for n in spec.split("+")]
        own = sum(v for v in service if v is not None) if None not in service else None
        theirs = sum(v for v in anchor if v is not None) if None not in anchor else None
        return f"{_ms(own)} vs {_ms(theirs)} CPU-ms per turn"
    name, _, base = spec.partition("/")
    unit = "CPU-ms per event" if kind == "cpu" else f"ms {kind}"
    bases = " + ".join(_ms(_line_figure(lines, n, kind)) for n in base.split("+"))
    return f"{_ms(_line_figure(lines, name, kind))} vs {bases} {unit}"


def render_score(
    ratios: Mapping[str, float | None],
    lines: Mapping[str, Mapping[str, Any]],
    load: Mapping[str, Any] | None = None,
) -> str:
    """Issue 33's table as Markdown: figure, this run's ratio (and what makes it), the issue's "now", bound,
    verdict; headed by the run's load average, which the ratios must be read beside. Pure."""
    rows = ["issue 33's score (each a ratio of lines measured side by side in this run):"]
    if load:
        rows.append(f"load average (1 min) during the run: {load_summary(load)}")
    rows += [
        "| figure | this run | from | issue's now | target | |",
        "|---|---|---|---|---|---|",
    ]
    for score in SCORE:
        goal = _goal(score.key)
        outcome = Outcome(goal, ratios.get(score.key))
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[outcome.passed]
        value = "-" if outcome.value is None else f"**{outcome.value:.3g}**"
        bound = f"{'<=' if goal.at_most else '>='} {goal.bound:g}"
        made_of = parts_of(score, lines)
        rows.append(f"| {score.label} | {value} | {made_of} | {score.issue_now:g} | {bound} | {verdict} |")
    return "\n".join(rows)


def load_summary(load: Mapping[str, Any]) -> str:
    """`start 1.2, max 3.4, mean 2.1, end 2.0 (nproc 2)` from `bench.run`'s load record. Pure."""
    parts = [f"{k} {load[k]:.2f}" for k in ("start", "max", "mean", "end") if load.get(k) is not None]
    text = ", ".join(parts) or "-"
    return f"{text} (nproc {load['nproc']})" if parts and load.get("nproc") else text


def load_record(samples: Sequence[float], nproc: int | None) -> dict[str, Any]:
    """The run's 1-minute load averages (sampled at its start, between lines, at its end), summed up. Pure."""
    if not samples:
        return {"samples": [], "nproc": nproc}
    return {
        "start": samples[0],
        "end": samples[-1],
        "max": max(samples),
        "mean": round(sum(samples) / len(samples), 2),
        "samples": [round(s, 2) for s in samples],
        "nproc": nproc,
    }


def score_json(
    ratios: Mapping[str, float | None], lines: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Issue 33's table for the record: per figure its value, what makes it, the issue's "now", the bound."""
    out = {}
    for score in SCORE:
        outcome = Outcome(_goal(score.key), ratios.get(score.key))
        out[score.key] = outcome.to_json() | {"from": parts_of(score, lines), "issue_now": score.issue_now}
    return out


# --- issue 33: the contract's floor, beside the issue's ---------------------------------------------------


@dataclass(frozen=True)
class ContractRow:
    """A target against both floors: the issue's ratio (`key`), the service against the contract's floor
    (`contract`), and the contract's floor against the issue's (`floors`)."""

    key: str
    label: str
    contract: str
    floors: str
    # the figures behind the ratios, `kind:line,line,...` (service, contract's floor, issue's floor)
    figures: str = ""


CONTRACT_ROWS: Final[tuple[ContractRow, ...]] = (
    ContractRow(
        "recall_cpu_vs_floor",
        "recall CPU per event",
        "recall_cpu_vs_contract_floor",
        "recall_contract_floor_vs_floor",
    ),
    ContractRow(
        "persist_cpu_vs_floor",
        "persist CPU per event",
        "persist_cpu_vs_contract_floor",
        "persist_contract_floor_vs_floor",
    ),
    ContractRow(
        "recall_cpu_vs_floor",
        "recall CPU per event, contract stream",
        "recall_cpu_vs_contract_stream",
        "recall_contract_stream_cpu_vs_floor",
        "cpu:service_recall,contract_recall_stream",
    ),
    ContractRow(
        "persist_cpu_vs_floor",
        "persist CPU per event, contract stream",
        "persist_cpu_vs_contract_stream",
        "persist_contract_stream_cpu_vs_floor",
        "cpu:service_persist,contract_persist_stream",
    ),
    ContractRow(
        "recall_idle_p50_vs_forwarder",
        "idle recall p50",
        "recall_idle_p50_vs_contract",
        "recall_idle_contract_vs_forwarder",
        "p50:idle_service_recall,idle_contract_recall,idle_forwarder_recall",
    ),
    ContractRow(
        "persist_idle_p50_vs_forwarder",
        "idle persist p50",
        "persist_idle_p50_vs_contract",
        "persist_idle_contract_vs_forwarder",
        "p50:idle_service_persist,idle_contract_persist,idle_forwarder_persist",
    ),
    ContractRow(
        "recall_p99_vs_b1",
        "recall p99 at half capacity",
        "recall_p99_vs_contract_stream",
        "recall_contract_stream_p99_vs_b1",
        "p99:service_recall,contract_recall_stream,b1_recall",
    ),
    ContractRow(
        "persist_p99_vs_b1",
        "persist p99 at half capacity",
        "persist_p99_vs_contract_stream",
        "persist_contract_stream_p99_vs_b1",
        "p99:service_persist,contract_persist_stream,b1_persist",
    ),
)
"""Issue 33's targets that are ratios to a floor, each with the contract's floor beside it: for CPU per
event B1 + B4 raw and the contract stream (one process: B1's forwarder making the contract's trips per batch),
for the idle p50 the forwarder making them per record, for the p99 at half capacity the contract stream."""


def contract_verdict(bound: float, floors: float | None, contract: float | None) -> str:
    """What the two floors say of a target's bound (`<= bound` over the issue's floor). Pure.

    The contract's floor alone over the bound: the target is beyond what the floor allows here (even a
    service adding nothing to the contract's commands misses it), whether the service was measured or not;
    else how far the service is above it."""
    if floors is not None and floors > bound:
        return f"beyond the floor: the contract's floor alone is {floors:.3g}x the issue's (bound {bound:g})"
    if floors is None or contract is None:
        return "not measured"
    room = bound / floors
    return f"within the floor: the service may be {room:.3g}x the contract's floor, is {contract:.3g}x"


def contract_figures(row: ContractRow, lines: Mapping[str, Mapping[str, Any]]) -> str:
    """The figures behind a row's ratios, from the record's lines: `70.6 / 30 / 10 ms p99`. Pure."""
    if not row.figures:
        return ""
    kind, names = row.figures.split(":", 1)
    unit = "CPU-ms per event" if kind == "cpu" else f"ms {kind}"
    return f"{' / '.join(_ms(_line_figure(lines, n, kind)) for n in names.split(','))} {unit}"


def render_contract(
    ratios: Mapping[str, float | None], lines: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """Issue 33's floor targets against the issue's floor and the contract's (Markdown), with the lines'
    figures behind them (service / contract's floor / issue's floor) when `lines` (the record's) are given.
    Pure."""
    rows = [
        "issue 33's floor targets against the contract's floor (B1 + B4 raw; B1's forwarder making the "
        "contract's trips: per batch, the contract stream; per record, idle):",
        "| figure | vs the issue's floor | vs the contract's floor | contract's floor / issue's | target | "
        "| from |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in CONTRACT_ROWS:
        goal = _goal(row.key)
        values = [ratios.get(k) for k in (row.key, row.contract, row.floors)]
        cells = ["-" if v is None else f"{v:.3g}" for v in values]
        verdict = contract_verdict(goal.bound, values[2], values[1])
        made_of = contract_figures(row, lines or {})
        rows.append(f"| {row.label} | {' | '.join(cells)} | <= {goal.bound:g} | {verdict} | {made_of} |")
    return "\n".join(rows)
