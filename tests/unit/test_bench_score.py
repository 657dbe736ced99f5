"""Issue 33's score table (`bench.targets.SCORE`): pure parts, from a record's lines and ratios."""

from __future__ import annotations

from typing import Any

import pytest

from bench import targets
from bench.stats import RATIOS


def _line(cpu: float | None = None, p50: float | None = None, p99: float | None = None) -> dict[str, Any]:
    return {"cpu_s_per_1k_events": cpu, "latency_ms": {"p50": p50, "p99": p99}}


LINES = {
    "service_recall": _line(cpu=0.887),
    "b1_recall": _line(cpu=0.279),
    "b2_recall_queries": _line(cpu=0.172),
    "service_persist": _line(cpu=0.212, p99=70.6),
    "b1_persist": _line(cpu=0.03, p99=10.0),
    "b3_bulk_upserts": _line(cpu=0.03),
    "mastra_memory": _line(cpu=1.047),
    "mastra_recall": _line(cpu=2.0),
    "mastra_persist": _line(cpu=1.0),
    "idle_service_persist": _line(p50=11.6),
    "idle_forwarder_persist": _line(p50=3.9),
}


def test_score_has_issue_33s_seven_targets_in_order() -> None:
    """Seven rows, each a target the run evaluates (a ratio it computes), none twice."""
    keys = [s.key for s in targets.SCORE]
    assert len(keys) == 7 == len(set(keys))
    assert {g.key for g in targets.GOALS} >= set(keys)
    assert set(RATIOS) >= set(keys)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("recall_cpu_vs_floor", "0.887 vs 0.279 + 0.172 CPU-ms per event"),
        ("persist_cpu_vs_floor", "0.212 vs 0.03 + 0.03 CPU-ms per event"),
        ("turn_service_vs_mastra_memory_per_core", "1.1 vs 1.05 CPU-ms per turn"),
        ("turn_service_vs_mastra_per_core", "1.1 vs 3 CPU-ms per turn"),
        ("persist_idle_p50_vs_forwarder", "11.6 vs 3.9 ms p50"),
        ("persist_p99_vs_b1", "70.6 vs 10 ms p99"),
        ("recall_idle_p50_vs_forwarder", "- vs - ms p50"),  # lines not run
    ],
)
def test_parts_name_the_figures_behind_each_ratio(key: str, expected: str) -> None:
    [score] = [s for s in targets.SCORE if s.key == key]
    assert targets.parts_of(score, LINES) == expected


def test_render_score_rows_values_verdicts_and_load() -> None:
    ratios = {"recall_cpu_vs_floor": 1.96, "persist_cpu_vs_floor": 1.8, "persist_p99_vs_b1": None}
    load = targets.load_record([1.5, 3.25, 2.0], 2)
    text = targets.render_score(ratios, LINES, load)
    assert "load average (1 min) during the run: start 1.50, max 3.25, mean 2.25, end 2.00 (nproc 2)" in text
    rows = [row for row in text.splitlines() if row.startswith("| ") and "---" not in row][1:]
    assert len(rows) == 7
    assert rows[0].startswith("| recall CPU per event / (B1 + B2 raw) | **1.96** |")
    assert rows[0].endswith("| 1.96 | <= 1.5 | FAIL |")
    assert rows[1].endswith("| 3.54 | <= 2 | PASS |")
    assert rows[6].endswith("| not measured |")


def test_score_json_carries_value_parts_and_the_issues_figure() -> None:
    out = targets.score_json({"persist_p99_vs_b1": 7.06}, LINES)
    assert list(out) == [s.key for s in targets.SCORE]
    assert out["persist_p99_vs_b1"] == {
        "label": "persist p99 at half capacity / B1's",
        "value": 7.06,
        "target": "<= 2",
        "passed": False,
        "from": "70.6 vs 10 ms p99",
        "issue_now": 7.06,
    }


def test_load_record_of_no_samples() -> None:
    assert targets.load_record([], 2) == {"samples": [], "nproc": 2}
    assert targets.load_summary({"samples": []}) == "-"
