"""`tune_gc`: the collector's settings applied at start-up (`MESSAGE_HISTORY_GC_FREEZE`, `_GC_THRESHOLD`)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from bench.extra.persist_batch import response_record
from message_history.app.process import tune_gc
from message_history.settings import Settings
from schemas.codec import decode_response

T = TypeVar("T")


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


def _young_passes_while(work: Callable[[], T]) -> tuple[int, T]:
    """How many young-generation passes the collector makes while `work` runs, and its result."""
    passes = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal passes
        if phase == "start" and info["generation"] == 0:
            passes += 1

    gc.collect()  # the young generation's count starts at zero
    gc.callbacks.append(count)
    try:
        result = work()
    finally:
        gc.callbacks.remove(count)
    return passes, result


@pytest.mark.parametrize(("threshold", "passes_expected"), [(None, False), (10_000, True)])
def test_a_full_batch_in_flight_stays_under_the_default_threshold(
    threshold: int | None, passes_expected: bool
) -> None:
    """A full batch of decoded responses, alive together as the persist path holds them, triggers no young
    pass at the default threshold; at 10,000 (the default before issue 33) it does, and every such pass scans
    the batch again (docs/benchmarks.md, "the collector's threshold, measured in the service")."""
    settings = Settings() if threshold is None else Settings(gc_threshold=threshold)
    tune_gc(settings)
    raws = [response_record(f"t{n}", 3, 1000).value or b"" for n in range(settings.max_batch_records)]
    passes, batch = _young_passes_while(lambda: [decode_response(raw) for raw in raws])
    assert len(batch) == settings.max_batch_records
    assert (passes > 0) is passes_expected, passes
