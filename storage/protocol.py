"""What the MessageHistory processor and the Kafka paths need from a storage: two static protocols.

`HistoryStorage`: the six single-item operations (the part of Mastra's `MemoryStorage` MessageHistory uses,
in Python form). `BatchHistoryStorage`: those and their batch forms (one round trip per batch), what the
Kafka paths use; `storage.sequential.SequentialBatches` gives the batch forms over any `HistoryStorage`.
`storage.mongodb.MongoHistoryStorage` declares `BatchHistoryStorage`, `storage.memory.InMemoryHistoryStorage`
declares `HistoryStorage`, so mypy checks them; nothing is probed at run time. No driver import here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from message_history.core.budget import Boundary, TokenBudget
from message_history.errors import InvalidInputError
from schemas.messages import Message


@dataclass(frozen=True, slots=True)
class Thread:
    """A row of `mastra_threads`."""

    id: str
    resourceId: str  # noqa: N815 -- Mastra's field name
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    createdAt: datetime | None = None  # noqa: N815
    updatedAt: datetime | None = None  # noqa: N815


@dataclass(frozen=True, slots=True)
class PageQuery:
    """One page of a token-budgeted recall (Mastra's `listMessages` with a date range and a page number).

    The thread's rows (of `resource_id` when given) with `start ≤ createdAt ≤ end` (None = open), ordered
    `(createdAt, id)` descending, `page × per_page` skipped, at most `per_page` returned, no total count.
    """

    thread_id: str
    resource_id: str | None
    start: datetime | None
    end: datetime | None
    page: int
    per_page: int


@dataclass(frozen=True, slots=True)
class Page:
    """The rows of a `PageQuery`, newest first, and whether more rows follow it."""

    messages: list[Message]
    has_more: bool


class HistoryStorage(Protocol):
    """The six operations of Mastra's `MemoryStorage` that MessageHistory uses, in Python form."""

    async def get_thread(self, thread_id: str) -> Thread | None:
        """The thread, or None when it does not exist."""
        ...

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        """The thread's newest `limit` messages (all when None), newest first by `(createdAt, id)`.

        Filters by `resource_id` too when given. `limit == 0` returns [] without a query.
        A failed read raises; it never returns an empty page in place of an error.
        """
        ...

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        """Upsert `messages` by id (`createdAt` only on first insert) and touch the thread.

        A missing thread is created (`title ''`, `metadata {}`); an existing one keeps its title and
        metadata and its `updatedAt` moves forward only (`$max` with the newest saved `createdAt`).
        Raises `ThreadOwnershipError` and writes nothing when the thread belongs to another resource.
        Returns the thread as it is after the save.
        """
        ...

    async def list_page(self, query: PageQuery) -> Page:
        """One page of `query.thread_id` (see `PageQuery`): what token-limited recall reads."""
        ...

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        """Set the keys of `update` in the thread's metadata (other keys kept), move `updatedAt` forward.

        Nothing happens when the thread does not exist.
        """
        ...

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        """Stored messages by id (Mastra's `listMessagesById`), for the client-echo filter and the tool-state
        merge: those among `message_ids` in one of `thread_ids` (any thread when None), in no particular
        order. The paths always pass the asking turn's thread: a copy in another thread must not change what
        a turn does (no existence oracle across threads or tenants)."""
        ...


@dataclass(frozen=True, slots=True)
class Tombstones:
    """When threads and resources were forgotten (`message-history forget`), by id.

    A turn created at or before its thread's or its resource's tombstone is forgotten history: the persist
    path skips it (`skipped: "forgotten"`), so that a replay or a late redelivery cannot write it back. A
    turn created after the tombstone is new history and is saved.
    """

    threads: dict[str, datetime] = field(default_factory=dict)
    resources: dict[str, datetime] = field(default_factory=dict)

    def forgets(self, *, thread_id: str, resource_id: str, created_at: datetime) -> bool:
        """True when the turn made at `created_at` in `thread_id` / `resource_id` was forgotten since."""
        for forgotten_at in (self.threads.get(thread_id), self.resources.get(resource_id)):
            if forgotten_at is not None and created_at <= forgotten_at:
                return True
        return False


class TombstoneReader(Protocol):
    """Reads the tombstones of a batch's threads and resources in one round trip."""

    async def tombstones(self, *, thread_ids: Sequence[str], resource_ids: Sequence[str]) -> Tombstones:
        """The tombstones among `thread_ids` and `resource_ids` (missing ones are absent)."""
        ...


@dataclass(frozen=True, slots=True)
class HistoryLoad:
    """One thread's token-limited load: what its `HistoryLoader` is made of (the pages follow from these)."""

    thread_id: str
    resource_id: str | None
    boundary: Boundary | None
    max_messages: int | None
    budget: TokenBudget


# --- the batch forms -------------------------------------------------------------------------------------


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


class BatchHistoryStorage(HistoryStorage, Protocol):
    """A `HistoryStorage` with the batch forms the Kafka paths use (one round trip each)."""

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        """The existing threads among `thread_ids`, by id (missing ones are absent)."""
        ...

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        """Per query's thread id, what `list_messages` would return for it (newest first)."""
        ...

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
        """`save_messages` for each turn, in order; a refused turn's entry is its error:
        `ThreadOwnershipError`, or `DocumentRefusedError` (MongoDB refused a document of it for itself)."""
        ...

    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        """`list_page` for each query, in order."""
        ...

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """`save_thread_metadata` for each `(thread id, update)`."""
        ...


async def save_one(
    storage: BatchHistoryStorage, *, thread_id: str, resource_id: str, messages: Sequence[Message]
) -> Thread:
    """`save_messages` as a batch of one `save_many`; a refused turn raises its error."""
    [result] = await storage.save_many([SaveTurn(thread_id, resource_id, messages)])
    if isinstance(result, InvalidInputError):
        raise result
    return result
