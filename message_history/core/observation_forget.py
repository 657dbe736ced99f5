"""Forgetting one thread of a resource-scoped observation log (issue 35): what leaves the row (pure, no I/O).

A resource-scoped log (`resource:<resourceId>`) holds each thread's observations in `<thread id="…">`
sections (`core.observation_resource.wrap_with_thread_tag`), appended after a message boundary or merged into
the thread's section of the same date. Forgetting thread T takes out, of the row's newest generation:

* T's sections from `activeObservations` and from Mastra's buffered fields (`activeObservationsPendingUpdate`,
  each `bufferedObservationChunks` entry's `observations`), with the message boundary written before each
  (its time is T's newest observed message's);
* the ids of messages that no longer exist (T's, deleted first by the forget) from `observedMessageIds` and
  from each chunk's `messageIds`;
* `observationTokenCount` counted again (`count_observations`, as Mastra OM counts), `pendingMessageTokens`
  zeroed (it counted T's unobserved messages too; the next turn counts again), a buffered reflection dropped
  (a condensed copy of a log that held T), and the row's `lastObservedAt` the newest remaining thread's when
  it was T's.

**Not separable** (`ForgetPlan.separable` False; then the whole resource log is cleared and every thread of
the resource observed again from scratch: privacy over cost): T's section is malformed (no `</thread>` before
the next `<thread` or the end); T was observed (it has a cursor) but the log holds no section of it; an older
generation (the input of a reflection) mentions T, could not be read, or T's cursor is not after the newest
generation's reflection (reflection condenses the log and may merge threads' sections into text no scanner
can attribute); a field that should be text is not.

The scanner is linear: `str.find` of T's exact opening tag (`<thread id="` + id + `">`, as Mastra's own
`replaceOrAppendThreadSection` finds a thread's section; ids with quotes or `<` are matched verbatim), then of
the next `</thread>` and of a `<thread` before it, each range scanned once; no regex, nothing that raises on
any text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from message_history.core.observation import _parse_date
from message_history.core.observation_dates import JS_SPACE_CHARS
from message_history.core.om_tokens import count_observations

__all__ = [
    "BUFFERED_REFLECTION_FIELDS",
    "ForgetPlan",
    "SectionRemoval",
    "mentions_thread",
    "plan_thread_forget",
    "remove_thread_sections",
    "thread_open_tag",
]

_CLOSE: Final = "</thread>"
_ANY_OPEN: Final = "<thread"
_BOUNDARY_OPEN: Final = "--- message boundary ("
_BOUNDARY_CLOSE: Final = ") ---"
BUFFERED_REFLECTION_FIELDS: Final = (
    "bufferedReflection",
    "bufferedReflectionTokens",
    "bufferedReflectionInputTokens",
    "reflectedObservationLineCount",
)
"""Mastra's buffered reflection of the log (`updateBufferedReflection`): dropped when the log held T."""


def thread_open_tag(thread_id: str) -> str:
    """The opening tag `wrap_with_thread_tag` (Mastra's `wrapWithThreadTag`) writes for the thread."""
    return f'<thread id="{thread_id}">'


def mentions_thread(text: Any, thread_id: str) -> bool:
    """Whether `text` holds the thread's opening tag (anything but text: False)."""
    return isinstance(text, str) and thread_open_tag(thread_id) in text


@dataclass(frozen=True, slots=True)
class SectionRemoval:
    """The log without the thread's sections; how many were removed; whether one had no end."""

    text: str
    removed: int
    malformed: bool


def remove_thread_sections(log: str, thread_id: str) -> SectionRemoval:
    """Every `<thread id="thread_id">…</thread>` section removed from `log`, each with the message boundary
    just before it (or, for the log's first, the one just after). A section with no `</thread>` before the
    next `<thread` (or the end) is malformed: the log is returned unchanged, `malformed` True."""
    needle = thread_open_tag(thread_id)
    pieces: list[str] = []
    pos = 0  # the text before `pos` is decided (kept in `pieces` or cut)
    removed = 0
    while True:
        start = log.find(needle, pos)
        if start == -1:
            break
        body = start + len(needle)
        close = log.find(_CLOSE, body)
        if close == -1 or log.find(_ANY_OPEN, body, close) != -1:
            return SectionRemoval(log, 0, True)
        pieces.append(log[pos : _cut_start(log, pos, start)])
        pos = close + len(_CLOSE)
        removed += 1
    if not removed:
        return SectionRemoval(log, 0, False)
    pieces.append(log[pos:])
    return SectionRemoval(_tidy("".join(pieces)), removed, False)


def _cut_start(log: str, floor: int, start: int) -> int:
    """Where a removal starting at `start` begins: before the whitespace and the one message boundary line
    just before it (not below `floor`, the end of what is already decided: each character looked at a
    bounded number of times, so the whole scan stays linear)."""
    cut = _back_over_space(log, floor, start)
    if cut - floor < len(_BOUNDARY_CLOSE) or not log.startswith(_BOUNDARY_CLOSE, cut - len(_BOUNDARY_CLOSE)):
        return cut
    line_start = max(log.rfind("\n", floor, cut) + 1, floor)
    if log.startswith(_BOUNDARY_OPEN, line_start):
        return _back_over_space(log, floor, line_start)
    return cut


def _back_over_space(log: str, floor: int, at: int) -> int:
    """`at` moved back over JavaScript whitespace, not below `floor` (a C-level strip of the range)."""
    return floor + len(log[floor:at].rstrip(JS_SPACE_CHARS))


def _tidy(text: str) -> str:
    """The log after removals: no leading boundary (its section went) and no space at either end."""
    text = text.strip(JS_SPACE_CHARS)
    if text.startswith(_BOUNDARY_OPEN):
        end = text.find("\n")
        line = text if end == -1 else text[:end]
        if line.rstrip(JS_SPACE_CHARS).endswith(_BOUNDARY_CLOSE):
            text = "" if end == -1 else text[end:].strip(JS_SPACE_CHARS)
    return text


@dataclass(frozen=True, slots=True)
class ForgetPlan:
    """What forgetting the thread does to the row's newest generation: `separable` False means the whole
    resource log must be cleared; else `fields` are the row's new values (`$set`), empty when nothing of the
    thread is in it."""

    separable: bool
    fields: dict[str, Any] = field(default_factory=dict)
    removed_sections: int = 0
    why: str = ""


def plan_thread_forget(
    row: Mapping[str, Any],
    thread_id: str,
    *,
    cursor: datetime | None = None,
    cursor_unknown: bool = False,
    older_mention: bool = False,
    missing_ids: frozenset[str] = frozenset(),
    others_newest: datetime | None = None,
) -> ForgetPlan:
    """The row's newest generation (a decoded document, as Mastra wrote it or a hand did) after forgetting
    `thread_id`: its sections out, `missing_ids` (messages no longer stored) out of the id lists, the counts
    again. `cursor`: the thread's `metadata.mastra.om.lastObservedAt` (`cursor_unknown`: its row could not be
    read, so it may have been observed); `older_mention`: an older generation mentions it (or could not be
    read); `others_newest`: the newest cursor of the resource's other threads."""
    log = row.get("activeObservations")
    log = "" if log is None else log
    if not isinstance(log, str):
        return ForgetPlan(False, why="activeObservations is not text")
    active = remove_thread_sections(log, thread_id)
    observed = cursor is not None or cursor_unknown
    why = _not_separable(row, log, active, cursor, observed=observed, older_mention=older_mention)
    if why:
        return ForgetPlan(False, why=why)
    fields: dict[str, Any] = {}
    if active.removed:
        fields["activeObservations"] = active.text
        fields["observationTokenCount"] = count_observations(active.text)
    removed = active.removed + _buffered(row, thread_id, missing_ids, fields)
    ids = row.get("observedMessageIds")
    if isinstance(ids, list) and missing_ids:
        left = [i for i in ids if not (isinstance(i, str) and i in missing_ids)]
        if len(left) != len(ids):
            fields["observedMessageIds"] = left
    if fields or observed:
        for name in BUFFERED_REFLECTION_FIELDS:
            if row.get(name) is not None:
                fields[name] = None
        if row.get("pendingMessageTokens"):
            fields["pendingMessageTokens"] = 0
        last = _parse_date(row.get("lastObservedAt"))
        if observed and last is not None and (cursor is None or cursor >= last) and others_newest != last:
            fields["lastObservedAt"] = others_newest
    return ForgetPlan(True, fields, removed)


def _not_separable(
    row: Mapping[str, Any],
    log: str,
    active: SectionRemoval,
    cursor: datetime | None,
    *,
    observed: bool,
    older_mention: bool,
) -> str:
    """Why the thread's part of the log cannot be told apart from the rest ("" when it can)."""
    if active.malformed:
        return "a section of the thread has no end"
    if older_mention:
        return "a reflection's input held the thread (or an older generation is unreadable)"
    if observed and not active.removed and log.strip(JS_SPACE_CHARS):
        return "the thread was observed but the log has no section of it"
    reflected_at = _parse_date(row.get("lastReflectionAt"))
    generation = row.get("generationCount")
    reflected = isinstance(generation, int | float) and not isinstance(generation, bool) and generation > 0
    if observed and reflected and (cursor is None or reflected_at is None or cursor <= reflected_at):
        return "the thread was observed before the log was reflected"
    return ""


def _buffered(
    row: Mapping[str, Any], thread_id: str, missing_ids: frozenset[str], fields: dict[str, Any]
) -> int:
    """Mastra's buffered observations without the thread (their new values into `fields`); how many of its
    sections were removed. A field that is not what Mastra writes is dropped: it may hold the thread."""
    removed = 0
    pending = row.get("activeObservationsPendingUpdate")
    if isinstance(pending, str) and pending:
        cut = remove_thread_sections(pending, thread_id)
        if cut.malformed:
            fields["activeObservationsPendingUpdate"] = None
        elif cut.removed:
            fields["activeObservationsPendingUpdate"] = cut.text or None
            removed += cut.removed
    elif pending is not None and not isinstance(pending, str):
        fields["activeObservationsPendingUpdate"] = None
    chunks = row.get("bufferedObservationChunks")
    if isinstance(chunks, list) and chunks:
        kept, cut_count, changed = _chunks(chunks, thread_id, missing_ids)
        removed += cut_count
        if changed:
            fields["bufferedObservationChunks"] = kept
    elif chunks is not None and not isinstance(chunks, list):
        fields["bufferedObservationChunks"] = []
    return removed


def _chunks(
    chunks: Sequence[Any], thread_id: str, missing_ids: frozenset[str]
) -> tuple[list[Any], int, bool]:
    """Mastra's buffered observation chunks without the thread: its sections out of each, the missing ids
    out of its `messageIds`; a chunk that held the thread's messages but no section of it (or a malformed
    one, or is no object) is dropped whole (never activated: its messages are observed again)."""
    kept: list[Any] = []
    removed = 0
    changed = False
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            changed = True
            continue
        text = chunk.get("observations")
        text = text if isinstance(text, str) else ""
        cut = remove_thread_sections(text, thread_id)
        ids = chunk.get("messageIds")
        ids = list(ids) if isinstance(ids, list) else []
        left = [i for i in ids if not (isinstance(i, str) and i in missing_ids)]
        lost = len(left) != len(ids)
        if cut.malformed or (lost and not cut.removed) or (cut.removed and not cut.text):
            changed = True
            removed += cut.removed
            continue
        if cut.removed or lost:
            changed = True
            removed += cut.removed
            new = {**chunk, "observations": cut.text, "messageIds": left}
            if cut.removed:
                new["tokenCount"] = count_observations(cut.text)
            kept.append(new)
            continue
        kept.append(chunk)
    return kept, removed, changed
