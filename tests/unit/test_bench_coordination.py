"""`--instances`: the coordination line's pure parts (the figures per instance count, the flag)."""

from __future__ import annotations

import pytest

from bench import coordination
from bench.cli import _counts
from bench.stats import LineResult


def _line(name: str, events: int, cpu_s: float, error: str | None = None) -> LineResult:
    return LineResult(name, events, 2.0, cpu_s, None, latencies_ms=[5.0, 10.0], error=error)


def test_cpu_per_event_against_the_first_count() -> None:
    """CPU per event of the n instances together, and its ratio to the smallest n's (1.0 = flat)."""
    lines = {
        "service_recall_x1": _line("service_recall_x1", 1000, 1.0),
        "service_recall_x2": _line("service_recall_x2", 1000, 1.1),
        "service_recall_x3": _line("service_recall_x3", 1000, 1.5),
        "service_persist_x1": _line("service_persist_x1", 1000, 0.2),
        "service_persist_x3": _line("service_persist_x3", 1000, 0.3, error="boom"),
    }
    out = coordination.summarize(lines, [3, 1, 2])
    recall = {row["instances"]: row for row in out["recall"]}
    assert [row["instances"] for row in out["recall"]] == [1, 2, 3]
    assert recall[1]["cpu_ms_per_event"] == 1.0
    assert recall[2]["cpu_vs_first"] == pytest.approx(1.1)
    assert recall[3]["cpu_vs_first"] == pytest.approx(1.5)
    assert recall[3]["events_per_s"] == 500
    persist = {row["instances"]: row for row in out["persist"]}
    assert persist[2]["error"] == "not run"
    assert persist[2]["cpu_vs_first"] is None
    assert persist[3]["cpu_ms_per_event"] is None  # a failed line has no figure
    text = coordination.render(out)
    assert "| 2 | 1.1 | 1.1 | 500 | - | - | - |" in text
    assert "| 1 | 1 | 1 | 500 | 0.2 | 1 | 500 |" in text


@pytest.mark.parametrize(
    ("text", "expected"), [(None, ()), ("1,2,3", (1, 2, 3)), ("3, 1,3", (1, 3)), ("1_000", (1000,))]
)
def test_instance_counts_flag(text: str | None, expected: tuple[int, ...]) -> None:
    assert _counts(text) == expected


def test_instance_counts_refuse_zero() -> None:
    with pytest.raises(SystemExit):
        _counts("0,1")
