"""Resource scope's reads and writes outside `mastra_observational_memory`: a resource's threads with their
cursors, its unobserved messages across them, and the cursors written back (issue 35;
docs/observational-memory.md).

Mastra keeps a resource-scoped observation's per-thread boundary in each thread's metadata
(`metadata.mastra.om.lastObservedAt`, an ISO string: `setThreadOMMetadata`), not in the resource's row; so
do these:

* `resource_cursors`: the resource's threads (the `max_threads` most recently updated: the
  `{resourceId, updatedAt}` index Mastra's storage makes) and each one's cursor
  (`core.observation_resource.thread_cursor`);
* `resource_messages`: one page (the newest `limit`) of the resource's threads' messages from the oldest
  cursor on (one `$in`, a merge of the `{thread_id, createdAt, id}` index ranges); each thread's own cursor
  is applied after (`unobserved_by_thread`), so rows between the oldest cursor and a thread's own take
  page slots, as Mastra's resource-wide `listMessagesByResourceId` since the row's `lastObservedAt` does;
  only the resource's threads are named, and a row naming another owner is dropped;
* `write_cursors`: each thread's cursor (and the Observer's hints) set, the owner in the filter, a thread
  row MongoDB refuses the keys into (its `metadata` not an object) logged and left: its messages stay
  unobserved by the cursor, and the row's `observedMessageIds` still keeps them from being observed twice.
  Thread scope writes its hints with it too (no cursor: Mastra's thread scope keeps none in the thread);
* `hint_rows` / `write_titles`: what Mastra's `patchThread` of an observation reads of each thread (its
  `title`, `metadata.titlePinned`, `metadata.mastra.om.extracted`), and the title it sets
  (`core.observation_hints.title_update`), conditional on the title and the pin as read and on the owner:
  a rename or a pin racing the answer wins, and a second write of the same title matches nothing;
  `write_threads`: both at once (one bulk write), as the observed path writes them.

Rows are input: an unreadable thread or message row is skipped and counted (`storage.unreadable`), never a
crash.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple

from pymongo import UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from message_history.core.observation_resource import thread_cursor
from message_history.errors import UnreadableRowError
from schemas.messages import format_timestamp
from storage.documents import MESSAGES, THREADS, message_from_doc
from storage.errors import storage_errors
from storage.raw_rows import RAW, decode_row
from storage.unreadable import skip

__all__ = [
    "CURSOR_KEY",
    "hint_rows",
    "resource_cursors",
    "resource_messages",
    "write_cursors",
    "write_threads",
    "write_titles",
]

log = logging.getLogger(__name__)

CURSOR_KEY: Final = "metadata.mastra.om.lastObservedAt"
"""Where a thread's resource-scope cursor lives (Mastra's `getThreadOMMetadata(...).lastObservedAt`)."""
_OM: Final = "metadata.mastra.om"


async def resource_cursors(
    db: AsyncDatabase[Any], resource_id: str, max_threads: int
) -> dict[str, datetime | None]:
    """The resource's threads (at most `max_threads`, most recently updated first) and their cursors."""
    rows = db.get_collection(THREADS, codec_options=RAW)
    with storage_errors("om threads"):
        raws = await (
            rows.find({"resourceId": resource_id}, {"_id": 0, "id": 1, "resourceId": 1, _OM: 1})
            .sort("updatedAt", -1)
            .limit(max_threads)
            .to_list()
        )
    cursors: dict[str, datetime | None] = {}
    for raw in raws:
        try:
            doc = decode_row(raw.raw, THREADS)
        except UnreadableRowError as exc:
            skip(exc)
            continue
        ident = doc.get("id")
        if isinstance(ident, str) and doc.get("resourceId") == resource_id:
            cursors[ident] = thread_cursor(doc.get("metadata"))
    return cursors


async def resource_messages(
    db: AsyncDatabase[Any], resource_id: str, cursors: Mapping[str, datetime | None], limit: int
) -> list[dict[str, Any]]:
    """The resource's messages newer than their thread's cursor (threads of `cursors` only), in wire form,
    oldest first: one page, the newest `limit`."""
    if not cursors or limit <= 0:
        return []
    # One `$in` over the resource's threads from the oldest cursor on (none when a thread has no cursor),
    # newest first: the planner merges the threads' `(thread_id, createdAt, id)` index ranges and stops at
    # the page. Per-thread ranges (an `$or`) or the owner in the query make it sort every unobserved row
    # (tests/integration/test_index_plans.py). Each thread's own cursor is then applied by the caller
    # (`core.observation_resource.unobserved_by_thread`); a row naming another owner is dropped below.
    threads = list(cursors)
    query: dict[str, Any] = {"thread_id": threads[0] if len(threads) == 1 else {"$in": threads}}
    known = [cursor for cursor in cursors.values() if cursor is not None]
    if len(known) == len(threads):
        query["createdAt"] = {"$gt": min(known)}
    rows = db.get_collection(MESSAGES, codec_options=RAW)
    with storage_errors("om resource messages"):
        raws = await (
            rows.find(query)
            .sort([("createdAt", -1), ("id", -1)])
            .limit(limit)
            .batch_size(limit + 1)
            .to_list()
        )
    messages: list[dict[str, Any]] = []
    for raw in raws:
        try:
            message = message_from_doc(decode_row(raw.raw, MESSAGES))
        except UnreadableRowError as exc:
            skip(exc)
            continue
        if message.resourceId not in (None, resource_id):
            continue  # another owner's row in the resource's thread (written around the service): not its
        messages.append(message.wire())
    messages.reverse()
    return messages


async def hint_rows(
    db: AsyncDatabase[Any], resource_id: str, thread_ids: Sequence[str]
) -> dict[str, ThreadRead]:
    """The resource's threads among `thread_ids` as an observation's write reads them (one `find`); a row
    that cannot be read is skipped and counted (its hints are then written as to a thread without them)."""
    ids = list(dict.fromkeys(thread_ids))
    if not ids:
        return {}
    rows = db.get_collection(THREADS, codec_options=RAW)
    projection = {
        "_id": 0,
        "id": 1,
        "resourceId": 1,
        "title": 1,
        "metadata.titlePinned": 1,
        f"{_OM}.extracted": 1,
    }
    with storage_errors("om thread rows"):
        raws = await rows.find({"id": {"$in": ids}, "resourceId": resource_id}, projection).to_list()
    found: dict[str, ThreadRead] = {}
    for raw in raws:
        try:
            doc = decode_row(raw.raw, THREADS)
        except UnreadableRowError as exc:
            skip(exc)
            continue
        ident, metadata = doc.get("id"), doc.get("metadata")
        if isinstance(ident, str) and doc.get("resourceId") == resource_id:
            om = _om(metadata)
            found[ident] = ThreadRead(doc.get("title"), metadata, om.get("extracted") if om else None)
    return found


def _om(metadata: object) -> Mapping[str, Any] | None:
    mastra = metadata.get("mastra") if isinstance(metadata, Mapping) else None
    om = mastra.get("om") if isinstance(mastra, Mapping) else None
    return om if isinstance(om, Mapping) else None


class ThreadRead(NamedTuple):
    """What an observation's write reads of a thread (Mastra's `getThreadById` before `patchThread`)."""

    title: object
    metadata: object  # `titlePinned` only
    extracted: object


async def write_titles(
    db: AsyncDatabase[Any], resource_id: str, titles: Sequence[tuple[str, str, object]], now: datetime
) -> int:
    """Each `(thread, title, title_was)`: the thread's `title` set if it is still `title_was`, not pinned,
    and the resource's; how many threads took it."""
    return await write_threads(db, resource_id, [], titles, now)


async def write_cursors(
    db: AsyncDatabase[Any],
    resource_id: str,
    cursors: Sequence[tuple[str, datetime | None, Mapping[str, object]]],
    now: datetime,
) -> int:
    """Each `(thread, cursor, hints)`: the thread's `metadata.mastra.om.lastObservedAt` (unless None) and the
    hints' keys under `metadata.mastra.om` set (a None value stored `null`, as Mastra's `undefined` is), if
    the thread is the resource's; how many threads took them."""
    return await write_threads(db, resource_id, cursors, [], now)


async def write_threads(
    db: AsyncDatabase[Any],
    resource_id: str,
    cursors: Sequence[tuple[str, datetime | None, Mapping[str, object]]],
    titles: Sequence[tuple[str, str, object]],
    now: datetime,
) -> int:
    """`write_cursors` and `write_titles` in one unordered bulk write (an observation's thread rows, one
    round trip); how many updates changed a row."""
    ops = [
        UpdateOne(
            {"id": thread, "resourceId": resource_id},
            _set(
                {
                    **({CURSOR_KEY: format_timestamp(cursor)} if cursor is not None else {}),
                    **{f"{_OM}.{k}": v for k, v in hints.items()},
                },
                now,
            ),
        )
        for thread, cursor, hints in cursors
    ]
    ops += [
        UpdateOne(
            # `title_was` None matches a missing title too; `$ne: true` is Mastra's `titlePinned === true`
            {"id": thread, "resourceId": resource_id, "title": was, "metadata.titlePinned": {"$ne": True}},
            {"$set": {"title": title}, "$max": {"updatedAt": now}},
        )
        for thread, title, was in titles
    ]
    if not ops:
        return 0
    return await _bulk(db, ops, [c[0] for c in cursors] + [t[0] for t in titles], "om thread hints")


def _set(fields: dict[str, object], now: datetime) -> dict[str, Any]:
    """The update: `fields` set (MongoDB refuses an empty `$set`), `updatedAt` moved forward."""
    return {**({"$set": fields} if fields else {}), "$max": {"updatedAt": now}}


async def _bulk(db: AsyncDatabase[Any], ops: list[UpdateOne], threads: list[str], what: str) -> int:
    """The thread rows' updates, unordered; a row MongoDB refuses one into logged and left."""
    with storage_errors(what):
        try:
            result = await db[THREADS].bulk_write(ops, ordered=False)
        except BulkWriteError as exc:  # some rows refused the keys: those cursors stay unwritten
            for error in exc.details.get("writeErrors", []):
                index = error.get("index", -1)
                thread = threads[index] if 0 <= index < len(threads) else "?"
                log.warning("%s not written: %s", what, error.get("errmsg"), extra={"thread_id": thread})
            if exc.details.get("writeConcernErrors"):
                raise  # not a row's refusal: the storage's (storage_errors maps it)
            return int(exc.details.get("nModified", 0))
    return result.modified_count
