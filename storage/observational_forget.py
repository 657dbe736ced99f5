"""Forgetting one thread of a resource whose Observational Memory is resource-scoped (issue 35): the thread's
part of the `resource:<resourceId>` row erased (docs/observational-memory.md#forget-and-replay).

Called by `storage.forgetting.MongoForgetting.forget_thread` after the thread's messages are deleted and
before its thread row is (its cursor is read from it). The row's newest generation is read, its change
planned by `core.observation_forget.plan_thread_forget` and written with a conditional update: the filter
holds every field the write replaces at the value read, the claim cycle and both claim flags, so an
observation (reflection) applied or claimed meanwhile makes the write match nothing, and the row is read and
planned again (at most `ATTEMPTS` times; then, as when the thread's part cannot be separated, the resource's
log is cleared). The write clears the claim flags and bumps `_mh_cycle`: an observation or reflection in
flight (whose work may hold the thread's messages or log) is answered stale and never re-adds them; its
thread's next turn (or the sweep) claims afresh.

Not separable (`plan_thread_forget`), an unreadable newest generation, or no write won after `ATTEMPTS`: every
generation of `resource:<resourceId>` is deleted (in-flight answers then match no row) and each of the
resource's threads loses its `metadata.mastra.om` (cursor and hints), so its still stored messages are
observed again from scratch: privacy over cost.

Rows are input: an unreadable row is skipped and counted (`storage.unreadable`) and, as forget treats one,
erased rather than left (here: it makes the log not separable); nothing here raises on a row's content.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from bson.raw_bson import RawBSONDocument
from pymongo import DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.observation_forget import mentions_thread, plan_thread_forget
from message_history.core.observation_resource import thread_cursor
from message_history.errors import UnreadableRowError
from storage.documents import MESSAGES, THREADS
from storage.errors import storage_errors
from storage.observational import lookup_key
from storage.observational_resource import CURSOR_KEY
from storage.observational_rows import CLAIMED_AT, CLAIMED_BY, CYCLE, OBSERVATIONAL, record_from_doc
from storage.raw_rows import RAW, decode_row, keys_row
from storage.unreadable import skip

__all__ = ["ATTEMPTS", "ThreadForgotten", "forget_thread_in_resource"]

log = logging.getLogger(__name__)

ATTEMPTS: Final = 8
"""Conditional writes tried against concurrent observations before the log is cleared instead."""
_OM: Final = "metadata.mastra.om"
_ID_CHUNK: Final = 1000  # observed ids looked up per `$in`
_TEXT_FIELDS: Final = ("activeObservations", "activeObservationsPendingUpdate", "bufferedReflection")


@dataclass(slots=True)
class ThreadForgotten:
    """What forgetting the thread did to its resource's log: `removed` sections, or `cleared` it whole."""

    removed: int = 0
    cleared: bool = False
    why: str = ""


async def forget_thread_in_resource(
    db: AsyncDatabase[Any], thread_id: str, resource_id: str, *, attempts: int = ATTEMPTS
) -> ThreadForgotten:
    """Erase `thread_id`'s observations from `resource_id`'s resource-scoped log (see the module)."""
    cursor, cursor_unknown = await _thread_cursor(db, thread_id, resource_id)
    for _ in range(attempts):
        newest, older_mention = await _generations(db, resource_id, thread_id)
        if newest is None:
            if older_mention:  # only unreadable or older rows: nothing to plan on
                return await _clear(db, resource_id, "no readable newest generation")
            break
        try:
            record_from_doc(newest)
        except UnreadableRowError as exc:
            skip(exc)
            return await _clear(db, resource_id, "the newest generation is unreadable")
        ids = newest.get("observedMessageIds")
        missing = await _missing(db, ids if isinstance(ids, list) else [])
        others = await _others_newest(db, resource_id, thread_id) if cursor or cursor_unknown else None
        plan = plan_thread_forget(
            newest,
            thread_id,
            cursor=cursor,
            cursor_unknown=cursor_unknown,
            older_mention=older_mention,
            missing_ids=missing,
            others_newest=others,
        )
        if not plan.separable:
            return await _clear(db, resource_id, plan.why)
        claimed = newest.get("isObserving") is True or newest.get("isReflecting") is True
        if not plan.fields and not claimed:
            break
        if await _write(db, newest, plan.fields):
            await _drop_cursor(db, thread_id, resource_id)
            return ThreadForgotten(removed=plan.removed_sections)
    else:
        return await _clear(db, resource_id, "concurrent observations kept changing the row")
    await _drop_cursor(db, thread_id, resource_id)
    return ThreadForgotten()


async def _thread_cursor(
    db: AsyncDatabase[Any], thread_id: str, resource_id: str
) -> tuple[datetime | None, bool]:
    """The thread's cursor, and whether its row could not be read (then it may have been observed)."""
    rows = db.get_collection(THREADS, codec_options=RAW)
    with storage_errors("om forget: the thread's cursor"):
        raw = await rows.find_one({"id": thread_id, "resourceId": resource_id}, {"_id": 0, _OM: 1})
    if raw is None:
        return None, False
    try:
        doc = decode_row(raw.raw, THREADS)
    except UnreadableRowError as exc:
        skip(exc)
        return None, True
    return thread_cursor(doc.get("metadata")), False


async def _generations(
    db: AsyncDatabase[Any], resource_id: str, thread_id: str
) -> tuple[dict[str, Any] | None, bool]:
    """The newest generation of the resource's log (decoded; None when there is none or it cannot be
    decoded), and whether an older one mentions the thread or cannot be read (one row held at a time)."""
    rows = db.get_collection(OBSERVATIONAL, codec_options=RAW)
    newest: dict[str, Any] | None = None
    older_mention = False
    first = True
    with storage_errors("om forget: the resource's generations"):
        cursor = rows.find({"lookupKey": lookup_key(None, resource_id)}).sort("generationCount", DESCENDING)
        async for raw in cursor:
            doc = _decoded(raw)
            if first:
                first = False
                if doc is None:
                    return None, True
                newest = doc
                continue
            if doc is None or _mentions(doc, thread_id):
                older_mention = True
                break
    return newest, older_mention


def _decoded(raw: RawBSONDocument) -> dict[str, Any] | None:
    try:
        return decode_row(raw.raw, OBSERVATIONAL)
    except UnreadableRowError as exc:
        skip(exc)
        return None


def _mentions(doc: dict[str, Any], thread_id: str) -> bool:
    """Whether a generation's text fields (or its buffered chunks) hold the thread's section."""
    if any(mentions_thread(doc.get(name), thread_id) for name in _TEXT_FIELDS):
        return True
    chunks = doc.get("bufferedObservationChunks")
    return isinstance(chunks, list) and any(
        isinstance(c, dict) and mentions_thread(c.get("observations"), thread_id) for c in chunks
    )


async def _missing(db: AsyncDatabase[Any], ids: list[Any]) -> frozenset[str]:
    """The observed ids whose message is no longer stored (the forgotten thread's, deleted first)."""
    wanted = list(dict.fromkeys(i for i in ids if isinstance(i, str)))
    found: set[str] = set()
    rows = db.get_collection(MESSAGES, codec_options=RAW)
    with storage_errors("om forget: the observed messages"):
        for start in range(0, len(wanted), _ID_CHUNK):
            chunk = wanted[start : start + _ID_CHUNK]
            for raw in await rows.find({"id": {"$in": chunk}}, {"_id": 0, "id": 1}).to_list():
                doc = keys_row(raw.raw)  # an undecodable one still exists: its id, read leniently, is kept
                if doc is not None and isinstance(doc.get("id"), str):
                    found.add(doc["id"])
    return frozenset(wanted) - found


async def _others_newest(db: AsyncDatabase[Any], resource_id: str, thread_id: str) -> datetime | None:
    """The newest cursor among the resource's other threads (ISO strings sort as their times)."""
    rows = db.get_collection(THREADS, codec_options=RAW)
    with storage_errors("om forget: the other threads' cursors"):
        raws = await (
            rows.find(
                {"resourceId": resource_id, "id": {"$ne": thread_id}, CURSOR_KEY: {"$type": "string"}},
                {"_id": 0, _OM: 1},
            )
            .sort(CURSOR_KEY, DESCENDING)
            .limit(1)
            .to_list()
        )
    for raw in raws:
        try:
            return thread_cursor(decode_row(raw.raw, THREADS).get("metadata"))
        except UnreadableRowError as exc:
            skip(exc)
    return None


async def _write(db: AsyncDatabase[Any], newest: dict[str, Any], fields: dict[str, Any]) -> bool:
    """The plan written if the row is still as read (each replaced field, the cycle, the flags), any claim
    cancelled (flags cleared, cycle bumped); False when another write came first."""
    guard: dict[str, Any] = {"_id": newest["_id"]}
    for name in (*fields, CYCLE, "isObserving", "isReflecting"):
        guard[name] = newest.get(name)
    update: dict[str, Any] = {
        "$set": {**fields, "isObserving": False, "isReflecting": False, CLAIMED_AT: None, CLAIMED_BY: None},
        "$inc": {CYCLE: 1},
    }
    with storage_errors("om forget: the resource's log"):
        result = await db[OBSERVATIONAL].update_one(guard, update)
    return result.matched_count == 1


async def _drop_cursor(db: AsyncDatabase[Any], thread_id: str, resource_id: str) -> None:
    """The thread's cursor and hints gone now (its row goes last in the forget: a forget run again after a
    crash must not read a cursor whose section is already removed)."""
    with storage_errors("om forget: the thread's cursor"):
        await db[THREADS].update_one({"id": thread_id, "resourceId": resource_id}, {"$unset": {_OM: ""}})


async def _clear(db: AsyncDatabase[Any], resource_id: str, why: str) -> ThreadForgotten:
    """The resource's whole log erased and its threads' cursors and hints unset: observed again from
    scratch."""
    with storage_errors("om forget: clear the resource's log"):
        await db[OBSERVATIONAL].delete_many({"lookupKey": lookup_key(None, resource_id)})
        await db[THREADS].update_many(
            {"resourceId": resource_id, _OM: {"$exists": True}}, {"$unset": {_OM: ""}}
        )
    log.info(
        "resource's observation log cleared to forget a thread: %s", why, extra={"resource_id": resource_id}
    )
    return ThreadForgotten(cleared=True, why=why)
