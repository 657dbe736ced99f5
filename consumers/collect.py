"""The persist path's batch reads and its write-only batch buffer (issue 25).

`load_batch` reads what a batch's read plan (`core.persist_plan.BatchNeeds`) says, in one round trip of
concurrent queries: the threads, the stored copies of the ids the turns may save (in their own threads
only), the newest row of the threads whose turns may continue it, and, on MongoDB, the homes of those ids
(where each is stored, for the ownership check of the write; with the copies, from one find), so the write
reads nothing again.

`PersistBuffer` takes each turn's write (or its skip) in batch order, answers the rules' reads from what was
loaded plus what earlier turns of the batch write (read-your-writes: the second turn of a thread sees the
thread and rows the first one writes), and is flushed once with one `save_many`. Its state is explicit:
collecting -> flushing -> done | failed. Every turn's result (the thread as written, or the write's
ownership refusal) is final when `flush` returns. A read the plan did not foresee is made, counted
(`message_history_plan_misses_total{path="persist"}`) and logged at INFO.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar, Protocol, runtime_checkable

from consumers.write_buffer import WriteBuffer
from message_history import metrics
from message_history.core.persist_plan import BatchNeeds, NeedsRead
from message_history.core.rules import check_owner
from message_history.errors import InvalidInputError
from schemas.messages import Message
from storage import unreadable
from storage.protocol import BatchHistoryStorage, RecallQuery, SaveTurn, Thread
from storage.save_plan import SaveReads

log = logging.getLogger(__name__)

PATH = "persist"


@runtime_checkable
class ReadsForSaves(Protocol):
    """A storage whose `save_many` can take its reads from the batch's load (`MongoHistoryStorage`).

    A capability, not part of `BatchHistoryStorage`: `SaveReads` is the document-level plan of the Mongo
    write (`storage.save_plan`); `SequentialBatches` saves through single `save_messages` and has no use
    for it. Decided once when the service is wired (`message_history.app.capabilities`) and passed in
    (`PersistHandler(save_reads=...)`); without it the batch's writes read for themselves (same result,
    more round trips)."""

    async def read_for_saves(
        self, thread_ids: Collection[str], message_ids: Collection[str]
    ) -> SaveReads: ...

    async def read_with_copies(
        self, thread_ids: Collection[str], message_ids: Collection[str]
    ) -> tuple[SaveReads, list[Message]]: ...

    async def save_many(
        self, turns: Sequence[SaveTurn], *, reads: SaveReads | None = None
    ) -> list[Thread | InvalidInputError]: ...


@dataclass(frozen=True, slots=True)
class Loaded:
    """A batch's reads: `threads` (stored, by id), `copies` by (thread, id), the ids `looked_up`, the
    `latest` row of the planned threads (None: the thread has none), and `save_reads` for the write."""

    threads: dict[str, Thread]
    copies: dict[tuple[str, str], Message]
    looked_up: frozenset[str]
    latest: dict[str, Message | None]
    save_reads: SaveReads | None = None

    def copy(self, thread_id: str, message_id: str) -> Message | None:
        """The stored copy of `message_id` in `thread_id`, if it was loaded and exists."""
        return self.copies.get((thread_id, message_id))


async def load_batch(
    storage: BatchHistoryStorage, needs: BatchNeeds, saves: ReadsForSaves | None = None
) -> Loaded:
    """Read `needs` with concurrent queries (one round trip): threads, stored copies, newest rows; with
    `saves` (the same storage's), the threads and the copies come with the write's reads
    (`Loaded.save_reads`), the copies and the homes from one find."""
    lookup = list(needs.lookup_ids)
    newest_of = list(needs.latest_of)

    async def threads() -> dict[str, Thread]:
        return await storage.get_threads(list(needs.thread_ids)) if needs.thread_ids else {}

    async def copies() -> list[Message]:
        if not lookup:
            return []
        return await storage.get_messages(lookup, thread_ids=needs.thread_ids)

    async def latest() -> dict[str, list[Message]]:
        if not newest_of:
            return {}
        return await storage.list_messages_many([RecallQuery(t, None, 1) for t in newest_of])

    save_reads: SaveReads | None = None
    if saves is not None:
        # the write's reads and the stored copies: one find on the messages for both (their homes and,
        # in the turns' own threads, their rows), beside the threads' and the newest rows'
        (save_reads, rows), newest = await asyncio.gather(
            saves.read_with_copies(needs.thread_ids, needs.lookup_ids), latest()
        )
        stored = dict(save_reads.threads)
    else:
        stored, rows, newest = await asyncio.gather(threads(), copies(), latest())
    latest_rows = {t: next(iter(newest.get(t, [])), None) for t in newest_of}
    if save_reads is not None:
        save_reads = save_reads.known_homes([m for m in latest_rows.values() if m is not None])
    return Loaded(
        threads=stored,
        copies={(m.threadId, m.id): m for m in rows if m.id and m.threadId},
        looked_up=frozenset(lookup),
        latest=latest_rows,
        save_reads=save_reads,
    )


@dataclass(slots=True)
class Slot:
    """One turn's place in the buffer: its write (None for a turn that writes nothing) and, once the buffer
    is done, its `result`: the thread as written (for a skipped turn: as the batch leaves it, None when it
    does not exist), or the write's ownership refusal."""

    order: int
    thread_id: str
    turn: SaveTurn | None
    result: Thread | InvalidInputError | None = None


@dataclass(slots=True)
class PersistBuffer(WriteBuffer):
    """A batch's writes, collected in batch order per thread and written with one `save_many` (a
    `WriteBuffer`: collecting -> flushing -> done | failed)."""

    what: ClassVar[str] = "persist"
    storage: BatchHistoryStorage
    loaded: Loaded
    # the storage's write that takes the batch's reads (`ReadsForSaves`); None: `save_many` reads itself
    save_reads: ReadsForSaves | None = None
    slots: list[Slot] = field(default_factory=list)
    # what this batch writes, overlaid on the loaded reads: created threads, rows by (thread, id), newest rows
    _threads: dict[str, Thread] = field(default_factory=dict)
    _rows: dict[tuple[str, str], Message] = field(default_factory=dict)
    _newest: dict[str, Message] = field(default_factory=dict)
    # read after the load (plan misses): copies by (thread, id) (None: none stored), newest rows
    _read: dict[tuple[str, str], Message | None] = field(default_factory=dict)
    _read_latest: dict[str, Message | None] = field(default_factory=dict)

    # --- reads, from the load and the batch's own writes ----------------------------------------------

    def thread(self, thread_id: str) -> Thread | None:
        """The thread as the batch has it: created by an earlier turn, or stored."""
        return self._threads.get(thread_id) or self.loaded.threads.get(thread_id)

    def copies_now(self, thread_id: str, message_ids: Sequence[str]) -> list[Message] | None:
        """The copies of `message_ids` in `thread_id` (written by the batch, or stored) when the batch's reads
        hold them all; None when they need a `read` (a plan miss)."""
        if self._unplanned(thread_id, message_ids):
            return None
        return self._copies(thread_id, message_ids)

    def _unplanned(self, thread_id: str, message_ids: Sequence[str]) -> list[str]:
        return [
            i
            for i in message_ids
            if i not in self.loaded.looked_up
            and (thread_id, i) not in self._rows
            and (thread_id, i) not in self._read
        ]

    def _copies(self, thread_id: str, message_ids: Sequence[str]) -> list[Message]:
        """The copies; `UnreadableRowError` when the stored copy of one the batch has not written is a row
        no Mastra would read: the turn would write over a row it cannot merge with (and keep its unreadable
        `createdAt`), so it is refused, its dead letter naming the row."""
        ledger = unreadable.current()
        if ledger is not None:
            unwritten = [i for i in message_ids if (thread_id, i) not in self._rows]
            error = ledger.unreadable(thread_id, unwritten)
            if error is not None:
                raise error
        out: list[Message] = []
        for message_id in message_ids:
            key = (thread_id, message_id)
            row = self._rows.get(key) or self.loaded.copy(thread_id, message_id) or self._read.get(key)
            if row is not None:
                out.append(row)
        return out

    async def read(self, thread_id: str, need: NeedsRead) -> None:
        """Read what a turn's decision lacks (`core.persist_plan.NeedsRead`): a read the plan did not
        foresee, counted and logged; the batch's later decisions answer from it too."""
        unplanned = self._unplanned(thread_id, need.copies or ())
        if unplanned:
            _miss("stored copies", thread_id)
            rows = await self.storage.get_messages(unplanned, thread_ids=(thread_id,))
            found = {m.id: m for m in rows if m.id}
            for message_id in unplanned:
                self._read[(thread_id, message_id)] = found.get(message_id)
        if need.latest and not self.has_latest(thread_id):
            _miss("the newest row", thread_id)
            rows = await self.storage.list_messages(thread_id, resource_id=None, limit=1)
            self._read_latest[thread_id] = rows[0] if rows else None

    def has_latest(self, thread_id: str) -> bool:
        """Whether `latest_now` answers from the batch's reads (False: it needs a `read`, a plan miss)."""
        return thread_id in self.loaded.latest or thread_id in self._read_latest

    def latest_now(self, thread_id: str) -> Message | None:
        """The thread's newest row, the batch's writes included; only when `has_latest`."""
        if thread_id in self.loaded.latest:
            return self._latest(thread_id, self.loaded.latest[thread_id])
        return self._latest(thread_id, self._read_latest[thread_id])

    def _latest(self, thread_id: str, stored: Message | None) -> Message | None:
        written = self._newest.get(thread_id)
        if written is None or (stored is not None and not _newer(written, stored)):
            return stored
        return written

    # --- writes ---------------------------------------------------------------------------------------

    def write(self, order: int, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Slot:
        """Take a turn's write; refuses a thread owned by another resource (stored, or created in this
        batch) with `ThreadOwnershipError`, as the write itself would."""
        self._collecting()
        thread = self.thread(thread_id)
        check_owner(thread, thread_id, resource_id)
        if thread is None:
            # provisional: the batch's later turns of this thread must see it exists and whose it is
            now = datetime.now(UTC)
            self._threads[thread_id] = Thread(
                id=thread_id, resourceId=resource_id, createdAt=now, updatedAt=now
            )
        slot = Slot(
            order, thread_id, SaveTurn(thread_id=thread_id, resource_id=resource_id, messages=messages)
        )
        self.slots.append(slot)
        self._overlay(thread_id, messages)
        return slot

    def skip(self, order: int, thread_id: str) -> Slot:
        """Take a turn that writes nothing: its result is its thread as the batch leaves it."""
        self._collecting()
        slot = Slot(order, thread_id, None)
        self.slots.append(slot)
        return slot

    def _overlay(self, thread_id: str, messages: Sequence[Message]) -> None:
        """Later turns of the batch see this turn's rows as stored (first `createdAt` kept, as upserts do)."""
        for message in messages:
            if message.id is None:
                continue
            earlier = self._rows.get((thread_id, message.id)) or self.loaded.copy(thread_id, message.id)
            row = message
            if earlier is not None and earlier.createdAt is not None:
                row = message.model_copy(update={"createdAt": earlier.createdAt})
            self._rows[(thread_id, message.id)] = row
            newest = self._newest.get(thread_id)
            if newest is None or _newer(row, newest):
                self._newest[thread_id] = row

    # --- the flush ------------------------------------------------------------------------------------

    async def _write(self) -> None:
        """Write every taken turn with one `save_many` (in batch order, so that of two threads' turns
        carrying one id the later is the one refused); then every slot has its final result."""
        self.slots.sort(key=lambda s: s.order)  # threads run concurrently; one thread's turns come in order
        writes = [s for s in self.slots if s.turn is not None]
        results = await self._save([s.turn for s in writes if s.turn is not None])
        if len(results) != len(writes):
            raise RuntimeError(f"save_many returned {len(results)} results for {len(writes)} turns")
        for slot, result in zip(writes, results, strict=True):
            slot.result = result
        last: dict[str, Thread] = {}
        for slot in self.slots:
            if isinstance(slot.result, Thread):
                last[slot.thread_id] = slot.result
            elif slot.turn is None:
                slot.result = last.get(slot.thread_id) or self.loaded.threads.get(slot.thread_id)

    async def _save(self, turns: list[SaveTurn]) -> list[Thread | InvalidInputError]:
        if not turns:
            return []
        reads = self.loaded.save_reads
        if reads is not None and self.save_reads is not None:
            threads, ids = reads.missing(turns)
            if threads or ids:
                _miss(
                    f"{len(threads)} threads and {len(ids)} message homes for the write",
                    threads[:1] or ids[:1],
                )
            return await self.save_reads.save_many(turns, reads=reads)
        return await self.storage.save_many(turns)


def _miss(what: str, where: Iterable[str] | str) -> None:
    """A read the batch's plan did not foresee: counted and logged, then made."""
    metrics.PLAN_MISSES.labels(path=PATH).inc()
    log.info("persist plan miss: %s (%s) read after the batch's load", what, where)


def _newer(message: Message, than: Message) -> bool:
    if message.createdAt is None or than.createdAt is None:
        return False
    return (message.createdAt, message.id or "") > (than.createdAt, than.id or "")
