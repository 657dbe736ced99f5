"""The storage's unordered bulk upserts: keyed by `_id` (else by `id`), one race retried, refusals by index.

Every write of the storage is an idempotent upsert (or `$set`), so a bulk run twice converges: that is what
lets a bulk that met a row Mastra inserted (an ObjectId `_id`) run again keyed by `id`, and one that lost an
upsert race to another writer run once more. A document MongoDB refuses for itself (over 16 MiB after the
update, a validator: `storage.errors.RECORD_CODES`) is named by its operation's index in
`RefusedDocumentsError`; the rest of the unordered bulk is written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError
from pymongo.results import BulkWriteResult

from storage.errors import record_errors, reply_codes, reply_entries, reply_int, to_storage_error
from storage.mongo_collections import MongoCollections
from storage.update_command import Statement, update_statements

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

__all__ = ["MongoUpserts", "RefusedDocumentsError"]

log = logging.getLogger("storage.mongodb")  # the storage's logger, as before its jobs had modules

# Unique-index violation on an upsert (duplicate key). Two writers upserting the same new id race this way.
_UPSERT_RACE_CODES = frozenset({11000, 11001})


class RefusedDocumentsError(Exception):
    """A bulk write MongoDB refused some documents of, each for itself (internal signal: by op index)."""

    def __init__(self, refused: dict[int, str], upserted: set[int]) -> None:
        self.refused = refused
        self.upserted = upserted  # the indices of the operations that inserted
        super().__init__(f"{len(refused)} documents refused")


class _UniqueIndexCollisionError(Exception):
    """An `_id`-keyed upsert met a row with the same `id` under another `_id` (internal signal)."""


class MongoUpserts(MongoCollections):
    """The bulk writes the saves and the thread updates go through."""

    async def _record_bulk_write(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: Callable[[bool], list[Statement]],
        operation: str,
    ) -> dict[int, str]:
        """`_keyed_bulk_write`; the operations MongoDB refused for their own document, by index (the others
        are written: the bulk is unordered)."""
        try:
            await self._keyed_bulk_write(collection, ops, operation)
        except RefusedDocumentsError as exc:
            return exc.refused
        return {}

    async def _keyed_bulk_write(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: Callable[[bool], list[Statement]],
        operation: str,
    ) -> BulkWriteResult | None:
        """The bulk keyed by `_id`; if it collides with a row Mastra inserted, the same bulk keyed by `id`.

        Rows this service inserts have `_id` = their id, so an upsert is a primary-key lookup. A message or
        thread that Mastra inserted has an ObjectId `_id`, so the `_id`-keyed upsert misses it
        and tries to insert a second row with the same `id`, which the unique `id` index refuses. Then the
        whole bulk runs again keyed by `id` as Mastra's own upserts are; every op is an idempotent upsert, so
        the ops of the first attempt that did apply are applied again without change.
        """
        try:
            return await self._bulk_write(collection, ops(False), operation, retry_race=False)
        except _UniqueIndexCollisionError:
            log.debug("%s: a row keyed by ObjectId, rewriting the batch keyed by id", operation)
            return await self._bulk_write(collection, ops(True), operation, retry_race=True)

    async def _bulk_write(
        self,
        collection: AsyncCollection[dict[str, Any]],
        ops: list[Statement],
        operation: str,
        *,
        retry_race: bool,
    ) -> BulkWriteResult | None:
        """One unordered bulk (`storage.update_command`: one `update` command, else `bulk_write`), its
        result (None when the server does not acknowledge writes). A unique-index collision raises
        `_UniqueIndexCollisionError`, or, with `retry_race`, first runs the bulk once more.

        Two writers upserting the same new id can both miss and both insert; the loser gets a duplicate key
        (MongoDB 4.2+ retries that itself for equality filters, other servers may not). Every op here is an
        idempotent upsert, so running the whole batch again is safe and converges.
        """
        for attempt in (1, 2):
            try:
                result = await update_statements(collection, ops, ordered=False)
            except BulkWriteError as exc:
                refused = record_errors(exc)
                if refused is not None:
                    upserted = {reply_int(u.get("index"), -1) for u in reply_entries(exc.details, "upserted")}
                    raise RefusedDocumentsError(refused, upserted) from exc
                codes = set(reply_codes(exc.details))
                if not (codes and codes <= _UPSERT_RACE_CODES):
                    raise to_storage_error(exc, operation) from exc
                collision: BaseException = exc
            except OperationFailure as exc:
                if exc.code not in _UPSERT_RACE_CODES:
                    raise to_storage_error(exc, operation) from exc
                collision = exc
            except PyMongoError as exc:
                raise to_storage_error(exc, operation) from exc
            else:
                return result if result.acknowledged else None
            if not retry_race:
                raise _UniqueIndexCollisionError(operation) from collision
            if attempt == 1:
                log.warning("retrying %s once after a duplicate key on upsert", operation)
                continue
            raise to_storage_error(collision, operation) from collision
        raise AssertionError("unreachable")  # pragma: no cover -- the loop returns or raises
