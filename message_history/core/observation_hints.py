"""The hints an observation leaves in each observed thread's `metadata.mastra.om`, as `@mastra/memory` 1.31's
`SyncObservationStrategy.persist` / `ResourceScopedObservationStrategy.persist` write them with
`setThreadOMMetadata` (issue 35; docs/observational-memory.md). Pure: no I/O.

* `currentTask`, `suggestedResponse`, `threadTitle`: the Observer's `<current-task>`, `<suggested-response>`
  and `<thread-title>` (the title trimmed, an empty one absent, as Mastra's parser leaves it). A hint the
  answer does not carry is left as the thread has it (Mastra's spread sets it `undefined`: a difference
  only until the next answer that carries it; Mastra shows its Observer the prior one to repeat).
* `lastObservedMessageCursor`: `{createdAt, id}` of the newest observed message by `createdAt` (the first one
  in the observed order on a tie; messages without an id or a date skipped), as Mastra's
  `getLastObservedMessageCursor`. Mastra reads it back as the `fallbackCursor` of `filterObservedMessages`:
  messages at or before it are pruned from the context even when the row's `observedMessageIds` lacks them.
* `extracted` is not here: Mastra fills it only from custom extractors (`observation.extractors`), which the
  observer protocol does not carry; absent, Mastra reads it as `{}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from schemas.messages import Message, format_timestamp

__all__ = ["CURSOR", "last_observed_cursors", "om_hints"]

CURSOR: Final = "lastObservedMessageCursor"


def last_observed_cursors(order: Sequence[str], messages: Iterable[Message]) -> dict[str, dict[str, str]]:
    """Each thread's `lastObservedMessageCursor` among `messages` (the stored observed messages, in any
    order), taken in `order` (the answer's `observedMessageIds`) as Mastra walks its observed messages."""
    rank = {ident: i for i, ident in reversed(list(enumerate(order)))}  # first position of each id
    known = [m for m in messages if m.id is not None and m.id in rank and m.createdAt is not None]
    known.sort(key=lambda m: rank[m.id or ""])
    newest: dict[str, Message] = {}
    for message in known:
        thread = message.threadId or ""
        current = newest.get(thread)
        # strictly newer replaces: on a tie the first in the observed order stays (Mastra's `>`)
        if current is None or _after(message, current):
            newest[thread] = message
    return {
        thread: {"createdAt": format_timestamp(m.createdAt), "id": m.id}
        for thread, m in newest.items()
        if m.createdAt is not None and m.id is not None
    }


def _after(message: Message, current: Message) -> bool:
    new, old = message.createdAt, current.createdAt
    return new is not None and old is not None and new > old


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
