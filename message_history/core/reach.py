"""Is a dependency reachable, and what to say about an outage: two pure decisions, on a clock passed in.

`Reach`: a dependency is unreachable once nothing has answered for longer than a grace. The time of the
last answer is what counts (a probe that hangs on a frozen broker and one refused at once by a stopped one
end the same way), so a blip shorter than the grace never makes a path unready.

`Narration`: what one path writes about one dependency's outage. One WARNING when it starts (what, since
when), one summary every `every_s` while it lasts (retries, how long), one INFO when it is back; every
other failed attempt only counts, and a dependency that flaps writes nothing for flaps shorter than a few
seconds.
An outage of a minute is then a handful of lines, whatever the retry rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class Reach:
    """Reachable unless nothing answered for `grace_s`; `last_answer` starts at the watch's start."""

    grace_s: float
    last_answer: float
    why: str = ""  # the last failure seen since the last answer

    def answered(self, sent_at: float) -> None:
        """An answer to a request sent at `sent_at` (the send time: a slow answer proves less)."""
        self.last_answer = max(self.last_answer, sent_at)
        self.why = ""

    def failed(self, why: str) -> None:
        self.why = why

    def reachable(self, now: float) -> bool:
        return now - self.last_answer < self.grace_s

    def silent_s(self, now: float) -> float:
        """Seconds since the last answer."""
        return max(0.0, now - self.last_answer)


@dataclass(frozen=True, slots=True)
class Line:
    """One line to write: its level, what it says, and the figures it carries."""

    level: Literal["warning", "info"]
    kind: Literal["unreachable", "still unreachable", "back"]
    retries: int  # failed attempts since the outage started
    lasted_s: float  # how long the outage has lasted
    since: float  # when it started (the caller's clock)


@dataclass
class Narration:
    """Which lines one path's outages of one dependency get; `failed` and `back` return the line to write.

    A dependency that flaps (a chunk goes through, the next fails) opens a new outage each time: one that
    opens within `every_s` of the last line is announced only once it has lasted `settle_s`, so flaps
    shorter than that are counted, not written (and end without a line); a second real outage soon after
    the first is still said.
    """

    every_s: float = 30.0
    settle_s: float = 5.0
    since: float | None = None  # the outage's start; None: no outage
    retries: int = 0
    announced: bool = False  # this outage's WARNING was written
    _last_line: float = float("-inf")

    def failed(self, now: float, since: float | None = None) -> Line | None:
        """A failed attempt at `now`; `since` dates the outage's start when it is older than `now` (the
        last answer before it). The first one opens the outage."""
        self.retries += 1
        if self.since is None:
            self.since = now if since is None else min(since, now)
            self.retries = 1
            self.announced = False
        settled = not self.announced and now - self.since >= self.settle_s
        if now - self._last_line < self.every_s and not settled:
            return None
        self._last_line = now
        kind: Literal["unreachable", "still unreachable"] = (
            "still unreachable" if self.announced else "unreachable"
        )
        self.announced = True
        return Line("warning", kind, self.retries, now - self.since, self.since)

    def back(self, now: float) -> Line | None:
        """The dependency answered: the INFO line once, if an announced outage was open."""
        if self.since is None:
            return None
        line = Line("info", "back", self.retries, now - self.since, self.since) if self.announced else None
        self.since = None
        self.retries = 0
        self.announced = False
        return line

    @property
    def open(self) -> bool:
        return self.since is not None
