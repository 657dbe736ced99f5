"""The batch forms over a plain `HistoryStorage`, one call per item (embedded use, tests, a fallback)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from message_history.errors import ThreadOwnershipError
from schemas.messages import Message
from storage.protocol import (
    BatchHistoryStorage,
    BudgetedHistoryStorage,
    HistoryStorage,
    MessageLookup,
    Page,
    PageQuery,
    RecallQuery,
    SaveTurn,
    Thread,
)


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

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        if not isinstance(self.storage, MessageLookup):
            raise TypeError(f"{type(self.storage).__name__} cannot look messages up by id")
        return await self.storage.get_messages(message_ids, thread_ids=thread_ids)

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
