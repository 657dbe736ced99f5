"""Removing busy-thread markers (`message_history_turns`) that no longer matter, on prune.

With the busy-thread policy on (`enqueue`, `reject`) a marker is written for every thread a request is
enriched for; forget removes the markers of the threads it forgets (`storage.forgetting`: erasure leaves no
request id behind), and this keeps the collection from growing forever otherwise. Prune, after the
messages and threads, removes the markers that no longer matter (`core.turn_rules.marker_expires`): it reads
the candidates in batches, checks which threads still have a `mastra_threads` row (one `distinct` per batch),
and deletes the chosen ones with a filter that repeats the age condition, so a marker written meanwhile (a
new turn on the thread) matches no more and is kept: the read and the delete never race a live write into
losing it. No index: one scan per prune costs less than an index that every mark on the recall path would
have to update.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from message_history.core.turn_rules import MarkerHorizons, marker_expires
from storage.client import CODEC
from storage.documents import THREADS
from storage.errors import storage_errors
from storage.turns import TURNS, marker_from_doc

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase


def _turns(db: AsyncDatabase[Any]) -> AsyncCollection[dict[str, Any]]:
    return db.get_collection(TURNS, codec_options=CODEC)


def _written_before(instant: datetime) -> dict[str, Any]:
    """Markers whose every write time is before `instant` (a missing or null one counts as before)."""
    return {
        "$and": [
            {"$or": [{field: {"$lt": instant}}, {field: None}]} for field in ("enrichedAt", "answeredAt")
        ]
    }


def last_write(doc: dict[str, Any]) -> datetime | None:
    """The newest of a marker's `enrichedAt` and `answeredAt`, None when it has neither."""
    times = [t for t in (doc.get("enrichedAt"), doc.get("answeredAt")) if isinstance(t, datetime)]
    return max(times) if times else None


async def expire_markers(
    db: AsyncDatabase[Any],
    horizons: MarkerHorizons,
    *,
    batch_size: int,
    dry_run: bool = False,
    on_batch: Callable[[int], None] | None = None,
    halted: Callable[[], bool] = lambda: False,
) -> tuple[int, bool]:
    """(markers deleted, or that would be with `dry_run`; True when every candidate was looked at)."""
    turns = _turns(db)
    candidates = _written_before(horizons.gone_before)
    removed = 0
    with storage_errors(f"find old markers on {TURNS}"):
        cursor = turns.find(candidates, batch_size=batch_size)
        chunk: list[dict[str, Any]] = []
        async for doc in cursor:
            chunk.append(doc)
            if len(chunk) >= batch_size:
                removed += await _expire(db, chunk, horizons, candidates, dry_run)
                chunk = []
                if on_batch is not None:
                    on_batch(removed)
                if halted():
                    await cursor.close()
                    return removed, False
        if chunk:
            removed += await _expire(db, chunk, horizons, candidates, dry_run)
            if on_batch is not None:
                on_batch(removed)
    return removed, True


async def _expire(
    db: AsyncDatabase[Any],
    chunk: list[dict[str, Any]],
    horizons: MarkerHorizons,
    unchanged: dict[str, Any],
    dry_run: bool,
) -> int:
    ids = [str(doc["_id"]) for doc in chunk]
    with storage_errors("find the markers' threads"):
        existing = set(await db.get_collection(THREADS).distinct("id", {"id": {"$in": ids}}))
    chosen = [
        doc["_id"]
        for doc in chunk
        if marker_expires(
            marker_from_doc(doc),
            last_write(doc),
            thread_exists=str(doc["_id"]) in existing,
            horizons=horizons,
        )
    ]
    if not chosen or dry_run:
        return len(chosen)
    with storage_errors(f"delete old markers on {TURNS}"):
        # the age condition again: a marker written since the read (a new turn) is no longer a candidate
        result = await _turns(db).delete_many({"$and": [{"_id": {"$in": chosen}}, unchanged]})
    return result.deleted_count
