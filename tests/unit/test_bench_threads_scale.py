"""`--threads-scale`: the per-size figures and their growth from the smallest to the largest size."""

from __future__ import annotations

import pytest

from bench import threads_scale
from bench.stats import LineResult


def _line(name: str, cpu_s: float, p99: float) -> LineResult:
    return LineResult(name, 1000, 1.0, cpu_s, None, latencies_ms=[p99], details={"completed": True})


def _lines(scale: float) -> dict[str, LineResult]:
    return {
        "b1_recall": _line("b1_recall", 0.25, 10),
        "b2_recall_queries": _line("b2_recall_queries", 0.25, 100),
        "service_recall": _line("service_recall", 1.0 * scale, 20 * scale),
        "b1_persist": _line("b1_persist", 0.05, 5),
        "b3_bulk_upserts": _line("b3_bulk_upserts", 0.05, 50),
        "service_persist": _line("service_persist", 0.2, 30),
    }


def test_size_row_and_growth() -> None:
    small = threads_scale.size_row(3000, _lines(1.0))
    assert small["recall_cpu_ms"] == pytest.approx(1.0)
    assert small["recall_cpu_vs_floor"] == pytest.approx(2.0)  # 1.0 / (0.25 + 0.25)
    assert small["persist_cpu_vs_floor"] == pytest.approx(2.0)  # 0.2 / (0.05 + 0.05)
    assert small["persist_p99_ms"] == 30
    assert small["completed"]
    large = threads_scale.size_row(30000, _lines(1.5))
    grown = threads_scale.growth([small, large])
    assert grown["recall_cpu_ms"] == 1.5
    assert grown["recall_p99_ms"] == 1.5
    assert grown["persist_cpu_ms"] == 1.0
    assert threads_scale.growth([small]) == {}
    text = threads_scale.render({"sizes": [small, large], "largest_over_smallest": grown})
    assert "| 3,000 | 1 | 2 | 20 | 0.2 | 2 | 30 | - |" in text
    assert "recall_cpu_ms x1.5" in text


def test_a_missing_line_leaves_its_figures_empty() -> None:
    lines = _lines(1.0)
    del lines["b2_recall_queries"]
    row = threads_scale.size_row(3000, lines)
    assert row["recall_cpu_vs_floor"] is None
    assert row["recall_cpu_ms"] == pytest.approx(1.0)
