"""`InMemoryHistoryStorage`: the `HistoryStorage` protocol in a process's memory.

For embedded use, examples and fast tests. Same observable semantics as the MongoDB storage:

* messages are upserted by `id`; the `createdAt` of the first insert never changes; every other field is
  replaced by the newest save; an id stored in another thread refuses the save (`MessageIdTakenError`,
  nothing written): unlike Mastra, an id never moves a message out of another thread;
* a missing thread is created (`title ''`, `metadata {}`, `createdAt` = the earliest saved `createdAt`);
  `updatedAt` becomes `max(updatedAt, newest saved createdAt)`. Both come from the messages, not the clock,
  so replaying an old turn changes nothing;
* a save into a thread owned by another resource raises `ThreadOwnershipError` and writes nothing (a thread
  stored without a `resourceId` is unowned: anyone may write into it, and it stays unowned);
* `list_messages` is newest first by `(createdAt, id)`, filtered by resource when one is given;
* system messages are stored if given (the rules never save them; a Mastra app might);
* everything going in or out is deep-copied, so callers cannot change stored state by accident.

Methods never await, so each runs atomically with respect to other tasks on the event loop.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from message_history.core.budget import PageRequest, page_of
from message_history.core.rules import check_owner
from message_history.errors import InvalidInputError, MessageIdTakenError
from schemas.messages import Message, utc_now_ms
from storage.protocol import HistoryStorage, Page, PageQuery, Thread

__all__ = ["InMemoryHistoryStorage"]


def _copy_thread(thread: Thread) -> Thread:
    return dataclasses.replace(thread, metadata=copy.deepcopy(thread.metadata))


class InMemoryHistoryStorage(HistoryStorage):
    """Threads and messages in dicts: a `HistoryStorage` (its batch forms: `SequentialBatches`)."""

    def __init__(self) -> None:
        self._threads: dict[str, Thread] = {}
        self._messages: dict[str, Message] = {}  # by id
        self._by_thread: dict[str, set[str]] = {}  # thread id -> message ids

    def __repr__(self) -> str:
        return f"InMemoryHistoryStorage(threads={len(self._threads)}, messages={len(self._messages)})"

    async def get_thread(self, thread_id: str) -> Thread | None:
        """The thread, or None when it does not exist."""
        thread = self._threads.get(thread_id)
        return _copy_thread(thread) if thread is not None else None

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        """The thread's newest `limit` messages (all when None), newest first by `(createdAt, id)`."""
        if not thread_id:
            raise InvalidInputError("thread id must not be empty")
        if limit is not None and limit < 0:
            raise InvalidInputError(f"limit must not be negative, got {limit}")
        if limit == 0:
            return []
        rows = [self._messages[i] for i in self._by_thread.get(thread_id, ())]
        if resource_id is not None:
            rows = [m for m in rows if m.resourceId == resource_id]
        # Stored messages always have createdAt and id (save_messages guarantees it).
        rows.sort(key=lambda m: (m.createdAt, m.id), reverse=True)
        if limit is not None:
            rows = rows[:limit]
        return [m.model_copy(deep=True) for m in rows]

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        """Upsert `messages` by id into `thread_id` and touch the thread; returns the thread as saved."""
        if not thread_id:
            raise InvalidInputError("thread id must not be empty")
        existing = self._threads.get(thread_id)
        check_owner(existing, thread_id, resource_id)

        # Prepare every row before writing any, so a bad message leaves storage as it was.
        now = utc_now_ms()
        rows: list[Message] = []
        for message in messages:
            if not message.id:
                raise InvalidInputError("a message to save has no id")
            previous = self._messages.get(message.id)
            if previous is not None and previous.threadId != thread_id:
                raise MessageIdTakenError(thread_id, resource_id, message.id)
            created = (
                previous.createdAt
                if previous is not None and previous.createdAt is not None
                else message.createdAt or now
            )
            rows.append(
                message.model_copy(
                    update={
                        "threadId": thread_id,
                        "resourceId": message.resourceId or resource_id,
                        "createdAt": created,
                    },
                    deep=True,
                )
            )
        if not rows:
            if existing is not None:
                return _copy_thread(existing)
            raise InvalidInputError("nothing to save into a thread that does not exist")

        earliest = min(m.createdAt for m in rows if m.createdAt is not None)
        newest = max(m.createdAt for m in rows if m.createdAt is not None)
        for row in rows:
            assert row.id is not None  # checked above
            previous = self._messages.get(row.id)
            if previous is not None and previous.threadId != thread_id and previous.threadId is not None:
                self._by_thread.get(previous.threadId, set()).discard(row.id)
            self._messages[row.id] = row
            self._by_thread.setdefault(thread_id, set()).add(row.id)

        if existing is None:
            thread = Thread(
                id=thread_id,
                resourceId=resource_id,
                title="",
                metadata={},
                createdAt=earliest,
                updatedAt=newest,
            )
        else:
            updated = (
                existing.updatedAt
                if existing.updatedAt is not None and existing.updatedAt > newest
                else newest
            )
            thread = dataclasses.replace(existing, updatedAt=updated)
        self._threads[thread_id] = thread
        return _copy_thread(thread)

    async def list_page(self, query: PageQuery) -> Page:
        """One page of a token-budgeted recall (see `storage.protocol.PageQuery`)."""
        rows = await self.list_messages(query.thread_id, resource_id=query.resource_id, limit=None)
        # every row here has a createdAt (saves set it), as `page_of` requires
        selected, more = page_of(rows, PageRequest(query.start, query.end, query.page, query.per_page))
        return Page(selected, more)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        """Set `update`'s keys in the thread's metadata; `updatedAt` moves forward to now."""
        existing = self._threads.get(thread_id)
        if existing is None:
            return
        now = utc_now_ms()
        updated = existing.updatedAt if existing.updatedAt is not None and existing.updatedAt > now else now
        metadata = {**copy.deepcopy(existing.metadata), **copy.deepcopy(update)}
        self._threads[thread_id] = dataclasses.replace(existing, metadata=metadata, updatedAt=updated)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        """The stored messages among `message_ids` in one of `thread_ids` (any thread when None)."""
        found = (self._messages.get(i) for i in dict.fromkeys(message_ids))
        return [
            m.model_copy(deep=True)
            for m in found
            if m is not None and (thread_ids is None or m.threadId in thread_ids)
        ]
