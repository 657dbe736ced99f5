"""`message_history_turns`: which turn of each thread is enriched and not answered yet (the busy markers).

One document per thread, in the same database as Mastra's collections but in a collection of its own, so
Mastra never reads or writes it:

    {_id: threadId, pending: requestId | null, enrichedAt: Date | null, resourceId (the request's),
     answered: [requestId, ...] (the newest 64), answeredAt: Date}

The recall path sets `pending` (an upsert by `_id`) while it sends the enriched request; the persist path,
after writing a batch of turns, adds their request ids to `answered` and clears `pending` when it names one
of them. A pending id found in `answered` is not busy, so the two writes may land in either order (a worker
may answer before the mark is acknowledged); each input record is committed only after its marker write.
Failed turns, read-only turns and turns with nothing to save count as answers. Round trips: one `find` per
recall batch; the marks of one batch in one `bulk_write` (the recall path's gate holds them until the
batch's requests are sent: `consumers.turn_gate.BatchGate.write_marks`; one write in flight at a time, the
marks made meanwhile go together in the next); one `bulk_write` per persist batch
(one update per thread); and while requests wait, one `find` per poll interval for every thread waited on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence, Set
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo.errors import BulkWriteError

from message_history.core.turn_rules import ANSWERED_KEPT, TurnMarker, still_waiting
from message_history.errors import FatalStorageError, WaitInterruptedError
from storage.client import CODEC, mongo_client
from storage.errors import reply_codes, storage_errors, to_storage_error
from storage.update_command import Statement, update_statements

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

    from message_history.settings import Settings

log = logging.getLogger(__name__)

TURNS = "message_history_turns"
_DUPLICATE_KEY = frozenset({11000, 11001})  # two writers upserting one new _id: the loser retries once
_OPS_PER_COMMAND = 500


def _answered_pipeline(thread_id: str, ids: list[str], now: datetime, upsert: bool = True) -> Statement:
    """One update: `pending` cleared when it is one of `ids`; `ids` appended to `answered` (newest kept)."""
    pending = {"$ifNull": ["$pending", None]}
    return {
        "q": {"_id": thread_id},
        "u": [
            {
                "$set": {
                    "pending": {"$cond": [{"$in": [pending, ids]}, None, pending]},
                    "answered": {
                        "$slice": [{"$concatArrays": [{"$ifNull": ["$answered", []]}, ids]}, -ANSWERED_KEPT]
                    },
                    "answeredAt": now,
                }
            }
        ],
        "upsert": upsert,
    }


def _answered_plain(thread_id: str, ids: list[str], now: datetime, upsert: bool = True) -> list[Statement]:
    """The same as `_answered_pipeline` in two plain updates, for servers without pipeline updates."""
    return [
        {
            "q": {"_id": thread_id},
            "u": {
                "$push": {"answered": {"$each": ids, "$slice": -ANSWERED_KEPT}},
                "$set": {"answeredAt": now},
            },
            "upsert": upsert,
        },
        {
            "q": {"_id": thread_id, "pending": {"$in": ids}},
            "u": {"$set": {"pending": None, "enrichedAt": None}},
            "upsert": False,
        },
    ]


def marker_from_doc(doc: Mapping[str, Any]) -> TurnMarker:
    pending = doc.get("pending")
    answered = doc.get("answered") or ()
    since = doc.get("enrichedAt")
    resource = doc.get("resourceId")
    return TurnMarker(
        pending=str(pending) if pending is not None else None,
        answered=tuple(str(a) for a in answered),
        pending_since=since if isinstance(since, datetime) else None,
        resource_id=str(resource) if resource is not None else None,
    )


class MongoTurnMarkers:
    """The busy markers of every thread; `poll_s` is how often waits look for an answer."""

    def __init__(self, db: AsyncDatabase[Any], *, poll_s: float = 0.05) -> None:
        self.collection: AsyncCollection[dict[str, Any]] = db.get_collection(TURNS, codec_options=CODEC)
        self._poll_s = poll_s
        self._marks = _Coalesced(self._write)
        self._waiters: dict[str, list[tuple[str, asyncio.Future[TurnMarker | None]]]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._pipelines = True  # until the server refuses one

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, settings: Settings) -> AsyncIterator[MongoTurnMarkers]:
        """Its own client on the service's database (same timeouts as the history storage)."""
        client = mongo_client(settings, appname="message-history-turns")
        markers = cls(client[settings.mongodb_database])
        try:
            yield markers
        finally:
            await markers.close()
            await client.close()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    # --- recall side ---

    async def get_many(self, thread_ids: Sequence[str]) -> dict[str, TurnMarker]:
        """The markers of `thread_ids` that exist (one `find`)."""
        if not thread_ids:
            return {}
        with storage_errors(f"find on {TURNS}"):
            docs = await self.collection.find({"_id": {"$in": list(dict.fromkeys(thread_ids))}}).to_list()
        return {str(doc["_id"]): marker_from_doc(doc) for doc in docs}

    async def mark(self, thread_id: str, request_id: str, *, resource_id: str | None = None) -> None:
        """Record `request_id` as the thread's pending turn; concurrent marks share one bulk write. The
        thread's `resource_id` is kept too, so forgetting the resource finds the marker of a thread that was
        never saved (no `mastra_threads` row to find it through)."""
        now = datetime.now(UTC)
        changes: dict[str, Any] = {"pending": request_id, "enrichedAt": now}
        if resource_id is not None:
            changes["resourceId"] = resource_id
        op: Statement = {"q": {"_id": thread_id}, "u": {"$set": changes}, "upsert": True}
        await self._marks.submit(op)

    async def release(self, thread_id: str, request_id: str) -> None:
        """Clear the thread's pending turn when it is still `request_id`: its enriched request was never sent
        (a dead letter at send time), so no answer will come. A newer pending turn is left as it is."""
        with storage_errors(f"update_one on {TURNS}"):
            await self.collection.update_one(
                {"_id": thread_id, "pending": request_id}, {"$set": {"pending": None, "enrichedAt": None}}
            )

    async def wait_answered(
        self, thread_id: str, awaited: str, timeout_s: float, stop: asyncio.Event | None = None
    ) -> TurnMarker | None:
        """Wait until `awaited` is no longer the thread's unanswered pending turn; the marker then, or None
        after `timeout_s`. Raises `WaitInterruptedError` when `stop` is set first."""
        future: asyncio.Future[TurnMarker | None] = asyncio.get_running_loop().create_future()
        entry = (awaited, future)
        self._waiters.setdefault(thread_id, []).append(entry)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="turn-markers-poll")
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waits: set[asyncio.Future[Any]] = {future} if stopper is None else {future, stopper}
            await asyncio.wait(waits, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED)
            if future.done():
                return future.result()  # raises the poller's storage error, if it failed
            if stop is not None and stop.is_set():
                raise WaitInterruptedError(f"stopping while thread {thread_id!r} waited for its turn")
            return None
        finally:
            if stopper is not None:
                stopper.cancel()
            entries = self._waiters.get(thread_id, [])
            if entry in entries:
                entries.remove(entry)
            if not entries:
                self._waiters.pop(thread_id, None)

    async def _poll(self) -> None:
        """While anyone waits: one `find` for every thread waited on, then wake the answered ones."""
        while self._waiters:
            await asyncio.sleep(self._poll_s)
            threads = list(self._waiters)
            try:
                markers = await self.get_many(threads)
            except Exception as exc:  # noqa: BLE001 -- handed to every waiter, who decides
                for entries in self._waiters.values():
                    for _, future in entries:
                        if not future.done():
                            future.set_exception(exc)
                continue
            for thread in threads:
                marker = markers.get(thread)
                for awaited, future in self._waiters.get(thread, []):
                    if not future.done() and not still_waiting(marker, awaited):
                        future.set_result(marker)

    # --- persist side ---

    async def answered(
        self, turns: Mapping[str, Sequence[str]], *, existing_only: Set[str] = frozenset()
    ) -> None:
        """After the turns' messages are written: remember their request ids and clear the pending ones.

        The threads in `existing_only` (forgotten ones) only have a marker that is still there updated, never
        one created: forget removed it, and no request id of theirs is to be left behind.
        One pipeline update per thread where the server has them (half the cost of two plain updates on
        the local stack); a server refusing pipelines (FerretDB 1.x) gets the two-update form from then on.
        """
        if not turns:
            return
        now = datetime.now(UTC)
        prepared = {t: (list(dict.fromkeys(ids)), t not in existing_only) for t, ids in turns.items()}
        if self._pipelines:
            ops = [_answered_pipeline(t, ids, now, upsert) for t, (ids, upsert) in prepared.items()]
            try:
                await self._write_chunks(ops)
            except FatalStorageError:
                log.info("%s: the server refuses pipeline updates; using plain updates", TURNS)
                self._pipelines = False
            else:
                return
        plain = [op for t, (ids, upsert) in prepared.items() for op in _answered_plain(t, ids, now, upsert)]
        await self._write_chunks(plain)

    async def _write_chunks(self, ops: list[Statement]) -> None:
        for start in range(0, len(ops), _OPS_PER_COMMAND):
            await self._write(ops[start : start + _OPS_PER_COMMAND])

    async def _write(self, ops: list[Statement]) -> None:
        operation = f"bulk_write on {TURNS}"
        for attempt in (1, 2):
            with storage_errors(operation):
                try:
                    await update_statements(self.collection, ops, ordered=True)
                except BulkWriteError as exc:
                    codes = set(reply_codes(exc.details))
                    if attempt == 2 or not codes or not codes <= _DUPLICATE_KEY:
                        raise to_storage_error(exc, operation) from exc
                    # two writers upserted one new _id and this one lost: the same ops again converge
                    log.debug("retrying %s after a duplicate key on upsert", operation)
                    continue
            return


class _Coalesced:
    """Marks go out as bulk writes, one in flight at a time: those submitted on one turn of the event loop,
    or while a write is in flight, go together in the next. One in flight keeps a thread's marks written in
    the order made. A recall batch's marks reach it on one turn (the gate holds them until the batch is sent,
    `consumers.turn_gate.BatchGate.write_marks`): this grouping alone left ~460 bulks of 2-3 marks where
    there were ~630 for 3,000 requests (issue 33, counted in the bench), the hold made them 72."""

    def __init__(self, write: Callable[[list[Statement]], Awaitable[None]]) -> None:
        self._write = write
        self._ops: list[Statement] = []
        self._futures: list[asyncio.Future[None]] = []
        self._flush_task: asyncio.Task[None] | None = None
        self.flushes = 0  # bulk writes sent, for tests and the bench

    async def submit(self, op: Statement) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ops.append(op)
        self._futures.append(future)
        if self._flush_task is None:
            self._flush_task = asyncio.create_task(self._flush(), name="turn-markers-write")
        await future

    async def _flush(self) -> None:
        futures: list[asyncio.Future[None]] = []
        try:
            while self._ops:
                await asyncio.sleep(0)  # let the other lanes of this turn of the loop add their marks
                ops, futures = self._ops, self._futures
                self._ops, self._futures = [], []
                self.flushes += 1
                try:
                    await self._write(ops)
                except Exception as exc:  # noqa: BLE001 -- every submitter gets the same error
                    _settle(futures, exc)
                else:
                    _settle(futures, None)
        finally:
            self._flush_task = None
            # cancelled (the process stops): the marks in flight and those waiting are never confirmed
            for future in (*futures, *self._futures):
                future.cancel()
            self._ops, self._futures = [], []


def _settle(futures: Sequence[asyncio.Future[None]], error: Exception | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
