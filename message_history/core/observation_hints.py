"""The hints an observation leaves in each observed thread's row, as `@mastra/memory` 1.31's
`SyncObservationStrategy.persist` / `ResourceScopedObservationStrategy.persist` write them with
`setThreadOMMetadata` and `patchThread` (issue 35; docs/observational-memory.md). Pure: no I/O.

* `currentTask`, `suggestedResponse`, `threadTitle` under `metadata.mastra.om`: the Observer's
  `<current-task>`, `<suggested-response>` and `<thread-title>` (the title trimmed; an empty one of any of
  them is none, as Mastra's parser's `||` leaves it). Mastra sets all three on every observation from an
  object spread: one the answer does not carry is `undefined`, which `@mastra/mongodb`'s `updateThread`
  (the Node driver's default `ignoreUndefined: false`) stores as `null`; so `null` here.
* `extracted`: Mastra's custom extractors' values (`observation.extract`), merged as
  `{...previous.extracted ?? {}, ...new}`: the answer's keys replace the thread's, the others stay; a value
  `null` or `""` is none (`normalizeExtractedValues`). Always written: `{}` on a thread that had none.
* `lastObservedMessageCursor`: `{createdAt, id}` of the newest observed message by `createdAt` (the first one
  in the observed order on a tie), as Mastra's `getLastObservedMessageCursor`, from each message's
  `StoredStamp` (a row without a readable id or date has none: the storage skips and counts it). Mastra
  reads it back as the `fallbackCursor` of `filterObservedMessages`: messages at or before it are pruned
  from the context even when the row's `observedMessageIds` lacks them.
* The thread's `title` (`title_update`): the answer's title when Mastra's `resolveThreadTitleUpdate` would
  set it (3 characters or more, not the current title, `metadata.titlePinned` not `true`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Final, NamedTuple

from message_history.core.observation_text import js_trim
from message_history.core.tokens import utf16_length
from schemas.messages import format_timestamp

__all__ = [
    "CURSOR",
    "EXTRACTED",
    "StoredStamp",
    "last_observed_cursors",
    "normalize_extracted",
    "om_hints",
    "title_update",
]

CURSOR: Final = "lastObservedMessageCursor"
EXTRACTED: Final = "extracted"
MIN_TITLE_CHARS: Final = 3
"""Mastra's `resolveThreadTitleUpdate`: a shorter title never replaces the thread's."""


class StoredStamp(NamedTuple):
    """A stored message's place in its thread: all a cursor is made of (the storage reads no more)."""

    id: str
    thread_id: str
    created_at: datetime


def last_observed_cursors(order: Sequence[str], stamps: Iterable[StoredStamp]) -> dict[str, dict[str, str]]:
    """Each thread's `lastObservedMessageCursor` among `stamps` (the stored observed messages', in any
    order), taken in `order` (the answer's `observedMessageIds`) as Mastra walks its observed messages."""
    rank = {ident: i for i, ident in reversed(list(enumerate(order)))}  # first position of each id
    known = sorted((s for s in stamps if s.id in rank), key=lambda s: rank[s.id])
    newest: dict[str, StoredStamp] = {}
    for stamp in known:
        current = newest.get(stamp.thread_id)
        # strictly newer replaces: on a tie the first in the observed order stays (Mastra's `>`)
        if current is None or stamp.created_at > current.created_at:
            newest[stamp.thread_id] = stamp
    return {thread: {"createdAt": format_timestamp(s.created_at), "id": s.id} for thread, s in newest.items()}


def normalize_extracted(values: Mapping[str, object] | None) -> dict[str, object]:
    """Mastra's `normalizeExtractedValues`: the keys whose value is neither `null` nor `""`."""
    return {key: value for key, value in (values or {}).items() if value is not None and value != ""}


def om_hints(
    *,
    current_task: str | None,
    suggested_response: str | None,
    thread_title: str | None,
    cursor: dict[str, str] | None,
    extracted: Mapping[str, object] | None = None,
    extracted_was: object = None,
) -> dict[str, object]:
    """The keys to set under the thread's `metadata.mastra.om` (dotted below it: `extracted.<key>` when the
    thread's `extracted` is an object, `extracted` whole when it is not: `extracted_was`, as read).

    The three hints are always set (`None`: stored `null`, Mastra's `undefined`). The cursor is set when
    known: Mastra computes it from the messages it just observed, which always have one; here it is read
    back from the stored rows, and a thread whose rows are gone keeps the cursor it has."""
    title = js_trim(thread_title) if thread_title is not None else None
    hints: dict[str, object] = {
        "currentTask": current_task or None,
        "suggestedResponse": suggested_response or None,
        "threadTitle": title or None,
    }
    if cursor is not None:
        hints[CURSOR] = cursor
    new = normalize_extracted(extracted)
    if isinstance(extracted_was, Mapping):  # merged key by key: the thread's other keys are kept
        hints.update({f"{EXTRACTED}.{key}": value for key, value in new.items()})
    else:
        # none yet: the answer's (`{}` when none). Not an object: replaced too (Mastra's spread would keep an
        # array's or a string's items under index keys; a number's or a boolean's it drops)
        hints[EXTRACTED] = new
    return hints


def title_update(title_was: object, metadata: object, candidate: str | None) -> str | None:
    """Mastra's `resolveThreadTitleUpdate(thread, threadTitle)`: the trimmed title to set on the thread, or
    None when the thread keeps its own (too short, pinned by `metadata.titlePinned === true`, or the same as
    the current title trimmed)."""
    title = js_trim(candidate) if candidate is not None else ""
    if utf16_length(title) < MIN_TITLE_CHARS:  # JavaScript's `length`
        return None
    if isinstance(metadata, Mapping) and metadata.get("titlePinned") is True:
        return None
    if isinstance(title_was, str) and title == js_trim(title_was):
        return None
    return title
