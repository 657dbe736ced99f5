"""The hints an observation leaves in each observed thread's `metadata.mastra.om`, as `@mastra/memory` 1.31's
`SyncObservationStrategy.persist` / `ResourceScopedObservationStrategy.persist` write them with
`setThreadOMMetadata` (issue 35; docs/observational-memory.md). Pure: no I/O.

* `currentTask`, `suggestedResponse`, `threadTitle`: the Observer's `<current-task>`, `<suggested-response>`
  and `<thread-title>` (the title trimmed, an empty one absent, as Mastra's parser leaves it). A hint the
  answer does not carry is left as the thread has it (Mastra's spread sets it `undefined`: a difference
  only until the next answer that carries it; Mastra shows its Observer the prior one to repeat).
* `lastObservedMessageCursor`: `{createdAt, id}` of the newest observed message by `createdAt` (the first one
  in the observed order on a tie), as Mastra's `getLastObservedMessageCursor`, from each message's
  `StoredStamp` (a row without a readable id or date has none: the storage skips and counts it). Mastra
  reads it back as the `fallbackCursor` of `filterObservedMessages`: messages at or before it are pruned
  from the context even when the row's `observedMessageIds` lacks them.
* `extracted` is not here: Mastra fills it only from custom extractors (`observation.extractors`), which the
  observer protocol does not carry; absent, Mastra reads it as `{}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Final, NamedTuple

from schemas.messages import format_timestamp

__all__ = ["CURSOR", "StoredStamp", "last_observed_cursors", "om_hints"]

CURSOR: Final = "lastObservedMessageCursor"


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


def om_hints(
    *,
    current_task: str | None,
    suggested_response: str | None,
    thread_title: str | None,
    cursor: dict[str, str] | None,
) -> dict[str, object]:
    """The keys to set under the thread's `metadata.mastra.om` (the ones the answer has)."""
    title = thread_title.strip() if thread_title is not None else None
    hints: dict[str, object] = {
        "currentTask": current_task,
        "suggestedResponse": suggested_response,
        "threadTitle": title or None,
        CURSOR: cursor,
    }
    return {key: value for key, value in hints.items() if value is not None}
