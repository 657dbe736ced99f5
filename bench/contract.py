"""B4: the contract's floor, the MongoDB commands each path must send per batch by its contract, raw driver.

B2 raw and B3 raw are the issue's floors: the recall's two finds, the persist's ownership find and two bulk
writes. The service's contract asks for more per batch, and these are the commands it sends for it today:

* recall (`b4_recall_contract`): trip 1, issued together, B2's two finds and the busy-thread markers' look-up
  (`message_history_turns`, `_id $in` the batch's threads: the barrier and the busy-thread policy need to know
  which thread has a turn in flight, `storage.turns.MongoTurnMarkers.get_many`); trip 2, the busy marks, one
  ordered `bulk_write` of `$set pending` upserts (`MongoTurnMarkers.mark`, coalesced per batch).
* persist (`b4_persist_contract`): trip 1, issued together, the `find` on `mastra_messages` by the turns'
  message ids (their homes: a message id owned by another thread refuses its turn; and the stored copies, one
  find for both: `MongoSaves.read_with_copies`), the ownership `find` on `mastra_threads`, and the tombstones'
  `find` by `_id` (`message_history_forgotten`: a turn made before a forget is never written,
  `storage.forgetting.Forgetting.tombstones`); trip 2, issued together, the messages' unordered bulk of
  upserts (by `_id`) and the existing threads' (by their stored `_id`, `$max updatedAt`):
  `MongoSaves.save_many`.

The same filters, projections, sorts, limits and batch sizes as the service's storage, replies kept raw
(`RawBSONDocument`, never decoded), the operations built before the clock starts: no model of ours. One
thread's shapes (`{"id": tid}`, the recall page filtered on its resource) are the service's for a batch of
one (the idle line's forwarder with the contract's trips, `bench.passthrough`). Not in the persist line: the
busy markers' `answered` pipeline update the persist path sends after its output (busy-thread `enqueue`, off
the latency path): the floor is the brief's, and lower for it.

The builders are pure; `recall_trips` and `persist_trips` issue the commands (`db` is raw-coded).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from bson.raw_bson import RawBSONDocument
from pymongo import UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from storage.documents import EXTRA_FIELD, MESSAGES, THREADS
from storage.forgetting import TOMBSTONES
from storage.recalled_rows import MESSAGE_PROJECTION
from storage.turns import TURNS

__all__ = [
    "CONTRACT_HEADER",
    "PersistTrips",
    "RecallTrips",
    "Turn",
    "busy_marks",
    "persist_plan",
    "persist_trips",
    "recall_finds",
    "recall_plan",
    "recall_trips",
    "stored_content",
    "thread_keys",
    "turn_from_header",
    "turn_header",
]

CONTRACT_HEADER: Final = "bench-contract"  # the idle line's record for the contract forwarder: its turn
_NEWEST_FIRST: Final = [("createdAt", -1), ("id", -1)]
_TOMBSTONE_FIELDS: Final = {"kind": 1, "threadId": 1, "resourceId": 1, "forgottenAt": 1}


@dataclass(frozen=True, slots=True)
class Turn:
    """What the commands of one turn need: its thread, resource, request id, and its messages' time."""

    thread_id: str
    resource_id: str
    request_id: str
    created_at: datetime


@dataclass(frozen=True)
class RecallTrips:
    """A recall batch's commands: the finds' keys and page size, and the busy marks, prebuilt."""

    thread_ids: list[str]
    resource_ids: list[str]
    limit: int  # rows per thread (the batch's find asks `limit * threads + 1`, as B2 and the prefetch)
    marks: list[UpdateOne]


@dataclass(frozen=True)
class PersistTrips:
    """A persist batch's commands: the finds' keys, and the two bulks' operations, prebuilt."""

    thread_ids: list[str]
    message_ids: list[str]
    tombstone_keys: list[str]
    messages: list[UpdateOne]
    threads: list[UpdateOne]


def recall_plan(turns: Sequence[Turn], limit: int, now: datetime) -> RecallTrips:
    """The batch's recall commands: one mark per thread (its last turn's, as the coalesced marks leave it).
    Pure."""
    latest = {t.thread_id: t for t in turns}
    marks = [
        UpdateOne(
            {"_id": t.thread_id},
            {"$set": {"pending": t.request_id, "enrichedAt": now, "resourceId": t.resource_id}},
            upsert=True,
        )
        for t in latest.values()
    ]
    return RecallTrips(
        thread_ids=list(latest),
        resource_ids=list(dict.fromkeys(t.resource_id for t in turns)),
        limit=limit,
        marks=marks,
    )


def persist_plan(
    turns: Sequence[Turn],
    contents: Sequence[tuple[str, str]],
    thread_keys: Mapping[str, Any],
    *,
    suffix: str = "",
) -> PersistTrips:
    """The batch's persist commands, shaped as `storage.save_plan` shapes them: per turn a user and an
    assistant message (ids: the turn's request id, `:in` / `:out`, then `suffix`), their stored `content`
    strings in `contents` (one pair per turn); each thread keyed by its stored `_id` (`thread_keys`, else its
    id). Pure."""
    messages: list[UpdateOne] = []
    ids: list[str] = []
    newest: dict[str, tuple[Turn, datetime, datetime]] = {}
    for t, pair in zip(turns, contents, strict=True):
        for role, side, content in (("user", "in", pair[0]), ("assistant", "out", pair[1])):
            ident = f"{t.request_id}:{side}{suffix}"
            ids.append(ident)
            fields = {
                "id": ident,
                "thread_id": t.thread_id,
                "content": content,
                "role": role,
                "type": "v2",
                "resourceId": t.resource_id,
            }
            update = {
                "$set": fields,
                "$setOnInsert": {"createdAt": t.created_at},
                "$unset": {EXTRA_FIELD: ""},
            }
            messages.append(UpdateOne({"_id": ident}, update, upsert=True))
        _, first, last = newest.get(t.thread_id, (t, t.created_at, t.created_at))
        newest[t.thread_id] = (t, min(first, t.created_at), max(last, t.created_at))
    threads = [
        UpdateOne(
            {"_id": thread_keys.get(thread_id, thread_id)},
            {
                "$setOnInsert": {
                    "id": thread_id,
                    "resourceId": t.resource_id,
                    "title": "",
                    "metadata": {},
                    "createdAt": first,
                },
                "$max": {"updatedAt": last},
            },
            upsert=True,
        )
        for thread_id, (t, first, last) in newest.items()
    ]
    thread_ids = list(newest)
    resources = list(dict.fromkeys(t.resource_id for t in turns))
    tombstones = [f"thread:{t}" for t in thread_ids] + [f"resource:{r}" for r in resources]
    return PersistTrips(thread_ids, ids, tombstones, messages, threads)


def stored_content(text: str) -> str:
    """A message's `content` as the storage keeps it: the content object's compact JSON. Pure."""
    return json.dumps({"format": 2, "parts": [{"type": "text", "text": text}]}, separators=(",", ":"))


def _by(field_name: str, values: Sequence[str]) -> dict[str, Any]:
    """The storage's filter on `values`: equality for one, `$in` for more (`MongoThreads._get_threads`)."""
    return {field_name: values[0]} if len(values) == 1 else {field_name: {"$in": list(values)}}


async def recall_trips(db: AsyncDatabase[RawBSONDocument], trips: RecallTrips) -> int:
    """Trip 1: the threads, the newest messages and the busy markers, together; trip 2: the busy marks. The
    number of message rows read."""
    found = await recall_finds(db, trips)
    await busy_marks(db, trips)
    return found


async def recall_finds(db: AsyncDatabase[RawBSONDocument], trips: RecallTrips) -> int:
    """The recall's trip 1: the threads, the newest messages and the busy markers, together; rows read."""
    ids = trips.thread_ids
    threads = db[THREADS].find(_by("id", ids), batch_size=len(ids) + 1).to_list()
    if len(ids) == 1:  # one thread: the storage's page query (`MongoRecall._find_page`)
        query: dict[str, Any] = {"thread_id": ids[0], "resourceId": trips.resource_ids[0]}
        page = db[MESSAGES].find(query, MESSAGE_PROJECTION).sort(_NEWEST_FIRST)
        messages = page.limit(trips.limit).batch_size(trips.limit).to_list()
    else:  # B2's find, unchanged
        cap = trips.limit * len(ids) + 1
        newest = db[MESSAGES].find({"thread_id": {"$in": ids}}, {"_id": 0}).sort(_NEWEST_FIRST)
        messages = newest.limit(cap).batch_size(cap).to_list()
    markers = db[TURNS].find({"_id": {"$in": ids}}).to_list()
    _, found, _ = await asyncio.gather(threads, messages, markers)
    return len(found)


async def busy_marks(db: AsyncDatabase[RawBSONDocument], trips: RecallTrips) -> None:
    """The recall's trip 2: the busy marks, one ordered bulk (`MongoTurnMarkers`' coalesced marks)."""
    await db[TURNS].bulk_write(trips.marks, ordered=True)


async def persist_trips(db: AsyncDatabase[RawBSONDocument], trips: PersistTrips) -> None:
    """Trip 1: the messages' homes and copies, the threads, the tombstones, together; trip 2: the messages'
    and the threads' bulks, together."""
    ids, thread_ids = trips.message_ids, trips.thread_ids
    await asyncio.gather(
        db[MESSAGES].find(_by("id", ids), MESSAGE_PROJECTION, batch_size=len(ids) + 1).to_list(),
        db[THREADS].find(_by("id", thread_ids), batch_size=len(thread_ids) + 1).to_list(),
        db[TOMBSTONES].find({"_id": {"$in": trips.tombstone_keys}}, _TOMBSTONE_FIELDS).to_list(),
    )
    await asyncio.gather(
        db[MESSAGES].bulk_write(trips.messages, ordered=False),
        db[THREADS].bulk_write(trips.threads, ordered=False),
    )


async def thread_keys(db: AsyncDatabase[Any], thread_ids: Sequence[str]) -> dict[str, Any]:
    """The stored `_id` of each thread among `thread_ids` (read before any clock starts)."""
    keys: dict[str, Any] = {}
    for start in range(0, len(thread_ids), 10_000):
        chunk = list(thread_ids[start : start + 10_000])
        async for doc in db[THREADS].find({"id": {"$in": chunk}}, {"_id": 1, "id": 1}):
            keys[str(doc["id"])] = doc["_id"]
    return keys


# --- the idle line's record: its turn, in a header ------------------------------------------------------


def turn_header(turn: Turn) -> bytes:
    """The header telling the contract forwarder the turn a record stands for. Pure."""
    return json.dumps(
        [turn.thread_id, turn.resource_id, turn.request_id, turn.created_at.isoformat()],
        separators=(",", ":"),
    ).encode()


def turn_from_header(headers: Sequence[tuple[str, bytes]] | None) -> Turn | None:
    """The turn `turn_header` wrote among `headers`; None without one. Pure."""
    for key, value in headers or ():
        if key == CONTRACT_HEADER:
            thread, resource, request, created = json.loads(value)
            at = datetime.fromisoformat(created)
            return Turn(thread, resource, request, at if at.tzinfo else at.replace(tzinfo=UTC))
    return None
