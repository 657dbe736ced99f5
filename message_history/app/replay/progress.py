"""How a replay shows where it is: a progress bar on a terminal, periodic log lines otherwise, a summary.

Stdlib only and no asyncio: the replay calls `ProgressDisplay.update` on a timer and `summary_lines` at the
end; formatting is a set of pure functions, tested with fixed values.

On a terminal the bar is redrawn in place on stderr with a carriage return:

    [########............]  41%  4,100/10,000  812/s  ETA 0:07  persisted 3,950  skipped 100  invalid 50

Elsewhere (a Kubernetes Job, a pipe) a `replay progress` log line every few seconds carries the same numbers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from message_history.app.replay.plan import Counts

Mode = Literal["bar", "log", "none"]
Status = Literal["done", "interrupted", "failed"]

BAR_WIDTH = 20
BAR_REDRAW_S = 0.2


# --- formatting (pure) -------------------------------------------------------------------------------------


def format_count(value: int) -> str:
    """`12345` -> `"12,345"`."""
    return f"{value:,}"


def format_duration(seconds: float) -> str:
    """`"0:07"`, `"12:05"`, `"1:02:03"` (hours only when needed); negative durations count as zero."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_rate(per_second: float) -> str:
    """`"812/s"`, `"1,234/s"`; one decimal below 10/s so a slow `--rate` does not read as 0."""
    if per_second < 10:
        return f"{per_second:.1f}/s"
    return f"{round(per_second):,}/s"


def eta_seconds(remaining: int, per_second: float) -> float | None:
    """Seconds left at the current rate; None while the rate is unknown (zero)."""
    if remaining <= 0:
        return 0.0
    if per_second <= 0:
        return None
    return remaining / per_second


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """`[#####...............]` for `fraction` in [0, 1] (clamped)."""
    filled = int(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def fraction_done(done: int, total: int) -> float:
    return 1.0 if total <= 0 else max(0.0, min(1.0, done / total))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a replay is: offsets done of the total, the tallies, the recent rate (offsets per second)."""

    done: int
    total: int
    counts: Counts
    elapsed_s: float
    rate: float


def outcome_parts(counts: Counts) -> list[str]:
    """The non-zero outcome counters, as `"persisted 3,950"`-style words, in a fixed order."""
    parts: list[tuple[str, int]] = [
        ("persisted", counts.persisted),
        ("skipped", sum(counts.skipped.values())),
        ("enriched", counts.enriched),
        ("invalid", counts.invalid),
        ("observed", counts.observations),
    ]
    words = [f"{name} {format_count(value)}" for name, value in parts if value]
    if counts.observing:  # `--observe`: the partitions stand still while their observers answer
        words.append(f"waiting for {format_count(counts.observing)} observations")
    return words


def progress_line(snapshot: Snapshot, width: int = 120) -> str:
    """The one-line bar, cut to `width` characters."""
    eta = eta_seconds(snapshot.total - snapshot.done, snapshot.rate)
    words = [
        bar(fraction_done(snapshot.done, snapshot.total)),
        f"{fraction_done(snapshot.done, snapshot.total) * 100:3.0f}%",
        f"{format_count(snapshot.done)}/{format_count(snapshot.total)}",
        format_rate(snapshot.rate),
        f"ETA {format_duration(eta)}" if eta is not None else "ETA ?",
        *outcome_parts(snapshot.counts),
    ]
    return "  ".join(words)[: max(10, width)]


def progress_fields(snapshot: Snapshot) -> dict[str, Any]:
    """The numbers of a `replay progress` log line."""
    eta = eta_seconds(snapshot.total - snapshot.done, snapshot.rate)
    counts = snapshot.counts
    return {
        "done": snapshot.done,
        "total": snapshot.total,
        "percent": round(fraction_done(snapshot.done, snapshot.total) * 100, 1),
        "events": counts.events,
        "rate_per_s": round(snapshot.rate, 1),
        "eta_s": round(eta, 1) if eta is not None else None,
        "elapsed_s": round(snapshot.elapsed_s, 1),
        "persisted": counts.persisted,
        "skipped": sum(counts.skipped.values()),
        "enriched": counts.enriched,
        "invalid": counts.invalid,
        "observed": counts.observations,
        "observing": counts.observing,
    }


# --- rate --------------------------------------------------------------------------------------------------


class RateMeter:
    """Progress per second over the last `window_s` seconds (the whole run until a window has passed)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> None:
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


# --- the display -------------------------------------------------------------------------------------------


class ProgressDisplay:
    """Renders snapshots: the bar in place (`bar`), a log line every `interval_s` (`log`), or nothing.

    `update` may be called as often as wanted; it draws at most every `BAR_REDRAW_S` (bar) or `interval_s`
    (log). `clear` erases the bar so that another line can be written to the same stream cleanly.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        mode: Mode,
        interval_s: float,
        log: Callable[[dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic,
        width: int = 120,
    ) -> None:
        self._stream = stream
        self.mode: Mode = mode
        self._interval = interval_s
        self._log = log
        self._clock = clock
        self._width = width
        self._started = clock()
        self._last_draw: float | None = None
        self._drawn = 0  # characters of the bar currently on screen
        self.meter = RateMeter()

    def snapshot(self, done: int, total: int, counts: Counts) -> Snapshot:
        now = self._clock()
        self.meter.add(now, done)
        return Snapshot(done, total, counts, now - self._started, self.meter.rate())

    def update(self, done: int, total: int, counts: Counts, *, force: bool = False) -> None:
        snap = self.snapshot(done, total, counts)
        if self.mode == "none":
            return
        now = self._clock()
        every = BAR_REDRAW_S if self.mode == "bar" else self._interval
        if not force and self._last_draw is not None and now - self._last_draw < every:
            return
        self._last_draw = now
        if self.mode == "bar":
            line = progress_line(snap, self._width - 1)
            self._stream.write("\r" + line + " " * max(0, self._drawn - len(line)))
            self._stream.flush()
            self._drawn = len(line)
        else:
            self._log(progress_fields(snap))

    def clear(self) -> None:
        """Erase the bar (a no-op in log mode)."""
        if self._drawn:
            self._stream.write("\r" + " " * self._drawn + "\r")
            self._stream.flush()
            self._drawn = 0

    def close(self, done: int, total: int, counts: Counts) -> None:
        """Draw the final state; the bar is left on screen with a newline after it."""
        self.update(done, total, counts, force=True)
        if self.mode == "bar" and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = 0


# --- the summary -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """What the replay did, printed at the end."""

    topic: str
    status: Status
    elapsed_s: float
    counts: Counts
    dry_run: bool = False
    path: Literal["persist", "recall"] = "persist"
    dead_letter_topic: str | None = None  # None: invalid records were reported, not dead-lettered
    emitted_to: str | None = None
    resume: str | None = None  # the `--from-offsets ...` flag to go on with; None when finished
    error: str | None = None
    notes: list[str] = field(default_factory=list)


_STATUS_WORDS = {"done": "finished", "interrupted": "interrupted", "failed": "FAILED"}


def summary_lines(summary: Summary) -> list[str]:
    """The end-of-run report, one fact per line; the resume flag, when there is one, on a line of its own."""
    c = summary.counts
    elapsed = max(summary.elapsed_s, 1e-9)
    what = "dry run" if summary.dry_run else "replay"
    lines = [
        f"{what} of {summary.topic} {_STATUS_WORDS[summary.status]} "
        f"after {format_duration(summary.elapsed_s)}" + (f": {summary.error}" if summary.error else ""),
        f"  events read        {format_count(c.events)}  ({format_rate(c.events / elapsed)})",
    ]
    if summary.path == "persist":
        would = "would be " if summary.dry_run else ""
        lines.append(f"  {'saved' if not summary.dry_run else 'to save':<18} {format_count(c.persisted)}")
        if c.skipped:
            reasons = ", ".join(f"{reason} {format_count(n)}" for reason, n in sorted(c.skipped.items()))
            lines.append(f"  skipped            {format_count(sum(c.skipped.values()))}  ({reasons})")
        else:
            lines.append("  skipped            0")
        messages = c.messages_inserted + c.messages_present
        lines.append(
            f"  messages           {format_count(messages)}  "
            f"({format_count(c.messages_inserted)} {would}inserted,"
            f" {format_count(c.messages_present)} already present)  "
            f"{format_rate(messages / elapsed)}"
        )
        threads = f"  threads            {format_count(c.threads)}"
        if summary.dry_run:
            threads += f"  ({format_count(c.threads_new)} new)"
        lines.append(threads)
        if c.observations:  # `--observe`
            lines.append(f"  observed           {format_count(c.observations)}  (claims sent and settled)")
    else:
        lines.append(
            f"  enriched           {format_count(c.enriched)}  ({format_count(c.recalled)} messages recalled)"
        )
    if summary.emitted_to:
        lines.append(f"  emitted to         {summary.emitted_to}")
    invalid = f"  invalid            {format_count(c.invalid)}"
    if c.invalid:
        where = (
            f"dead-lettered to {summary.dead_letter_topic}"
            if summary.dead_letter_topic and c.dead_lettered
            else "not dead-lettered, reported"
        )
        invalid += f"  ({where})"
    lines.append(invalid)
    lines.extend(f"    at {sample}" for sample in c.invalid_samples)
    if c.invalid > len(c.invalid_samples):
        lines.append(f"    ... {format_count(c.invalid - len(c.invalid_samples))} more (see the log)")
    if c.lost_to_retention:
        lines.append(
            f"  lost to retention  {format_count(c.lost_to_retention)} offsets deleted before they were read"
        )
    lines.extend(f"  note: {note}" for note in summary.notes)
    if summary.resume:
        lines.append(f"resume with: {summary.resume}")
    return lines
