"""The recall path's batch load: a batch's threads, pages and look-ups, read once, and its boundary writes.

`PrefetchedHistory.load` reads what the batch's requests plan (`core.recall_plan.plan_recall`, passed as
`RecallQuery`s): one `get_threads`, the plain threads' newest rows (as bytes when the storage can), the
budgeted threads' pages and the client-echo filter's stored copies, issued concurrently; the budgeted
threads' `HistoryLoader`s then run together, one round trip per paging round for the whole batch. It is not a
storage: it answers the decision's reads (`RecallReads`: `newest`, `copies`, `history`) and `recall` hands
them to `processor.recall.recall_from`, the same decision the library makes per turn. A read the plan did
not foresee (a boundary an earlier request moved, a larger page) is a plan miss: counted
(`message_history_plan_misses_total{path="recall"}`), logged at INFO, then read from the storage. Boundary
writes go to a write-only `BoundaryBuffer`, flushed before the batch is acknowledged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

from consumers.write_buffer import WriteBuffer
from message_history import metrics
from message_history.core.budget import PAGE_SIZE, HistoryLoader, LoadedHistory
from message_history.core.echo import EchoPlan
from message_history.core.recall_plan import PlainPage, PlainRow, RecallNeeds, load_boundary
from message_history.core.tokens import CountCache
from message_history.processor.recall import RecallOutcome, load_history, recall_from
from schemas.messages import Message
from storage import unreadable
from storage.protocol import (
    BatchHistoryStorage,
    HistoryLoad,
    Page,
    PageQuery,
    RecallQuery,
    Thread,
)

log = logging.getLogger(__name__)


@runtime_checkable
class RawRecallStorage(Protocol):
    """A storage that reads recall pages as each row's stored bytes (`MongoHistoryStorage`).

    A capability, not part of `BatchHistoryStorage`: only a document store has stored bytes to hand over
    (`SequentialBatches` over the in-memory storage holds models). Decided once, when the service is wired
    (`message_history.app.capabilities`), and passed in (`RecallHandler(raw_rows=...)`); without it recall
    reads models (`list_messages_many`): same rows, more CPU."""

    async def recall_raw_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[bytes]]: ...

    def plain_rows(self, docs: Sequence[bytes]) -> list[PlainRow | None]: ...

    def plain_page_of(
        self, docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]
    ) -> tuple[PlainPage, int] | None: ...

    def recalled_from_raw(self, docs: Sequence[bytes]) -> list[Message]: ...


def _first_page(newest: list[Message], start: datetime | None, skipped: int = 0) -> Page:
    """Page 0 from `start` on, cut from a thread's newest PAGE_SIZE + 1 rows (newest first), of which
    `skipped` were rows no Mastra would read (left out of `newest`).

    Rows at or after `start` are a prefix of the newest-first order, so the cut is exact; more follow when
    all PAGE_SIZE + 1 rows are in it. With skipped rows (whose times are unknown) more may follow as soon as
    the read was full: the loader then asks for the next page (read from the storage: a plan miss).
    """
    rows = [m for m in newest if start is None or (m.createdAt is not None and m.createdAt >= start)]
    return Page(
        rows[:PAGE_SIZE], len(rows) > PAGE_SIZE or (skipped > 0 and len(newest) + skipped > PAGE_SIZE)
    )


def _page_query(query: RecallQuery, loader: HistoryLoader) -> PageQuery:
    request = loader.next_page
    assert request is not None
    return PageQuery(
        query.thread_id, query.resource_id, request.start, request.end, request.page, request.per_page
    )


@dataclass(slots=True)
class BoundaryBuffer(WriteBuffer):
    """The token boundaries a recall batch moves: write-only, flushed before the batch's acknowledgement.

    A `WriteBuffer`, like the persist path's `PersistBuffer`; while collecting, a thread's own updates may
    be written early (`flush_thread`), before a parked request of it reads MongoDB. Nothing reads a
    boundary back from here: the batch's later requests of a thread see the moved boundary in the loaded
    thread row, which the decision updates itself.
    """

    what: ClassVar[str] = "boundary"
    storage: BatchHistoryStorage
    _updates: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def pending(self) -> dict[str, dict[str, Any]]:
        """The updates not written yet, by thread (a copy, for tests and logs)."""
        return {thread: dict(update) for thread, update in self._updates.items()}

    def write(self, thread_id: str, update: dict[str, Any]) -> None:
        self._collecting()
        self._updates.setdefault(thread_id, {}).update(update)

    async def flush_thread(self, thread_id: str) -> None:
        """Write only `thread_id`'s updates, now, and keep collecting: before a request of it is recalled
        from MongoDB, which must see them (and whose own boundary the batch's flush must not write back
        over)."""
        self._collecting("flushes no thread")
        update = self._updates.pop(thread_id, None)
        if update is not None:
            await self._save([(thread_id, update)])

    async def _write(self) -> None:
        """The batch's one round trip (nothing when there are no updates)."""
        await self._save(list(self._updates.items()))
        self._updates.clear()

    async def _save(self, updates: list[tuple[str, dict[str, Any]]]) -> None:
        if updates:
            await self.storage.save_thread_metadata_many(updates)


@dataclass(frozen=True, slots=True)
class _Page:
    resource_id: str | None
    limit: int | None
    messages: list[Message]  # newest first


class PrefetchedHistory:
    """Read-only view of a batch's threads and recent messages, loaded in one concurrent round trip."""

    def __init__(
        self,
        storage: BatchHistoryStorage,
        raw: RawRecallStorage | None,
        threads: dict[str, Thread],
        pages: dict[str, _Page],
        known: Iterable[str],
    ) -> None:
        self._storage = storage
        self._raw_rows = raw  # the storage's byte reads (None: it reads models only)
        self._threads = threads  # the existing threads among `known`
        self._pages = pages
        # pages read as bytes (a `RawRecallStorage`): `plain` rows, `list_messages` models, made on demand
        self._raw: dict[str, tuple[_Page, list[bytes]]] = {}
        self._plain: dict[str, list[PlainRow | None]] = {}
        self._known = set(known)  # thread ids whose existence was prefetched
        self.misses = 0  # queries answered by the storage: a sign the prefetch guessed wrong
        self.counter = CountCache()  # token counts of the batch's messages, shared with the processor
        self.budget_pages: dict[PageQuery, Page] = {}  # token-limited recall's pages, prefetched in rounds
        self.page_rounds = 0  # round trips spent on those pages
        self._loaded: dict[HistoryLoad, LoadedHistory] = {}  # those loaders' results, for the decision
        self.boundaries = BoundaryBuffer(storage)  # boundary writes, flushed once per batch
        self.by_id: dict[tuple[str, str], Message] = {}  # (thread, id): stored copies the echo filter needs
        self.looked_up: set[str] = set()
        self.looked_in: set[str] = set()  # the threads those copies were looked up in

    @classmethod
    async def load(
        cls,
        storage: BatchHistoryStorage,
        queries: Iterable[RecallQuery],
        *,
        raw: RawRecallStorage | None = None,
    ) -> PrefetchedHistory:
        """Prefetch for `queries`: one query per thread (the first resource seen, the largest page asked).

        `raw`: the storage's byte reads (`RawRecallStorage`, the same storage), to read unbudgeted pages as
        bytes; None: every page as models."""
        queries = list(queries)
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
        lookup_threads = list(dict.fromkeys(q.thread_id for q in queries if q.lookup))

        async def copies() -> list[Message]:
            if lookup:
                # copies in the asking threads only: another thread's row must not change a request
                return await storage.get_messages(lookup, thread_ids=lookup_threads)
            return []

        async def recent() -> dict[str, list[Message]]:
            # budgeted threads count the tokens of their rows' content, so they get models (as do the
            # plain pages of a storage that cannot read bytes, or with the fast route off)
            if raw is not None:
                return await storage.list_messages_many(first) if first else {}
            return await storage.list_messages_many([*wanted, *first])

        async def raw_recent(raw: RawRecallStorage) -> dict[str, list[bytes]]:
            return await raw.recall_raw_many(wanted) if wanted else {}

        # Unbudgeted pages as bytes when the storage can: a plain request is decided from them without a
        # model per row (`RecallHandler`), any other request reads them as messages (`list_messages`).
        raw_pages: dict[str, list[bytes]] | None = None
        if raw is not None:
            threads, raw_pages, pages, rows = await asyncio.gather(
                storage.get_threads(ids), raw_recent(raw), recent(), copies()
            )
            loaded: dict[str, _Page] = {}
        else:
            threads, pages, rows = await asyncio.gather(storage.get_threads(ids), recent(), copies())
            loaded = {
                q.thread_id: _Page(q.resource_id, q.limit, list(pages.get(q.thread_id, []))) for q in wanted
            }
        history = cls(storage, raw, dict(threads), loaded, ids)
        if raw_pages is not None:
            history._raw = {
                q.thread_id: (_Page(q.resource_id, q.limit, []), raw_pages.get(q.thread_id, []))
                for q in wanted
            }
        if lookup:
            history.by_id = {
                (m.threadId, m.id): m for m in rows if m.id is not None and m.threadId is not None
            }
            history.looked_up = set(lookup)
            history.looked_in = set(lookup_threads)
        newest = {q.thread_id: list(pages.get(q.thread_id, [])) for q in first}
        # ...and answer the client-echo filter's probe (`list_messages`, limit 1) of a budgeted thread.
        history._pages.update(
            {q.thread_id: _Page(q.resource_id, PAGE_SIZE + 1, newest[q.thread_id]) for q in first}
        )
        await history._load_budgeted(budgeted, newest)
        return history

    async def _load_budgeted(self, queries: Sequence[RecallQuery], newest: dict[str, list[Message]]) -> None:
        """Run every budgeted thread's `HistoryLoader` (its pages follow from the thread's stored boundary)
        together: one round trip per paging round after the first, whose pages are cut from each thread's
        `newest` rows."""
        loaders: list[tuple[RecallQuery, HistoryLoader]] = []
        loads: list[HistoryLoad] = []
        for query in queries:  # `load` passes only budgeted queries (a budget, max_tokens > 0)
            assert query.budget is not None
            thread = self._threads.get(query.thread_id)
            boundary = load_boundary(query.budget, thread.metadata if thread is not None else None)
            load = HistoryLoad(
                query.thread_id, query.resource_id, boundary, query.limit, query.budget, query.max_rows
            )
            loader = HistoryLoader(
                boundary=load.boundary,
                max_messages=load.max_messages,
                budget=load.budget,
                count=self.counter,
                max_rows=load.max_rows,
            )
            loaders.append((query, loader))
            loads.append(load)
            page_query = _page_query(query, loader)
            if page_query.page == 0 and page_query.end is None and page_query.per_page == PAGE_SIZE:
                ledger = unreadable.current()
                skipped = ledger.skipped(query.thread_id, PAGE_SIZE + 1) if ledger is not None else 0
                self.budget_pages[page_query] = _first_page(
                    newest.get(query.thread_id, []), page_query.start, skipped
                )
        while active := [(q, loader) for q, loader in loaders if loader.next_page is not None]:
            asked = [_page_query(q, loader) for q, loader in active]
            missing = [p for p in dict.fromkeys(asked) if p not in self.budget_pages]
            if missing:
                self.budget_pages.update(
                    zip(missing, await self._storage.list_pages_many(missing), strict=True)
                )
                self.page_rounds += 1
            for (_, loader), page_query in zip(active, asked, strict=True):
                page = self.budget_pages[page_query]
                loader.feed(page.messages, has_more=page.has_more)
        self._loaded.update((load, loader.loaded()) for load, (_, loader) in zip(loads, loaders, strict=True))

    async def copies(self, thread_id: str, message_ids: Sequence[str]) -> Sequence[Message]:
        """The stored copies of `message_ids` in `thread_id` (the client-echo filter's look-up)."""
        if set(message_ids) <= self.looked_up and thread_id in self.looked_in:
            return [m for i in message_ids if (m := self.by_id.get((thread_id, i))) is not None]
        self._missed("get_messages", thread_id)
        return await self._storage.get_messages(message_ids, thread_ids=(thread_id,))

    async def history(self, load: HistoryLoad, count: Callable[[Message], float]) -> LoadedHistory:
        """The budgeted thread's loaded rows when the batch ran this very load (same boundary, counter);
        otherwise (a boundary an earlier request of the batch moved) its loader runs now, over the batch's
        pages where it has them; each page it must read from the storage is a plan miss."""
        if count is self.counter:
            loaded = self._loaded.get(load)
            if loaded is not None:
                return loaded
        return await load_history(load, count, lambda query: self._budget_page(load.thread_id, query))

    async def _budget_page(self, thread_id: str, query: PageQuery) -> Page:
        page = self.budget_pages.get(query)
        if page is None:  # a page the plan did not foresee
            self._missed("list_page", thread_id)
            [page] = await self._storage.list_pages_many([query])
            self.budget_pages[query] = page
        return page

    async def recall(
        self,
        needs: RecallNeeds,
        incoming: Sequence[Message],
        echo: EchoPlan | None,
        *,
        read_only: bool,
        system: Sequence[str] = (),
    ) -> RecallOutcome:
        """One request's recall from the batch's loaded reads (`recall_from`, the library's decision); a
        boundary it moves is buffered for the batch's flush, and the batch's later requests of the thread
        see it in the thread's loaded row. The thread's ownership is the caller's check."""
        thread = await self.get_thread(needs.thread_id)
        recalled = await recall_from(
            self, needs, thread, incoming, echo, system=system, read_only=read_only, count=self.counter
        )
        if recalled.update is not None:
            self.boundaries.write(needs.thread_id, recalled.update)
            if thread is not None:
                metadata = {**thread.metadata, **recalled.update}
                self._threads[needs.thread_id] = dataclasses.replace(thread, metadata=metadata)
        return recalled.outcome

    async def flush(self, thread_id: str | None = None) -> None:
        """The boundary buffer's flush (see `BoundaryBuffer`): the batch's, or only `thread_id`'s."""
        if thread_id is None:
            await self.boundaries.flush()
        else:
            await self.boundaries.flush_thread(thread_id)

    async def get_thread(self, thread_id: str) -> Thread | None:
        if thread_id in self._known:
            return self._threads.get(thread_id)
        self._missed("get_thread", thread_id)
        return await self._storage.get_thread(thread_id)

    def plain_page_of(
        self, thread_id: str, resource_id: str | None, read: int, limit: int, incoming: Sequence[Message]
    ) -> tuple[PlainPage, int] | None:
        """`plain_page(plain(thread_id, resource_id, read), limit, incoming)` and the length of those rows,
        decided on the page's bytes in one native call (`storage.row_codec.plain_page_of`: no object per
        row), or None: `plain` and `plain_page` then decide (a page not read as bytes for this resource and
        at least this limit, a row the codec is not sure of, a page that does not qualify, no native codec).
        A thread whose rows `plain` already decoded is left to them."""
        entry = self._raw.get(thread_id)
        if (
            entry is None
            or entry[0].resource_id != resource_id
            or _larger(read, entry[0].limit)
            or thread_id in self._plain
        ):
            return None
        assert self._raw_rows is not None  # it read the bytes
        return self._raw_rows.plain_page_of(entry[1], read, limit, incoming)

    def plain(self, thread_id: str, resource_id: str | None, limit: int) -> list[PlainRow | None] | None:
        """The thread's newest `limit` rows as `PlainRow`s (None per row not in the plain shape), newest
        first; None when its page was not read as bytes for this resource and at least this limit."""
        entry = self._raw.get(thread_id)
        if entry is None or entry[0].resource_id != resource_id or _larger(limit, entry[0].limit):
            return None
        rows = self._plain.get(thread_id)
        if rows is None:
            assert self._raw_rows is not None  # it read the bytes
            rows = self._plain[thread_id] = self._raw_rows.plain_rows(entry[1])
            if None in rows and thread_id not in self._pages:
                # a row not in the plain shape, maybe one no Mastra reads: the page is read as messages
                # now (as `newest` would), so its unreadable rows are met and counted whatever the limit,
                # as the model route meets them (`history.skipped` is the same on both routes)
                self._pages[thread_id] = dataclasses.replace(
                    entry[0], messages=self._raw_rows.recalled_from_raw(entry[1])
                )
        return rows[:limit]

    async def newest(self, thread_id: str, resource_id: str | None, limit: int | None) -> Sequence[Message]:
        """`list_messages` from the batch's pages (a page read as bytes is decoded once, on demand)."""
        if limit == 0:
            return []
        entry = self._raw.get(thread_id)
        if entry is not None and thread_id not in self._pages:  # a byte page read as messages: decoded once
            assert self._raw_rows is not None  # it read the bytes
            self._pages[thread_id] = dataclasses.replace(
                entry[0], messages=self._raw_rows.recalled_from_raw(entry[1])
            )
        page = self._pages.get(thread_id)
        if page is not None and page.resource_id == resource_id and not _larger(limit, page.limit):
            return list(page.messages if limit is None else page.messages[:limit])
        self._missed("list_messages", thread_id)
        return await self._storage.list_messages(thread_id, resource_id=resource_id, limit=limit)

    def _missed(self, read: str, *thread_ids: str) -> None:
        """A read the batch's plan did not load: counted and logged, then sent to the storage."""
        self.misses += 1
        metrics.PLAN_MISSES.labels(path="recall").inc()
        log.info(
            "recall plan missed a read", extra={"path": "recall", "read": read, "threads": list(thread_ids)}
        )


def _larger(limit: int | None, than: int | None) -> bool:
    """True when a page of `limit` holds more than one of `than` (None = unlimited)."""
    if limit is None:
        return than is not None
    return than is not None and limit > than
