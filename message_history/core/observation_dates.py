"""The dates Mastra's Observational Memory annotates in the context (pure): `addRelativeTimeToObservations`.

As `@mastra/memory` 1.31.0's `date-utils.ts` does it, on the optimized log at the request's time:

* inline `(estimated May 27-28, 2023)` / `(meaning May 30, 2023)` get their distance, `- 3 weeks ago`, and
  `, likely already happened` when the line said it was planned (`will …`, `plans to`, …) and the date passed;
* each `Date: May 15, 2023` header line gets `(1 month ago)`, and a `[2 weeks later]` marker goes before a
  header more than a day after the previous one.

Dates are read as V8 reads `new Date("May 15, 2023")`, in UTC (Mastra uses its host's zone). JavaScript's
regular expressions are reproduced by hand where a Python pattern could backtrack super-linearly on a
hostile log (tests/unit/test_regex_bounds.py audits the rest); tests/unit/test_observation_rules.py compares
the results with Mastra's own `buildContextSystemMessages` on recorded cases.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = ["JS_SPACE", "JS_SPACE_CHARS", "add_relative_time", "expand_inline_dates"]

JS_SPACE: Final = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
"""JavaScript's `\\s` as a character-class body (Python's `\\s` differs at U+001C..U+001F, U+0085, U+FEFF)."""
JS_SPACE_CHARS: Final = JS_SPACE.replace("\u2000-\u200a", "".join(map(chr, range(0x2000, 0x200B))))
"""The same characters listed one by one (for `str.strip` and membership tests)."""
_SPACE_CHARS: Final = frozenset(JS_SPACE_CHARS)
_LETTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS: Final = frozenset("0123456789")
_SIMPLE: Final = re.compile(f"([A-Z][a-z]+)[{JS_SPACE}]+([0-9]{{1,2}}),?[{JS_SPACE}]+([0-9]{{4}})")
_RANGE: Final = re.compile(
    f"([A-Z][a-z]+)[{JS_SPACE}]+([0-9]{{1,2}})-[0-9]{{1,2}},?[{JS_SPACE}]+([0-9]{{4}})"
)
# isFutureIntentObservation's patterns, as where each starts to hold (see _intent_starts).
_WILL: Final = re.compile(f"\\bwill[{JS_SPACE}]+(?=\\w)", re.IGNORECASE | re.ASCII)
_INTENT: Final = re.compile(
    f"\\b(?:plans?|planning|looking[{JS_SPACE}]+forward|going|intends?|wants?|needs?|about)[{JS_SPACE}]+to\\b",
    re.IGNORECASE | re.ASCII,
)
_VAGUE: Final = (("late", 23), ("early", 7), ("mid", 15))
# JavaScript's multiline `^`/`$`: at the ends of the text or next to any of its line terminators.
_HEADER: Final = re.compile(
    f"(?:^|(?<=[\n\r\u2028\u2029]))(Date:[{JS_SPACE}]*)([A-Z][a-z]+) ([0-9]{{1,2}}), ([0-9]{{4}})"
    "(?=[\n\r\u2028\u2029]|\\Z)"
)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MONTHS: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_MS: Final = 86_400_000


def _v8_date(month: str, day: str, year: str) -> datetime | None:
    """`new Date("<Month> <D>, <YYYY>")` as V8 parses it (UTC): a month named by its first three letters,
    day 1-31 rolling over into the next month, years 0-49 and 50-99 read as 20xx and 19xx."""
    if len(month) < 3 or month[:3].lower() not in _MONTHS or not 1 <= int(day) <= 31:
        return None
    number = int(year)
    if number < 50:
        number += 2000
    elif number < 100:
        number += 1900
    if number < 1:
        return None
    first = datetime(number, _MONTHS.index(month[:3].lower()) + 1, 1, tzinfo=UTC)
    return first + timedelta(days=int(day) - 1)


def _ms(moment: datetime) -> int:
    """A JavaScript `Date`'s time value: whole milliseconds since the epoch."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(milliseconds=1)


_NEAR: Final = {-1: "tomorrow", 0: "today", 1: "yesterday"}


def _relative(date: datetime, now: datetime) -> str:
    """`formatRelativeTime`: today, yesterday, tomorrow, else N days/weeks/months/years ago or ahead."""
    days = (_ms(now) - _ms(date)) // _DAY_MS
    if days in _NEAR:
        return _NEAR[days]
    span = _span(abs(days), years=True)
    return f"in {span}" if days < 0 else f"{span} ago"


def _span(days: int, *, years: bool) -> str:
    """A distance of two days or more, as `formatRelativeTime` and `formatGapBetweenDates` word it (the gap
    never in years)."""
    if days < 7:
        return f"{days} days"
    if days < 14:
        return "1 week"
    if days < 30:
        return f"{days // 7} weeks"
    if days < 60:
        return "1 month"
    if days < 365 or not years:
        return f"{days // 30} months"
    count = days // 365
    return f"{count} year{'s' if count > 1 else ''}"


def _gap(previous: datetime, current: datetime) -> str | None:
    """`formatGapBetweenDates`: a marker when more than a day passed between two headers."""
    days = (_ms(current) - _ms(previous)) // _DAY_MS
    return f"[{_span(days, years=False)} later]" if days > 1 else None


def add_relative_time(observations: str, now: datetime) -> str:
    """`addRelativeTimeToObservations`: inline dates expanded, then `Date: May 15, 2023 (1 month ago)` with
    gap markers between headers."""
    observations = expand_inline_dates(observations, now)
    found = []
    for match in _HEADER.finditer(observations):
        date = _v8_date(match[2], match[3], match[4])
        if date is not None:
            found.append((match, date))
    if not found:
        return observations
    out: list[str] = []
    last = 0
    previous: datetime | None = None
    for match, date in found:
        out.append(observations[last : match.start()])
        gap = _gap(previous, date) if previous is not None else None
        if gap:
            out.append(f"\n{gap}\n\n")
        out.append(f"{match[1]}{match[2]} {match[3]}, {match[4]} ({_relative(date, now)})")
        last = match.end()
        previous = date
    out.append(observations[last:])
    return "".join(out)


def _runs(text: str, members: frozenset[str]) -> list[int]:
    """For each position, where the run of `members` starting there ends (itself when none starts)."""
    ends = list(range(len(text) + 1))
    for index in range(len(text) - 1, -1, -1):
        if text[index] in members:
            ends[index] = ends[index + 1]
    return ends


def _ieq(text: str, at: int, word: str) -> bool:
    """`word` (lowercase ASCII) at `at`, ASCII case-insensitively (JavaScript's `/i` without `u`)."""
    piece = text[at : at + len(word)]
    return piece.isascii() and piece.lower() == word


class _Scan:
    """One date text with its letter, space and digit runs found once (the hand-made patterns use them)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.letters = _runs(text, _LETTERS)
        self.spaces = _runs(text, _SPACE_CHARS)
        self.digits = _runs(text, _DIGITS)

    def month_year(self, at: int) -> tuple[str, str] | None:
        """`([A-Z][a-z]+)\\s+(\\d{4})` (case-insensitive) matched at `at`: the month word and the year."""
        end = self.letters[at]
        if end - at < 2:
            return None
        year = self.spaces[end]
        if year == end or self.digits[year] - year < 4:
            return None
        return self.text[at:end], self.text[year : year + 4]

    def separator(self, at: int) -> list[int]:
        """`[- ]?`: taken first, then left out."""
        return [at + 1, at] if self.text[at : at + 1] in ("-", " ") else [at]

    def vague(self) -> tuple[str, int, str] | None:
        """`/(late|early|mid)[- ]?(?:to[- ]?(?:late|early|mid)[- ]?)?([A-Z][a-z]+)\\s+(\\d{4})/i`, first
        match: (month, day the modifier stands for, year)."""
        text = self.text
        for start in range(len(text)):
            found = next(((w, d) for w, d in _VAGUE if _ieq(text, start, w)), None)
            if found is None:
                continue
            for after in self.separator(start + len(found[0])):
                for month_at in [*self._to_modifier(after), after]:
                    hit = self.month_year(month_at)
                    if hit is not None:
                        return hit[0], found[1], hit[1]
        return None

    def _to_modifier(self, at: int) -> list[int]:
        """Where the month may start after the optional `to[- ]?(late|early|mid)[- ]?`, in trying order."""
        if not _ieq(self.text, at, "to"):
            return []
        out = []
        for after_to in self.separator(at + 2):
            word = next((w for w, _ in _VAGUE if _ieq(self.text, after_to, w)), None)
            if word is not None:
                out.extend(self.separator(after_to + len(word)))
        return out

    def cross_month(self) -> tuple[str, str] | None:
        """`/([A-Z][a-z]+)\\s+to\\s+(?:early\\s+)?([A-Z][a-z]+)\\s+(\\d{4})/i`, first match: (second month,
        year). The first word runs to the end of its letters, so only each run's first letter can start it."""
        text = self.text
        start = 0
        while start < len(text):
            end = self.letters[start]
            if end == start:
                start += 1
                continue
            if end - start >= 2:
                hit = self._cross_tail(end)
                if hit is not None:
                    return hit
            start = end
        return None

    def _cross_tail(self, end: int) -> tuple[str, str] | None:
        to = self.spaces[end]
        if to == end or not _ieq(self.text, to, "to"):
            return None
        month_at = self.spaces[to + 2]
        if month_at == to + 2:
            return None
        if _ieq(self.text, month_at, "early") and self.spaces[month_at + 5] > month_at + 5:
            hit = self.month_year(self.spaces[month_at + 5])
            if hit is not None:
                return hit
        return self.month_year(month_at)


def parse_date(content: str) -> datetime | None:
    """`parseDateFromContent`: `May 30, 2023`, `May 27-28, 2023`, `late April 2023`, `April to May 2023`."""
    for pattern in (_SIMPLE, _RANGE):
        match = pattern.search(content)
        if match:
            date = _v8_date(match[1], match[2], match[3])
            if date is not None:
                return date
    scan = _Scan(content)
    vague = scan.vague()
    if vague is not None:
        date = _v8_date(vague[0], str(vague[1]), vague[2])
        if date is not None:
            return date
    cross = scan.cross_month()
    return _v8_date(cross[0], "1", cross[1]) if cross is not None else None


class _Intents:
    """Where `isFutureIntentObservation` holds on a line's text cut at an offset, answered in log time.

    Each phrase is kept as (its start, the smallest cut that contains it). A cut always ends before a `(`, so
    a phrase ending right there ends at a word boundary: what a cut holds only grows with it. So a cut of the
    line starting at `line_start` holds a phrase iff the smallest "ready" of the phrases starting at or after
    `line_start` is at most the cut (a phrase starting after the cut is ready after it too)."""

    def __init__(self, text: str) -> None:
        found = [(m.start(), m.end() + 1) for m in _WILL.finditer(text)]
        found += [(m.start(), m.end()) for m in _INTENT.finditer(text)]
        found.sort()
        self.starts = [start for start, _ in found]
        self.ready = [ready for _, ready in found]
        for index in range(len(self.ready) - 2, -1, -1):
            self.ready[index] = min(self.ready[index], self.ready[index + 1])

    def holds(self, line_start: int, cut: int) -> bool:
        first = bisect_left(self.starts, line_start)
        return first < len(self.ready) and self.ready[first] <= cut


def expand_inline_dates(observations: str, now: datetime) -> str:
    """`expandInlineEstimatedDates`: `(estimated|meaning <date>)` gets its distance from `now`."""
    text = observations
    intents = _Intents(text)
    out: list[str] = []
    last = 0
    close = -1  # the first `)` after the current `(`: found again only once passed (linear)
    line_start = searched = 0  # the current line's start, looked for back to `searched` only (linear)
    index = text.find("(")
    while index != -1:
        word = next((w for w in ("estimated", "meaning") if _ieq(text, index + 1, w)), None)
        if word is None:
            index = text.find("(", index + 1)
            continue
        spaces_at = index + 1 + len(word)
        spaces_end = spaces_at
        while spaces_end < len(text) and text[spaces_end] in _SPACE_CHARS:
            spaces_end += 1
        if close <= index:
            close = text.find(")", index + 1)
            if close == -1:
                break
        content = _content(text, spaces_at, spaces_end, close)
        if content is None:
            index = text.find("(", index + 1)
            continue
        date = parse_date(content)
        if date is not None:
            prefix = text[index + 1 : spaces_at]
            note = _relative(date, now)
            line_start = max(line_start, text.rfind("\n", searched, index + 1) + 1)
            searched = index + 1
            planned = intents.holds(line_start, index)
            if date < now and planned:
                note += ", likely already happened"
            out.append(text[last:index])
            out.append(f"({prefix} {content} - {note})")
            last = close + 1
        index = text.find("(", close + 1)
    out.append(text[last:])
    return "".join(out)


def _content(text: str, spaces_at: int, spaces_end: int, close: int) -> str | None:
    """`\\s+([^)]+\\d{4})\\)` after the word: the date text up to the first `)`, ending in four digits."""
    if (
        spaces_end == spaces_at
        or close - spaces_end < 4
        or not all(c in _DIGITS for c in text[close - 4 : close])
    ):
        return None  # decided before any slice of the rest: many `(estimated` before one `)` stay linear
    if close - spaces_end >= 5:
        return text[spaces_end:close]
    if spaces_end - spaces_at >= 2:
        return text[spaces_end - 1 : close]  # the space run gives one back
    return None
