"""The persist path's storage stand-in: every turn of a batch recorded, then written with one `save_many`.

`CollectingHistory` answers `get_thread` from one `get_threads` prefetch plus what earlier turns of the
same batch created, records each `save_messages` as a `SaveTurn` instead of writing, and then `flush()`
writes every turn with one `save_many`. Turns of one thread must be run in batch order (the lanes do), so
that the second turn of a thread sees the thread the first one creates, and a turn from another resource
is refused as the storage would refuse it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from message_history.errors import ThreadOwnershipError
from schemas.messages import Message
from storage.protocol import BatchHistoryStorage, MessageLookup, RecallQuery, SaveTurn, Thread


@dataclass(slots=True)
class CollectedTurn:
    """A `save_messages` call recorded for the batch write; `result` is set by `flush()`."""

    turn: SaveTurn
    result: Thread | ThreadOwnershipError | None = None
    order: int = 0  # the turn's place in the batch: `flush` writes in batch order, not in completion order


class CollectingHistory:
    """Records a batch's saves and writes them with one `save_many`; reads come from one prefetch."""

    def __init__(
        self, storage: BatchHistoryStorage, threads: dict[str, Thread], known: Iterable[str]
    ) -> None:
        self._storage = storage
        self._threads = threads  # stored threads, then overlaid by this batch's saves
        self._known = set(known)
        self.turns: list[CollectedTurn] = []
        self.misses = 0
        # For the tool-state merge: stored copies by (thread, id) and each thread's newest row, overlaid by
        # the saves. Keyed by thread: a turn sees only its own thread's copies (never another tenant's).
        self._by_id: dict[tuple[str, str], Message] = {}
        self._looked_up: set[str] = set()
        self._latest: dict[str, Message | None] = {}

    @classmethod
    async def load(
        cls,
        storage: BatchHistoryStorage,
        thread_ids: Iterable[str],
        message_ids: Iterable[str] = (),
        latest_of: Iterable[str] = (),
    ) -> CollectingHistory:
        """Prefetch the threads and, for the tool-state merge, the stored copies of `message_ids` in those
        threads and the newest row of the `latest_of` threads (turns without user input): concurrent
        queries, one round trip."""
        ids = list(dict.fromkeys(thread_ids))
        merges = isinstance(storage, MessageLookup)  # the tool-state merge needs the stored copies by id
        lookup = list(dict.fromkeys(message_ids)) if merges else []
        newest_of = list(dict.fromkeys(latest_of)) if merges else []  # even when no id is to be looked up

        async def copies() -> list[Message]:
            if not lookup or not isinstance(storage, MessageLookup):
                return []
            return await storage.get_messages(lookup, thread_ids=ids)

        async def latest() -> dict[str, list[Message]]:
            if not newest_of:
                return {}
            return await storage.list_messages_many([RecallQuery(t, None, 1) for t in newest_of])

        threads, rows, newest = await asyncio.gather(
            storage.get_threads(ids) if ids else _no_threads(), copies(), latest()
        )
        batch = cls(storage, dict(threads), ids)
        batch._by_id = {(m.threadId, m.id): m for m in rows if m.id and m.threadId}
        batch._looked_up = set(lookup)
        batch._latest = {t: next(iter(newest.get(t, [])), None) for t in newest_of}
        return batch

    def stored(self, thread_id: str, message_id: str) -> Message | None:
        """The prefetched (or batch-saved) copy of `message_id` in `thread_id`, if any."""
        return self._by_id.get((thread_id, message_id))

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        cached = thread_ids is not None and set(thread_ids) <= self._known
        if cached and thread_ids is not None and set(message_ids) <= self._looked_up:
            return [m for t in thread_ids for i in message_ids if (m := self._by_id.get((t, i))) is not None]
        if not isinstance(self._storage, MessageLookup):
            return []  # a storage without lookup: no stored copies known, turns are saved as they come
        self.misses += 1
        return await self._storage.get_messages(message_ids, thread_ids=thread_ids)

    async def latest(self, thread_id: str) -> list[Message]:
        if thread_id in self._latest:
            row = self._latest[thread_id]
            return [row] if row is not None else []
        self.misses += 1
        return await self._storage.list_messages(thread_id, resource_id=None, limit=1)

    def for_turn(self, order: int = 0) -> TurnStorage:
        """A `HistoryStorage` for one turn (the `order`-th of the batch): its save (at most one) is recorded
        as that turn's."""
        return TurnStorage(self, order)

    async def get_thread(self, thread_id: str) -> Thread | None:
        if thread_id in self._known:
            return self._threads.get(thread_id)
        self.misses += 1
        thread = await self._storage.get_thread(thread_id)
        self._known.add(thread_id)
        if thread is not None:
            self._threads[thread_id] = thread
        return thread

    def record(
        self, *, thread_id: str, resource_id: str, messages: Sequence[Message], order: int = 0
    ) -> CollectedTurn:
        """Record a save; refuses a thread owned by another resource (stored, or created in this batch)."""
        thread = self._threads.get(thread_id)
        if thread is not None and thread.resourceId and thread.resourceId != resource_id:
            raise ThreadOwnershipError(thread_id, resource_id, thread.resourceId)
        if thread is None:
            # provisional: the batch's later turns of this thread must see it exists and whose it is
            now = datetime.now(UTC)
            self._threads[thread_id] = Thread(
                id=thread_id, resourceId=resource_id, createdAt=now, updatedAt=now
            )
        collected = CollectedTurn(
            SaveTurn(thread_id=thread_id, resource_id=resource_id, messages=messages), order=order
        )
        self.turns.append(collected)
        self._overlay(thread_id, messages)
        return collected

    def _overlay(self, thread_id: str, messages: Sequence[Message]) -> None:
        """Later turns of the batch see this turn's rows as stored (first `createdAt` kept, as upserts do)."""
        for message in messages:
            if message.id is None:
                continue
            earlier = self._by_id.get((thread_id, message.id))
            row = message
            if earlier is not None and earlier.createdAt is not None:
                row = message.model_copy(update={"createdAt": earlier.createdAt})
            self._by_id[(thread_id, message.id)] = row
            self._looked_up.add(message.id)
            if thread_id in self._latest:
                current = self._latest[thread_id]
                if current is None or _newer(row, current):
                    self._latest[thread_id] = row

    async def flush(self) -> None:
        """Write every recorded turn with one `save_many`; each turn gets its result."""
        if not self.turns:
            return
        # Batch order, so that of two threads' turns carrying one message id the later record is the one
        # refused (threads run concurrently; one thread's turns are recorded in order; the sort is stable).
        self.turns.sort(key=lambda c: c.order)
        results = await self._storage.save_many([c.turn for c in self.turns])
        if len(results) != len(self.turns):
            raise RuntimeError(f"save_many returned {len(results)} results for {len(self.turns)} turns")
        for collected, result in zip(self.turns, results, strict=True):
            collected.result = result


class TurnStorage:
    """One turn's view of a `CollectingHistory`: reads are shared, the save is remembered as `saved`."""

    def __init__(self, batch: CollectingHistory, order: int = 0) -> None:
        self._batch = batch
        self._order = order
        self.saved: CollectedTurn | None = None

    async def get_thread(self, thread_id: str) -> Thread | None:
        return await self._batch.get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        if limit != 1 or resource_id is not None:
            raise RuntimeError("the persist path reads only a thread's newest row")  # a programming error
        return await self._batch.latest(thread_id)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        return await self._batch.get_messages(message_ids, thread_ids=thread_ids)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        self.saved = self._batch.record(
            thread_id=thread_id, resource_id=resource_id, messages=messages, order=self._order
        )
        thread = await self._batch.get_thread(thread_id)
        assert thread is not None  # just recorded
        return thread


def _newer(message: Message, than: Message) -> bool:
    if message.createdAt is None or than.createdAt is None:
        return False
    return (message.createdAt, message.id or "") > (than.createdAt, than.id or "")


async def _no_threads() -> dict[str, Thread]:
    return {}
