"""The storage's two collections, each as documents and as raw replies, their indexes, and the ping.

`MongoCollections` is the base every job of `storage.mongodb.MongoHistoryStorage` builds on: the threads and
messages collections with the service's codec (writes) and as raw BSON replies (reads, decoded row by row:
`storage.raw_rows`), the recall options, `ping` and `ensure_indexes` (@mastra/mongodb 1.19's memory indexes
and recall's, idempotent, either side may go first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from bson.raw_bson import RawBSONDocument
from pymongo import IndexModel, timeout
from pymongo.errors import OperationFailure

from message_history.errors import FatalStorageError
from storage.client import CODEC
from storage.documents import MESSAGES, THREADS
from storage.errors import storage_errors
from storage.raw_rows import RAW

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

__all__ = ["MESSAGE_INDEXES", "THREAD_INDEXES", "MongoCollections", "RecallStrategy"]

# @mastra/mongodb 1.19 `getDefaultIndexDefinitions` (memory domain). Mastra does not name them, so the
# drivers' generated names apply (`id_1`, `thread_id_1_createdAt_1`, ...); PyMongo generates the same names,
# so `createIndexes` from either side is a no-op for the other.
MESSAGE_INDEXES: tuple[IndexModel, ...] = (
    IndexModel([("id", 1)], unique=True),
    IndexModel([("thread_id", 1), ("createdAt", 1)]),
    IndexModel([("resourceId", 1), ("createdAt", 1)]),
    # ours: recall's `find({thread_id}).sort(createdAt -1, id -1).limit(n)` walks it backwards, no sort
    IndexModel([("thread_id", 1), ("createdAt", 1), ("id", 1)]),
)
THREAD_INDEXES: tuple[IndexModel, ...] = (
    IndexModel([("id", 1)], unique=True),
    IndexModel([("resourceId", 1), ("createdAt", -1)]),
    IndexModel([("resourceId", 1), ("updatedAt", -1)]),
)

_INDEX_CONFLICT_CODES = frozenset({85, 86})  # IndexOptionsConflict, IndexKeySpecsConflict

RecallStrategy = Literal["in", "concurrent"]


class MongoCollections:
    """`mastra_threads` / `mastra_messages` of `db`, and how `list_messages_many` reads.

    `recall_strategy` picks how `list_messages_many` reads: `"in"` (one `$in` query, the default) or
    `"concurrent"` (one query per thread, at most `recall_concurrency` in flight).
    """

    def __init__(
        self,
        db: AsyncDatabase[Any],
        *,
        recall_strategy: RecallStrategy = "in",
        recall_concurrency: int = 32,
    ) -> None:
        if recall_concurrency < 1:
            raise ValueError("recall_concurrency must be at least 1")
        self.db = db
        self.recall_strategy: RecallStrategy = recall_strategy
        self.recall_concurrency = recall_concurrency
        self.threads: AsyncCollection[dict[str, Any]] = db.get_collection(THREADS, codec_options=CODEC)
        # reads take replies as raw BSON and decode row by row (`storage.unreadable`): one row the codec
        # refuses is that row's fault, never the whole reply's
        self.raw_threads: AsyncCollection[RawBSONDocument] = db.get_collection(THREADS, codec_options=RAW)
        self.messages: AsyncCollection[dict[str, Any]] = db.get_collection(MESSAGES, codec_options=CODEC)
        # the same collection read as reply bytes (naive dates): rows the recall only passes through
        self.raw_messages: AsyncCollection[RawBSONDocument] = db.get_collection(MESSAGES, codec_options=RAW)

    async def ping(self, timeout_s: float | None = None) -> None:
        """One `ping` (within `timeout_s` when given, else the client's timeout); raises
        `StorageUnavailableError` when the server cannot be reached or does not answer in time."""
        with storage_errors("ping"):
            if timeout_s is None:
                await self.db.command("ping")
                return
            with timeout(timeout_s):
                await self.db.command("ping")

    async def ensure_indexes(self) -> None:
        """Create @mastra/mongodb 1.19's memory indexes and recall's; idempotent, either side may go first."""
        await self._ensure(self.messages, MESSAGE_INDEXES)
        await self._ensure(self.threads, THREAD_INDEXES)

    async def _ensure(
        self, collection: AsyncCollection[dict[str, Any]], models: Sequence[IndexModel]
    ) -> None:
        # One index per createIndexes command, and only the missing ones, as Mastra's Node driver does: an
        # existing index under another name (made by Mastra or an operator) then fails only its own command.
        operation = f"createIndexes on {collection.name}"
        with storage_errors(operation):
            existing = [index async for index in await collection.list_indexes()]
        for model in models:
            if _index_present(collection.name, model, existing):
                continue
            with storage_errors(operation):
                try:
                    await collection.create_indexes([model])
                except OperationFailure as exc:
                    if exc.code not in _INDEX_CONFLICT_CODES:
                        raise
                    # Created meanwhile by another process (Mastra's init, another replica), maybe under
                    # another name: fine when it has our keys.
                    existing = [index async for index in await collection.list_indexes()]
                    if not _index_present(collection.name, model, existing):
                        raise


def _index_present(collection: str, model: IndexModel, existing: Sequence[Mapping[str, Any]]) -> bool:
    """True when an index with `model`'s keys exists; raises when it exists in a form we cannot use."""
    spec = model.document
    keys = list(spec["key"].items())
    same_keys = next((ix for ix in existing if list(ix["key"].items()) == keys), None)
    if same_keys is None:
        if any(ix["name"] == spec["name"] for ix in existing):
            raise FatalStorageError(f"{collection} has an index named {spec['name']!r} with other keys")
        return False
    if spec.get("unique") and not same_keys.get("unique"):
        raise FatalStorageError(
            f"{collection} has a non-unique index {same_keys['name']!r} on {dict(keys)}; Mastra and this "
            "service need it unique (remove duplicates, drop it, restart)"
        )
    return True
