"""The recall fast path against the real server: documents of every shape, stored and read back through
BSON, give the model path's bytes (tests/recall_docs.py; the unit form is tests/unit/test_recalled_rows.py).

Per row: every document read back is either spliced with exactly the model path's enriched bytes, or left
to the model path. Per thread: `recall_rows_many` and `list_messages_many` (both recall strategies) give
the same enriched event bytes for a few thousand generated threads, and skip a broken row alike.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import pytest
from bson.regex import Regex
from pymongo.asynchronous.database import AsyncDatabase

from message_history import metrics
from message_history.core.rules import build_context
from schemas.codec import encode
from schemas.events import EnrichedRequest
from schemas.recalled import RecalledRow, encode_enriched
from storage import row_codec
from storage.documents import MESSAGES, message_from_doc
from storage.mongodb import MongoHistoryStorage
from storage.protocol import RecallQuery
from storage.recalled_rows import MESSAGE_PROJECTION, row_from_doc
from tests.recall_docs import model_bytes, request_for, stored_docs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RESOURCE = "r-eq"
THREADS = 2000
BATCH = 250


async def _seed(db: AsyncDatabase[dict[str, Any]]) -> list[str]:
    # recall's index only: the unique index on `id` would refuse the rows with a missing or odd id
    await db[MESSAGES].create_index([("thread_id", 1), ("createdAt", 1), ("id", 1)])
    docs: list[dict[str, Any]] = []
    threads = []
    for seed in range(THREADS):
        thread = f"t{seed}"
        threads.append(thread)
        docs.extend(copy.deepcopy(stored_docs(seed, seed % 45, thread, RESOURCE)))
    await db[MESSAGES].insert_many(docs, ordered=False)
    return threads


async def test_rows_read_back_encode_as_the_model_path(mongo_db: AsyncDatabase[dict[str, Any]]) -> None:
    storage = MongoHistoryStorage(mongo_db)
    await _seed(mongo_db)
    taken = refused = 0
    async for doc in storage.messages.find({}, MESSAGE_PROJECTION):
        row = row_from_doc(doc, message_from_doc)
        if row is None:
            refused += 1
            continue
        taken += 1
        thread = str(doc["thread_id"])
        expected = model_bytes(doc, thread, RESOURCE)
        assert expected is not None, f"the fast path took a row the model path refuses: {doc!r:.300}"
        assert row.enriched_json("memory") == expected
    assert taken > 20_000
    assert refused > 3000


@pytest.mark.parametrize("strategy", ["in", "concurrent"])
async def test_recall_gives_the_same_event_bytes(
    mongo_db: AsyncDatabase[dict[str, Any]], strategy: str
) -> None:
    storage = MongoHistoryStorage(mongo_db, recall_strategy=strategy)  # type: ignore[arg-type]
    threads = await _seed(mongo_db)
    compared = spliced = 0
    skipped_before = _skipped()
    for start in range(0, len(threads), BATCH):
        queries = [RecallQuery(t, RESOURCE, 40) for t in threads[start : start + BATCH]]
        # a broken row is skipped on both paths alike (it used to fail the whole batch: issue 31)
        models = await storage.list_messages_many(queries)
        for thread, page in models.items():
            [views] = (await storage.recall_rows_many([RecallQuery(thread, RESOURCE, 40)])).values()
            request = request_for(int(thread[1:]), thread, RESOURCE, [m.id or "" for m in page])
            model_context = build_context(page, request.messages)
            view_context = build_context(views, request.messages)
            recalled = sum(1 for _, source in model_context if source == "memory")
            try:
                expected = encode(
                    EnrichedRequest.from_request(request, model_context, recalled=recalled, limit=40)
                )
            except ValueError as exc:  # a recalled row without an id: no enriched event on either path
                with pytest.raises(ValueError, match=re.escape(str(exc))):
                    encode_enriched(request, view_context, recalled=recalled, limit=40)
                continue
            assert encode_enriched(request, view_context, recalled=recalled, limit=40) == expected, thread
            compared += 1
            spliced += sum(1 for m in views if isinstance(m, RecalledRow))
    assert compared > THREADS // 3  # the rest hold a row the model path refuses, compared above
    assert spliced > 10_000
    assert _skipped() > skipped_before  # broken rows were met, and skipped on both paths alike


def _skipped() -> float:
    return sum(
        sample.value
        for metric in metrics.UNREADABLE_ROWS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def test_the_in_read_is_grouped_natively_as_by_the_reference(
    mongo_db: AsyncDatabase[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recall_raw_many`'s `$in` read cut per thread by the native walk (`row_codec.group_rows`) gives the
    rows the reference's loop gives, and one `find` per thread too; over rows of every shape, so both the
    batches the native walk groups and those it leaves to the reference (a row it is not sure of) are met."""
    threads = await _seed(mongo_db)
    # a row whose owner the native walk is not sure of (a field of a BSON type it does not step over), in
    # one thread of four batches: the reference groups those batches
    odd = [
        {
            "id": f"odd-{n}",
            "thread_id": threads[n],
            "resourceId": RESOURCE,
            "role": "user",
            "content": Regex("x"),
        }
        for n in range(0, len(threads), 500)
    ]
    await mongo_db[MESSAGES].insert_many(odd)
    answered = declined = 0
    native = row_codec.select_group("native")

    def counted(docs: Sequence[bytes], wanted: Sequence[row_codec.Wanted]) -> list[list[bytes]] | None:
        nonlocal answered, declined
        pages = native(docs, wanted)
        answered, declined = answered + (pages is not None), declined + (pages is None)
        return pages

    by_route: dict[str, dict[str, list[bytes]]] = {}
    for route, grouping in [("native", counted), ("python", row_codec.no_grouping), ("concurrent", None)]:
        storage = MongoHistoryStorage(mongo_db, recall_strategy="concurrent" if grouping is None else "in")
        monkeypatch.setattr(row_codec, "_selected_group", grouping or row_codec.no_grouping)
        pages: dict[str, list[bytes]] = {}
        for start in range(0, len(threads), 40):
            queries = [
                RecallQuery(t, RESOURCE if start % 80 else None, 30) for t in threads[start : start + 40]
            ]
            pages.update(await storage.recall_raw_many(queries))
        by_route[route] = pages
    assert by_route["native"] == by_route["python"] == by_route["concurrent"]
    assert sum(map(len, by_route["native"].values())) > 20_000
    assert answered > 0, declined
    assert declined > 0, answered
