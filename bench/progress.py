"""Progress lines on stderr for long phases, at most one every few seconds (stdout is kept for the table)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`update(done, total)` prints `phase: done/total (rate/s)` when `every_s` has passed since the last."""

    def __init__(self, phase: str, *, every_s: float = 5.0, out: TextIO | None = None) -> None:
        self.phase = phase
        self._every = every_s
        self._out = out if out is not None else sys.stderr
        self._started = time.monotonic()
        self._last = 0.0

    def say(self, text: str) -> None:
        print(f"[bench] {self.phase}: {text}", file=self._out, flush=True)

    def update(self, done: int, total: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every and done < total:
            return
        self._last = now
        elapsed = now - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        self.say(f"{done:,}/{total:,} ({rate:,.0f}/s, {elapsed:,.0f} s)")


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)
