"""`MongoHistoryStorage`: `HistoryStorage` on PyMongo's `AsyncMongoClient`, in @mastra/mongodb's layout.

A Mastra application using `@mastra/mongodb` and this service share one database and one history
(docs/events.md#14-storage-layout). Documents are written as `MemoryStorageMongoDB` (1.19) writes them:

    mastra_messages  {id, thread_id, resourceId, role, type ('v2' unless the message has another),
                      content (JSON string of the format-2 content), createdAt (BSON Date)}
    mastra_threads   {id, resourceId, title, metadata (object), createdAt (Date), updatedAt (Date)}

Top-level message keys that Mastra's row has no column for (unknown keys of the `Message`) are kept in one
more field, `_mh_extra`, holding their JSON text. Mastra's `parseRow` picks its own fields by name and
never sees it, and JSON text keeps any key as it came (dotted or `$`-prefixed keys included).

Round trips (each is one command unless a reply exceeds one batch, 16 MiB):

* `list_messages`: one `find` (`sort(createdAt -1, id -1).limit(n)`, batch size = n), no count;
  backed by the index `{thread_id: 1, createdAt: 1, id: 1}`, so the `(createdAt, id)` tie-break is free.
* `get_thread` / `get_threads`: one `find`.
* `save_messages` / `save_many`: one `find` on the threads and one on the message ids (ownership), issued
  concurrently; one unordered `bulk_write` creating the new threads (only when the batch has any), one of
  message upserts, one touching the existing threads. The returned threads are computed, not read back.
* `list_messages_many`: one `find` with `$in` (the default, measured faster, see `docs/storage.md`), or one
  `find` per thread issued concurrently.
* token-limited recall: `list_page` one `find` (date range, skip, `per_page + 1` rows, no count);
  `list_pages_many` those concurrently; `save_thread_metadata_many` one unordered bulk `$set` of
  `metadata.<key>` (the boundary), `updatedAt` moved forward.
* `get_messages` (the echo filter and the tool-state merge): one `find` with `$in` on `id`, within the
  asking threads.

The documents' mapping is `storage.documents`, the save planner `storage.save_plan`; this module is the one
storage class and its round trips (one job, hence its length).

Every read takes its reply as raw documents and decodes them one by one (`storage.raw_rows`): a row the
codec or `schemas.stored_rows` refuses is skipped and counted (`storage.unreadable.skip`), never the reply's
failure, so one row no Mastra would read neither fails its batch's other threads nor stops the service
(docs/rules.md#stored-rows). A write MongoDB refuses for one document refuses the turns writing it
(`DocumentRefusedError`); the rest of the unordered bulk is written.

A save uses no transaction (it must work on a standalone server, which has none), so it is not atomic across
the two collections: a new thread is created (owner and all) first, then the messages are written, then the
existing threads touched; every write is an idempotent upsert, so a retried save converges.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import IndexModel, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError
from pymongo.results import BulkWriteResult

from message_history.core.recall_plan import PlainRow
from message_history.errors import (
    DocumentRefusedError,
    FatalStorageError,
    InvalidInputError,
    UnreadableRowError,
)
from schemas.messages import Message, utc_now_ms
from storage import row_codec
from storage.client import CODEC, mongo_client
from storage.documents import (
    MESSAGES,
    THREADS,
    _recalled_or_model,
    message_from_doc,
    thread_from_doc,
)
from storage.errors import record_errors, storage_errors, to_storage_error
from storage.protocol import BatchHistoryStorage, Page, PageQuery, RecallQuery, SaveTurn, Thread, save_one
from storage.raw_rows import decode_row, lenient_row
from storage.recalled_rows import MESSAGE_PROJECTION
from storage.save_plan import SavePlan, SaveReads, _check_thread_id, _check_turns, plan_saves
from storage.unreadable import skip

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

    from message_history.settings import Settings

__all__ = [
    "MESSAGE_INDEXES",
    "THREAD_INDEXES",
    "MongoHistoryStorage",
    "RecallStrategy",
]

log = logging.getLogger(__name__)

# @mastra/mongodb 1.19 `getDefaultIndexDefinitions` (memory domain). Mastra does not name them, so the
# drivers' generated names apply (`id_1`, `thread_id_1_createdAt_1`, ...); PyMongo generates the same names,
# so `createIndexes` from either side is a no-op for the other.
MESSAGE_INDEXES: tuple[IndexModel, ...] = (
    IndexModel([("id", 1)], unique=True),
    IndexModel([("thread_id", 1), ("createdAt", 1)]),
    IndexModel([("resourceId", 1), ("createdAt", 1)]),
    # ours: recall's `find({thread_id}).sort(createdAt -1, id -1).limit(n)` walks it backwards, no sort
    IndexModel([("thread_id", 1), ("createdAt", 1), ("id", 1)]),
)
THREAD_INDEXES: tuple[IndexModel, ...] = (
    IndexModel([("id", 1)], unique=True),
    IndexModel([("resourceId", 1), ("createdAt", -1)]),
    IndexModel([("resourceId", 1), ("updatedAt", -1)]),
)

_NEWEST_FIRST = [("createdAt", -1), ("id", -1)]
_INDEX_CONFLICT_CODES = frozenset({85, 86})  # IndexOptionsConflict, IndexKeySpecsConflict
# Unique-index violation on an upsert (duplicate key). Two writers upserting the same new id race this way.
_UPSERT_RACE_CODES = frozenset({11000, 11001})
_MONGO_MAX_BATCH = 100_000  # PyMongo caps batchSize; the server stops a batch at 16 MiB anyway

RecallStrategy = Literal["in", "concurrent"]
_Row = TypeVar("_Row")
_Build = Callable[[Mapping[str, Any]], _Row]


# Every read takes the reply as raw documents: the rows the recall passes through are read as bytes
# (`storage.row_codec`), every other row is decoded alone, as our collections read (`storage.unreadable`).
RAW_CODEC: Final[CodecOptions[RawBSONDocument]] = CodecOptions(document_class=RawBSONDocument, tz_aware=False)


# Sizes of the fixed-size BSON element types, to step over a top-level element without decoding it.
_FIXED_SIZES: Final = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}


class _RawOwner:
    """`thread_id` and the `resourceId` check of a raw reply's documents, read from the bytes where the
    document's layout makes it certain (else from the decoded document, ~5 us: most of a raw row's cost).

    Certain: `id` then `thread_id` as the first two elements, both strings, and no other key named
    `thread_id` after them; then the top-level elements stepped over (not decoded: a nested document is
    skipped by its size, so its keys are never mistaken for the row's) up to `resourceId`, a string, with no
    other key so named after it. One call per row, searching the bytes once per field (~40 rows an event).
    """

    __slots__ = ("_elements",)

    def __init__(self) -> None:
        self._elements: dict[str, bytes] = {}

    def read(self, doc: Mapping[str, Any], wanted: Mapping[str, RecallQuery]) -> RecallQuery | None:
        """The query `doc` answers: its `thread_id`'s, when owned by the query's resource (or the query names
        none); else None: as `wanted.get(doc.get("thread_id", ""))`, `doc.get("resourceId") == resource`."""
        raw = bytes(cast(RawBSONDocument, doc).raw)
        if raw[4:8] == b"\x02id\x00":
            start = 12 + int.from_bytes(raw[8:12], "little")
            if raw[start : start + 11] == b"\x02thread_id\x00" and raw.find(b"thread_id\x00", start + 11) < 0:
                end = start + 14 + int.from_bytes(raw[start + 11 : start + 15], "little")
                try:
                    query = wanted.get(raw[start + 15 : end].decode())
                except UnicodeDecodeError:
                    return self._decoded(doc, wanted)
                if query is None or query.resource_id is None:
                    return query
                owned = self._owned(raw, end + 1, query.resource_id)
                if owned is None:
                    owned = doc.get("resourceId") == query.resource_id
                return query if owned else None
        return self._decoded(doc, wanted)

    @staticmethod
    def _decoded(doc: Mapping[str, Any], wanted: Mapping[str, RecallQuery]) -> RecallQuery | None:
        query = wanted.get(doc.get("thread_id", ""))
        if query is None or query.resource_id is None or doc.get("resourceId") == query.resource_id:
            return query
        return None

    def _owned(self, raw: bytes, at: int, resource: str) -> bool | None:
        """Whether the top-level `resourceId` is `resource`, stepping over the elements from offset `at`;
        None when the bytes do not make it certain."""
        element = self._elements.get(resource)
        if element is None:
            value = resource.encode()
            element = b"\x02resourceId\x00" + (len(value) + 1).to_bytes(4, "little") + value + b"\x00"
            self._elements[resource] = element
        last = len(raw) - 1
        while at < last:
            if raw.startswith(b"resourceId\x00", at + 1):
                if raw.startswith(element, at) and raw.find(b"resourceId\x00", at + len(element)) < 0:
                    return True
                return None  # another value, or another key so named later: the decoded document says
            kind = raw[at]
            key_end = raw.find(b"\x00", at + 1)
            if kind == 0x02:
                at = key_end + 5 + int.from_bytes(raw[key_end + 1 : key_end + 5], "little")
            elif kind in (0x03, 0x04):
                at = key_end + 1 + int.from_bytes(raw[key_end + 1 : key_end + 5], "little")
            elif kind in _FIXED_SIZES:
                at = key_end + 1 + _FIXED_SIZES[kind]
            else:
                return None
        return False if at == last else None  # no top-level `resourceId`: `doc.get` gives None


def _raw_bytes(doc: Mapping[str, Any]) -> bytes:
    assert isinstance(doc, RawBSONDocument)  # read from `raw_messages`
    return bytes(doc.raw)


def _decoded(build: Callable[[Mapping[str, Any]], _Row]) -> Callable[[Mapping[str, Any]], _Row]:
    """`build` of a raw reply's document, decoded here, alone (`storage.unreadable.decode_row`)."""

    def decoded(doc: Mapping[str, Any]) -> _Row:
        assert isinstance(doc, RawBSONDocument)  # every message read is a raw reply
        return build(decode_row(doc.raw, MESSAGES))

    return decoded


_message: Final = _decoded(message_from_doc)
_recalled: Final = _decoded(_recalled_or_model)


def _readable(
    docs: Sequence[Mapping[str, Any]], build: Callable[[Mapping[str, Any]], _Row], *, first: int | None = 0
) -> list[_Row]:
    """`build` of each raw document; a row no Mastra would read is skipped (`storage.unreadable.skip`).
    `first`: the rank of the first document in its thread's newest-first history (None: not a history)."""
    rows: list[_Row] = []
    for n, doc in enumerate(docs):
        try:
            rows.append(build(doc))
        except UnreadableRowError as exc:
            skip(exc, None if first is None else first + n)
    return rows


def _named(doc: Mapping[str, Any], collection: str) -> UnreadableRowError:
    """The refusal of a raw document whose fields cannot even be looked at (for its thread and id)."""
    assert isinstance(doc, RawBSONDocument)
    try:
        decode_row(doc.raw, collection)
    except UnreadableRowError as exc:
        return exc
    return UnreadableRowError(collection, None, None, "bson", "the stored document cannot be read")


def _index_present(collection: str, model: IndexModel, existing: Sequence[Mapping[str, Any]]) -> bool:
    """True when an index with `model`'s keys exists; raises when it exists in a form we cannot use."""
    spec = model.document
    keys = list(spec["key"].items())
    same_keys = next((ix for ix in existing if list(ix["key"].items()) == keys), None)
    if same_keys is None:
        if any(ix["name"] == spec["name"] for ix in existing):
            raise FatalStorageError(f"{collection} has an index named {spec['name']!r} with other keys")
        return False
    if spec.get("unique") and not same_keys.get("unique"):
        raise FatalStorageError(
            f"{collection} has a non-unique index {same_keys['name']!r} on {dict(keys)}; Mastra and this "
            "service need it unique (remove duplicates, drop it, restart)"
        )
    return True


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise InvalidInputError(f"limit must not be negative, got {limit}")


# --- the storage -------------------------------------------------------------------------------------------


class MongoHistoryStorage(BatchHistoryStorage):
    """`mastra_threads` / `mastra_messages`: a `BatchHistoryStorage` (six operations, their batch forms).

    `recall_strategy` picks how `list_messages_many` reads: `"in"` (one `$in` query, the default) or
    `"concurrent"` (one query per thread, at most `recall_concurrency` in flight).
    """

    def __init__(
        self,
        db: AsyncDatabase[Any],
        *,
        recall_strategy: RecallStrategy = "in",
        recall_concurrency: int = 32,
    ) -> None:
        if recall_concurrency < 1:
            raise ValueError("recall_concurrency must be at least 1")
        self.db = db
        self.recall_strategy: RecallStrategy = recall_strategy
        self.recall_concurrency = recall_concurrency
        self.threads: AsyncCollection[dict[str, Any]] = db.get_collection(THREADS, codec_options=CODEC)
        # reads take replies as raw BSON and decode row by row (`storage.unreadable`): one row the codec
        # refuses is that row's fault, never the whole reply's
        self.raw_threads: AsyncCollection[RawBSONDocument] = db.get_collection(
            THREADS, codec_options=RAW_CODEC
        )
        self.messages: AsyncCollection[dict[str, Any]] = db.get_collection(MESSAGES, codec_options=CODEC)
        # the same collection read as reply bytes (naive dates): rows the recall only passes through
        self.raw_messages: AsyncCollection[RawBSONDocument] = db.get_collection(
            MESSAGES, codec_options=RAW_CODEC
        )

    def __repr__(self) -> str:
        return f"MongoHistoryStorage(db={self.db.name!r}, recall_strategy={self.recall_strategy!r})"

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        *,
        recall_strategy: RecallStrategy = "in",
        appname: str = "message-history",
        create_indexes: bool = True,
    ) -> AsyncIterator[MongoHistoryStorage]:
        """Connect with the settings' timeouts, ping (fail fast), ensure indexes (unless told not to: a dry
        run changes nothing); close the client on exit."""
        client = mongo_client(settings, appname=appname)
        try:
            storage = cls(client[settings.mongodb_database], recall_strategy=recall_strategy)
            await storage.ping()
            if create_indexes:
                await storage.ensure_indexes()
            yield storage
        finally:
            await client.close()

    async def ping(self) -> None:
        """One `ping`; raises `StorageUnavailableError` when the server cannot be reached."""
        with storage_errors("ping"):
            await self.db.command("ping")

    # --- indexes ---

    async def ensure_indexes(self) -> None:
        """Create @mastra/mongodb 1.19's memory indexes and recall's; idempotent, either side may go first."""
        await self._ensure(self.messages, MESSAGE_INDEXES)
        await self._ensure(self.threads, THREAD_INDEXES)

    async def _ensure(
        self, collection: AsyncCollection[dict[str, Any]], models: Sequence[IndexModel]
    ) -> None:
        # One index per createIndexes command, and only the missing ones, as Mastra's Node driver does: an
        # existing index under another name (made by Mastra or an operator) then fails only its own command.
        operation = f"createIndexes on {collection.name}"
        with storage_errors(operation):
            existing = [index async for index in await collection.list_indexes()]
        for model in models:
            if _index_present(collection.name, model, existing):
                continue
            with storage_errors(operation):
                try:
                    await collection.create_indexes([model])
                except OperationFailure as exc:
                    if exc.code not in _INDEX_CONFLICT_CODES:
                        raise
                    # Created meanwhile by another process (Mastra's init, another replica), maybe under
                    # another name: fine when it has our keys.
                    existing = [index async for index in await collection.list_indexes()]
                    if not _index_present(collection.name, model, existing):
                        raise

    # --- reads ---

    async def get_thread(self, thread_id: str) -> Thread | None:
        """The thread, or None when it does not exist."""
        _check_thread_id(thread_id)
        with storage_errors("get_thread"):
            doc = await self.raw_threads.find_one({"id": thread_id}, {"_id": 0})
        if doc is None:
            return None
        found = _thread_doc(doc)
        return thread_from_doc(found) if found is not None else None

    async def get_threads(self, thread_ids: Collection[str]) -> dict[str, Thread]:
        """The existing threads among `thread_ids`, by id, with one `find` (none for an empty list)."""
        threads, _ = await self._get_threads(thread_ids)
        return threads

    async def _get_threads(self, thread_ids: Collection[str]) -> tuple[dict[str, Thread], dict[str, Any]]:
        """The threads by id, and their documents' `_id`s (for keyed writes)."""
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return {}, {}
        for thread_id in ids:
            _check_thread_id(thread_id)
        query: dict[str, Any] = {"id": ids[0]} if len(ids) == 1 else {"id": {"$in": ids}}
        with storage_errors("get_threads"):
            raws = await self.raw_threads.find(query, batch_size=len(ids) + 1).to_list()
        found: dict[str, Thread] = {}
        keys: dict[str, Any] = {}
        for raw in raws:
            doc = _thread_doc(raw)
            if doc is None:
                continue
            thread = thread_from_doc(doc)
            if thread.id not in found:
                found[thread.id] = thread
                keys[thread.id] = doc.get("_id")
        return found, keys

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
        cursor = self.raw_messages.find(query, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        if limit is not None:
            # batch size = limit, so the page comes back in the first reply (the default first batch is 101)
            cursor = cursor.limit(limit).batch_size(min(limit, _MONGO_MAX_BATCH))
        with storage_errors("list_messages"):
            docs = await cursor.to_list()
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
        cursor = self.raw_messages.find(query, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        if cap is not None:
            cursor = cursor.limit(cap).batch_size(min(cap, _MONGO_MAX_BATCH))
        with storage_errors("list_messages_many"):
            docs = await cursor.to_list()
        pages: dict[str, list[_Row]] = {tid: [] for tid in ids}
        # rows of each thread taken, skipped ones included: a skipped row fills its place in the limit, as
        # it does in one thread's query (`_find_page`), so both strategies recall the same rows
        taken: dict[str, int] = dict.fromkeys(ids, 0)
        owner = _RawOwner()
        for doc in docs:
            try:
                wanted = owner.read(doc, by_thread)
            except Exception:  # noqa: BLE001 -- a document the codec refuses: that row's fault, its thread's
                error = _named(doc, MESSAGES)  # as far as a lenient decoding names it
                wanted = by_thread.get(error.thread_id) if isinstance(error.thread_id, str) else None
            if wanted is None:
                continue
            rank = taken[wanted.thread_id]
            if wanted.limit is None or rank < wanted.limit:
                taken[wanted.thread_id] += 1
                try:
                    pages[wanted.thread_id].append(build(doc))
                except UnreadableRowError as exc:
                    skip(exc, rank)
        if cap is not None and len(docs) >= cap:
            short = [q for q in queries if q.limit is not None and taken[q.thread_id] < q.limit]
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
        cursor = self.raw_messages.find(spec, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        cursor = cursor.skip(query.page * query.per_page)
        cursor = cursor.limit(wanted).batch_size(wanted)
        with storage_errors("list_page"):
            docs = await cursor.to_list()
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
            docs = await self.raw_messages.find(query, MESSAGE_PROJECTION, batch_size=len(ids) + 1).to_list()
        return _readable(docs, _message, first=None)

    async def message_homes(self, message_ids: Collection[str]) -> dict[str, str | None]:
        """The thread each stored message among `message_ids` is in, by id: one `find` on the unique `id`
        index, ids and thread ids only (the per-message ownership check of `save_many`)."""
        ids = list(dict.fromkeys(message_ids))
        if not ids:
            return {}
        query: dict[str, Any] = {"id": ids[0]} if len(ids) == 1 else {"id": {"$in": ids}}
        with storage_errors("save messages"):
            raws = await self.raw_messages.find(
                query, {"_id": 0, "id": 1, "thread_id": 1}, batch_size=len(ids) + 1
            ).to_list()
        homes: dict[str, str | None] = {}
        for raw in raws:
            try:
                doc = decode_row(raw.raw, MESSAGES)
            except UnreadableRowError as exc:
                # its id and thread as far as they can be read: an id that is not one of the turn's is
                # no home of it, a thread that is not the turn's refuses the turn (never another's row)
                doc = {"id": exc.row_id, "thread_id": exc.thread_id}
            ident = doc.get("id")
            if isinstance(ident, str):
                thread = doc.get("thread_id")
                homes[ident] = thread if isinstance(thread, str) or thread is None else repr(thread)
        return homes

    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        """`list_page` for each query, issued concurrently (at most `recall_concurrency` in flight)."""
        gate = asyncio.Semaphore(self.recall_concurrency)

        async def one(query: PageQuery) -> Page:
            async with gate:
                return await self.list_page(query)

        return list(await asyncio.gather(*(one(q) for q in queries)))

    # --- writes ---

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        """Set `update`'s keys in the thread's metadata (others kept), `updatedAt` forward to now."""
        await self.save_thread_metadata_many([(thread_id, update)])

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """`save_thread_metadata` for each thread with one unordered bulk write (no upsert: a missing thread
        stays missing, as Mastra's `updateThreadMetadata` leaves it)."""
        if not updates:
            return
        now = utc_now_ms()
        ops = []
        for thread_id, update in updates:
            _check_thread_id(thread_id)
            fields = {f"metadata.{key}": value for key, value in update.items()}
            ops.append(UpdateOne({"id": thread_id}, {"$set": fields, "$max": {"updatedAt": now}}))
        try:
            await self._bulk_write(self.threads, ops, "update thread metadata", retry_race=False)
        except _RefusedDocumentsError as exc:
            # a thread row MongoDB will not take the boundary into (its `metadata` not an object, a
            # validator): the boundary stays unwritten, as if read-only; the recall it came from stands
            for index, why in exc.refused.items():
                thread_id = updates[index][0] if 0 <= index < len(updates) else "?"
                log.warning("token boundary not written: %s", why, extra={"thread_id": thread_id})

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        """Upsert `messages` by id and touch the thread (see `save_many`); raises `ThreadOwnershipError`."""
        return await save_one(self, thread_id=thread_id, resource_id=resource_id, messages=messages)

    async def read_for_saves(self, thread_ids: Collection[str], message_ids: Collection[str]) -> SaveReads:
        """What `save_many` reads before planning (the threads with their `_id`s, the homes of the ids),
        concurrently, for a batch that reads it together with its other needs and hands it to `save_many`."""
        threads = frozenset(thread_ids)
        ids = frozenset(message_ids)
        (state, keys), homes = await asyncio.gather(self._get_threads(threads), self.message_homes(ids))
        return SaveReads(threads, state, keys, ids, homes)

    async def save_many(
        self, turns: Sequence[SaveTurn], *, reads: SaveReads | None = None
    ) -> list[Thread | InvalidInputError]:
        """`save_messages` for each turn, in order: one read, then the batch's new threads, its messages and
        its existing threads, each with one unordered bulk write (no write when there is nothing to write).

        The read (a `find` on the threads and one on the turns' message ids, concurrently) feeds the plan
        (`storage.save_plan`): a turn whose thread belongs to another resource (stored, or created by an
        earlier turn of the batch) gets its `ThreadOwnershipError`, one with a message id stored in (or saved
        by the batch into) another thread its `MessageIdTakenError`; a refused turn writes nothing.

        New threads are created, owner included (`$setOnInsert`), before any message is written into them.
        A creation that did not insert (another writer created the thread in between: another instance, a
        replay, Mastra) reads the thread back, and the turns are planned again against its real owner, so
        two resources creating one thread end with one owner and nothing of the other in it.

        Messages of one id saved twice in the batch into one thread are written once: the last save's
        fields, the first save's `createdAt` (what two saves in a row give). A turn with no messages writes
        nothing and reports the thread; if the thread does not exist either, the batch is refused with
        `InvalidInputError` before anything is written.

        A document MongoDB refuses for itself (`storage.errors.RECORD_CODES`: over 16 MiB after the update, a
        validator) refuses the turns that write it (`DocumentRefusedError`, their dead letters); the rest of
        the batch is written.
        """
        if not turns:
            return []
        _check_turns(turns)  # before reading anything
        state, keys, homes = await self._save_reads(turns, reads)
        results, plan = plan_saves(turns, state, keys, homes=homes, check=False)  # checked above
        created = await self._create_threads(plan, [t for t in plan.threads if t not in state])
        if created.lost:
            # another writer created some of them first: plan again against their real owners
            found, found_keys = await self._get_threads(created.lost)
            state.update(found)
            keys.update(found_keys)
            state.update(created.ours)
            results, plan = plan_saves(turns, state, keys, homes=homes, check=False)
        # message id or thread id -> why MongoDB refused its document; nothing is written into a thread
        # whose creation was refused
        refused: dict[str, str] = dict(created.refused)
        if refused:
            plan.messages = {
                i: w for i, w in plan.messages.items() if w.fields["thread_id"] not in created.refused
            }
        if plan.messages:
            ids = list(plan.messages)
            refused.update(
                (ids[i], why)
                for i, why in (
                    await self._record_bulk_write(
                        self.messages,
                        lambda by_id_field: [w.op(by_id_field=by_id_field) for w in plan.messages.values()],
                        "save messages",
                    )
                ).items()
            )
        touched = {
            t: w for t, w in plan.threads.items() if t not in created.ours and t not in created.refused
        }
        if touched:
            threads = list(touched)
            refused.update(
                (threads[i], why)
                for i, why in (
                    await self._record_bulk_write(
                        self.threads,
                        lambda by_id_field: [w.op(t, by_id_field=by_id_field) for t, w in touched.items()],
                        "update threads",
                    )
                ).items()
            )
        written: list[Thread | InvalidInputError] = list(results)
        return _refused(turns, written, refused) if refused else written

    async def _record_bulk_write(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: Callable[[bool], list[UpdateOne]],
        operation: str,
    ) -> dict[int, str]:
        """`_keyed_bulk_write`; the operations MongoDB refused for their own document, by index (the others
        are written: the bulk is unordered)."""
        try:
            await self._keyed_bulk_write(collection, ops, operation)
        except _RefusedDocumentsError as exc:
            return exc.refused
        return {}

    async def _save_reads(
        self, turns: Sequence[SaveTurn], reads: SaveReads | None
    ) -> tuple[dict[str, Thread], dict[str, Any], dict[str, str | None]]:
        """The threads, their `_id`s and the ids' homes the plan needs: from `reads` (read earlier by the
        batch), plus what `reads` does not cover (all of it without `reads`)."""
        if reads is None:
            threads = list(dict.fromkeys(t.thread_id for t in turns))
            ids = [m.id for t in turns for m in t.messages if m.id is not None]
            state: dict[str, Thread] = {}
            keys: dict[str, Any] = {}
            homes: dict[str, str | None] = {}
        else:
            threads, ids = reads.missing(turns)
            state, keys, homes = dict(reads.threads), dict(reads.keys), dict(reads.homes)
        if threads or ids:
            (more_state, more_keys), more_homes = await asyncio.gather(
                self._get_threads(threads), self.message_homes(ids)
            )
            state.update(more_state)
            keys.update(more_keys)
            homes.update(more_homes)
        return state, keys, homes

    async def _create_threads(self, plan: SavePlan, thread_ids: Sequence[str]) -> _Created:
        """Upsert the plan's new threads (one unordered bulk): which this write inserted, which it found."""
        if not thread_ids:
            return _Created({}, [], {})
        refused: dict[str, str] = {}
        try:
            result = await self._keyed_bulk_write(
                self.threads,
                lambda by_id_field: [plan.threads[t].op(t, by_id_field=by_id_field) for t in thread_ids],
                "create threads",
            )
            inserted = set(result.upserted_ids or {}) if result is not None else set()
        except _RefusedDocumentsError as exc:  # the others are created (an unordered bulk)
            inserted = exc.upserted
            refused = {thread_ids[i]: why for i, why in exc.refused.items() if 0 <= i < len(thread_ids)}
        ours = {t: plan.state[t] for i, t in enumerate(thread_ids) if i in inserted}
        return _Created(ours, [t for t in thread_ids if t not in ours and t not in refused], refused)

    async def _keyed_bulk_write(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: Callable[[bool], list[UpdateOne]],
        operation: str,
    ) -> BulkWriteResult | None:
        """The bulk keyed by `_id`; if it collides with a row Mastra inserted, the same bulk keyed by `id`.

        Rows this service inserts have `_id` = their id, so an upsert is a primary-key lookup. A message or
        thread that Mastra inserted has an ObjectId `_id`, so the `_id`-keyed upsert misses it
        and tries to insert a second row with the same `id`, which the unique `id` index refuses. Then the
        whole bulk runs again keyed by `id` as Mastra's own upserts are; every op is an idempotent upsert, so
        the ops of the first attempt that did apply are applied again without change.
        """
        try:
            return await self._bulk_write(collection, ops(False), operation, retry_race=False)
        except _UniqueIndexCollisionError:
            log.debug("%s: a row keyed by ObjectId, rewriting the batch keyed by id", operation)
            return await self._bulk_write(collection, ops(True), operation, retry_race=True)

    async def _bulk_write(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: list[UpdateOne],
        operation: str,
        *,
        retry_race: bool,
    ) -> BulkWriteResult | None:
        """One unordered `bulk_write`, its result (None when the server does not acknowledge writes). A
        unique-index collision raises `_UniqueIndexCollisionError`, or, with `retry_race`, first runs the
        bulk once more.

        Two writers upserting the same new id can both miss and both insert; the loser gets a duplicate key
        (MongoDB 4.2+ retries that itself for equality filters, other servers may not). Every op here is an
        idempotent upsert, so running the whole batch again is safe and converges.
        """
        for attempt in (1, 2):
            try:
                result = await collection.bulk_write(ops, ordered=False)
            except BulkWriteError as exc:
                refused = record_errors(exc)
                if refused is not None:
                    upserted = {int(u.get("index", -1)) for u in exc.details.get("upserted", ())}
                    raise _RefusedDocumentsError(refused, upserted) from exc
                codes = {int(e.get("code", 0)) for e in exc.details.get("writeErrors", ())}
                if not (codes and codes <= _UPSERT_RACE_CODES):
                    raise to_storage_error(exc, operation) from exc
                collision: BaseException = exc
            except OperationFailure as exc:
                if exc.code not in _UPSERT_RACE_CODES:
                    raise to_storage_error(exc, operation) from exc
                collision = exc
            except PyMongoError as exc:
                raise to_storage_error(exc, operation) from exc
            else:
                return result if result.acknowledged else None
            if not retry_race:
                raise _UniqueIndexCollisionError(operation) from collision
            if attempt == 1:
                log.warning("retrying %s once after a duplicate key on upsert", operation)
                continue
            raise to_storage_error(collision, operation) from collision
        raise AssertionError("unreachable")  # pragma: no cover -- the loop returns or raises


def _thread_doc(raw: RawBSONDocument) -> dict[str, Any] | None:
    """A `mastra_threads` document, decoded alone. One the codec refuses is counted and logged, then read
    leniently (invalid UTF-8 replaced, dates clamped): the owner check needs the row, and a `resourceId` so
    read is no one's, so it refuses rather than admits. None when not even that reads it (the thread is then
    not found: a save of it meets the unique `id` index, never another owner's row)."""
    try:
        return decode_row(raw.raw, THREADS)
    except UnreadableRowError as exc:
        skip(exc)
        return lenient_row(raw.raw)


@dataclass(frozen=True, slots=True)
class _Created:
    """A batch's new threads after their creation: inserted by it (its own), or found created by another."""

    ours: dict[str, Thread]
    lost: list[str]
    refused: dict[str, str]  # thread id -> why MongoDB refused to create it


def _refused(
    turns: Sequence[SaveTurn], results: list[Thread | InvalidInputError], refused: Mapping[str, str]
) -> list[Thread | InvalidInputError]:
    """`results` with each turn that writes a refused document (a message of it, or its thread) refused."""
    out = list(results)
    for n, turn in enumerate(turns):
        if not isinstance(out[n], Thread):
            continue
        for key in [turn.thread_id, *(m.id for m in turn.messages if m.id is not None)]:
            why = refused.get(key)
            if why is not None:
                kind = "thread" if key == turn.thread_id else "message"
                log.warning("%s refused by MongoDB: %s", kind, why, extra={"thread_id": turn.thread_id})
                out[n] = DocumentRefusedError(
                    f"{why}; writing {kind} {key!r} of thread {turn.thread_id!r} (the turn's other "
                    "documents may be written: a redrive writes them again, unchanged)"
                )
                break
    return out


class _RefusedDocumentsError(Exception):
    """A bulk write MongoDB refused some documents of, each for itself (internal signal: by op index)."""

    def __init__(self, refused: dict[int, str], upserted: set[int]) -> None:
        self.refused = refused
        self.upserted = upserted  # the indices of the operations that inserted
        super().__init__(f"{len(refused)} documents refused")


class _UniqueIndexCollisionError(Exception):
    """An `_id`-keyed upsert met a row with the same `id` under another `_id` (internal signal)."""
