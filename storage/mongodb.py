"""`MongoHistoryStorage`: `HistoryStorage` on PyMongo's `AsyncMongoClient`, in @mastra/mongodb's layout.

A Mastra application using `@mastra/mongodb` and this service share one database and one history
(docs/events.md#14-storage-layout). Documents are written as `MemoryStorageMongoDB` (1.19) writes them:

    mastra_messages  {id, thread_id, resourceId, role, type ('v2' unless the message has another),
                      content (JSON string of the format-2 content), createdAt (BSON Date)}
    mastra_threads   {id, resourceId, title, metadata (object), createdAt (Date), updatedAt (Date)}

Top-level message keys that Mastra's row has no column for (unknown keys of the `Message`) are kept in one
more field, `_mh_extra`, holding their JSON text. Mastra's `parseRow` picks its own fields by name and
never sees it, and JSON text keeps any key as it came (dotted or `$`-prefixed keys included).

This module is the one storage class: its constructor and `open`; each job, with its round trips, is a
module of its own, which the class is made of:

* `storage.mongo_collections`: the collections (as documents and as raw replies), `ping`, the indexes;
* `storage.mongo_recall`: the message reads (recall pages, budgeted pages, stored copies by id), with
  `storage.raw_owner` sorting a batch's `$in` reply to its threads;
* `storage.mongo_threads`: threads read by id, their metadata's keys set (the token boundary);
* `storage.mongo_saves`: `save_many`, its ownership read, plan (`storage.save_plan`) and writes;
* `storage.mongo_upserts`: the unordered bulk upserts every write goes through.

Forgetting and pruning (`storage.forgetting`, `storage.pruning`) work on the same collections beside it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from schemas.messages import Message
from storage.client import mongo_client
from storage.mongo_collections import RecallStrategy
from storage.mongo_recall import MongoRecall
from storage.mongo_saves import MongoSaves
from storage.protocol import BatchHistoryStorage, Thread, save_one

if TYPE_CHECKING:
    from message_history.settings import Settings

__all__ = ["MongoHistoryStorage", "RecallStrategy"]


class MongoHistoryStorage(MongoRecall, MongoSaves, BatchHistoryStorage):
    """`mastra_threads` / `mastra_messages`: a `BatchHistoryStorage` (six operations, their batch forms).

    `recall_strategy` picks how `list_messages_many` reads: `"in"` (one `$in` query, the default) or
    `"concurrent"` (one query per thread, at most `recall_concurrency` in flight).
    """

    def __repr__(self) -> str:
        return f"MongoHistoryStorage(db={self.db.name!r}, recall_strategy={self.recall_strategy!r})"

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        """Upsert `messages` by id and touch the thread (see `save_many`); raises `ThreadOwnershipError`."""
        return await save_one(self, thread_id=thread_id, resource_id=resource_id, messages=messages)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        settings: Settings,
        *,
        recall_strategy: RecallStrategy = "in",
        appname: str = "message-history",
        create_indexes: bool = True,
    ) -> AsyncIterator[MongoHistoryStorage]:
        """Connect with the settings' timeouts, ping (fail fast), ensure indexes (unless told not to: a dry
        run changes nothing); close the client on exit."""
        client = mongo_client(settings, appname=appname)
        try:
            storage = cls(client[settings.mongodb_database], recall_strategy=recall_strategy)
            await storage.ping()
            if create_indexes:
                await storage.ensure_indexes()
            yield storage
        finally:
            await client.close()
