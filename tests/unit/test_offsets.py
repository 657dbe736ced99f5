"""The commit watermark: contiguous completed offsets per partition, gaps and revokes included."""

from __future__ import annotations

import pytest

from consumers.offsets import OffsetTracker, PartitionOffsets


@pytest.mark.parametrize(
    ("fetched", "done", "expected"),
    [
        pytest.param([], [], None, id="nothing-fetched"),
        pytest.param([5, 6, 7], [], None, id="nothing-done-is-not-news"),
        pytest.param([5, 6, 7], [5], 6, id="first-done"),
        pytest.param([5, 6, 7], [6, 7], None, id="hole-at-start-blocks"),
        pytest.param([5, 6, 7], [7, 5], 6, id="hole-in-middle-stops-there"),
        pytest.param([5, 6, 7], [7, 6, 5], 8, id="all-done-out-of-order"),
        pytest.param([5, 9, 12], [5, 9, 12], 13, id="gaps-in-offsets-are-skipped"),
        pytest.param([5, 9, 12], [5, 12], 9, id="gap-then-pending"),
        pytest.param([5, 6], [5, 6, 6, 5], 7, id="done-twice-is-harmless"),
        pytest.param([5, 6], [4, 8], None, id="untracked-offsets-ignored"),
        pytest.param([5, 6, 5, 6, 7], [5, 6, 7], 8, id="refetch-below-high-mark-ignored"),
    ],
)
def test_committable_is_contiguous_watermark(
    fetched: list[int], done: list[int], expected: int | None
) -> None:
    """The committable offset is one past the longest completed run from the first fetched offset."""
    part = PartitionOffsets()
    for offset in fetched:
        part.track(offset)
    for offset in done:
        part.done(offset)
    assert part.committable() == expected


def test_committable_only_when_moved() -> None:
    """After a commit, the same watermark is not offered again; a later completion is."""
    tracker: OffsetTracker[str] = OffsetTracker()
    part = tracker.track("p0", 0)
    tracker.track("p0", 1)
    part.done(0)
    assert tracker.committable() == {"p0": 1}
    tracker.mark_committed({"p0": 1})
    assert tracker.committable() == {}
    part.done(1)
    assert tracker.committable() == {"p0": 2}


def test_pending_counts_incomplete_records() -> None:
    """Pending counts fetched records not yet done, including ones done above a hole."""
    tracker: OffsetTracker[str] = OffsetTracker()
    for offset in range(4):
        tracker.track("a", offset)
    tracker.track("b", 10)
    tracker.partition("a").done(2)
    assert tracker.pending() == 4
    tracker.partition("a").done(0)
    assert tracker.pending() == 3


def test_forgotten_partition_ignores_late_completion() -> None:
    """Work finishing after its partition was revoked cannot move the next assignment's watermark."""
    tracker: OffsetTracker[str] = OffsetTracker()
    old = tracker.track("p0", 10)
    tracker.forget(["p0"])
    new = tracker.track("p0", 10)
    old.done(10)
    assert tracker.committable() == {}
    assert not tracker.owns("p0", old)
    assert tracker.owns("p0", new)
    new.done(10)
    assert tracker.committable() == {"p0": 11}


def test_committable_limited_to_keys() -> None:
    """Restricting to some partitions (a revoke) leaves the others out."""
    tracker: OffsetTracker[str] = OffsetTracker()
    for key in ("a", "b"):
        tracker.track(key, 0)
        tracker.track(key, 1).done(0)
    assert tracker.committable(["b", "zzz"]) == {"b": 1}
    assert tracker.committable() == {"a": 1, "b": 1}
