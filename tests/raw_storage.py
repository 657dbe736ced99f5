"""`RawRowStorage`: the in-memory storage over stored *documents*, read by the MongoDB storage's own readers.

tests/paths.py drives both paths over an in-memory storage, which keeps `Message` models: a row the service
did not write (a Mastra app's, an operator's, a bug's) cannot be put there. This storage keeps every message
as the BSON document MongoDB would hold (inserted rows as given, saved ones as a save writes them:
`storage.save_plan.message_write`) and reads them as `MongoHistoryStorage` reads a reply
(`MongoHistoryStorage.recalled_from_raw`, the MongoDB storage's raw route; `plain_rows` for the recall's fast
route), so whatever the product does with a row it cannot read (skip and count, or refuse) happens here as on
the server, in milliseconds. Queries are answered as the server answers them: `thread_id` / `resourceId`
equality on the stored value, `sort(createdAt -1, id -1)` in BSON's order of types, `limit` before decoding
(an unreadable row takes a slot, as on the server), the recall projection.

Threads are the in-memory storage's (`add_threads` reads stored thread documents with `thread_from_doc`).
What the server refuses to store (invalid UTF-8, dates past year 9999) is the integration variant's
(tests/integration/test_fuzz_stored_rows.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import bson
from bson import Decimal128, Int64, ObjectId
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.regex import Regex

from message_history.core.recall_plan import PlainPage, PlainRow
from message_history.errors import InvalidInputError, MessageIdTakenError
from schemas.messages import Message, utc_now_ms
from schemas.recalled import RecalledRow
from storage.documents import EXTRA_FIELD, thread_from_doc
from storage.memory import InMemoryHistoryStorage
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery, Thread
from storage.recalled_rows import MESSAGE_PROJECTION
from storage.save_plan import message_write
from storage.sequential import SequentialBatches

__all__ = ["RawRowStorage"]

# how the storage looks at a document's fields to answer a query (never to read a row: that is the product's)
_PEEK: Final[CodecOptions[dict[str, Any]]] = CodecOptions(
    document_class=dict,
    tz_aware=True,
    unicode_decode_error_handler="replace",
    datetime_conversion=DatetimeConversion.DATETIME_CLAMP,
)


def _peek(raw: bytes) -> dict[str, Any]:
    try:
        return bson.decode(raw, _PEEK)
    except Exception:  # a document not even a lenient decoder reads matches no query
        return {}


def _rank(value: Any) -> tuple[int, Any]:
    """MongoDB's sort order across BSON types (absent sorts as null), then the value within its type."""
    if value is None:
        return (1, 0)
    if isinstance(value, bool):
        return (8, value)
    if isinstance(value, int | float | Int64 | Decimal128):
        number = float(value.to_decimal()) if isinstance(value, Decimal128) else float(value)
        return (2, -math.inf if math.isnan(number) else number)
    if isinstance(value, str):
        return (3, value.encode("utf-8", "surrogatepass"))
    if isinstance(value, Mapping):
        return (4, repr(value))
    if isinstance(value, list):
        return (5, repr(value))
    if isinstance(value, bytes):
        return (6, value)
    if isinstance(value, ObjectId):
        return (7, value.binary)
    if isinstance(value, datetime):
        return (9, value.timestamp())
    if isinstance(value, Regex):
        return (11, repr(value))
    return (12, repr(value))


class _RawMessages(InMemoryHistoryStorage):
    """The in-memory storage (threads, ownership) whose messages are stored documents."""

    def __init__(self) -> None:
        super().__init__()
        self.documents: list[bytes] = []  # in insertion order, as a collection without the unique index
        self.thread_docs: dict[str, dict[str, Any]] = {}  # stored thread documents not read yet

    # --- stored documents ------------------------------------------------------------------------------

    def add_messages(self, docs: Iterable[Mapping[str, Any] | bytes]) -> None:
        for doc in docs:
            self.documents.append(doc if isinstance(doc, bytes) else bson.encode(doc))

    def add_threads(self, docs: Iterable[Mapping[str, Any]]) -> None:
        """Thread documents, read when a path asks for the thread (`thread_from_doc`, as the MongoDB storage
        reads them); a save's changes apply to what was read."""
        for doc in docs:
            ident = doc.get("id")
            if isinstance(ident, str) and ident not in self.thread_docs:
                self.thread_docs[ident] = dict(doc)

    def _read_thread(self, thread_id: str) -> None:
        doc = self.thread_docs.pop(thread_id, None)
        if doc is not None and thread_id not in self._threads:
            self._threads[thread_id] = thread_from_doc(doc)

    async def get_thread(self, thread_id: str) -> Thread | None:
        self._read_thread(thread_id)
        return await super().get_thread(thread_id)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        self._read_thread(thread_id)
        await super().save_thread_metadata(thread_id, update)

    def _find(self, match: Mapping[str, Any]) -> list[tuple[bytes, dict[str, Any]]]:
        """Documents whose fields equal `match`'s (a collection value: any of it), with their fields."""
        found: list[tuple[bytes, dict[str, Any]]] = []
        for raw in self.documents:
            doc = _peek(raw)
            if all(
                type(doc.get(k)) is str
                and (
                    doc.get(k) in v
                    if isinstance(v, Collection) and not isinstance(v, str)
                    else doc.get(k) == v
                )
                for k, v in match.items()
            ):
                found.append((raw, doc))
        return found

    @staticmethod
    def _projected(raw: bytes, doc: Mapping[str, Any]) -> bytes:
        """The recall projection of `raw` (the fields `message_from_doc` reads, in stored order)."""
        if set(doc) <= {k for k, v in MESSAGE_PROJECTION.items() if v}:
            return raw
        try:
            full = bson.decode(raw, CodecOptions(document_class=dict, tz_aware=False))
        except Exception:  # left whole: the product's reader decides what it is
            return raw
        return bson.encode({k: v for k, v in full.items() if MESSAGE_PROJECTION.get(k) == 1})

    def newest(self, thread_id: str, resource_id: str | None, limit: int | None) -> list[bytes]:
        """The thread's documents as the recall query returns them: newest first, `limit`, projected."""
        match: dict[str, Any] = {"thread_id": thread_id}
        if resource_id is not None:
            match["resourceId"] = resource_id
        found = self._find(match)
        found.sort(key=lambda pair: (_rank(pair[1].get("createdAt")), _rank(pair[1].get("id"))), reverse=True)
        if limit is not None:
            found = found[:limit]
        return [self._projected(raw, doc) for raw, doc in found]

    @staticmethod
    def _models(docs: Sequence[bytes]) -> list[Message]:
        """The documents read by the MongoDB storage's reader (a row it cannot read: as it decides)."""
        rows = MongoHistoryStorage.recalled_from_raw(docs)
        return [row.materialize() if isinstance(row, RecalledRow) else row for row in rows]

    # --- HistoryStorage --------------------------------------------------------------------------------

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        if not thread_id:
            raise InvalidInputError("thread id must not be empty")
        if limit is not None and limit < 0:
            raise InvalidInputError(f"limit must not be negative, got {limit}")
        if limit == 0:
            return []
        return self._models(self.newest(thread_id, resource_id, limit))

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        match: dict[str, Any] = {"id": frozenset(message_ids)}
        if thread_ids is not None:
            match["thread_id"] = frozenset(thread_ids)
        return self._models([self._projected(raw, doc) for raw, doc in self._find(match)])

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        """The in-memory save (ownership, thread), then each message upserted by `id` into the documents as
        the MongoDB storage's update does (`$set` of the fields, `createdAt` only on insert)."""
        held = {
            doc.get("id"): doc for _, doc in self._find({"id": frozenset(m.id for m in messages if m.id)})
        }
        for message in messages:
            other = held.get(message.id)
            if other is not None and other.get("thread_id") != thread_id:
                raise MessageIdTakenError(thread_id, resource_id, message.id or "")
        self._read_thread(thread_id)
        thread = await super().save_messages(thread_id=thread_id, resource_id=resource_id, messages=messages)
        now = utc_now_ms()
        for message in messages:
            assert message.id is not None  # the in-memory save refuses a message without one
            saved = self._messages.pop(message.id)
            self._by_thread.get(thread_id, set()).discard(message.id)
            write = message_write(saved, thread_id, resource_id, now)
            self._upsert(message.id, write.fields, write.extra, write.created)
        return thread

    def _upsert(self, ident: str, fields: Mapping[str, Any], extra: str | None, created: datetime) -> None:
        for i, raw in enumerate(self.documents):
            doc = _peek(raw)
            if doc.get("id") == ident:
                try:
                    stored = bson.decode(raw, CodecOptions(document_class=dict, tz_aware=True))
                except Exception:  # the server rewrites what it holds; so does this
                    stored = doc
                stored.update(fields)
                if extra is None:
                    stored.pop(EXTRA_FIELD, None)
                else:
                    stored[EXTRA_FIELD] = extra
                self.documents[i] = bson.encode(stored)
                return
        new = {**fields, "createdAt": created}
        if extra is not None:
            new[EXTRA_FIELD] = extra
        self.documents.append(bson.encode(new))


class RawRowStorage(SequentialBatches):
    """A `BatchHistoryStorage` over stored documents, with the recall's raw route (`recall_raw_many`)."""

    def __init__(self) -> None:
        self.rows = _RawMessages()
        super().__init__(self.rows)

    def add_messages(self, docs: Iterable[Mapping[str, Any] | bytes]) -> None:
        """Stored `mastra_messages` documents, as inserted (no unique index: ids may repeat)."""
        self.rows.add_messages(docs)

    def add_threads(self, docs: Iterable[Mapping[str, Any]]) -> None:
        """Stored `mastra_threads` documents."""
        self.rows.add_threads(docs)

    async def recall_raw_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[bytes]]:
        return {q.thread_id: self.rows.newest(q.thread_id, q.resource_id, q.limit) for q in queries}

    def plain_rows(self, docs: Sequence[bytes]) -> list[PlainRow | None]:
        return MongoHistoryStorage.plain_rows(docs)

    def plain_page_of(
        self, docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]
    ) -> tuple[PlainPage, int] | None:
        return MongoHistoryStorage.plain_page_of(docs, read, limit, incoming)

    def recalled_from_raw(self, docs: Sequence[bytes]) -> list[Message]:
        return MongoHistoryStorage.recalled_from_raw(docs)
