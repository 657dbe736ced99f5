"""The storage's message reads: recall (newest first, one thread or a batch), budgeted pages, lookups by id.

Round trips (each is one command unless a reply exceeds one batch, 16 MiB):

* `list_messages`: one `find` (`sort(createdAt -1, id -1).limit(n)`, batch size = n), no count;
  backed by the index `{thread_id: 1, createdAt: 1, id: 1}`, so the `(createdAt, id)` tie-break is free.
* `list_messages_many` (and its row forms `recall_rows_many`, `recall_raw_many`): one `find` with `$in`
  (the default, measured faster, see `docs/storage.md`), or one `find` per thread issued concurrently.
* token-limited recall: `list_page` one `find` (date range, skip, `per_page + 1` rows, no count);
  `list_pages_many` those concurrently.
* `get_messages` (the echo filter and the tool-state merge): one `find` with `$in` on `id`, within the
  asking threads.

Every read takes its reply as each row's bytes (`storage.raw_batches.RowsCursor`: the driver's own cursor,
`getMore`s and timeouts, but no object per row), and decodes them one by one
(`storage.raw_rows`): a row the codec or `schemas.stored_rows` refuses is skipped and counted
(`storage.unreadable.skip`), never the reply's failure, so one row no Mastra would read neither fails its
batch's other threads nor stops the service (docs/rules.md#stored-rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar, cast

from message_history.core.recall_plan import PlainPage, PlainRow
from message_history.errors import InvalidInputError, UnreadableRowError
from schemas.messages import Message
from storage import row_codec
from storage.documents import MESSAGES, _recalled_or_model, message_from_doc
from storage.errors import storage_errors
from storage.mongo_collections import MongoCollections
from storage.protocol import Page, PageQuery, RecallQuery
from storage.raw_batches import RowsCursor
from storage.raw_owner import RawOwner, owned_query
from storage.raw_rows import decode_row
from storage.recalled_rows import MESSAGE_PROJECTION
from storage.save_plan import _check_thread_id
from storage.unreadable import skip

__all__ = ["MongoRecall"]

_NEWEST_FIRST = [("createdAt", -1), ("id", -1)]
_MONGO_MAX_BATCH = 100_000  # PyMongo caps batchSize; the server stops a batch at 16 MiB anyway

_Row = TypeVar("_Row")
_Build = Callable[[bytes], _Row]


def _raw_bytes(doc: bytes) -> bytes:
    return doc


def _decoded(build: Callable[[Mapping[str, Any]], _Row]) -> Callable[[bytes], _Row]:
    """`build` of a raw reply's document, decoded here, alone (`storage.unreadable.decode_row`)."""

    def decoded(doc: bytes) -> _Row:
        return build(decode_row(doc, MESSAGES))

    return decoded


async def _documents(cursor: RowsCursor) -> list[bytes]:
    """Every row of the cursor, as bytes, in the reply's order."""
    rows: list[bytes] = await cursor.to_list()
    return rows


_message: Final = _decoded(message_from_doc)
_recalled: Final = _decoded(_recalled_or_model)


def _readable(docs: Sequence[bytes], build: _Build[_Row], *, first: int | None = 0) -> list[_Row]:
    """`build` of each raw document; a row no Mastra would read is skipped (`storage.unreadable.skip`).
    `first`: the rank of the first document in its thread's newest-first history (None: not a history)."""
    rows: list[_Row] = []
    for n, doc in enumerate(docs):
        try:
            rows.append(build(doc))
        except UnreadableRowError as exc:
            skip(exc, None if first is None else first + n)
    return rows


def _named(doc: bytes, collection: str) -> UnreadableRowError:
    """The refusal of a raw document whose fields cannot even be looked at (for its thread and id)."""
    try:
        decode_row(doc, collection)
    except UnreadableRowError as exc:
        return exc
    return UnreadableRowError(collection, None, None, "bson", "the stored document cannot be read")


def _query_of(
    doc: bytes, sure: row_codec.Owner | None, owner: RawOwner, by_thread: Mapping[str, RecallQuery]
) -> RecallQuery | None:
    """The query of a batch's `$in` reply that the row `doc` answers (None: none): from the native walk's
    `(thread_id, resourceId)` when it was `sure`, else read by `owner`; a row whose bytes cannot even be read
    is its thread's as far as a lenient decoding names it (it is skipped there, in the thread's count)."""
    if sure is not None:
        return owned_query(by_thread, *sure)
    try:
        return owner.read(doc, by_thread)
    except Exception:  # noqa: BLE001 -- a document the codec refuses: that row's fault, its thread's
        error = _named(doc, MESSAGES)
        return by_thread.get(error.thread_id) if isinstance(error.thread_id, str) else None


def group_rows_py(docs: Sequence[bytes], by_thread: Mapping[str, RecallQuery]) -> dict[str, list[bytes]]:
    """A batch's `$in` reply, newest first, cut per thread: the rows each query answers (`_query_of`), at most
    its limit, in reply order. A row the page keeps counts in its limit even when it is then skipped as
    unreadable, as in one thread's query (`_find_page`), so both strategies recall the same rows. The
    reference of the native `group_rows` (`storage.row_codec`), which answers only where it is sure of
    every row's owner."""
    pages: dict[str, list[bytes]] = {tid: [] for tid in by_thread}
    owner = RawOwner()
    known = row_codec.owners_from_raw(docs)  # the native walk, where it is sure; else `RawOwner`
    for doc, sure in zip(docs, known, strict=True):
        wanted = _query_of(doc, sure, owner, by_thread)
        if wanted is not None:
            page = pages[wanted.thread_id]
            if wanted.limit is None or len(page) < wanted.limit:
                page.append(doc)
    return pages


def _grouped(docs: Sequence[bytes], by_thread: Mapping[str, RecallQuery]) -> dict[str, list[bytes]]:
    """`group_rows_py`'s answer: the native walk's when sure of the whole batch, else the reference's."""
    pages = row_codec.group_rows(docs, [(q.thread_id, q.resource_id, q.limit) for q in by_thread.values()])
    if pages is None:
        return group_rows_py(docs, by_thread)
    return dict(zip(by_thread, pages, strict=True))


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise InvalidInputError(f"limit must not be negative, got {limit}")


class MongoRecall(MongoCollections):
    """`mastra_messages` read: recall pages, budgeted pages, stored copies by id."""

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        """The thread's newest `limit` messages (all when None), newest first by `(createdAt, id)`."""
        _check_thread_id(thread_id)
        _check_limit(limit)
        if limit == 0:
            return []
        return await self._find_page(thread_id, resource_id, limit, _message)

    async def _find_page(
        self, thread_id: str, resource_id: str | None, limit: int | None, build: _Build[_Row]
    ) -> list[_Row]:
        query: dict[str, Any] = {"thread_id": thread_id}
        if resource_id is not None:
            query["resourceId"] = resource_id
        cursor = RowsCursor(self.raw_messages, query, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        if limit is not None:
            # batch size = limit, so the page comes back in the first reply (the default first batch is 101)
            cursor = cursor.limit(limit).batch_size(min(limit, _MONGO_MAX_BATCH))
        with storage_errors("list_messages"):
            docs = await _documents(cursor)
        return _readable(docs, build)

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        """Per query's thread id, what `list_messages` returns for it; thread ids must be distinct."""
        return await self._list_many(queries, _message)

    async def recall_rows_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        """`list_messages_many`, where a row in the plain shape is a `RecalledRow` (no content model).

        For the recall path's plain last-N recall, which only orders, dedupes and sends the rows: each
        `RecalledRow` encodes as its model would, and `materialize()` gives the model when needed.
        """
        return await self._list_many(queries, _recalled)

    async def recall_raw_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[bytes]]:
        """`list_messages_many` as each row's BSON bytes (the reply's own, read with naive dates): for the
        recall path's plain last-N recall, which decodes them with `storage.row_codec` (no model per row)."""
        return await self._list_many(queries, _raw_bytes)

    @staticmethod
    def plain_rows(docs: Sequence[bytes]) -> list[PlainRow | None]:
        """The rows of `recall_raw_many` in the plain shape (None: the model path must read that row)."""
        return row_codec.rows_from_raw(docs)

    @staticmethod
    def plain_page_of(
        docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]
    ) -> tuple[PlainPage, int] | None:
        """A plain recall's page decided on the rows of `recall_raw_many` in one native call
        (`storage.row_codec.plain_page_of`), or None: the caller reads them with `plain_rows` and decides."""
        return row_codec.plain_page_of(docs, read, limit, incoming)

    @staticmethod
    def recalled_from_raw(docs: Sequence[bytes]) -> list[Message]:
        """The rows of `recall_raw_many` as `recall_rows_many` reads them (views where sure, else models)."""
        rows: list[Message] = []
        for rank, doc in enumerate(docs):
            try:
                rows.append(_recalled_or_model(decode_row(doc, MESSAGES)))
            except UnreadableRowError as exc:
                skip(exc, rank)
        return rows

    async def _list_many(self, queries: Sequence[RecallQuery], build: _Build[_Row]) -> dict[str, list[_Row]]:
        wanted: dict[str, RecallQuery] = {}
        for query in queries:
            _check_thread_id(query.thread_id)
            _check_limit(query.limit)
            seen = wanted.setdefault(query.thread_id, query)
            if seen != query:
                raise InvalidInputError(f"thread {query.thread_id!r} is queried twice with different pages")
        result: dict[str, list[_Row]] = {q.thread_id: [] for q in wanted.values() if q.limit == 0}
        live = [q for q in wanted.values() if q.limit != 0]
        if not live:
            return result
        if self.recall_strategy == "concurrent" or len(live) == 1:
            result.update(await self._recall_concurrent(live, build))
        else:
            result.update(await self._recall_in(live, build))
        return result

    async def _recall_concurrent(
        self, queries: Sequence[RecallQuery], build: _Build[_Row]
    ) -> dict[str, list[_Row]]:
        gate = asyncio.Semaphore(self.recall_concurrency)

        async def one(query: RecallQuery) -> list[_Row]:
            async with gate:
                return await self._find_page(query.thread_id, query.resource_id, query.limit, build)

        pages = await asyncio.gather(*(one(q) for q in queries))
        return {q.thread_id: page for q, page in zip(queries, pages, strict=True)}

    async def _recall_in(self, queries: Sequence[RecallQuery], build: _Build[_Row]) -> dict[str, list[_Row]]:
        """One `$in` query, newest first across the batch, cut client-side per thread.

        MongoDB has no per-group limit in `find` (an aggregation loses the index order), so the query asks
        for at most `sum(limits) + 1` rows. If fewer come back, every thread is complete. If the cap was hit,
        a thread that got fewer rows than its limit may have been crowded out by busier threads; only those
        are read again, one query each. With equal-length histories (the common case) that never happens.
        """
        by_thread = {q.thread_id: q for q in queries}
        ids = list(by_thread)
        resources = {q.resource_id for q in queries}
        query: dict[str, Any] = {"thread_id": {"$in": ids}}
        shared_resource = next(iter(resources)) if len(resources) == 1 else None
        if shared_resource is not None:
            query["resourceId"] = shared_resource
        cap: int | None = None
        if all(q.limit is not None for q in queries):
            cap = sum(q.limit for q in queries if q.limit is not None) + 1
        cursor = RowsCursor(self.raw_messages, query, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        if cap is not None:
            cursor = cursor.limit(cap).batch_size(min(cap, _MONGO_MAX_BATCH))
        with storage_errors("list_messages_many"):
            docs = await _documents(cursor)
        raw = _grouped(docs, by_thread)
        # a row whose `build` fails is skipped at its rank (`_readable`); the raw route builds nothing
        pages = (
            cast(dict[str, list[_Row]], raw)
            if build is _raw_bytes
            else {tid: _readable(rows, build) for tid, rows in raw.items()}
        )
        if cap is not None and len(docs) >= cap:
            short = [q for q in queries if q.limit is not None and len(raw[q.thread_id]) < q.limit]
            if short:
                pages.update(await self._recall_concurrent(short, build))
        return pages

    async def list_page(self, query: PageQuery) -> Page:
        """One page of a token-budgeted recall: one `find` with a date range, a skip and `per_page + 1` rows.

        The extra row only says whether more follow (Mastra's `hasMore` without a count).
        """
        _check_thread_id(query.thread_id)
        spec: dict[str, Any] = {"thread_id": query.thread_id}
        if query.resource_id is not None:
            spec["resourceId"] = query.resource_id
        created: dict[str, datetime] = {}
        if query.start is not None:
            created["$gte"] = query.start
        if query.end is not None:
            created["$lte"] = query.end
        if created:
            spec["createdAt"] = created
        wanted = query.per_page + 1
        cursor = RowsCursor(self.raw_messages, spec, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        cursor = cursor.skip(query.page * query.per_page)
        cursor = cursor.limit(wanted).batch_size(wanted)
        with storage_errors("list_page"):
            docs = await _documents(cursor)
        rows = _readable(docs[: query.per_page], _message, first=query.page * query.per_page)
        return Page(rows, len(docs) > query.per_page)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        """The stored messages among `message_ids` in one of `thread_ids` (any thread when None), with one
        `find` (none for an empty list). The filter is in the query: a copy in another thread never leaves
        the server, so no answer depends on another thread's rows."""
        ids = list(dict.fromkeys(message_ids))
        if not ids or (thread_ids is not None and not thread_ids):
            return []
        query: dict[str, Any] = {"id": {"$in": ids}}
        if thread_ids is not None:
            threads = list(dict.fromkeys(thread_ids))
            query["thread_id"] = threads[0] if len(threads) == 1 else {"$in": threads}
        with storage_errors("get_messages"):
            found = RowsCursor(self.raw_messages, query, MESSAGE_PROJECTION, batch_size=len(ids) + 1)
            docs = await _documents(found)
        return _readable(docs, _message, first=None)

    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        """`list_page` for each query, issued concurrently (at most `recall_concurrency` in flight)."""
        gate = asyncio.Semaphore(self.recall_concurrency)

        async def one(query: PageQuery) -> Page:
            async with gate:
                return await self.list_page(query)

        return list(await asyncio.gather(*(one(q) for q in queries)))
