"""`tune_gc`: the collector's settings applied at start-up (`MESSAGE_HISTORY_GC_FREEZE`, `_GC_THRESHOLD`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from message_history.app.process import tune_gc
from message_history.settings import Settings


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_defaults_freeze_and_raise_the_young_threshold() -> None:
    """The defaults the benchmark chose (docs/operations.md#11-runtime-and-allocator-settings)."""
    before = gc.get_threshold()
    tune_gc(Settings())
    assert gc.get_threshold() == (100_000, before[1], before[2])
    assert gc.get_freeze_count() > 0


def test_pythons_own_collector_when_asked() -> None:
    before = gc.get_threshold()
    tune_gc(Settings(gc_freeze=False, gc_threshold=700))
    assert gc.get_threshold() == (700, before[1], before[2])
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("threshold", [0, 700, 50_000])
def test_threshold_sets_the_young_generation_only(threshold: int) -> None:
    _, older, oldest = gc.get_threshold()
    tune_gc(Settings(gc_threshold=threshold))
    assert gc.get_threshold() == (threshold, older, oldest)


def test_freeze_moves_start_up_objects_out_of_reach() -> None:
    tune_gc(Settings(gc_freeze=True))
    assert gc.get_freeze_count() > 0
