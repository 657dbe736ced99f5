"""Resource scope's reads and writes outside `mastra_observational_memory`: a resource's threads with their
cursors, its unobserved messages across them, and the cursors written back (issue 35;
docs/observational-memory.md).

Mastra keeps a resource-scoped observation's per-thread boundary in each thread's metadata
(`metadata.mastra.om.lastObservedAt`, an ISO string: `setThreadOMMetadata`), not in the resource's row; so
do these:

* `resource_cursors`: the resource's threads (the `max_threads` most recently updated: the
  `{resourceId, updatedAt}` index Mastra's storage makes) and each one's cursor
  (`core.observation_resource.thread_cursor`);
* `resource_threads`: the persist path's and the sweep's page of the resource's threads: the next `limit`
  by `(updatedAt, id)`, newest first, after where the last page ended (kept on the resource's row,
  `_mh_threads_after`), wrapping round to the newest; plus the thread that just spoke. So every thread is
  read within `ceil(threads / limit)` records (a thread updated meanwhile moves to the front and is read on
  the next round), each record reading at most `limit + 1` threads (`THREAD_PAGE_INDEX`, a walk of the
  service's `{resourceId, updatedAt, id}` index);
* `resource_messages`: one page (the newest `limit`) of the resource's threads' messages from the oldest
  cursor on (one `$in`, a merge of the `{thread_id, createdAt, id}` index ranges); each thread's own cursor
  is applied after (`unobserved_by_thread`), so rows between the oldest cursor and a thread's own take
  page slots, as Mastra's resource-wide `listMessagesByResourceId` since the row's `lastObservedAt` does;
  the page full, up to `limit` more of the rows it cut off (each such thread's oldest past its cursor), so
  no thread's messages wait behind the others' newer rows; only the resource's threads are named, and a row
  naming another owner is dropped;
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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from bson.raw_bson import RawBSONDocument
from pymongo import UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from message_history.core.observation_resource import thread_cursor
from message_history.errors import UnreadableRowError
from schemas.messages import Message, format_timestamp
from storage.documents import MESSAGES, THREADS, message_from_doc
from storage.errors import reply_entries, reply_int, storage_errors
from storage.raw_rows import RAW, decode_row, lenient_row
from storage.unreadable import skip

__all__ = [
    "CURSOR_KEY",
    "THREAD_PAGE_INDEX",
    "ThreadPage",
    "hint_rows",
    "resource_cursors",
    "resource_messages",
    "resource_threads",
    "write_cursors",
    "write_threads",
    "write_titles",
]

log = logging.getLogger(__name__)

CURSOR_KEY: Final = "metadata.mastra.om.lastObservedAt"
"""Where a thread's resource-scope cursor lives (Mastra's `getThreadOMMetadata(...).lastObservedAt`)."""
_OM: Final = "metadata.mastra.om"
THREAD_PAGE_INDEX: Final = (("resourceId", 1), ("updatedAt", -1), ("id", -1))
"""The service's index on `mastra_threads` for `resource_threads` (made with the OM store's indexes): the
`(updatedAt, id)` order comes from it, ties included (an observation's cursor writes give its threads one
`updatedAt`), so a page examines what it returns."""

Position = tuple[datetime, str]
"""A thread's place in the page order: its `(updatedAt, id)`."""


@dataclass(frozen=True, slots=True)
class ThreadPage:
    """A page of a resource's threads: their cursors, and where the next page starts (None: the newest)."""

    cursors: dict[str, datetime | None]
    after: Position | None


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
        _read_thread(raw, resource_id, cursors)
    return cursors


async def resource_threads(
    db: AsyncDatabase[Any],
    resource_id: str,
    limit: int,
    after: Position | None,
    *,
    include: str | None = None,
) -> ThreadPage:
    """The next `limit` of the resource's threads by `(updatedAt, id)` newest first, after `after` (from the
    newest when None), wrapping round to the newest when the end comes first; and `include` (the thread
    that just spoke) when the page missed it. Each with its cursor; `after` of the result: the last thread
    read (None once the whole resource fit in the page)."""
    cursors: dict[str, datetime | None] = {}
    position: Position | None = None
    if limit > 0:
        taken, position = await _thread_page(db, resource_id, limit, after, cursors)
        if taken < limit and after is not None:  # the end came first: round again from the newest
            more, wrapped = await _thread_page(db, resource_id, limit - taken, None, cursors)
            position = None if more < limit - taken else wrapped or position
        elif taken < limit:
            position = None  # every thread fit: the next page starts from the newest again
    if include is not None and include not in cursors:
        rows = db.get_collection(THREADS, codec_options=RAW)
        with storage_errors("om threads"):
            raw = await rows.find_one({"id": include, "resourceId": resource_id}, _THREAD_FIELDS)
        _read_thread(raw, resource_id, cursors)
    return ThreadPage(cursors, position)


_THREAD_FIELDS: Final = {"_id": 0, "id": 1, "resourceId": 1, "updatedAt": 1, _OM: 1}


async def _thread_page(
    db: AsyncDatabase[Any],
    resource_id: str,
    limit: int,
    after: Position | None,
    into: dict[str, datetime | None],
) -> tuple[int, Position | None]:
    """Up to `limit` threads after `after` read into `into`; how many rows came, and the last readable
    one's position (a row with no date `updatedAt` has none: only the first page, whose range has no
    bound, reaches it)."""
    queries: list[dict[str, Any]] = [{"resourceId": resource_id}]
    if after is not None:
        at, ident = after
        # two exact ranges of the index, not one `$or`: the rest of the ties at `at`, then the older
        # threads; each walk examines what it returns, whatever the planner makes of an `$or`
        queries = [
            {"resourceId": resource_id, "updatedAt": at, "id": {"$lt": ident}},
            {"resourceId": resource_id, "updatedAt": {"$lt": at}},
        ]
    rows = db.get_collection(THREADS, codec_options=RAW)
    raws: list[RawBSONDocument] = []
    for query in queries:
        if len(raws) >= limit:
            break
        with storage_errors("om threads"):
            raws += await (
                rows.find(query, _THREAD_FIELDS)
                .sort([("updatedAt", -1), ("id", -1)])
                .limit(limit - len(raws))
                .batch_size(limit - len(raws) + 1)
                .to_list()
            )
    position: Position | None = None
    for raw in raws:
        # an unreadable row still moves the page on (read leniently for its place), or a page of them
        # would hold the scan for ever
        doc = _read_thread(raw, resource_id, into) or lenient_row(raw.raw) or {}
        if isinstance(doc.get("updatedAt"), datetime) and isinstance(doc.get("id"), str):
            position = (doc["updatedAt"], doc["id"])
    return len(raws), position


def _read_thread(
    raw: RawBSONDocument | None, resource_id: str, into: dict[str, datetime | None]
) -> dict[str, Any] | None:
    """One thread row into `into` (its cursor), the decoded row returned; unreadable: skipped, counted."""
    if raw is None:
        return None
    try:
        doc = decode_row(raw.raw, THREADS)
    except UnreadableRowError as exc:
        skip(exc)
        return None
    ident = doc.get("id")
    if isinstance(ident, str) and doc.get("resourceId") == resource_id:
        into[ident] = thread_cursor(doc.get("metadata"))
    return doc


async def resource_messages(
    db: AsyncDatabase[Any], resource_id: str, cursors: Mapping[str, datetime | None], limit: int
) -> list[dict[str, Any]]:
    """The resource's messages newer than their thread's cursor (threads of `cursors` only), in wire form,
    oldest first: one page, the newest `limit`; when that page is full, also up to `limit` of the oldest
    rows it cut off (`_cut_off`), so at most `2 * limit` rows."""
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
    page = _owned(raws, resource_id)
    if len(raws) == limit:
        page = await _cut_off(db, resource_id, cursors, page, limit)
    page.sort(key=lambda m: (m.createdAt or _EPOCH, m.id or ""))
    return [message.wire() for message in page]


_EPOCH: Final = datetime.min.replace(tzinfo=UTC)


def _owned(raws: Sequence[RawBSONDocument], resource_id: str) -> list[Message]:
    """The rows as messages; unreadable ones skipped (counted), another owner's dropped."""
    messages: list[Message] = []
    for raw in raws:
        try:
            message = message_from_doc(decode_row(raw.raw, MESSAGES))
        except UnreadableRowError as exc:
            skip(exc)
            continue
        if message.resourceId not in (None, resource_id):
            continue  # another owner's row in the resource's thread (written around the service): not its
        messages.append(message)
    return messages


async def _cut_off(
    db: AsyncDatabase[Any],
    resource_id: str,
    cursors: Mapping[str, datetime | None],
    page: list[Message],
    limit: int,
) -> list[Message]:
    """A full page's rows plus what it cut off: rows of threads whose cursor is older than the page's
    oldest row (`floor`) may lie between the two, behind newer rows of other threads, observed or not (a
    thread with all the resource's threads in one page would wait there for ever). One more query reads
    them: an `$or` of each such thread's exact range `(cursor, floor]`, no sort, at most `limit` rows, each
    thread's oldest first (every branch a forward walk of its index range, the next branch only after it;
    a thread with nothing there costs one key). A thread read there keeps only those rows when the query
    came back full (its rows past them are not read: observing it then moves its cursor only to the last of
    them, so none is skipped)."""
    floor = min((m.createdAt for m in page if m.createdAt is not None), default=None)
    if floor is None:
        return page
    ranges: list[dict[str, Any]] = []
    for thread, cursor in cursors.items():
        if cursor is None or cursor < floor:
            bounds = {"$lte": floor} if cursor is None else {"$gt": cursor, "$lte": floor}
            ranges.append({"thread_id": thread, "createdAt": bounds})
    if not ranges:
        return page
    rows = db.get_collection(MESSAGES, codec_options=RAW)
    with storage_errors("om resource messages"):
        raws = await (
            rows.find(ranges[0] if len(ranges) == 1 else {"$or": ranges})
            .limit(limit)
            .batch_size(limit + 1)
            .to_list()
        )
    older = _owned(raws, resource_id)
    if len(raws) == limit:
        sliced = {m.threadId for m in older}
        page = [m for m in page if m.threadId not in sliced]
    seen = {m.id for m in older}
    return older + [m for m in page if m.id not in seen]


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
            for error in reply_entries(exc.details, "writeErrors"):
                index = reply_int(error.get("index"), -1)
                thread = threads[index] if 0 <= index < len(threads) else "?"
                log.warning("%s not written: %s", what, error.get("errmsg"), extra={"thread_id": thread})
            if exc.details.get("writeConcernErrors"):
                raise  # not a row's refusal: the storage's (storage_errors maps it)
            return reply_int(exc.details.get("nModified"), 0)
    return result.modified_count
