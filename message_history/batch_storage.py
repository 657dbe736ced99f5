"""Storage stand-ins that let `MessageHistory` run once per event while MongoDB sees one round trip per batch.

The processor is the one implementation of the rules, and it talks to a `HistoryStorage` one event at a time.
The Kafka paths hand it these wrappers instead of the real storage:

* `PrefetchedHistory` (recall path): loaded with one `get_threads` and one `list_messages_many` for the whole
  batch (issued concurrently), it answers `get_thread` / `list_messages` from memory. It is a cache, not a
  copy of the rules: a query it was not loaded for (another resource, a larger page) goes to the storage.
* `CollectingHistory` (persist path): answers `get_thread` from one `get_threads` prefetch plus what earlier
  turns of the same batch created, records each `save_messages` as a `SaveTurn` instead of writing, and then
  `flush()` writes every turn with one `save_many`. Turns of one thread must be run in batch order (the
  lanes do), so that the second turn of a thread sees the thread the first one creates, and a turn from
  another resource is refused as the storage would refuse it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from message_history.budget import PAGE_SIZE, HistoryLoader, TokenBudget, boundary_for, read_boundary
from message_history.errors import ThreadOwnershipError
from message_history.tokens import CountCache
from schemas.messages import Message
from storage.protocol import BudgetedHistoryStorage, HistoryStorage, MessageLookup, Page, PageQuery, Thread


@dataclass(frozen=True, slots=True)
class RecallQuery:
    """One `list_messages` of a batch: the thread's newest `limit` messages (None = all) of `resource_id`.

    With a `budget`, the recall is token-limited instead: `limit` is the count cap, and the pages the
    thread's `HistoryLoader` asks for are prefetched.
    """

    thread_id: str
    resource_id: str | None
    limit: int | None
    budget: TokenBudget | None = None
    lookup: tuple[str, ...] = ()  # message ids whose stored copies the client-echo filter needs


@dataclass(frozen=True, slots=True)
class SaveTurn:
    """One `save_messages` of a batch."""

    thread_id: str
    resource_id: str
    messages: Sequence[Message] = field(default_factory=list)


@runtime_checkable
class BatchHistoryStorage(HistoryStorage, Protocol):
    """A `HistoryStorage` with the batch forms the Kafka paths use (one round trip each)."""

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        """The existing threads among `thread_ids`, by id (missing ones are absent)."""
        ...

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        """Per query's thread id, what `list_messages` would return for it (newest first)."""
        ...

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | ThreadOwnershipError]:
        """`save_messages` for each turn, in order; a refused turn's entry is its `ThreadOwnershipError`."""
        ...


@runtime_checkable
class RowRecallStorage(Protocol):
    """A storage whose plain recall can answer with `RecalledRow`s (`schemas.recalled`), not models."""

    async def recall_rows_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        """`list_messages_many`, where rows may be `RecalledRow`s: for ordering, deduping and sending only."""
        ...


@runtime_checkable
class BatchPagedStorage(Protocol):
    """The batch forms of token-limited recall: many pages, many boundary writes, one round trip each."""

    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        """`list_page` for each query, in order."""
        ...

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """`save_thread_metadata` for each `(thread id, update)`."""
        ...


async def _pages_many(storage: HistoryStorage, queries: Sequence[PageQuery]) -> list[Page]:
    if not queries:
        return []
    if isinstance(storage, BatchPagedStorage):
        return await storage.list_pages_many(queries)
    if not isinstance(storage, BudgetedHistoryStorage):
        raise TypeError(f"{type(storage).__name__} cannot page a thread")
    return list(await asyncio.gather(*(storage.list_page(q) for q in queries)))


def _first_page(newest: list[Message], start: datetime | None) -> Page:
    """Page 0 from `start` on, cut from a thread's newest PAGE_SIZE + 1 rows (newest first).

    Rows at or after `start` are a prefix of the newest-first order, so the cut is exact; more follow when
    all PAGE_SIZE + 1 rows are in it.
    """
    rows = [m for m in newest if start is None or (m.createdAt is not None and m.createdAt >= start)]
    return Page(rows[:PAGE_SIZE], len(rows) > PAGE_SIZE)


def _page_query(query: RecallQuery, loader: HistoryLoader) -> PageQuery:
    request = loader.next_page
    assert request is not None
    return PageQuery(
        query.thread_id, query.resource_id, request.start, request.end, request.page, request.per_page
    )


# --- recall ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Page:
    resource_id: str | None
    limit: int | None
    messages: list[Message]  # newest first


class PrefetchedHistory:
    """Read-only view of a batch's threads and recent messages, loaded in one concurrent round trip."""

    def __init__(
        self,
        storage: HistoryStorage,
        threads: dict[str, Thread],
        pages: dict[str, _Page],
        known: Iterable[str],
    ) -> None:
        self._storage = storage
        self._threads = threads  # the existing threads among `known`
        self._pages = pages
        self._known = set(known)  # thread ids whose existence was prefetched
        self.misses = 0  # queries answered by the storage: a sign the prefetch guessed wrong
        self.counter = CountCache()  # token counts of the batch's messages, shared with the processor
        self.budget_pages: dict[PageQuery, Page] = {}  # token-limited recall's pages, prefetched in rounds
        self.page_rounds = 0  # round trips spent on those pages
        self.metadata_updates: dict[str, dict[str, Any]] = {}  # boundary writes, flushed once per batch
        self.by_id: dict[str, Message] = {}  # stored copies the client-echo filter asked for
        self.looked_up: set[str] = set()

    @classmethod
    async def load(cls, storage: BatchHistoryStorage, queries: Iterable[RecallQuery]) -> PrefetchedHistory:
        """Prefetch for `queries`: one query per thread (the first resource seen, the largest page asked)."""
        merged: dict[str, RecallQuery] = {}
        for query in queries:
            seen = merged.get(query.thread_id)
            if seen is None or (seen.resource_id == query.resource_id and _larger(query.limit, seen.limit)):
                merged[query.thread_id] = query
        ids = list(merged)
        wanted = [q for q in merged.values() if q.limit != 0 and q.budget is None]
        budgeted = [
            q for q in merged.values() if q.budget is not None and q.limit != 0 and q.budget.max_tokens != 0
        ]
        # A budgeted thread's first page is its newest rows from the boundary on; its newest PAGE_SIZE + 1
        # rows hold it whatever the boundary is, so they come with the threads, in the same round trip.
        first = [RecallQuery(q.thread_id, q.resource_id, PAGE_SIZE + 1) for q in budgeted]
        lookup = list(dict.fromkeys(i for q in queries for i in q.lookup))

        async def copies() -> list[Message]:
            if lookup and isinstance(storage, MessageLookup):
                return await storage.get_messages(lookup)
            return []

        async def recent() -> dict[str, list[Message]]:
            # Plain recall only orders, dedupes and sends its rows, so views do (`RowRecallStorage`);
            # budgeted threads count the tokens of their rows' content, so they get models.
            if not wanted or not isinstance(storage, RowRecallStorage):
                return await storage.list_messages_many([*wanted, *first])
            if not first:
                return await storage.recall_rows_many(wanted)
            views, models = await asyncio.gather(
                storage.recall_rows_many(wanted), storage.list_messages_many(first)
            )
            return {**views, **models}

        threads, pages, rows = await asyncio.gather(storage.get_threads(ids), recent(), copies())
        loaded = {
            q.thread_id: _Page(q.resource_id, q.limit, list(pages.get(q.thread_id, []))) for q in wanted
        }
        history = cls(storage, dict(threads), loaded, ids)
        if lookup and isinstance(storage, MessageLookup):
            history.by_id = {m.id: m for m in rows if m.id is not None}
            history.looked_up = set(lookup)
        newest = {q.thread_id: list(pages.get(q.thread_id, [])) for q in first}
        await history._prefetch_budgeted(budgeted, newest)
        return history

    async def _prefetch_budgeted(
        self, queries: Sequence[RecallQuery], newest: dict[str, list[Message]]
    ) -> None:
        """Run every budgeted thread's `HistoryLoader` together: one round trip per paging round after the
        first (whose pages are cut from each thread's `newest` rows)."""
        loaders: list[tuple[RecallQuery, HistoryLoader]] = []
        for query in queries:
            if query.budget is None or query.budget.max_tokens == 0:
                continue
            thread = self._threads.get(query.thread_id)
            stored = read_boundary(thread.metadata) if thread is not None else None
            loader = HistoryLoader(
                boundary=boundary_for(query.budget, stored),
                max_messages=query.limit,
                budget=query.budget,
                count=self.counter,
            )
            loaders.append((query, loader))
            page_query = _page_query(query, loader)
            if page_query.page == 0 and page_query.end is None and page_query.per_page == PAGE_SIZE:
                self.budget_pages[page_query] = _first_page(newest.get(query.thread_id, []), page_query.start)
        while active := [(q, loader) for q, loader in loaders if loader.next_page is not None]:
            asked = [_page_query(q, loader) for q, loader in active]
            missing = [p for p in dict.fromkeys(asked) if p not in self.budget_pages]
            if missing:
                self.budget_pages.update(zip(missing, await _pages_many(self._storage, missing), strict=True))
                self.page_rounds += 1
            for (_, loader), page_query in zip(active, asked, strict=True):
                page = self.budget_pages[page_query]
                loader.feed(page.messages, has_more=page.has_more)

    async def get_messages(self, message_ids: Sequence[str]) -> list[Message]:
        if set(message_ids) <= self.looked_up:
            return [self.by_id[i] for i in message_ids if i in self.by_id]
        self.misses += 1
        if not isinstance(self._storage, MessageLookup):
            raise TypeError(f"{type(self._storage).__name__} cannot look messages up by id")
        return await self._storage.get_messages(message_ids)

    async def list_page(self, query: PageQuery) -> Page:
        page = self.budget_pages.get(query)
        if page is not None:
            return page
        self.misses += 1
        if not isinstance(self._storage, BudgetedHistoryStorage):
            raise TypeError(f"{type(self._storage).__name__} cannot page a thread")
        page = await self._storage.list_page(query)
        self.budget_pages[query] = page
        return page

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        """Recorded for `flush()`; later requests of the batch see the thread as updated."""
        self.metadata_updates.setdefault(thread_id, {}).update(update)
        thread = self._threads.get(thread_id)
        if thread is not None:
            self._threads[thread_id] = dataclasses.replace(thread, metadata={**thread.metadata, **update})

    async def flush(self) -> None:
        """Write the batch's boundary updates: one round trip (nothing when there are none)."""
        if not self.metadata_updates:
            return
        updates = list(self.metadata_updates.items())
        if isinstance(self._storage, BatchPagedStorage):
            await self._storage.save_thread_metadata_many(updates)
        elif isinstance(self._storage, BudgetedHistoryStorage):
            for thread_id, update in updates:
                await self._storage.save_thread_metadata(thread_id, update)
        else:
            raise TypeError(f"{type(self._storage).__name__} cannot store a token boundary")
        self.metadata_updates.clear()

    async def get_thread(self, thread_id: str) -> Thread | None:
        if thread_id in self._known:
            return self._threads.get(thread_id)
        self.misses += 1
        return await self._storage.get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        if limit == 0:
            return []
        page = self._pages.get(thread_id)
        if page is not None and page.resource_id == resource_id and not _larger(limit, page.limit):
            return list(page.messages if limit is None else page.messages[:limit])
        self.misses += 1
        return await self._storage.list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        raise RuntimeError("the recall path does not write")  # pragma: no cover -- a programming error


def _larger(limit: int | None, than: int | None) -> bool:
    """True when a page of `limit` holds more than one of `than` (None = unlimited)."""
    if limit is None:
        return than is not None
    return than is not None and limit > than


# --- persist -----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class CollectedTurn:
    """A `save_messages` call recorded for the batch write; `result` is set by `flush()`."""

    turn: SaveTurn
    result: Thread | ThreadOwnershipError | None = None


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
        # For the tool-state merge: stored copies by id and each thread's newest row, overlaid by the saves.
        self._by_id: dict[str, Message] = {}
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
        """Prefetch the threads and, for the tool-state merge, the stored copies of `message_ids` and the
        newest row of the `latest_of` threads (turns without user input): concurrent queries, one round
        trip."""
        ids = list(dict.fromkeys(thread_ids))
        lookup = list(dict.fromkeys(message_ids)) if isinstance(storage, MessageLookup) else []
        newest_of = list(dict.fromkeys(latest_of)) if lookup else []

        async def copies() -> list[Message]:
            return await storage.get_messages(lookup) if lookup and isinstance(storage, MessageLookup) else []

        async def latest() -> dict[str, list[Message]]:
            if not newest_of:
                return {}
            return await storage.list_messages_many([RecallQuery(t, None, 1) for t in newest_of])

        threads, rows, newest = await asyncio.gather(
            storage.get_threads(ids) if ids else _no_threads(), copies(), latest()
        )
        batch = cls(storage, dict(threads), ids)
        if lookup:
            batch._by_id = {m.id: m for m in rows if m.id is not None}
            batch._looked_up = set(lookup)
            batch._latest = {t: next(iter(newest.get(t, [])), None) for t in newest_of}
        return batch

    async def get_messages(self, message_ids: Sequence[str]) -> list[Message]:
        if set(message_ids) <= self._looked_up:
            return [self._by_id[i] for i in message_ids if i in self._by_id]
        if not isinstance(self._storage, MessageLookup):
            return []  # a storage without lookup: no stored copies known, turns are saved as they come
        self.misses += 1
        return await self._storage.get_messages(message_ids)

    async def latest(self, thread_id: str) -> list[Message]:
        if thread_id in self._latest:
            row = self._latest[thread_id]
            return [row] if row is not None else []
        self.misses += 1
        return await self._storage.list_messages(thread_id, resource_id=None, limit=1)

    def for_turn(self) -> TurnStorage:
        """A `HistoryStorage` for one turn: its save (at most one) is recorded as that turn's."""
        return TurnStorage(self)

    async def get_thread(self, thread_id: str) -> Thread | None:
        if thread_id in self._known:
            return self._threads.get(thread_id)
        self.misses += 1
        thread = await self._storage.get_thread(thread_id)
        self._known.add(thread_id)
        if thread is not None:
            self._threads[thread_id] = thread
        return thread

    def record(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> CollectedTurn:
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
        collected = CollectedTurn(SaveTurn(thread_id=thread_id, resource_id=resource_id, messages=messages))
        self.turns.append(collected)
        self._overlay(thread_id, messages)
        return collected

    def _overlay(self, thread_id: str, messages: Sequence[Message]) -> None:
        """Later turns of the batch see this turn's rows as stored (first `createdAt` kept, as upserts do)."""
        for message in messages:
            if message.id is None:
                continue
            earlier = self._by_id.get(message.id)
            row = message
            if earlier is not None and earlier.createdAt is not None:
                row = message.model_copy(update={"createdAt": earlier.createdAt})
            self._by_id[message.id] = row
            self._looked_up.add(message.id)
            if thread_id in self._latest:
                current = self._latest[thread_id]
                if current is None or _newer(row, current):
                    self._latest[thread_id] = row

    async def flush(self) -> None:
        """Write every recorded turn with one `save_many`; each turn gets its result."""
        if not self.turns:
            return
        results = await self._storage.save_many([c.turn for c in self.turns])
        if len(results) != len(self.turns):
            raise RuntimeError(f"save_many returned {len(results)} results for {len(self.turns)} turns")
        for collected, result in zip(self.turns, results, strict=True):
            collected.result = result


class TurnStorage:
    """One turn's view of a `CollectingHistory`: reads are shared, the save is remembered as `saved`."""

    def __init__(self, batch: CollectingHistory) -> None:
        self._batch = batch
        self.saved: CollectedTurn | None = None

    async def get_thread(self, thread_id: str) -> Thread | None:
        return await self._batch.get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        if limit != 1 or resource_id is not None:
            raise RuntimeError("the persist path reads only a thread's newest row")  # a programming error
        return await self._batch.latest(thread_id)

    async def get_messages(self, message_ids: Sequence[str]) -> list[Message]:
        return await self._batch.get_messages(message_ids)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        self.saved = self._batch.record(thread_id=thread_id, resource_id=resource_id, messages=messages)
        thread = await self._batch.get_thread(thread_id)
        assert thread is not None  # just recorded
        return thread


def _newer(message: Message, than: Message) -> bool:
    if message.createdAt is None or than.createdAt is None:
        return False
    return (message.createdAt, message.id or "") > (than.createdAt, than.id or "")


async def _no_threads() -> dict[str, Thread]:
    return {}


# --- any storage -------------------------------------------------------------------------------------------


class SequentialBatches:
    """The batch forms over a plain `HistoryStorage`, one call per item (embedded use, tests, a fallback)."""

    def __init__(self, storage: HistoryStorage) -> None:
        self.storage = storage

    async def get_thread(self, thread_id: str) -> Thread | None:
        return await self.storage.get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        return await self.storage.list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        return await self.storage.save_messages(
            thread_id=thread_id, resource_id=resource_id, messages=messages
        )

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        found = {tid: await self.storage.get_thread(tid) for tid in dict.fromkeys(thread_ids)}
        return {tid: thread for tid, thread in found.items() if thread is not None}

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        return {
            q.thread_id: await self.storage.list_messages(
                q.thread_id, resource_id=q.resource_id, limit=q.limit
            )
            for q in queries
        }

    async def get_messages(self, message_ids: Sequence[str]) -> list[Message]:
        if not isinstance(self.storage, MessageLookup):
            raise TypeError(f"{type(self.storage).__name__} cannot look messages up by id")
        return await self.storage.get_messages(message_ids)

    async def list_page(self, query: PageQuery) -> Page:
        if not isinstance(self.storage, BudgetedHistoryStorage):
            raise TypeError(f"{type(self.storage).__name__} cannot page a thread")
        return await self.storage.list_page(query)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        if not isinstance(self.storage, BudgetedHistoryStorage):
            raise TypeError(f"{type(self.storage).__name__} cannot store a token boundary")
        await self.storage.save_thread_metadata(thread_id, update)

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | ThreadOwnershipError]:
        out: list[Thread | ThreadOwnershipError] = []
        for turn in turns:
            try:
                out.append(
                    await self.storage.save_messages(
                        thread_id=turn.thread_id, resource_id=turn.resource_id, messages=turn.messages
                    )
                )
            except ThreadOwnershipError as exc:
                out.append(exc)
        return out


def as_batch_storage(storage: HistoryStorage) -> BatchHistoryStorage:
    """`storage` itself when it has the batch forms, else `SequentialBatches` around it."""
    if isinstance(storage, BatchHistoryStorage):
        return storage
    return SequentialBatches(storage)
