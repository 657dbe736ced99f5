"""`mastra_observational_memory` as `@mastra/mongodb` 1.19 writes and reads it, plus the service's claims.

One row per generation of a lookup key (`thread:<threadId>`, or `resource:<resourceId>` with resource scope);
the newest generation (highest `generationCount`) is the live one. The fields, their defaults and how each is
read back are `MemoryStorageMongoDB`'s (`initializeObservationalMemory`, `updateActiveObservations`,
`createReflectionGeneration`, `parseOMDocument`), so a Mastra app with Observational Memory on the same
database reads the service's observations and the service reads the app's (tests/integration/
test_observational_storage.py; docs/observational-memory.md).

The service adds what Mastra lacks for work done elsewhere, in two top-level fields Mastra neither reads nor
overwrites (its updates `$set` named fields only):

* `_mh_cycle`: a counter bumped by every claim; a result applies only to the claim it answers
  (`generationCount` and `_mh_cycle` equal, the flag still set), so a late, repeated or superseded answer
  changes nothing;
* `_mh_claimed_at`: when the flag was set; a claim older than the timeout is taken again (a crashed or slow
  observer never leaves `isObserving` stuck). A flag set by a Mastra app has no claim time: its `updatedAt`
  stands in;
* `_mh_claimed_by`: the request whose saved turn made the claim, so that the same turn redelivered (its batch
  retried after a failed send, or the service restarted between the claim and its commit) sends the claim's
  work again instead of waiting out the timeout.

Rows are input: each is decoded alone and read as Mastra reads it (`storage.observational_rows`), and one no
Mastra would read is skipped and counted (`storage.unreadable`), never a crash.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core.observation_hints import StoredStamp
from schemas.observational import Scope
from storage.errors import storage_errors
from storage.observational_resource import (
    THREAD_PAGE_INDEX,
    Position,
    ThreadPage,
    ThreadRead,
    hint_rows,
    resource_cursors,
    resource_messages,
    resource_threads,
    write_cursors,
    write_threads,
    write_titles,
)
from storage.observational_rows import (
    CLAIMED_AT,
    CLAIMED_BY,
    CYCLE,
    OBSERVATIONAL,
    THREADS_AFTER,
    ObservationalRecord,
    readable_record,
    record_from_doc,
    record_from_raw,
)
from storage.observed_stamps import observed_stamps
from storage.raw_rows import RAW, decode_row

__all__ = [
    "CLAIM_TIMEOUT",
    "OBSERVATIONAL",
    "Claim",
    "ClaimOutcome",
    "MongoObservationalStore",
    "ObservationUpdate",
    "ObservationalRecord",
    "forget_observations",
    "lookup_key",
    "record_from_doc",
]

MESSAGES: Final = "mastra_messages"
THREADS: Final = "mastra_threads"
CLAIM_TIMEOUT: Final = timedelta(minutes=5)
"""How long a claim holds before another may take it (an observer answers well within it, or is retried)."""
_READ_BACK: Final = 5  # newest generations read to find a readable one past unreadable rows

Kind = Literal["observe", "reflect"]
ClaimOutcome = Literal["held", "settled", "reflected"]
_FLAGS: Final[dict[str, str]] = {"observe": "isObserving", "reflect": "isReflecting"}


def lookup_key(thread_id: str | None, resource_id: str) -> str:
    """`getOMKey`: `thread:<id>` for a thread's record, `resource:<id>` for a resource-scoped one."""
    return f"thread:{thread_id}" if thread_id else f"resource:{resource_id}"


@dataclass(frozen=True, slots=True)
class Claim:
    """The right to have one observation (reflection) applied: the row, its generation, the cycle."""

    record_id: str
    generation: int
    cycle: int
    kind: Kind


@dataclass(frozen=True, slots=True)
class ObservationUpdate:
    """What an observation writes: Mastra's `UpdateActiveObservationsInput` (the row is the claim's)."""

    observations: str  # the whole log after this cycle
    token_count: int  # the log's tokens, as Mastra OM counts them
    last_observed_at: datetime
    observed_message_ids: Sequence[str]


class MongoObservationalStore:
    """Reads and conditional writes of `mastra_observational_memory` (one instance per database)."""

    def __init__(self, db: AsyncDatabase[Any], *, claim_timeout: timedelta = CLAIM_TIMEOUT) -> None:
        self._rows: AsyncCollection[Any] = db[OBSERVATIONAL]
        self._raw: AsyncCollection[RawBSONDocument] = db.get_collection(OBSERVATIONAL, codec_options=RAW)
        self._timeout = claim_timeout

    async def ensure_indexes(self) -> None:
        """@mastra/mongodb's own two indexes: `id` unique, `(lookupKey, generationCount desc)`; and the
        service's `_mh_claimed_at` (the stale-claim sweep's range; Mastra neither reads nor minds it); and on
        `mastra_threads` the service's `{resourceId, updatedAt, id}`, resource scope's thread pages."""
        with storage_errors("om indexes"):
            await self._rows.create_index([("id", ASCENDING)], unique=True)
            await self._rows.create_index([("lookupKey", ASCENDING), ("generationCount", DESCENDING)])
            await self._rows.create_index([(CLAIMED_AT, ASCENDING)])
            await self._rows.database[THREADS].create_index(list(THREAD_PAGE_INDEX))

    async def stale_claims(self, cutoff: datetime, limit: int) -> list[ObservationalRecord]:
        """The rows whose claim the service made before `cutoff` and still holds, oldest claim first, at
        most `limit` (a range on the `_mh_claimed_at` index: a settled claim has it null, a Mastra app's
        flag has none, so neither is in the range). Unreadable rows are skipped (and counted)."""
        with storage_errors("om read"):
            rows = (
                await self._raw.find({CLAIMED_AT: {"$lt": cutoff}})
                .sort(CLAIMED_AT, ASCENDING)
                .limit(limit)
                .to_list()
            )
        return [record for raw in rows if (record := readable_record(raw)) is not None]

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None:
        """`getObservationalMemory`: the newest readable generation of the key (unreadable ones skipped)."""
        key = lookup_key(thread_id, resource_id)
        with storage_errors("om read"):
            cursor = self._raw.find({"lookupKey": key}).sort("generationCount", DESCENDING).limit(_READ_BACK)
            rows = await cursor.to_list()
        for raw in rows:
            record = readable_record(raw)
            if record is not None:
                return record
        return None

    async def history(
        self, thread_id: str | None, resource_id: str, limit: int = 10
    ) -> list[ObservationalRecord]:
        """`getObservationalMemoryHistory`: the readable generations, newest first."""
        key = lookup_key(thread_id, resource_id)
        with storage_errors("om read"):
            rows = (
                await self._raw.find({"lookupKey": key})
                .sort("generationCount", DESCENDING)
                .limit(limit)
                .to_list()
            )
        return [record for raw in rows if (record := readable_record(raw)) is not None]

    async def initialize(
        self,
        *,
        scope: Scope,
        thread_id: str | None,
        resource_id: str,
        config: Mapping[str, Any],
        now: datetime,
        observed_timezone: str | None = None,
    ) -> ObservationalRecord:
        """`initializeObservationalMemory`: generation 0, Mastra's document field for field (idempotent: an
        existing generation 0 of the key is kept and returned)."""
        key = lookup_key(thread_id, resource_id)
        first = _first_generation(key, scope, resource_id, thread_id or None, config, observed_timezone, now)
        return await self._insert_once(first, "om initialize")

    async def claim(
        self, record: ObservationalRecord, kind: Kind, now: datetime, *, by: str | None = None
    ) -> Claim | None:
        """Set `isObserving` (`isReflecting`) on the row if no live claim holds it; None when one does. `by`:
        the request making it (`ObservationalRecord.claimed_by` when read back)."""
        flag = _FLAGS[kind]
        cutoff = now - self._timeout
        free = [
            {flag: {"$ne": True}},
            {CLAIMED_AT: {"$lt": cutoff}},
            {CLAIMED_AT: None, "updatedAt": {"$lt": cutoff}},
        ]
        with storage_errors("om claim"):
            found = await self._rows.find_one_and_update(
                {"id": record.id, "generationCount": record.generation, "$or": free},
                {"$set": {flag: True, CLAIMED_AT: now, CLAIMED_BY: by, "updatedAt": now}, "$inc": {CYCLE: 1}},
                projection={CYCLE: 1, "_id": 0},
                return_document=ReturnDocument.AFTER,
            )
        if found is None:
            return None
        return Claim(record.id, record.generation, int(found[CYCLE]), kind)

    async def claim_outcome(self, claim: Claim) -> ClaimOutcome:
        """Where `claim` stands (a replay with `--observe` waits for it): `held` while its flag is set under
        its cycle or a later one (a claim that timed out and was taken again, by the sweep say: the same
        work, re-sent); `reflected` once a reflection's next generation exists (its answer settles the claim,
        then inserts that row: both are waited for); else `settled` (applied, released, forgotten)."""
        flag = _FLAGS[claim.kind]
        with storage_errors("om read"):
            row = await self._rows.find_one(
                {"id": claim.record_id}, {flag: 1, CYCLE: 1, "lookupKey": 1, "_id": 0}
            )
            if row is None:
                return "settled"
            cycle = row.get(CYCLE)
            # `type() is int`: a hand-written `true` is no cycle (bool is an int subclass)
            if row.get(flag) is True and type(cycle) is int and cycle >= claim.cycle:
                return "held"
            key = row.get("lookupKey")
            # only a string is looked up: a row's object there would be a query operator ({"$ne": null})
            if claim.kind == "reflect" and isinstance(key, str):
                newer = await self._rows.find_one(
                    {"lookupKey": key, "generationCount": claim.generation + 1}, {"_id": 1}
                )
                if newer is not None:
                    return "reflected"
        return "settled"

    async def release(self, claim: Claim, now: datetime) -> bool:
        """Give a claim back unused (the observer failed for good): the flag cleared if still this claim's."""
        return await self._settle(claim, {"updatedAt": now})

    async def drop_claim_time(self, record_id: str, cycle: int) -> bool:
        """The claim time (and maker) of a row whose flags someone else cleared (a Mastra app's own write
        `$set`s the flag, not the service's fields), if still that cycle's: off the stale-claim sweep."""
        with storage_errors("om apply"):
            result = await self._rows.update_one(
                {"id": record_id, CYCLE: cycle, "isObserving": {"$ne": True}, "isReflecting": {"$ne": True}},
                {"$set": {CLAIMED_AT: None, CLAIMED_BY: None}},
            )
        return result.matched_count == 1

    async def apply_observation(self, claim: Claim, update: ObservationUpdate, now: datetime) -> bool:
        """`updateActiveObservations` for the claim it answers (False and nothing written if not current).

        As Mastra: the log and its token count replaced, `lastObservedAt` and `observedMessageIds` set,
        `pendingMessageTokens` zeroed, `totalTokensObserved` increased by the log's token count.
        """
        count = update.token_count if update.token_count >= 0 else 0
        fields = {
            "activeObservations": update.observations,
            "lastObservedAt": update.last_observed_at,
            "pendingMessageTokens": 0,
            "observationTokenCount": count,
            "observedMessageIds": list(update.observed_message_ids),
            "updatedAt": now,
        }
        return await self._settle(claim, fields, {"totalTokensObserved": count})

    async def apply_reflection(
        self, claim: Claim, *, reflection: str, token_count: int, now: datetime
    ) -> ObservationalRecord | None:
        """`createReflectionGeneration` for the claim it answers: the claim settled, then generation g + 1
        inserted once (an upsert on the key and generation). None when the claim is not current."""
        with storage_errors("om reflect"):
            settled_raw = await self._raw.find_one_and_update(
                {**_claimed(claim), "isReflecting": True},
                {"$set": {"isReflecting": False, CLAIMED_AT: None, CLAIMED_BY: None, "updatedAt": now}},
                return_document=ReturnDocument.AFTER,
            )
        if settled_raw is None:
            return None
        settled = decode_row(settled_raw.raw, OBSERVATIONAL)
        current = record_from_doc(settled)
        first = _first_generation(
            current.lookup_key,
            current.scope,
            current.resource_id,
            current.thread_id,
            current.config,
            settled.get("observedTimezone"),
            now,
        )
        document = {
            **first,  # the keys keep Mastra's order; these are the reflection's own values
            "activeObservations": reflection,
            "originType": "reflection",
            "generationCount": current.generation + 1,
            "lastObservedAt": current.last_observed_at,
            "lastReflectionAt": now,
            "totalTokensObserved": current.total_tokens_observed,
            "observationTokenCount": token_count,
            "metadata": current.metadata,
        }
        return await self._insert_once(document, "om reflect")

    async def set_pending_tokens(self, record_id: str, tokens: int, now: datetime) -> None:
        """`setPendingMessageTokens`: the unobserved tokens counted so far (a finite, non-negative count)."""
        if tokens < 0:
            raise ValueError(f"pending tokens must be non-negative, got {tokens}")
        with storage_errors("om pending"):
            await self._rows.update_one(
                {"id": record_id}, {"$set": {"pendingMessageTokens": tokens, "updatedAt": now}}
            )

    async def covered(self, record: ObservationalRecord) -> int:
        """How many stored messages the record's log covers: its thread's (its resource's, with resource
        scope) up to `lastObservedAt`, and the last cycle's `observedMessageIds` after it (one count)."""
        if record.last_observed_at is None and not record.observed_message_ids:
            return 0
        owner: dict[str, Any] = (
            {"thread_id": record.thread_id} if record.thread_id else {"resourceId": record.resource_id}
        )
        either: list[dict[str, Any]] = [{"id": {"$in": list(record.observed_message_ids)}}]
        if record.last_observed_at is not None:
            either.append({"createdAt": {"$lte": record.last_observed_at}})
        with storage_errors("om read"):
            return await self._rows.database[MESSAGES].count_documents({**owner, "$or": either})

    async def resource_cursors(self, resource_id: str, max_threads: int) -> dict[str, datetime | None]:
        """The resource's threads and their cursors (`storage.observational_resource`)."""
        return await resource_cursors(self._rows.database, resource_id, max_threads)

    async def resource_threads(
        self, resource_id: str, limit: int, after: Position | None, *, include: str | None = None
    ) -> ThreadPage:
        """The next page of the resource's threads after `after` (`storage.observational_resource`)."""
        return await resource_threads(self._rows.database, resource_id, limit, after, include=include)

    async def keep_threads_after(self, record_id: str, after: Position | None) -> None:
        """Where the row's next thread page starts (`THREADS_AFTER`): a hint, written unconditionally (two
        writers racing lose one page's move, nothing else); None: from the newest again."""
        update: dict[str, Any] = (
            {"$unset": {THREADS_AFTER: ""}}
            if after is None
            else {"$set": {THREADS_AFTER: {"at": after[0], "id": after[1]}}}
        )
        with storage_errors("om write"):
            await self._rows.update_one({"id": record_id}, update)

    async def resource_messages(
        self, resource_id: str, cursors: Mapping[str, datetime | None], limit: int
    ) -> list[dict[str, Any]]:
        """One page of the resource's messages past their threads' cursors, oldest first."""
        return await resource_messages(self._rows.database, resource_id, cursors, limit)

    async def write_cursors(
        self,
        resource_id: str,
        cursors: Sequence[tuple[str, datetime | None, Mapping[str, object]]],
        now: datetime,
    ) -> int:
        """The threads' cursors (and hints) set, the resource's threads only."""
        return await write_cursors(self._rows.database, resource_id, cursors, now)

    async def hint_rows(self, resource_id: str, thread_ids: Sequence[str]) -> dict[str, ThreadRead]:
        """What an observation's write reads of the resource's threads (`storage.observational_resource`)."""
        return await hint_rows(self._rows.database, resource_id, thread_ids)

    async def write_titles(
        self, resource_id: str, titles: Sequence[tuple[str, str, object]], now: datetime
    ) -> int:
        """The threads' titles set where still as read and not pinned, the resource's threads only."""
        return await write_titles(self._rows.database, resource_id, titles, now)

    async def write_threads(
        self,
        resource_id: str,
        cursors: Sequence[tuple[str, datetime | None, Mapping[str, object]]],
        titles: Sequence[tuple[str, str, object]],
        now: datetime,
    ) -> int:
        """`write_cursors` and `write_titles` in one bulk write."""
        return await write_threads(self._rows.database, resource_id, cursors, titles, now)

    async def message_stamps(
        self, message_ids: Sequence[str], thread_ids: Collection[str], resource_id: str
    ) -> list[StoredStamp]:
        """The observed messages' places for their threads' cursors (`storage.observed_stamps`)."""
        return await observed_stamps(self._rows.database, message_ids, thread_ids, resource_id)

    async def clear(self, thread_id: str | None, resource_id: str) -> int:
        """`clearObservationalMemory`: every generation of the key deleted (forget)."""
        with storage_errors("om clear"):
            result = await self._rows.delete_many({"lookupKey": lookup_key(thread_id, resource_id)})
        return result.deleted_count

    async def clear_resource(self, resource_id: str) -> int:
        """Forget a resource: its resource-scoped rows and every thread-scoped row it owns."""
        with storage_errors("om clear"):
            result = await self._rows.delete_many(
                {"$or": [{"lookupKey": lookup_key(None, resource_id)}, {"resourceId": resource_id}]}
            )
        return result.deleted_count

    async def _insert_once(self, document: dict[str, Any], what: str) -> ObservationalRecord:
        """The document's generation of its key, inserted unless it exists (an upsert: a repeated insert
        returns the stored row unchanged), read back."""
        with storage_errors(what):
            found = await self._raw.find_one_and_update(
                {"lookupKey": document["lookupKey"], "generationCount": document["generationCount"]},
                {"$setOnInsert": document},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        assert found is not None  # an upsert returning the document after it
        return record_from_raw(found)

    async def _settle(self, claim: Claim, fields: dict[str, Any], inc: dict[str, Any] | None = None) -> bool:
        flag = _FLAGS[claim.kind]
        update: dict[str, Any] = {"$set": {**fields, flag: False, CLAIMED_AT: None, CLAIMED_BY: None}}
        if inc:
            update["$inc"] = inc
        with storage_errors("om apply"):
            result = await self._rows.update_one({**_claimed(claim), flag: True}, update)
        return result.matched_count == 1


def _first_generation(
    key: str,
    scope: str,
    resource_id: str,
    thread_id: str | None,
    config: Mapping[str, Any],
    observed_timezone: str | None,
    now: datetime,
) -> dict[str, Any]:
    """Generation 0 of a key as `initializeObservationalMemory` writes it (Mastra's fields, in its order)."""
    return {
        "id": str(uuid.uuid4()),
        "lookupKey": key,
        "scope": scope,
        "resourceId": resource_id,
        "threadId": thread_id,
        "activeObservations": "",
        "activeObservationsPendingUpdate": None,
        "originType": "initial",
        "config": dict(config),
        "generationCount": 0,
        "lastObservedAt": None,
        "lastReflectionAt": None,
        "pendingMessageTokens": 0,
        "totalTokensObserved": 0,
        "observationTokenCount": 0,
        "isObserving": False,
        "isReflecting": False,
        "isBufferingObservation": False,
        "isBufferingReflection": False,
        "lastBufferedAtTokens": 0,
        "lastBufferedAtTime": None,
        "observedTimezone": observed_timezone,
        "createdAt": now,
        "updatedAt": now,
    }


def _claimed(claim: Claim) -> dict[str, Any]:
    return {"id": claim.record_id, "generationCount": claim.generation, CYCLE: claim.cycle}


async def forget_observations(
    db: AsyncDatabase[Any], *, thread_id: str | None = None, resource_id: str | None = None
) -> int:
    """Forget's erasure of Observational Memory (`storage.forgetting`): a thread's rows (Mastra's
    `clearObservationalMemory`), or a resource's: its resource-scoped rows and every row it owns."""
    store = MongoObservationalStore(db)
    if thread_id is not None:
        return await store.clear(thread_id, "")
    if resource_id is None:
        raise ValueError("forget_observations needs a thread_id or a resource_id")
    return await store.clear_resource(resource_id)


async def open_observational(db: Any, claim_timeout_s: float) -> MongoObservationalStore:
    """`mastra_observational_memory` on `db`, its indexes made (the service's and replay's one way in)."""
    store = MongoObservationalStore(db, claim_timeout=timedelta(seconds=claim_timeout_s))
    await store.ensure_indexes()
    return store
