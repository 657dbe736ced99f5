"""The storage's saves: `save_many` (and `save_messages`), ownership read, planned, then three bulk upserts.

`save_messages` / `save_many`: one `find` on the threads and one on the message ids (ownership), issued
concurrently; one unordered `bulk_write` creating the new threads (only when the batch has any), one of
message upserts, one touching the existing threads. The returned threads are computed, not read back. The
documents' mapping is `storage.documents`, the plan `storage.save_plan`, the bulk writes
`storage.mongo_upserts`.

A save uses no transaction (it must work on a standalone server, which has none), so it is not atomic across
the two collections: a new thread is created (owner and all) first, then the messages are written, then the
existing threads touched; every write is an idempotent upsert, so a retried save converges. A write MongoDB
refuses for one document refuses the turns writing it (`DocumentRefusedError`); the rest of the unordered
bulk is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from message_history.errors import DocumentRefusedError, InvalidInputError, UnreadableRowError
from storage.documents import MESSAGES
from storage.errors import storage_errors
from storage.mongo_threads import MongoThreads
from storage.mongo_upserts import RefusedDocumentsError
from storage.protocol import SaveTurn, Thread
from storage.raw_rows import decode_row
from storage.save_plan import SavePlan, SaveReads, _check_turns, plan_saves

__all__ = ["MongoSaves"]

log = logging.getLogger("storage.mongodb")  # the storage's logger, as before its jobs had modules


class MongoSaves(MongoThreads):
    """Turns saved: their threads created or touched, their messages upserted, ownership checked first."""

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
        except RefusedDocumentsError as exc:  # the others are created (an unordered bulk)
            inserted = exc.upserted
            refused = {thread_ids[i]: why for i, why in exc.refused.items() if 0 <= i < len(thread_ids)}
        ours = {t: plan.state[t] for i, t in enumerate(thread_ids) if i in inserted}
        return _Created(ours, [t for t in thread_ids if t not in ours and t not in refused], refused)


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
