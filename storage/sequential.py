"""The batch forms over any `HistoryStorage`, one call per item (embedded use, tests, a fallback)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from message_history.errors import DocumentRefusedError, InvalidInputError, ThreadOwnershipError
from schemas.messages import Message
from storage.protocol import (
    BatchHistoryStorage,
    HistoryStorage,
    Page,
    PageQuery,
    RecallQuery,
    SaveTurn,
    Thread,
)


class SequentialBatches(BatchHistoryStorage):
    """A `BatchHistoryStorage` over a plain `HistoryStorage`: each batch form is one call per item."""

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

    async def list_page(self, query: PageQuery) -> Page:
        return await self.storage.list_page(query)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        await self.storage.save_thread_metadata(thread_id, update)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        return await self.storage.get_messages(message_ids, thread_ids=thread_ids)

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

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
        out: list[Thread | InvalidInputError] = []
        for turn in turns:
            try:
                out.append(
                    await self.storage.save_messages(
                        thread_id=turn.thread_id, resource_id=turn.resource_id, messages=turn.messages
                    )
                )
            except (ThreadOwnershipError, DocumentRefusedError) as exc:
                out.append(exc)
        return out

    # through this class's own single forms, so that a subclass observing them (tests count calls) sees
    # the paging rounds and boundary writes whichever form the caller used
    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        return [await self.list_page(query) for query in queries]

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        for thread_id, update in updates:
            await self.save_thread_metadata(thread_id, update)
