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
