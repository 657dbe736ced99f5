"""`python -m bench --latency-rate R`: every Kafka line's latency phase at one rate, not half its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from bench.cli import options_from, parser
from bench.context import Budget
from bench.stats import LineResult
from bench.stream_line import _latency


def test_the_rate_reaches_the_budget() -> None:
    assert options_from(parser().parse_args(["--latency-rate", "300"]), []).budget.latency_rate == 300.0
    assert options_from(parser().parse_args([]), []).budget.latency_rate is None
    floor = options_from(parser().parse_args(["--latency-rate", "0.2"]), [])
    assert floor.budget.latency_rate == 0.2


@pytest.mark.parametrize("rate", ["0", "-5", "0.0000001", "0.19", "nan", "inf"])
def test_a_rate_that_is_no_rate_is_refused(rate: str) -> None:
    with pytest.raises(SystemExit, match="--latency-rate"):
        options_from(parser().parse_args([f"--latency-rate={rate}"]), [])


@dataclass
class _Running:
    """What `_latency` reads of a running line; `timed` records the rate and count it was asked for."""

    asked: list[tuple[int, float]] = field(default_factory=list)
    line: Any = field(default_factory=lambda: SimpleNamespace(name="service_persist"))
    launch: Any = field(default_factory=lambda: SimpleNamespace(trace=None))
    launches: list[Any] = field(default_factory=list)
    output_bytes: float = 0.0
    last_probe: Any = None

    async def timed(self, *, count: int, rate: float, timeout_s: float) -> tuple[float, ...]:
        self.asked.append((count, rate))
        return (1.0,) * count


def _asked(budget: Budget, events_per_s: float) -> tuple[int, float]:
    running = _Running()
    result = LineResult("service_persist", int(events_per_s), wall_s=1.0, cpu_s=1.0, peak_rss_bytes=None)
    asyncio.run(_latency(SimpleNamespace(budget=budget), running, result))  # type: ignore[arg-type]
    assert result.details["latency_rate_per_s"] == running.asked[0][1]
    return running.asked[0]


def test_without_it_each_line_is_timed_at_half_its_own_throughput() -> None:
    budget = Budget(latency_events=1000, latency_seconds=2.0)
    assert _asked(budget, 2000.0) == (1000, 1000.0)
    assert _asked(budget, 400.0) == (400, 200.0)  # a slower line: a lower rate


def test_with_it_every_line_is_timed_at_that_rate() -> None:
    budget = Budget(latency_events=1000, latency_seconds=2.0, latency_rate=300.0)
    assert _asked(budget, 2000.0) == (600, 300.0)
    assert _asked(budget, 400.0) == (600, 300.0)
