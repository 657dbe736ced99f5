"""A read the recall batch's plan did not load is counted (`message_history_plan_misses_total{path}`) and
logged at INFO with its thread, then answered by the storage (one more round trip, never a wrong answer)."""

from __future__ import annotations

import logging

import pytest

from consumers.prefetch import PrefetchedHistory
from message_history import metrics
from message_history.core.budget import resolve_budget
from message_history.processor import MessageHistory
from storage.protocol import RecallQuery
from tests.unit.test_batch_stand_ins import _Counting, _CountingPages, _recall, _seed


def _misses() -> float:
    return metrics.REGISTRY.get_sample_value("message_history_plan_misses_total", {"path": "recall"}) or 0.0


async def test_a_page_larger_than_planned_is_a_counted_logged_miss(caplog: pytest.LogCaptureFixture) -> None:
    storage = _Counting()
    await _seed(storage, "t", "u", 6)
    history = await PrefetchedHistory.load(storage, [RecallQuery("t", "u", 2)])
    before = _misses()
    with caplog.at_level(logging.INFO, logger="consumers.prefetch"):
        assert len(await history.newest("t", "u", 2)) == 2  # planned: no miss
        assert _misses() == before
        assert len(await history.newest("t", "u", 5)) == 5  # not planned
    assert _misses() == before + 1
    [record] = [r for r in caplog.records if r.getMessage() == "recall plan missed a read"]
    assert record.levelno == logging.INFO
    assert record.__dict__["threads"] == ["t"]
    assert record.__dict__["read"] == "list_messages"


async def test_a_budgeted_page_not_loaded_is_a_miss() -> None:
    """A boundary an earlier request of the batch moved asks for pages the batch did not load: each is a
    counted miss, read from the storage, and the rows are the library's over the storage."""
    storage = _CountingPages()
    await _seed(storage, "t", "u", 100)
    budget = resolve_budget(60, 30)
    history = await PrefetchedHistory.load(storage, [RecallQuery("t", "u", None, budget)])
    before = _misses()
    assert (await _recall(history, "t", last_messages=False, budget=budget)).trimmed  # planned
    assert _misses() == before
    pages = storage.calls.get("list_page", 0)
    got = await _recall(history, "t", last_messages=False, budget=budget, read_only=True)  # from the new one
    assert _misses() > before
    assert storage.calls.get("list_page", 0) > pages
    await history.flush()
    expected = await MessageHistory(storage=storage).recall(
        thread_id="t", resource_id="u", incoming=[], last_messages=False, budget=budget, read_only=True
    )
    assert [m.id for m, _ in got.context] == [m.id for m, _ in expected.context]
