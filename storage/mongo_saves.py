"""The storage's saves: `save_many` (and `save_messages`), ownership read, planned, then three bulk upserts.

`save_messages` / `save_many`: one `find` on the threads and one on the message ids (ownership), issued
concurrently (or none: the persist batch reads them with its load, `read_with_copies`); one unordered
`bulk_write` creating the new threads (only when the batch has any), then one of message upserts and one
touching the existing threads, issued together (one round trip). The returned threads are computed, not
read back. The documents' mapping is `storage.documents`, the plan `storage.save_plan`, the bulk writes
`storage.mongo_upserts`.

A save uses no transaction (it must work on a standalone server, which has none), so it is not atomic across
the two collections: a new thread is created (owner and all) first, then the messages are written and the
existing threads touched, concurrently (why that is safe: at the write, in `save_many`); every write is an
idempotent upsert, so a retried save converges. A write MongoDB refuses for one document refuses the turns
writing it (`DocumentRefusedError`); the rest of the unordered bulk is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from message_history.errors import DocumentRefusedError, InvalidInputError, UnreadableRowError
from schemas.messages import Message
from storage.documents import MESSAGES, message_from_doc
from storage.errors import storage_errors
from storage.mongo_threads import MongoThreads
from storage.mongo_upserts import RefusedDocumentsError
from storage.protocol import SaveTurn, Thread
from storage.raw_rows import decode_row, projected
from storage.recalled_rows import MESSAGE_PROJECTION
from storage.save_plan import SavePlan, SaveReads, _check_turns, plan_saves
from storage.unreadable import skip

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

    async def read_with_copies(
        self, thread_ids: Collection[str], message_ids: Collection[str]
    ) -> tuple[SaveReads, list[Message]]:
        """`read_for_saves`, and the stored copies of `message_ids` in `thread_ids` (`get_messages` with
        `thread_ids`), with one `find` on the messages for both (`_homes_and_copies`) beside the threads'."""
        threads = frozenset(thread_ids)
        ids = frozenset(message_ids)
        (state, keys), (homes, copies) = await asyncio.gather(
            self._get_threads(threads), self._homes_and_copies(ids, threads)
        )
        return SaveReads(threads, state, keys, ids, homes), copies

    async def save_many(
        self, turns: Sequence[SaveTurn], *, reads: SaveReads | None = None
    ) -> list[Thread | InvalidInputError]:
        """`save_messages` for each turn, in order: one read, then the batch's new threads, then its messages
        and its existing threads together, each with one unordered bulk write (no write when there is
        nothing to write): two round trips after the read when the batch creates a thread, else one.

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
        touched = {
            t: w for t, w in plan.threads.items() if t not in created.ours and t not in created.refused
        }
        messages, threads = list(plan.messages), list(touched)
        # The messages' bulk and the existing threads' (`updatedAt` moved forward) in one round trip, issued
        # together (issue 33), not one after the other. Safe because neither write depends on the other's
        # outcome, and what a reader can see in between was already possible: (1) `updatedAt` is computed from
        # the turns' message times by the plan (never read back) and only moves forward (`$max`), so the
        # thread ends the same whichever lands first, and `save_many`'s results are the plan's; (2) a thread
        # this batch creates is still created, owner and all, before any message is written into it (above),
        # and only existing threads are touched here, whose owner the plan already checked; (3) a refused
        # message does not stop its thread's touch, as before (a turn that ends as a dead letter may leave its
        # thread's `updatedAt` moved, as a refused message's turn did); (4) a crash or an outage between or
        # during the two leaves one of them written: the batch's offsets are not committed (`save_many`
        # raises, or the process is gone), so the batch is written again and both idempotent upserts converge,
        # as after a crash between the two sequential writes; we wait for both before raising, so no write of
        # a failed attempt is still running when the batch is retried. The only new in-between state, a thread
        # touched a millisecond before its new messages are readable, is within what the contract allows (no
        # transaction spans the two collections: an effectively-once end state, not an atomic one), and
        # per-thread order is kept: the thread's next batch starts after both writes are acknowledged.
        outcomes = await asyncio.gather(
            self._record_bulk_write(
                self.messages,
                lambda by_id_field: [w.op(by_id_field=by_id_field) for w in plan.messages.values()],
                "save messages",
            )
            if messages
            else _nothing(),
            self._record_bulk_write(
                self.threads,
                lambda by_id_field: [w.op(t, by_id_field=by_id_field) for t, w in touched.items()],
                "update threads",
            )
            if threads
            else _nothing(),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        message_refusals, thread_refusals = cast("tuple[dict[int, str], dict[int, str]]", tuple(outcomes))
        refused.update((messages[i], why) for i, why in message_refusals.items())
        refused.update((threads[i], why) for i, why in thread_refusals.items())
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

    async def _homes_and_copies(
        self, message_ids: Collection[str], thread_ids: Collection[str]
    ) -> tuple[dict[str, str | None], list[Message]]:
        """`message_homes(message_ids)` and `get_messages(message_ids, thread_ids=thread_ids)` from one `find`
        by id (issue 33: one command on `mastra_messages` in a batch's load, not two).

        The reply holds every stored row among the ids, whatever its thread: of a row in another thread only
        its `id` and `thread_id` are used (its home, as `message_homes` reads it, from those two fields
        alone when the row is one the codec refuses), so no answer depends on another thread's content and
        such a row is not noted as unreadable; a row in one of `thread_ids` (as the server's filter
        `thread_id: {$in: thread_ids}` would match it) is a copy, decoded and built as `get_messages` does,
        an unreadable one skipped (`storage.unreadable.skip`). In the common case (a turn's ids are new) the
        reply is empty."""
        ids = list(dict.fromkeys(message_ids))
        if not ids:
            return {}, []
        own = frozenset(thread_ids)
        query: dict[str, Any] = {"id": ids[0]} if len(ids) == 1 else {"id": {"$in": ids}}
        with storage_errors("save messages"):
            raws = await self.raw_messages.find(query, MESSAGE_PROJECTION, batch_size=len(ids) + 1).to_list()
        homes: dict[str, str | None] = {}
        copies: list[Message] = []
        for raw in raws:
            refused: UnreadableRowError | None = None
            try:
                doc = decode_row(raw.raw, MESSAGES)
            except UnreadableRowError as exc:
                refused = exc
                doc = _home_fields(raw.raw, exc)
            ident, thread = doc.get("id"), doc.get("thread_id")
            if isinstance(ident, str):
                homes[ident] = thread if isinstance(thread, str) or thread is None else repr(thread)
            if not _matches(thread, own):
                continue
            if refused is None:
                try:
                    copies.append(message_from_doc(doc))
                    continue
                except UnreadableRowError as exc:
                    refused = exc
            skip(refused, None)
        return homes, copies

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


async def _nothing() -> dict[int, str]:
    """No bulk write to make: no refusal."""
    return {}


_HOME_FIELDS: Final = frozenset({b"id", b"thread_id"})


def _home_fields(raw: bytes | memoryview, refused: UnreadableRowError) -> dict[str, Any]:
    """The `id` and `thread_id` of a row the codec refused, as `message_homes`' projection of those two
    fields reads them (decoded alone, so a refusal for another field does not hide them); as far as a
    lenient decoding reads them when even they are refused."""
    fields = projected(raw, _HOME_FIELDS)
    if fields is not None:
        try:
            return decode_row(fields, MESSAGES)
        except UnreadableRowError as exc:
            refused = exc
    return {"id": refused.row_id, "thread_id": refused.thread_id}


def _matches(thread: object, thread_ids: frozenset[str]) -> bool:
    """Whether a row's `thread_id` matches `{thread_id: {$in: thread_ids}}` as the server matches it (an array
    matches by any of its elements)."""
    if isinstance(thread, str):
        return thread in thread_ids
    if isinstance(thread, list):
        return any(isinstance(t, str) and t in thread_ids for t in thread)
    return False


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
