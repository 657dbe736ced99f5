"""The plain recall decided on reply bytes against the real server: the same bytes as today's route.

Threads of every stored shape (tests/recall_docs.py: this service's writes, Mastra's `JSON.stringify`, older
and broken rows), plus duplicated ids and equal `createdAt`s, are recalled by `RecallHandler` twice over one
`MongoHistoryStorage`: `fast_recall=False` (the reference route: `list_messages_many`, every row a model,
every request through the library's decision `recall_from`) and the default (pages read as BSON bytes,
plain requests decided by `plain_page`).
The published events must be byte-identical; a row no Mastra would read is skipped by both routes alike
(it used to fail them with `FatalStorageError`: issue 31), and counted in `history.skipped`. The property
form over the in-memory storage:
tests/unit/test_recall_plain_equivalence.py.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Sequence
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from message_history.core import recall_plan
from message_history.errors import FatalStorageError
from storage import row_codec
from storage.documents import MESSAGES, message_from_doc
from storage.mongodb import MongoHistoryStorage
from storage.recalled_rows import row_from_doc
from tests.recall_docs import request_for, stored_docs
from tests.unit.test_recall_plain_equivalence import _published

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RESOURCE = "r-plain"
THREADS = 240
MEMORIES: list[dict[str, Any]] = [
    {},
    {"lastMessages": None},
    {"lastMessages": False},
    {"lastMessages": 0},
    {"lastMessages": 1},
    {"lastMessages": 7},
    {"lastMessages": 100},
    {"readOnly": True},
    {"retainFullInput": True, "lastMessages": 12},
]


def _thread_docs(seed: int, thread: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    docs = copy.deepcopy(stored_docs(seed, seed % 30, thread, RESOURCE))
    if seed % 4 == 1:  # a thread of rows in the plain shape only (the others hold odd rows, mostly)
        docs = [d for d in docs if row_from_doc(d, message_from_doc) is not None and d["role"] != "system"]
    if docs and rng.random() < 0.4:  # an id stored twice (no unique index here, as on an old database)
        twin = copy.deepcopy(rng.choice(docs))
        if "createdAt" in twin and not isinstance(twin["createdAt"], str):
            twin["createdAt"] = twin["createdAt"].replace(microsecond=0)
        docs.append(twin)
    if len(docs) > 2 and rng.random() < 0.3:  # two rows in one millisecond
        docs[1]["createdAt"] = docs[0].get("createdAt")
    return docs


def _record(offset: int, thread: str, seed: int, stored_ids: Sequence[str], resource: str = RESOURCE) -> Any:
    request = request_for(seed, thread, resource, stored_ids)
    value = json.loads(request.model_dump_json(exclude_unset=True))
    value["memory"] = dict(MEMORIES[seed % len(MEMORIES)])
    if seed % 2:
        # most turns: the input is newer than the history and kept whole (the plain route's common case)
        value["memory"].setdefault("retainFullInput", True)
        for n, message in enumerate(value["messages"]):
            message["createdAt"] = f"2025-03-01T10:00:00.{n:03d}Z"
    value["requestId"] = f"{thread}:{offset}"
    return type(
        "Rec",
        (),
        {
            "topic": "requests",
            "partition": 0,
            "offset": offset,
            "key": thread.encode(),
            "value": json.dumps(value).encode(),
            "headers": [],
        },
    )()


async def _or_error(storage: MongoHistoryStorage, records: Sequence[Any], *, fast: bool) -> Any:
    try:
        return await _published(storage, records, fast=fast)
    except FatalStorageError as exc:
        return type(exc)


async def _seed(mongo_db: AsyncDatabase[dict[str, Any]]) -> list[list[Any]]:
    """Per thread, its requests (1 to 3; a few from another resource, which recall nothing)."""
    await mongo_db[MESSAGES].create_index([("thread_id", 1), ("createdAt", 1), ("id", 1)])
    per_thread: list[list[Any]] = []
    for seed in range(THREADS):
        thread = f"p{seed}"
        docs = _thread_docs(seed, thread)
        if docs:
            await mongo_db[MESSAGES].insert_many(docs, ordered=False)
        ids = [str(d.get("id")) for d in docs]
        resource = "someone-else" if seed % 7 == 3 else RESOURCE
        per_thread.append([_record(n, thread, seed * 3 + n, ids, resource) for n in range(1 + seed % 3)])
    return per_thread


async def test_plain_recall_gives_todays_bytes(
    mongo_db: AsyncDatabase[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = await _seed(mongo_db)
    decided = 0
    plain_page = recall_plan.plain_page

    def counting(*args: Any) -> Any:
        nonlocal decided
        page = plain_page(*args)
        decided += page is not None
        return page

    fused = 0
    plain_page_of = row_codec.plain_page_of

    def counting_fused(*args: Any) -> Any:
        nonlocal fused
        answer = plain_page_of(*args)
        fused += answer is not None and answer[0] is not None
        return answer

    monkeypatch.setattr("consumers.recall.plain_page", counting)
    monkeypatch.setattr(row_codec, "plain_page_of", counting_fused)
    storage = MongoHistoryStorage(mongo_db)
    compared = failed = skipped = 0
    for records in batches:
        today = await _or_error(storage, records, fast=False)
        fast = await _or_error(storage, records, fast=True)
        assert fast == today, records[0].key
        if isinstance(today, list):
            skipped += sum(b'"skipped":' in value for value in today)
            compared += len(today)
        else:
            failed += 1
    assert failed == 0  # no broken row fails a route any more (issue 31)...
    assert compared > THREADS
    assert skipped > 0  # ...broken rows were met, skipped and said alike by both routes
    assert decided + fused > THREADS // 8  # the plain route was taken, not only its fallback
    if row_codec.select_plain_runs() is not row_codec.no_fusing or os.environ.get("CI"):
        assert fused > THREADS // 8  # most plain pages decided natively on the server's own rows


@pytest.mark.parametrize("resources", ["one", "mixed"])
async def test_batches_of_threads_give_todays_bytes(
    mongo_db: AsyncDatabase[dict[str, Any]], resources: str
) -> None:
    """Batches of many threads: one `$in` read, the reply cut per thread (and per resource) from its bytes."""
    per_thread = await _seed(mongo_db)
    if resources == "one":
        per_thread = [records for records in per_thread if b'"someone-else"' not in records[0].value]
    storage = MongoHistoryStorage(mongo_db)
    compared = 0
    for start in range(0, len(per_thread), 12):
        records = [r for thread in per_thread[start : start + 12] for r in thread]
        records = [_renumbered(r, n) for n, r in enumerate(records)]
        today = await _or_error(storage, records, fast=False)
        assert await _or_error(storage, records, fast=True) == today
        compared += len(today) if isinstance(today, list) else 0
    assert compared > THREADS  # a batch holding a broken row is enriched too (its row skipped)


def _renumbered(record: Any, offset: int) -> Any:
    record.offset = offset
    return record
