"""B2 and B3: the MongoDB work of each path alone, batch after batch, in a process of their own.

The ceilings are the driver's own cost, without a model of ours, so that service / B2 and service / B3 measure
what the service adds:

* B2 raw (`b2`, line `b2_recall_queries`): per batch of `batch` threads, the two commands the recall path's
  prefetch sends, issued together: the threads `find` (`id $in`) and the messages `find` (`thread_id $in`,
  newest first, at most `sum(limits) + 1` rows), with the same filters, sort, limit and batch size as
  `storage.mongodb`, the replies kept as `RawBSONDocument`s (no decoding into dicts, let alone messages).
* B2 with models (`b2_models`, line `b2_recall_models`): the same through the service's storage code
  (`PrefetchedHistory.load`: rows decoded into `Message`s, cut per thread), as B2 was before issue 14.
* B3 raw (`b3`, line `b3_bulk_upserts`): per batch of `batch` turns, the commands the persist path's save
  sends: the ownership `find` on the threads (raw replies), then one unordered `bulk_write` of the message
  upserts and one of the thread upserts, the operations built before the clock starts (the same `$set` /
  `$setOnInsert` / `$unset` / `$max` shape as `storage.mongodb`; threads keyed by `id`).
* B3 with models (`b3_models`, line `b3_save_many`): one `save_many` of the service's storage, of `Message`s.
* B4, the contract's floor (`b4_recall`, `b4_persist`; lines `b4_recall_contract`, `b4_persist_contract`):
  the commands each path must send per batch by its contract, in its two trips (`bench.contract`).

One batch at a time, as the service's loop does per path. Latency samples are whole batch round trips.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from bench import contract
from bench.processes import END, START
from bench.procstat import peak_rss_bytes
from bench.progress import Progress
from bench.workload import Workload, turn_message
from consumers.prefetch import PrefetchedHistory
from message_history.settings import Settings
from schemas.messages import Message
from storage.documents import EXTRA_FIELD, MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery, SaveTurn

KINDS = {
    "b2": "b2_recall_queries",
    "b2_models": "b2_recall_models",
    "b3": "b3_bulk_upserts",
    "b3_models": "b3_save_many",
    "b4_recall": "b4_recall_contract",
    "b4_persist": "b4_persist_contract",
}
_RAW: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
_NEWEST_FIRST = [("createdAt", -1), ("id", -1)]


async def run(config: dict[str, Any]) -> dict[str, Any]:
    """Run one of `KINDS` (`config["kind"]`) for `config["events"]` events or `config["seconds"]`."""
    settings = Settings()
    w = Workload(**config["workload"])
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        settings.mongodb_uri.get_secret_value(), tz_aware=True
    )
    db = client[config["db"]]
    storage = MongoHistoryStorage(db)
    raw_db = db.with_options(codec_options=_RAW)
    events, seconds, kind = config["events"], config["seconds"], config["kind"]
    latencies: list[float] = []
    done = rows = faults = 0
    wall = cpu = 0.0
    progress = Progress(KINDS[kind])
    # the threads' stored `_id`s, which the service's thread writes are keyed by: read before any clock
    keys = (
        await contract.thread_keys(db, [w.thread_id(i) for i in range(w.threads)])
        if kind == "b4_persist"
        else {}
    )
    print(START, file=sys.stderr, flush=True)
    try:
        while done < events and wall < seconds:
            indexes = range(done, min(done + w.batch, events))
            # inputs are built outside the timed part: only the MongoDB work (and, for *_models, our code)
            queries = [RecallQuery(w.thread_id(i), w.resource_id(i), w.history) for i in indexes]
            turns = [_turn(w, i, config["turn"]) for i in indexes] if kind == "b3_models" else []
            ops = _raw_writes(w, indexes, config["turn"]) if kind == "b3" else ([], [])
            trips = _contract_trips(raw_db, kind, w, indexes, config["turn"], keys)
            t0, c0, f0 = (
                time.perf_counter(),
                time.process_time(),
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
            )
            if kind == "b2":
                rows += await _raw_recall(raw_db, queries)
            elif kind == "b2_models":
                history = await PrefetchedHistory.load(storage, queries)
            elif kind == "b3":
                await _raw_save(raw_db, [q.thread_id for q in queries], *ops)
            elif trips is not None:
                rows += await trips()
            else:
                await storage.save_many(turns)
            elapsed = time.perf_counter() - t0
            wall, cpu = wall + elapsed, cpu + time.process_time() - c0
            faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            latencies.append(elapsed * 1000)
            done += len(indexes)
            progress.update(done, events)
            if kind == "b2_models":
                for query in queries:  # answered from the prefetch: no query, a check that it recalled
                    page = await history.newest(query.thread_id, query.resource_id, query.limit)
                    rows += len(page)
    finally:
        print(END, file=sys.stderr, flush=True)
        await client.close()
    details: dict[str, Any] = {"batches": len(latencies), "batch": w.batch}
    if done:
        details["minor_faults_per_event"] = round(faults / done, 1)
    if kind.startswith("b2") or kind == "b4_recall":
        details["recalled_messages"] = rows
    return {
        "events": done,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_bytes": peak_rss_bytes(os.getpid()),
        "latencies_ms": latencies,
        "details": details,
    }


async def _raw_recall(db: AsyncDatabase[RawBSONDocument], queries: Sequence[RecallQuery]) -> int:
    """The prefetch's two finds, concurrently, replies undecoded; the number of message rows read."""
    ids = [q.thread_id for q in queries]
    cap = sum(q.limit or 0 for q in queries) + 1
    threads = db[THREADS].find({"id": {"$in": ids}}, batch_size=len(ids) + 1).to_list()
    newest = db[MESSAGES].find({"thread_id": {"$in": ids}}, {"_id": 0}).sort(_NEWEST_FIRST)
    messages = newest.limit(cap).batch_size(cap).to_list()
    _, found = await asyncio.gather(threads, messages)
    return len(found)


async def _raw_save(
    db: AsyncDatabase[RawBSONDocument],
    thread_ids: list[str],
    messages: list[UpdateOne],
    threads: list[UpdateOne],
) -> None:
    """The save's ownership find (raw replies), then the two unordered bulk upserts, in that order."""
    await db[THREADS].find({"id": {"$in": thread_ids}}, batch_size=len(thread_ids) + 1).to_list()
    await db[MESSAGES].bulk_write(messages, ordered=False)
    await db[THREADS].bulk_write(threads, ordered=False)


def _raw_writes(w: Workload, indexes: range, turn: int) -> tuple[list[UpdateOne], list[UpdateOne]]:
    """The batch's message and thread upserts, shaped as `storage.mongodb` shapes them."""
    messages: list[UpdateOne] = []
    threads: list[UpdateOne] = []
    for i in indexes:
        created: list[datetime] = []
        for role in ("user", "assistant"):
            m = turn_message(w, i, turn, role=role)
            at = datetime.fromisoformat(m["createdAt"]).astimezone(UTC)
            created.append(at)
            fields = {
                "id": m["id"],
                "thread_id": m["threadId"],
                "content": json.dumps(m["content"], separators=(",", ":")),
                "role": role,
                "type": "v2",
                "resourceId": m["resourceId"],
            }
            update = {"$set": fields, "$setOnInsert": {"createdAt": at}, "$unset": {EXTRA_FIELD: ""}}
            messages.append(UpdateOne({"_id": m["id"]}, update, upsert=True))
        thread = {"id": w.thread_id(i), "resourceId": w.resource_id(i), "title": "", "metadata": {}}
        threads.append(
            UpdateOne(
                {"id": w.thread_id(i)},
                {"$setOnInsert": {**thread, "createdAt": min(created)}, "$max": {"updatedAt": max(created)}},
                upsert=True,
            )
        )
    return messages, threads


def _contract_turn(w: Workload, i: int, turn: int) -> contract.Turn:
    """Thread `i`'s turn `turn` as the workload's events carry it (`bench.workload.request_event`)."""
    created = datetime.fromisoformat(turn_message(w, i, turn, role="user")["createdAt"]).astimezone(UTC)
    return contract.Turn(w.thread_id(i), w.resource_id(i), f"{w.thread_id(i)}:t{turn}", created)


def _contract_trips(
    db: AsyncDatabase[RawBSONDocument],
    kind: str,
    w: Workload,
    indexes: range,
    turn: int,
    keys: dict[str, Any],
) -> Callable[[], Awaitable[int]] | None:
    """B4's batch, its commands prebuilt: for `b4_recall` B2's finds (the same page size), the markers' find
    and the busy marks; for `b4_persist` B3's messages (the same ids and contents) and its threads' writes,
    keyed as the service keys them. None for another kind. Calling it issues the commands (rows read)."""
    if kind not in ("b4_recall", "b4_persist"):
        return None
    turns = [_contract_turn(w, i, turn) for i in indexes]
    if kind == "b4_recall":
        return functools.partial(
            contract.recall_trips, db, contract.recall_plan(turns, w.history, datetime.now(UTC))
        )
    contents = [
        tuple(
            json.dumps(turn_message(w, i, turn, role=role)["content"], separators=(",", ":"))
            for role in ("user", "assistant")
        )
        for i in indexes
    ]
    plan = contract.persist_plan(turns, [(u, a) for u, a in contents], keys)

    async def persist() -> int:
        await contract.persist_trips(db, plan)
        return 0

    return persist


def _turn(w: Workload, i: int, turn: int) -> SaveTurn:
    messages = [Message.model_validate(turn_message(w, i, turn, role=role)) for role in ("user", "assistant")]
    return SaveTurn(thread_id=w.thread_id(i), resource_id=w.resource_id(i), messages=messages)
