"""The storage's threads: read by id (`get_thread`, `get_threads`), and their metadata's keys set.

`get_thread` / `get_threads`: one `find`. `save_thread_metadata_many` (the token boundary of a budgeted
recall): one unordered bulk `$set` of `metadata.<key>`, `updatedAt` moved forward, no upsert.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from bson.raw_bson import RawBSONDocument

from message_history.errors import UnreadableRowError
from schemas.messages import utc_now_ms
from storage.documents import THREADS, thread_from_doc
from storage.errors import storage_errors
from storage.mongo_upserts import MongoUpserts, RefusedDocumentsError
from storage.protocol import Thread
from storage.raw_rows import decode_row, lenient_row
from storage.save_plan import _check_thread_id
from storage.unreadable import skip
from storage.update_command import Statement

__all__ = ["MongoThreads"]

log = logging.getLogger("storage.mongodb")  # the storage's logger, as before its jobs had modules


class MongoThreads(MongoUpserts):
    """`mastra_threads` read by id, and metadata keys set."""

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

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        """Set `update`'s keys in the thread's metadata (others kept), `updatedAt` forward to now."""
        await self.save_thread_metadata_many([(thread_id, update)])

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """`save_thread_metadata` for each thread with one unordered bulk write (no upsert: a missing thread
        stays missing, as Mastra's `updateThreadMetadata` leaves it)."""
        if not updates:
            return
        now = utc_now_ms()
        ops: list[Statement] = []
        for thread_id, update in updates:
            _check_thread_id(thread_id)
            fields = {f"metadata.{key}": value for key, value in update.items()}
            update_doc = {"$set": fields, "$max": {"updatedAt": now}}
            ops.append({"q": {"id": thread_id}, "u": update_doc, "upsert": False})
        try:
            await self._bulk_write(self.threads, ops, "update thread metadata", retry_race=False)
        except RefusedDocumentsError as exc:
            # a thread row MongoDB will not take the boundary into (its `metadata` not an object, a
            # validator): the boundary stays unwritten, as if read-only; the recall it came from stands
            for index, why in exc.refused.items():
                thread_id = updates[index][0] if 0 <= index < len(updates) else "?"
                log.warning("token boundary not written: %s", why, extra={"thread_id": thread_id})


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
