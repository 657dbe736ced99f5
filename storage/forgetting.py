"""Forgetting history in MongoDB: delete a thread or a whole resource, and keep a tombstone of it.

`message_history_forgotten` (beside Mastra's collections; Mastra never reads it) holds one document per
forgotten thread or resource:

    {_id: "thread:<id>" | "resource:<id>", kind: "thread" | "resource", threadId?, resourceId?, forgottenAt}

`forgottenAt` only moves forward (`$max`), so forgetting again extends the tombstone to what the second call
deleted. The persist path reads the tombstones of each batch (`tombstones`, one `find` by `_id`) and skips a
turn made before its thread or resource was forgotten: a replay of the responses topic, or a late
redelivery, does not write the history back.

Order, as Mastra's `deleteThread` (messages, then the thread): the tombstone first, so that the persist path
stops writing the thread from its next batch on, then the messages in chunks (find `chunk_size` `_id`s, delete
them, again until none is left: each step bounded, whatever the size of the history), then the threads'
busy-thread markers (`message_history_turns`: no request id of the thread is left behind; a request waiting
on one goes out with `history.complete: false`, as after its timeout), then the threads (last, as their ids
are what a second run finds again).
Every step is idempotent, so a forget interrupted part-way is completed by running it again.

Rows are read raw and decoded one by one (`storage.raw_rows.keys_of`): a row the codec refuses (invalid
UTF-8, a date out of range) is counted as unreadable and, read leniently, still deleted by its `_id`; it never
fails the forget. A row whose `_id` not even that finds again (invalid UTF-8 in the `_id` itself) is left,
counted: a chunk of which nothing was deleted ends the step rather than finding it again for ever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import pymongo
from bson.raw_bson import RawBSONDocument
from pymongo import IndexModel

from message_history.errors import ForgetRefusedError, ThreadOwnershipError
from schemas.commands import MAX_LISTED_IDS, ForgetOutcome
from schemas.messages import utc_now_ms
from storage.client import CODEC
from storage.documents import MESSAGES, THREADS
from storage.errors import storage_errors
from storage.observational import forget_observations
from storage.observational_forget import forget_thread_in_resource
from storage.protocol import Tombstones
from storage.raw_rows import RAW, keys_of
from storage.turns import TURNS

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

TOMBSTONES: Final = "message_history_forgotten"
DELETE_BATCH: Final = 1000  # `_id`s per deleteMany, as @mastra/mongodb's prune batches
FORGET_OPERATION_TIMEOUT_MS: Final = 60_000
"""The least bound of each operation of a forget (the CLI's and the commands path's), above the service's
`MONGODB_TIMEOUT_MS`: a chunk of deletes takes longer than a recall's read."""

Progress = Callable[[ForgetOutcome], None]
"""Told the outcome so far after each chunk of a forget (the counts grow as it goes)."""


class MongoForgetting:
    """Forget and tombstones on the service's database (the same one as `MongoHistoryStorage`)."""

    def __init__(
        self,
        db: AsyncDatabase[Any],
        *,
        chunk_size: int = DELETE_BATCH,
        operation_timeout_s: float | None = None,
    ) -> None:
        self.db = db
        self.chunk_size = chunk_size  # rows found and deleted per step of a forget
        self.operation_timeout_s = operation_timeout_s  # each of its operations' bound; None: the client's
        self.tombstones_collection: AsyncCollection[dict[str, Any]] = db.get_collection(
            TOMBSTONES, codec_options=CODEC
        )
        # raw replies: each row decoded alone (`_keys`), so one undecodable row fails no forget
        self.messages: AsyncCollection[RawBSONDocument] = db.get_collection(MESSAGES, codec_options=RAW)
        self.threads: AsyncCollection[RawBSONDocument] = db.get_collection(THREADS, codec_options=RAW)
        self.turns: AsyncCollection[RawBSONDocument] = db.get_collection(TURNS, codec_options=RAW)

    async def ensure_indexes(self) -> None:
        """The tombstones are read by `_id` only; a `resourceId` index lets operators list a user's. The
        markers' `resourceId` index serves a resource's forget (every mark writes the same value again, which
        changes no index entry)."""
        with storage_errors(f"createIndexes on {TOMBSTONES}"):
            await self.tombstones_collection.create_indexes([IndexModel([("resourceId", 1)])])
        with storage_errors(f"createIndexes on {TURNS}"):
            await self.turns.create_indexes([IndexModel([("resourceId", 1)])])

    # --- the persist path's guard ---

    async def tombstones(self, *, thread_ids: Sequence[str], resource_ids: Sequence[str]) -> Tombstones:
        """The tombstones among `thread_ids` and `resource_ids`, with one `find` by `_id`."""
        keys = [f"thread:{t}" for t in thread_ids] + [f"resource:{r}" for r in resource_ids]
        if not keys:
            return Tombstones()
        with storage_errors("find tombstones"):
            docs = await self.tombstones_collection.find(
                {"_id": {"$in": keys}}, {"kind": 1, "threadId": 1, "resourceId": 1, "forgottenAt": 1}
            ).to_list()
        found = Tombstones()
        for doc in docs:
            at = doc.get("forgottenAt")
            if not isinstance(at, datetime):
                continue
            at = at if at.tzinfo else at.replace(tzinfo=UTC)
            if doc.get("kind") == "thread" and isinstance(doc.get("threadId"), str):
                found.threads[doc["threadId"]] = at
            elif doc.get("kind") == "resource" and isinstance(doc.get("resourceId"), str):
                found.resources[doc["resourceId"]] = at
        return found

    # --- forgetting ---

    async def forget_thread(
        self,
        thread_id: str,
        *,
        resource_id: str | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> ForgetOutcome:
        """Delete the thread and its messages; with `resource_id`, only that resource's history.

        With `resource_id` (owner-scoped), nothing is deleted and `ThreadOwnershipError` raised when another
        resource owns the thread. A thread with no owner recorded (no `mastra_threads` row, or one without
        `resourceId`) is forgotten only when everything in it is that resource's: its messages (the delete
        is scoped to them too, so a message of another written meanwhile stays) and its busy marker; else
        `ForgetRefusedError`, nothing deleted. Messages go in chunks (`progress` after each).
        """
        with self._bounded("find the thread to forget"):
            found = await self.threads.find_one({"id": thread_id}, {"_id": 0, "resourceId": 1})
        # read leniently when refused: a `resourceId` so read is no one's, so the owner check refuses
        thread = keys_of(found, THREADS) if found is not None else None
        owner = (thread.get("resourceId") or None) if thread else None
        query: dict[str, Any] = {"thread_id": thread_id}
        marker: dict[str, Any] = {"_id": thread_id}
        if resource_id is not None and owner is not None and owner != resource_id:
            raise ThreadOwnershipError(thread_id, resource_id, str(owner))
        if resource_id is not None and owner is None:
            await self._check_unowned(thread_id, resource_id)
            query["resourceId"] = resource_id
            marker["resourceId"] = {"$in": [resource_id, None]}
        outcome = ForgetOutcome(
            "thread", thread_id, utc_now_ms(), dry_run, thread_ids=[thread_id] if found is not None else []
        )
        if dry_run:
            outcome.deleted_messages = await self._count(self.messages, query, outcome.message_ids)
            outcome.deleted_threads = len(outcome.thread_ids)
            return outcome
        await self._tombstone(
            f"thread:{thread_id}",
            outcome.forgotten_at,
            kind="thread",
            threadId=thread_id,
            resourceId=owner or resource_id,
        )
        await self._delete_chunks(self.messages, query, "forget messages", outcome, progress)
        with self._bounded("forget the thread's observations"):  # Observational Memory's rows
            await forget_observations(self.db, thread_id=thread_id)
            if owner or resource_id:  # its part of the resource's log (resource scope), its cursor read first
                await forget_thread_in_resource(self.db, thread_id, str(owner or resource_id))
        with self._bounded("forget the thread's markers"):
            await self.turns.delete_many(marker)
        with self._bounded("forget the thread"):
            result = await self.threads.delete_many({"id": thread_id})
        outcome.deleted_threads = result.deleted_count
        if progress is not None:
            progress(outcome)
        return outcome

    async def _check_unowned(self, thread_id: str, resource_id: str) -> None:
        """Refuse (`ForgetRefusedError`) an owner-scoped forget of a thread with no owner recorded when it
        holds a message that is not `resource_id`'s (another's, or one without a resource), or another
        resource's turn is pending on it (the recall path counts it that resource's: `foreign_pending`)."""
        with self._bounded("find other resources' messages in the thread to forget"):
            other = await self.messages.find_one(
                {"thread_id": thread_id, "resourceId": {"$ne": resource_id}}, {"_id": 1}
            )
            pending = await self.turns.find_one(
                {"_id": thread_id, "resourceId": {"$nin": [resource_id, None]}, "pending": {"$ne": None}},
                {"_id": 1},
            )
        if other is not None or pending is not None:
            raise ForgetRefusedError(thread_id, resource_id)

    async def forget_resource(
        self, resource_id: str, *, dry_run: bool = False, progress: Progress | None = None
    ) -> ForgetOutcome:
        """Delete every thread of `resource_id`, their messages, and any other message of it.

        In bounded chunks, each a few operations of `chunk_size` rows within the operation timeout, so a
        resource of any size is forgotten in steps that each finish (`progress` after each), never one
        operation that times out and is retried whole for ever. The tombstone first; then its threads a
        chunk at a time (their messages, their markers, then the thread rows: a run interrupted anywhere
        finds the rest again, so running it again completes it); then its messages in other threads, then the
        markers of its threads never saved. Counts are of this run; id lists keep the first `MAX_LISTED_IDS`.
        """
        outcome = ForgetOutcome("resource", resource_id, utc_now_ms(), dry_run)
        if dry_run:
            return await self._count_resource(resource_id, outcome)
        await self._tombstone(
            f"resource:{resource_id}", outcome.forgotten_at, kind="resource", resourceId=resource_id
        )
        while True:
            with self._bounded("find the resource's threads"):
                found = (
                    await self.threads.find({"resourceId": resource_id}, {"_id": 1, "id": 1})
                    .limit(self.chunk_size)
                    .to_list()
                )
            threads = _keys(found, THREADS)
            if not threads:
                break
            ids = list(dict.fromkeys(str(doc.get("id")) for doc in threads))
            _listed(outcome.thread_ids, ids)
            await self._delete_chunks(
                self.messages, {"thread_id": {"$in": ids}}, "forget messages", outcome, progress
            )
            # the markers before the threads: a forget interrupted after the threads finds no thread ids again
            with self._bounded("forget the threads' markers"):
                await delete_by_keys(self.turns, ids, "forget the threads' markers")
            with self._bounded("forget threads"):
                outcome.deleted_threads += await delete_by_keys(
                    self.threads, [doc["_id"] for doc in threads], "forget threads"
                )
            if progress is not None:
                progress(outcome)
            if len(found) < self.chunk_size:
                break
        await self._delete_chunks(
            self.messages, {"resourceId": resource_id}, "forget messages", outcome, progress
        )
        # the markers of its threads never saved (no thread row to find them through)
        await self._delete_chunks(self.turns, {"resourceId": resource_id}, "forget the resource's markers")
        with self._bounded("forget the resource's observations"):  # Observational Memory's rows
            await forget_observations(self.db, resource_id=resource_id)
        return outcome

    async def _count_resource(self, resource_id: str, outcome: ForgetOutcome) -> ForgetOutcome:
        """A dry run of `forget_resource`: counts (and the first ids) of what it would delete, read in the
        same chunks (a page of threads at a time, by `_id`)."""
        after: Any = None
        while True:
            query: dict[str, Any] = {"resourceId": resource_id}
            if after is not None:
                query["_id"] = {"$gt": after}
            with self._bounded("find the resource's threads"):
                found = (
                    await self.threads.find(query, {"_id": 1, "id": 1})
                    .sort("_id", 1)
                    .limit(self.chunk_size)
                    .to_list()
                )
            threads = _keys(found, THREADS)
            if not threads:
                break
            after = threads[-1]["_id"]
            ids = list(dict.fromkeys(str(doc.get("id")) for doc in threads))
            _listed(outcome.thread_ids, ids)
            outcome.deleted_threads += len(threads)
            outcome.deleted_messages += await self._count(
                self.messages,
                {"thread_id": {"$in": ids}, "resourceId": {"$ne": resource_id}},
                outcome.message_ids,
            )
        outcome.deleted_messages += await self._count(
            self.messages, {"resourceId": resource_id}, outcome.message_ids
        )
        return outcome

    async def _count(
        self, collection: AsyncCollection[RawBSONDocument], query: dict[str, Any], listed: list[str]
    ) -> int:
        """How many documents match `query`; the first ids go into `listed` (up to `MAX_LISTED_IDS` + 1)."""
        with self._bounded("count what to forget"):
            count = await collection.count_documents(query)
            room = MAX_LISTED_IDS + 1 - len(listed)
            if room > 0 and count:
                found = await collection.find(query, {"_id": 0, "id": 1}).limit(room).to_list()
                _listed(listed, [str(doc.get("id")) for doc in _keys(found, collection.name, need_id=False)])
        return count

    async def _delete_chunks(
        self,
        collection: AsyncCollection[RawBSONDocument],
        query: dict[str, Any],
        what: str,
        outcome: ForgetOutcome | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Delete what matches `query`, `chunk_size` documents at a time (find their `_id`s, delete those),
        until none is left; with `outcome`, counted as messages (and their first ids listed), `progress`
        told after each chunk. A document written meanwhile that matches is deleted too."""
        deleted = 0
        while True:
            with self._bounded(what):
                found = await collection.find(query, {"_id": 1, "id": 1}).limit(self.chunk_size).to_list()
                docs = _keys(found, collection.name)
                if not docs:  # none left, or none whose `_id` reads: found again for ever otherwise
                    return deleted
                result = await collection.delete_many({"_id": {"$in": [doc["_id"] for doc in docs]}})
            deleted += result.deleted_count
            if outcome is not None:
                outcome.deleted_messages += result.deleted_count
                _listed(outcome.message_ids, [str(doc.get("id")) for doc in docs])
                if progress is not None:
                    progress(outcome)
            if len(found) < self.chunk_size or not result.deleted_count:
                return deleted  # all found, or only rows whose `_id` (read leniently) finds nothing

    @contextlib.contextmanager
    def _bounded(self, what: str) -> Iterator[None]:
        """Storage errors mapped (`storage_errors`), each operation under `operation_timeout_s` when set."""
        with contextlib.ExitStack() as stack:
            if self.operation_timeout_s is not None:
                stack.enter_context(pymongo.timeout(self.operation_timeout_s))
            with storage_errors(what):
                yield

    async def _tombstone(self, key: str, at: datetime, **fields: Any) -> None:
        values = {k: v for k, v in fields.items() if v is not None}
        with self._bounded("write the tombstone"):
            await self.tombstones_collection.update_one(
                {"_id": key}, {"$set": values, "$max": {"forgottenAt": at}}, upsert=True
            )


def _keys(found: Sequence[RawBSONDocument], collection: str, *, need_id: bool = True) -> list[dict[str, Any]]:
    """The found raw rows decoded one by one (`keys_of`: an undecodable one counted, read leniently); with
    `need_id`, only those whose `_id` was read (what a delete by `_id` needs)."""
    rows = [row for row in (keys_of(doc, collection) for doc in found) if row is not None]
    return [row for row in rows if "_id" in row] if need_id else rows


def _listed(listed: list[str], ids: Sequence[str]) -> None:
    """`ids` added to `listed` up to `MAX_LISTED_IDS` + 1 (one more says the list was cut): bounded memory."""
    room = MAX_LISTED_IDS + 1 - len(listed)
    if room > 0:
        listed.extend(ids[:room])


async def delete_by_keys(collection: AsyncCollection[Any], keys: Sequence[Any], what: str) -> int:
    """Delete the documents with these `_id`s, `DELETE_BATCH` per `deleteMany`; how many there were."""
    deleted = 0
    for start in range(0, len(keys), DELETE_BATCH):
        with storage_errors(what):
            result = await collection.delete_many({"_id": {"$in": list(keys[start : start + DELETE_BATCH])}})
        deleted += result.deleted_count
    return deleted
