"""Retention in MongoDB: delete messages older than a cut-off, then the threads they left empty.

The order and the batching are those of `@mastra/mongodb`'s `MemoryStorageMongoDB.prune()` (1.19), so a Mastra
application sharing the database never sees a thread deleted before its messages:

1. `mastra_messages` with `createdAt < cutoff`, in batches: a bounded `find` of `_id`s, then `deleteMany` of
   exactly those (`deleteMany` has no limit). A batch smaller than the batch size means done.
2. `mastra_threads` left empty: `updatedAt < cutoff` (every message of such a thread is older than the
   cut-off, since `updatedAt` is the newest message's time) and no message left, checked per batch.

3. `message_history_turns`, the busy-thread markers that no longer matter (`storage.turn_expiry`): those last
   written before the cut-off, and those of threads that are gone (never closer to now than
   `core.turn_rules.MARKER_GRACE`). Mastra has no such collection.

Mastra's prune also deletes `mastra_resources` rows by their `createdAt` and threads by their *creation* time
(even with newer messages); this service writes no resources and keeps a thread while it has messages.

Rows are read raw and decoded one by one (`storage.raw_rows.keys_of`): a message the codec refuses
(invalid UTF-8, a date out of range) is counted as unreadable and, read leniently, still deleted by its `_id`;
a thread so refused is counted and kept (whether it is empty cannot be looked up by an id read leniently).
Neither stops the prune. A batch of which nothing was deleted (rows whose `_id` itself is invalid UTF-8)
ends the step rather than finding it again for ever.

Each step is idempotent: an interrupted prune run again with the same cut-off ends where one uninterrupted
run ends. Like Mastra's, it deletes documents and does not return disk space to the OS (WiredTiger reuses it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.raw_bson import RawBSONDocument
from pymongo import IndexModel

from message_history.core.turn_rules import marker_horizons
from message_history.errors import UnreadableRowError
from storage.documents import MESSAGES, THREADS
from storage.errors import storage_errors
from storage.raw_rows import RAW, decode_row, keys_of
from storage.turn_expiry import expire_markers
from storage.unreadable import skip

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

# @mastra/mongodb's retention anchor (`ensureAnchorIndex`): same keys, so the same name, so either side's
# createIndexes is a no-op for the other. Without it each batch's `find` would scan the collection.
ANCHOR_INDEX = IndexModel([("createdAt", -1)])


@dataclass(slots=True)
class PruneProgress:
    """What a prune has deleted so far; `done` once nothing older than the cut-off is left."""

    messages: int = 0
    threads: int = 0
    markers: int = 0
    batches: int = 0
    done: bool = False


class MongoPruner:
    """Batched, resumable deletion of old history from `mastra_messages` and `mastra_threads`, then of the
    busy-thread markers that no longer matter (`turn_timeout_s`: the service's turn timeout)."""

    def __init__(
        self, db: AsyncDatabase[Any], *, batch_size: int = 1000, turn_timeout_s: float = 0.0
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.db = db
        self.batch_size = batch_size
        self.turn_timeout_s = turn_timeout_s
        # raw replies: each row decoded alone (`keys_of`), so one undecodable row stops no prune
        self.messages: AsyncCollection[RawBSONDocument] = db.get_collection(MESSAGES, codec_options=RAW)
        self.threads: AsyncCollection[RawBSONDocument] = db.get_collection(THREADS, codec_options=RAW)

    async def count(self, cutoff: datetime, *, now: datetime | None = None) -> tuple[int, int, int]:
        """(messages older than `cutoff`, threads older than it, markers that would go): what a prune would
        look at (dry run; the markers of threads this prune would delete are not counted as gone yet)."""
        with storage_errors("count what prune would delete"):
            messages = await self.messages.count_documents({"createdAt": {"$lt": cutoff}})
            threads = await self.threads.count_documents(_stale_threads(cutoff))
        horizons = marker_horizons(cutoff, now or datetime.now(UTC), self.turn_timeout_s)
        markers, _ = await expire_markers(self.db, horizons, batch_size=self.batch_size, dry_run=True)
        return messages, threads, markers

    async def prune(
        self,
        cutoff: datetime,
        *,
        on_batch: Callable[[PruneProgress], None] | None = None,
        stop: asyncio.Event | None = None,
        max_batches: int | None = None,
        now: datetime | None = None,
    ) -> PruneProgress:
        """Delete messages older than `cutoff`, then the threads left empty, then the markers that no longer
        matter (as of `now`, default the start); stops early on `stop` or after `max_batches` batches (then
        `done` is False and a second run with the same cut-off finishes)."""
        progress = PruneProgress()
        horizons = marker_horizons(cutoff, now or datetime.now(UTC), self.turn_timeout_s)
        with storage_errors("create the retention index"):
            await self.messages.create_indexes([ANCHOR_INDEX])

        def halted() -> bool:
            stopped = stop is not None and stop.is_set()
            return stopped or (max_batches is not None and progress.batches >= max_batches)

        while not halted():
            with storage_errors("find old messages"):
                found = await (
                    self.messages.find({"createdAt": {"$lt": cutoff}}, {"_id": 1})
                    .limit(self.batch_size)
                    .to_list()
                )
            docs = _with_ids(found, MESSAGES)
            if found and not docs:
                break  # only rows whose `_id` cannot be read: found again for ever otherwise
            if docs:
                with storage_errors("delete old messages"):
                    result = await self.messages.delete_many({"_id": {"$in": [d["_id"] for d in docs]}})
                progress.messages += result.deleted_count
                if not result.deleted_count:
                    break  # only rows whose `_id` (read leniently) finds nothing: found again for ever else
                progress.batches += 1
                if on_batch is not None:
                    on_batch(progress)
            if len(found) < self.batch_size:
                break
        else:
            return progress
        if not await self._prune_threads(cutoff, progress, on_batch, halted) or halted():
            return progress  # stopped, or out of batches: the markers wait for the next run

        def counted(markers: int) -> None:
            progress.markers = markers
            progress.batches += 1
            if on_batch is not None:
                on_batch(progress)

        _, progress.done = await expire_markers(
            self.db, horizons, batch_size=self.batch_size, on_batch=counted, halted=halted
        )
        return progress

    async def _prune_threads(
        self,
        cutoff: datetime,
        progress: PruneProgress,
        on_batch: Callable[[PruneProgress], None] | None,
        halted: Callable[[], bool],
    ) -> bool:
        """Delete the stale threads without messages; True when every candidate was looked at."""
        with storage_errors("find stale threads"):
            cursor = self.threads.find(
                _stale_threads(cutoff), {"_id": 1, "id": 1}, batch_size=self.batch_size
            )
            chunk: list[dict[str, Any]] = []
            async for raw in cursor:
                try:
                    chunk.append(decode_row(raw.raw, THREADS))
                except UnreadableRowError as exc:
                    # kept: its messages cannot be looked up by an id read leniently, so it is not known empty
                    skip(exc)
                    continue
                if len(chunk) >= self.batch_size:
                    await self._delete_empty(chunk, progress, on_batch)
                    chunk = []
                    if halted():
                        await cursor.close()
                        return False
            if chunk:
                await self._delete_empty(chunk, progress, on_batch)
        return True

    async def _delete_empty(
        self,
        chunk: list[dict[str, Any]],
        progress: PruneProgress,
        on_batch: Callable[[PruneProgress], None] | None,
    ) -> None:
        ids = [str(doc.get("id")) for doc in chunk]
        with storage_errors("find threads that still have messages"):
            kept = set(await self.messages.distinct("thread_id", {"thread_id": {"$in": ids}}))
        empty = [doc["_id"] for doc in chunk if str(doc.get("id")) not in kept]
        if empty:
            with storage_errors("delete empty threads"):
                result = await self.threads.delete_many({"_id": {"$in": empty}})
            progress.threads += result.deleted_count
        progress.batches += 1
        if on_batch is not None:
            on_batch(progress)


def _with_ids(found: list[RawBSONDocument], collection: str) -> list[dict[str, Any]]:
    """The found raw rows decoded one by one (`keys_of`: an undecodable one counted, read leniently), those
    whose `_id` was read (what a delete by `_id` needs)."""
    rows = (keys_of(doc, collection) for doc in found)
    return [row for row in rows if row is not None and "_id" in row]


def _stale_threads(cutoff: datetime) -> dict[str, Any]:
    """Threads whose newest message is older than `cutoff` (`createdAt` for a thread without `updatedAt`)."""
    return {
        "$or": [
            {"updatedAt": {"$lt": cutoff}},
            {"updatedAt": {"$exists": False}, "createdAt": {"$lt": cutoff}},
        ]
    }
