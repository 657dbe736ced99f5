"""Replay's progress display and summary: formatting, the in-place bar, periodic log lines, the end report."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import pytest

from message_history.app.replay.plan import Counts
from message_history.app.replay.progress import (
    BAR_REDRAW_S,
    ProgressDisplay,
    RateMeter,
    Snapshot,
    Summary,
    bar,
    eta_seconds,
    format_count,
    format_duration,
    format_rate,
    progress_fields,
    progress_line,
    summary_lines,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0:00"), (7.4, "0:07"), (59.6, "1:00"), (725, "12:05"), (3723, "1:02:03"), (-3, "0:00")],
    ids=["zero", "seconds", "rounds-up", "minutes", "hours", "negative"],
)
def test_format_duration(seconds: float, text: str) -> None:
    """Durations read as M:SS, with hours only when needed."""
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("rate", "text"),
    [(0.0, "0.0/s"), (4.25, "4.2/s"), (812.4, "812/s"), (12345.6, "12,346/s")],
    ids=["zero", "slow", "hundreds", "thousands"],
)
def test_format_rate(rate: float, text: str) -> None:
    """Rates below 10/s keep a decimal; larger ones are whole and grouped."""
    assert format_rate(rate) == text


@pytest.mark.parametrize(
    ("remaining", "rate", "eta"),
    [(100, 10.0, 10.0), (0, 0.0, 0.0), (5, 0.0, None), (-3, 1.0, 0.0)],
    ids=["steady", "done", "unknown-rate", "overshoot"],
)
def test_eta_seconds(remaining: int, rate: float, eta: float | None) -> None:
    """ETA is remaining over rate; unknown while nothing moved; zero when done."""
    assert eta_seconds(remaining, rate) == eta


@pytest.mark.parametrize(
    ("fraction", "text"),
    [(0.0, "[..........]"), (0.45, "[####......]"), (1.0, "[##########]"), (1.7, "[##########]")],
    ids=["empty", "part", "full", "clamped"],
)
def test_bar(fraction: float, text: str) -> None:
    """The bar fills in proportion, never past its width."""
    assert bar(fraction, width=10) == text


def _counts(**values: Any) -> Counts:
    counts = Counts()
    for name, value in values.items():
        setattr(counts, name, value)
    return counts


def test_progress_line_shows_counts_rate_eta_and_outcomes() -> None:
    """The bar line carries percent, done/total, the rate, the ETA and the non-zero outcome counters."""
    snap = Snapshot(
        done=4100,
        total=10_000,
        counts=_counts(persisted=3950, skipped=Counter({"read-only": 100}), invalid=50),
        elapsed_s=5,
        rate=820.0,
    )
    line = progress_line(snap)
    assert line.startswith("[########............]   41%  4,100/10,000  820/s  ETA 0:07")
    assert line.endswith("persisted 3,950  skipped 100  invalid 50")
    assert "enriched" not in line
    assert len(progress_line(snap, width=30)) == 30


def test_progress_line_before_any_rate_says_eta_unknown() -> None:
    """With no progress yet the ETA is shown as unknown rather than infinite."""
    assert "ETA ?" in progress_line(Snapshot(0, 10, Counts(), 0.1, 0.0))


def test_progress_fields_for_log_lines() -> None:
    """A progress log line has the same numbers as the bar, as fields."""
    fields = progress_fields(Snapshot(250, 1000, _counts(events=250, persisted=240, invalid=10), 10.0, 25.0))
    assert fields == {
        "done": 250,
        "total": 1000,
        "percent": 25.0,
        "events": 250,
        "rate_per_s": 25.0,
        "eta_s": 30.0,
        "elapsed_s": 10.0,
        "persisted": 240,
        "skipped": 0,
        "enriched": 0,
        "invalid": 10,
        "observed": 0,
        "observing": 0,
    }


@pytest.mark.parametrize(
    ("samples", "rate"),
    [
        ([(0.0, 0)], 0.0),
        ([(0.0, 0), (2.0, 100)], 50.0),
        ([(0.0, 0), (5.0, 100), (10.0, 100), (15.0, 400)], 30.0),
    ],
    ids=["one-sample", "steady", "window-drops-old-samples"],
)
def test_rate_meter(samples: list[tuple[float, int]], rate: float) -> None:
    """The rate is progress over the recent window (10 s), older samples forgotten."""
    meter = RateMeter(window_s=10.0)
    for now, done in samples:
        meter.add(now, done)
    assert meter.rate() == pytest.approx(rate)


def test_bar_mode_redraws_in_place_at_most_every_redraw_interval() -> None:
    """On a terminal the bar is redrawn with a carriage return, throttled, padded over a longer old line."""
    stream, clock = io.StringIO(), FakeClock()
    display = ProgressDisplay(stream, mode="bar", interval_s=5, log=lambda f: None, clock=clock)
    display.update(0, 1000, _counts(persisted=123456))
    first = stream.getvalue()
    assert first.startswith("\r[")
    display.update(10, 1000, Counts())  # too soon: nothing drawn
    assert stream.getvalue() == first
    clock.now += BAR_REDRAW_S
    display.update(500, 1000, Counts())
    second = stream.getvalue()[len(first) :]
    assert second.startswith("\r[##########..........]   50%")
    assert len(second) == len(first)  # the shorter line is padded over the old one
    display.close(1000, 1000, Counts())
    assert stream.getvalue().endswith("\n")
    assert "100%" in stream.getvalue().rsplit("\r", 1)[1]


def test_clear_erases_the_bar_before_another_line() -> None:
    """`clear` blanks the drawn bar and returns the cursor, so a log line starts on a clean line."""
    stream = io.StringIO()
    display = ProgressDisplay(stream, mode="bar", interval_s=5, log=lambda f: None, clock=FakeClock())
    display.update(1, 2, Counts())
    drawn = len(stream.getvalue()) - 1
    display.clear()
    assert stream.getvalue().endswith("\r" + " " * drawn + "\r")
    display.clear()  # nothing on screen: nothing written
    assert stream.getvalue().endswith("\r" + " " * drawn + "\r")


def test_log_mode_logs_every_interval_and_writes_nothing_to_the_stream() -> None:
    """Off a terminal, progress is a log line every `interval_s`, plus one at the end."""
    stream, clock = io.StringIO(), FakeClock()
    logged: list[dict[str, Any]] = []
    display = ProgressDisplay(stream, mode="log", interval_s=5, log=logged.append, clock=clock)
    for _ in range(12):  # 12 updates, one a second
        display.update(len(logged), 100, Counts())
        clock.now += 1
    display.close(100, 100, Counts())
    assert [f["done"] for f in logged] == [0, 1, 2, 100]  # at t=0, 5, 10, and the final one
    assert logged[-1]["percent"] == 100.0
    assert stream.getvalue() == ""


def test_none_mode_shows_nothing() -> None:
    """`--progress none` draws and logs nothing."""
    stream = io.StringIO()
    logged: list[dict[str, Any]] = []
    display = ProgressDisplay(stream, mode="none", interval_s=1, log=logged.append, clock=FakeClock())
    display.update(1, 2, Counts())
    display.close(2, 2, Counts())
    assert (stream.getvalue(), logged) == ("", [])


# --- summary -----------------------------------------------------------------------------------------------


def test_summary_of_a_finished_replay() -> None:
    """The summary reports events, saves, skips by reason, messages inserted vs present, threads, invalid."""
    counts = _counts(
        events=1000,
        persisted=900,
        skipped=Counter({"read-only": 60, "nothing-to-save": 20}),
        messages_inserted=1500,
        messages_present=300,
        threads=40,
    )
    counts.add_invalid(
        partition=2, offset=17, error="EventValidationError: not valid JSON", dead_lettered=True
    )
    lines = summary_lines(
        Summary(
            topic="agent.responses", status="done", elapsed_s=10.0, counts=counts, dead_letter_topic="x.dlq"
        )
    )
    assert lines == [
        "replay of agent.responses finished after 0:10",
        "  events read        1,001  (100/s)",
        "  saved              900",
        "  skipped            80  (nothing-to-save 20, read-only 60)",
        "  messages           1,800  (1,500 inserted, 300 already present)  180/s",
        "  threads            40",
        "  invalid            1  (dead-lettered to x.dlq)",
        "    at 2/17: EventValidationError: not valid JSON",
    ]


def test_summary_of_an_interrupted_dry_run_ends_with_the_resume_flag() -> None:
    """A stopped run's last line is the flag to resume with; a dry run says 'would be inserted'."""
    counts = _counts(
        events=10, persisted=10, messages_inserted=15, messages_present=5, threads=3, threads_new=2
    )
    lines = summary_lines(
        Summary(
            topic="t",
            status="interrupted",
            elapsed_s=2.0,
            counts=counts,
            dry_run=True,
            resume="--from-offsets 0:10,1:4",
        )
    )
    assert lines[0] == "dry run of t interrupted after 0:02"
    assert "  messages           20  (15 would be inserted, 5 already present)  10/s" in lines
    assert "  threads            3  (2 new)" in lines
    assert lines[-1] == "resume with: --from-offsets 0:10,1:4"


def test_summary_of_a_failed_recall_replay_names_the_error_and_what_was_reported() -> None:
    """A failure shows its reason; the recall path reports enrichments; skipped invalid records say so."""
    counts = _counts(enriched=7, recalled=70)
    for offset in range(Counts.SAMPLES + 2):
        counts.add_invalid(partition=0, offset=offset, error="E: x", dead_lettered=False)
    lines = summary_lines(
        Summary(
            topic="agent.requests",
            status="failed",
            elapsed_s=1.0,
            counts=counts,
            path="recall",
            emitted_to="side",
            error="ReplayAbortedError: MongoDB down",
            resume="--from-offsets 0:12",
        )
    )
    assert lines[0] == "replay of agent.requests FAILED after 0:01: ReplayAbortedError: MongoDB down"
    assert "  enriched           7  (70 messages recalled)" in lines
    assert "  emitted to         side" in lines
    assert f"  invalid            {Counts.SAMPLES + 2}  (not dead-lettered, reported)" in lines
    assert "    ... 2 more (see the log)" in lines
    assert lines[-1] == "resume with: --from-offsets 0:12"


def test_format_count_groups_thousands() -> None:
    """Counts are grouped by thousands."""
    assert format_count(1234567) == "1,234,567"
