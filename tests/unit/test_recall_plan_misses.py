"""A read the recall batch's plan did not load is counted (`message_history_plan_misses_total{path}`) and
logged at INFO with its thread, then answered by the storage (one more round trip, never a wrong answer)."""

from __future__ import annotations

import logging

import pytest

from consumers.prefetch import PrefetchedHistory
from message_history import metrics
from storage.protocol import RecallQuery
from tests.unit.test_batch_stand_ins import _Counting, _seed


def _misses() -> float:
    return metrics.REGISTRY.get_sample_value("message_history_plan_misses_total", {"path": "recall"}) or 0.0


async def test_a_page_larger_than_planned_is_a_counted_logged_miss(caplog: pytest.LogCaptureFixture) -> None:
    storage = _Counting()
    await _seed(storage, "t", "u", 6)
    history = await PrefetchedHistory.load(storage, [RecallQuery("t", "u", 2)])
    before = _misses()
    with caplog.at_level(logging.INFO, logger="consumers.prefetch"):
        assert len(await history.list_messages("t", resource_id="u", limit=2)) == 2  # planned: no miss
        assert _misses() == before
        assert len(await history.list_messages("t", resource_id="u", limit=5)) == 5  # not planned
    assert _misses() == before + 1
    [record] = [r for r in caplog.records if r.getMessage() == "recall plan missed a read"]
    assert record.levelno == logging.INFO
    assert record.__dict__["threads"] == ["t"]
    assert record.__dict__["read"] == "list_messages"


async def test_an_unplanned_thread_is_a_miss() -> None:
    storage = _Counting()
    history = await PrefetchedHistory.load(storage, [RecallQuery("t", "u", 2)])
    before = _misses()
    assert await history.get_thread("t") is None  # planned (it does not exist): no miss
    assert await history.get_thread("other") is None
    assert _misses() == before + 1
