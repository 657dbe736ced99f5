"""The recall decision, one for the library and the recall path: `recall_from` reads what a request's plan
(`core.recall_plan.RecallNeeds`) says through `RecallReads` and decides (`decide_plain`, `decide_budgeted`).

`MessageHistory.recall` reads per turn from its storage (`StorageReads`); the recall path reads from its
batch's load (`consumers.prefetch.PrefetchedHistory`). They differ only in where the reads come from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from message_history.core.budget import (
    BOUNDARY_KEY,
    Boundary,
    HistoryLoader,
    LoadedHistory,
    advance_boundary,
    trim_memory,
)
from message_history.core.echo import EchoPlan
from message_history.core.echo import filter_echo as drop_client_echo
from message_history.core.recall_plan import RecallNeeds, load_boundary
from message_history.core.rules import Source, build_context
from schemas.messages import Message
from storage.protocol import HistoryLoad, HistoryStorage, Page, PageQuery, Thread


@dataclass(frozen=True, slots=True)
class RecallOutcome:
    """The result of a recall.

    `context`: the model's context, `(message, source)` pairs in `(createdAt, id)` order; `recalled`: how many
    of them come from storage; `limit`: the page size used (`None` = no limit); `thread`: the stored thread,
    None when it does not exist yet (or there is no thread id). With a token budget: `tokens`, the recalled
    messages' count; `trimmed`, the ids the memory-only limiter removed; `boundary`, the thread's boundary
    for this budget after the recall (None when there is none). `truncated`: the row cap (`max_rows`) left
    stored rows out that the request asked for.
    """

    context: list[tuple[Message, Source]]
    recalled: int
    limit: int | None
    thread: Thread | None = None
    tokens: float | None = None
    trimmed: list[str] = field(default_factory=list)
    boundary: Boundary | None = None
    truncated: bool = False


class RecallReads(Protocol):
    """What a recall reads once its thread row is known: per turn from a storage (`MessageHistory`), or
    from what the recall path loaded for its whole batch (`consumers.prefetch.PrefetchedHistory`)."""

    async def newest(self, thread_id: str, resource_id: str | None, limit: int | None) -> Sequence[Message]:
        """`list_messages`: the thread's newest `limit` rows of `resource_id`, newest first."""
        ...

    async def copies(self, thread_id: str, message_ids: Sequence[str]) -> Sequence[Message]:
        """The stored copies of `message_ids` in `thread_id` (the client-echo filter's look-up)."""
        ...

    async def history(self, load: HistoryLoad, count: Callable[[Message], float]) -> LoadedHistory:
        """`HistoryLoader.loaded()` of `load`: the token-limited recall's pages, loaded and fed."""
        ...


@dataclass(frozen=True, slots=True)
class Recalled:
    """A decided recall: its outcome, and the metadata update to store on its thread (a moved token
    boundary), None when there is nothing to write."""

    outcome: RecallOutcome
    update: dict[str, Any] | None = None


async def recall_from(
    reads: RecallReads,
    needs: RecallNeeds,
    thread: Thread | None,
    incoming: Sequence[Message],
    echo: EchoPlan | None,
    *,
    system: Sequence[str] = (),
    read_only: bool,
    count: Callable[[Message], float],
) -> Recalled:
    """One request's recall, its thread row checked already: the reads `needs` plans, then the decision.

    `echo`: the input's `plan_echo` (None: kept whole). The library and the recall path both decide here;
    they differ only in where `reads` comes from.
    """
    thread_id = needs.thread_id
    if echo is not None and not echo.unchanged and not needs.off:
        incoming = await _filter_echo(reads, needs, incoming, echo)
    if needs.budget is not None and not needs.off:
        boundary = load_boundary(needs.budget, thread.metadata if thread is not None else None)
        load = HistoryLoad(thread_id, needs.resource_id, boundary, needs.limit, needs.budget, needs.max_rows)
        loaded = await reads.history(load, count)
        return decide_budgeted(
            load,
            thread,
            loaded.messages,
            incoming,
            system=system,
            read_only=read_only,
            count=count,
            truncated=loaded.truncated,
        )
    recalled: Sequence[Message] = []
    if needs.limit != 0:
        # one row past a cap that cut the asked count tells whether the cap left rows out
        recalled = await reads.newest(thread_id, needs.resource_id, needs.read_limit)
    truncated = needs.cut(len(recalled))
    if needs.capped:
        recalled = recalled[: needs.limit]
    return Recalled(decide_plain(thread, recalled, incoming, needs.limit, truncated=truncated))


async def _filter_echo(
    reads: RecallReads, needs: RecallNeeds, incoming: Sequence[Message], plan: EchoPlan
) -> Sequence[Message]:
    """Mastra's `MemoryInputFilter`: a probe of the thread's newest row, the resent ids' stored copies."""
    thread_id = needs.thread_id
    probe = await reads.newest(thread_id, needs.resource_id, 1)
    stored: dict[str, Message] = {}
    if needs.lookup:
        # this thread's copies only: a copy elsewhere must not change the turn (nor reveal it exists)
        rows = await reads.copies(thread_id, needs.lookup)
        stored = {m.id: m for m in rows if m.id is not None and m.threadId == thread_id}
    return drop_client_echo(incoming, plan, thread_empty=not probe, stored=stored, thread_id=thread_id)


def decide_plain(
    thread: Thread | None,
    recalled: Sequence[Message],
    incoming: Sequence[Message],
    limit: int | None,
    *,
    truncated: bool = False,
) -> RecallOutcome:
    """The count-capped recall of a loaded page (newest first): `build_context`."""
    context = build_context(recalled, incoming)
    count = sum(1 for _, source in context if source == "memory")
    return RecallOutcome(context=context, recalled=count, limit=limit, thread=thread, truncated=truncated)


def decide_budgeted(
    load: HistoryLoad,
    thread: Thread | None,
    loaded: Sequence[Message],
    incoming: Sequence[Message],
    *,
    system: Sequence[str],
    read_only: bool,
    count: Callable[[Message], float],
    truncated: bool = False,
) -> Recalled:
    """The token-limited recall of `load`'s loaded rows: the context, the memory-only limiter, and the
    boundary it moves (to store unless `read_only` or the thread does not exist). `truncated`: the row
    cap stopped the paging."""
    budget = load.budget
    boundary = load.boundary
    context = build_context(loaded[::-1], incoming)
    removed, _ = trim_memory(context, budget, system=system, count=count)
    removed_ids = {m.id for m in removed}
    context = [(m, s) for m, s in context if s != "memory" or m.id not in removed_ids]
    advanced = advance_boundary(boundary, [m for m in removed if m.threadId == load.thread_id], budget)
    update: dict[str, Any] | None = None
    if advanced is not None and advanced is not boundary and thread is not None and not read_only:
        update = {BOUNDARY_KEY: advanced.to_metadata()}
        boundary = advanced
    memory = [m for m, s in context if s == "memory"]
    tokens: float = 0
    for message in memory:
        tokens += count(message)
    outcome = RecallOutcome(
        context=context,
        recalled=len(memory),
        limit=load.max_messages,
        thread=thread,
        tokens=tokens,
        trimmed=[m.id for m in removed if m.id is not None],
        boundary=boundary,
        truncated=truncated,
    )
    return Recalled(outcome, update)


class StorageReads:
    """`RecallReads` over a storage, one turn at a time (the library)."""

    def __init__(self, storage: HistoryStorage) -> None:
        self._storage = storage

    async def newest(self, thread_id: str, resource_id: str | None, limit: int | None) -> Sequence[Message]:
        return await self._storage.list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def copies(self, thread_id: str, message_ids: Sequence[str]) -> Sequence[Message]:
        return await self._storage.get_messages(message_ids, thread_ids=(thread_id,))

    async def history(self, load: HistoryLoad, count: Callable[[Message], float]) -> LoadedHistory:
        return await load_history(load, count, self._storage.list_page)


async def load_history(
    load: HistoryLoad, count: Callable[[Message], float], page: Callable[[PageQuery], Awaitable[Page]]
) -> LoadedHistory:
    """`load`'s `HistoryLoader` run to its end, each page it asks for read with `page` (the library: the
    storage's `list_page`; the recall path: its batch's pages, a plan miss read from the storage)."""
    loader = HistoryLoader(
        boundary=load.boundary,
        max_messages=load.max_messages,
        budget=load.budget,
        count=count,
        max_rows=load.max_rows,
    )
    while (request := loader.next_page) is not None:
        query = PageQuery(
            load.thread_id, load.resource_id, request.start, request.end, request.page, request.per_page
        )
        loaded = await page(query)
        loader.feed(loaded.messages, has_more=loaded.has_more)
    return loader.loaded()
