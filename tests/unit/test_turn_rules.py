"""The turn barrier's and busy-thread policy's pure decisions, table by table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from message_history.core.turn_rules import (
    MARKER_GRACE,
    BusyPolicy,
    Decision,
    MarkerHorizons,
    TurnMarker,
    best_progress,
    busy_decision,
    foreign_pending,
    is_abandoned,
    lagging,
    marker_expires,
    marker_horizons,
    partition_mismatch,
    should_mark,
    still_waiting,
)

PENDING_K = TurnMarker(pending="k")
ANSWERED_K = TurnMarker(pending="k", answered=("k",))
IDLE = TurnMarker(pending=None, answered=("j",))


@pytest.mark.parametrize(
    ("marker", "request_id", "policy", "expected"),
    [
        (None, "k1", "enqueue", "go"),  # a thread never seen
        (IDLE, "k1", "enqueue", "go"),  # the previous turn was answered
        (PENDING_K, "k1", "enqueue", "wait"),
        (PENDING_K, "k1", "reject", "reject"),
        (PENDING_K, "k1", "allow", "go"),
        (PENDING_K, "k", "enqueue", "go"),  # a redelivered copy of the pending turn: not waiting on itself
        (PENDING_K, "k", "reject", "go"),
        (ANSWERED_K, "k1", "enqueue", "go"),  # answered while the clear raced: not busy
    ],
)
def test_busy_decision(
    marker: TurnMarker | None, request_id: str, policy: BusyPolicy, expected: Decision
) -> None:
    """Only another turn, pending and unanswered, makes a thread busy; the policy says what then."""
    assert busy_decision(marker, request_id, policy) == expected


_NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
_HORIZON = _NOW - timedelta(minutes=15)  # abandon_turn_after 15 min


@pytest.mark.parametrize(
    ("marker", "request_id", "policy", "expected"),
    [
        # pending since before the horizon: abandoned, the thread is free under every policy
        (TurnMarker(pending="k", pending_since=_NOW - timedelta(hours=1)), "k1", "enqueue", "go"),
        (TurnMarker(pending="k", pending_since=_NOW - timedelta(hours=1)), "k1", "reject", "go"),
        # within the horizon: still busy
        (TurnMarker(pending="k", pending_since=_NOW - timedelta(minutes=14)), "k1", "enqueue", "wait"),
        (TurnMarker(pending="k", pending_since=_NOW - timedelta(minutes=14)), "k1", "reject", "reject"),
        # no time known (a marker written before times were read): never abandoned
        (TurnMarker(pending="k"), "k1", "reject", "reject"),
        # answered: not busy whatever its age
        (
            TurnMarker(pending="k", answered=("k",), pending_since=_NOW - timedelta(days=2)),
            "k1",
            "reject",
            "go",
        ),
    ],
)
def test_an_abandoned_turn_does_not_hold_its_thread(
    marker: TurnMarker, request_id: str, policy: BusyPolicy, expected: Decision
) -> None:
    """A turn enriched before the horizon and never answered no longer makes its thread busy."""
    assert busy_decision(marker, request_id, policy, abandoned_before=_HORIZON) == expected
    # without the horizon, the same markers keep their thread busy forever (what `reject` did before)
    still = busy_decision(marker, request_id, policy)
    assert still == ("go" if marker.pending in marker.answered else {"enqueue": "wait"}.get(policy, policy))


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        (_HORIZON - timedelta(seconds=1), True),
        (_HORIZON, False),
        (_HORIZON + timedelta(seconds=1), False),
        (None, False),
    ],
)
def test_is_abandoned_at_the_horizon(since: datetime | None, expected: bool) -> None:
    assert is_abandoned(TurnMarker(pending="k", pending_since=since), _HORIZON) is expected


@pytest.mark.parametrize(
    ("marker", "resource", "expected"),
    [
        pytest.param(TurnMarker(pending="k", resource_id="a"), "b", "a", id="another-resource-pending"),
        pytest.param(TurnMarker(pending="k", resource_id="a"), "a", None, id="own-pending"),
        pytest.param(
            TurnMarker(pending="k", answered=("k",), resource_id="a"), "b", None, id="answered-not-held"
        ),
        pytest.param(TurnMarker(pending=None, answered=("k",), resource_id="a"), "b", None, id="idle"),
        pytest.param(PENDING_K, "b", None, id="resource-unknown"),
        pytest.param(TurnMarker(pending="k", resource_id="a"), None, None, id="request-without-resource"),
        pytest.param(None, "b", None, id="no-marker"),
    ],
)
def test_foreign_pending(marker: TurnMarker | None, resource: str | None, expected: str | None) -> None:
    assert foreign_pending(marker, resource, abandoned_before=None) == expected


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        pytest.param(_HORIZON - timedelta(milliseconds=1), None, id="past-the-horizon-lapses"),
        pytest.param(_HORIZON, "a", id="at-the-horizon-holds"),
        pytest.param(_HORIZON + timedelta(seconds=1), "a", id="recent-holds"),
        pytest.param(None, "a", id="no-time-holds"),  # never abandoned: an old marker written before times
    ],
)
def test_a_foreign_marker_lapses_at_the_abandonment_horizon(
    since: datetime | None, expected: str | None
) -> None:
    """A turn pending for another resource past the horizon no longer reserves the thread id."""
    marker = TurnMarker(pending="k", resource_id="a", pending_since=since)
    assert foreign_pending(marker, "b", abandoned_before=_HORIZON) == expected


def test_enriched_keeps_the_resource_of_the_pending_turn() -> None:
    assert TurnMarker().enriched("k", None, "a").resource_id == "a"
    assert TurnMarker(resource_id="a").enriched("k").resource_id == "a"


@pytest.mark.parametrize(
    ("marker", "awaited", "expected"),
    [
        (PENDING_K, "k", True),
        (ANSWERED_K, "k", False),
        (TurnMarker(pending=None, answered=("k",)), "k", False),
        (TurnMarker(pending="k2"), "k", False),  # a newer turn took its place (after a timeout elsewhere)
        (None, "k", False),  # the marker is gone
    ],
)
def test_still_waiting(marker: TurnMarker | None, awaited: str, expected: bool) -> None:
    """A wait ends when its turn is answered, replaced or gone."""
    assert still_waiting(marker, awaited) is expected


@pytest.mark.parametrize(
    ("marker", "request_id", "expected"),
    [(None, "k", True), (PENDING_K, "k1", True), (ANSWERED_K, "k", False), (IDLE, "j", False)],
)
def test_should_mark(marker: TurnMarker | None, request_id: str, expected: bool) -> None:
    """A request already answered (replay, redelivery after the answer) never marks its thread busy."""
    assert should_mark(marker, request_id) is expected
    after = (marker or TurnMarker()).enriched(request_id)
    assert after == (TurnMarker(pending=request_id, answered=after.answered) if expected else marker)


@pytest.mark.parametrize(
    ("ends", "progress", "expected"),
    [
        ({0: 10, 1: 5}, {0: 10, 1: 5}, {}),  # caught up: no wait
        ({0: 10, 1: 5}, {0: 9, 1: 7}, {0: 10}),
        ({0: 10}, {0: None}, {0: 10}),  # progress unknown: behind
        ({0: 0}, {0: None}, {}),  # an empty partition needs nothing
        ({0: 3}, {}, {0: 3}),
    ],
)
def test_lagging(ends: dict[int, int], progress: dict[int, int | None], expected: dict[int, int]) -> None:
    """A partition is behind while its persist progress is below the end offset seen."""
    assert lagging(ends, progress) == expected


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [((None, None), None), ((5, None), 5), ((None, 7), 7), ((5, 7), 7), ((-1, None), None)],
)
def test_best_progress(candidates: tuple[int | None, ...], expected: int | None) -> None:
    """The furthest report wins; -1 (no commit) counts as unknown."""
    assert best_progress(*candidates) == expected


@pytest.mark.parametrize(
    ("requests", "responses", "expected"),
    [(4, 4, False), (4, 2, True), (None, 2, False), (4, None, False)],
)
def test_partition_mismatch(requests: int | None, responses: int | None, expected: bool) -> None:
    """Only two existing topics with different counts are refused; a missing one is looked at later."""
    assert partition_mismatch(requests, responses) is expected


_NOW = datetime(2026, 6, 1, tzinfo=UTC)
_DAY = timedelta(days=1)
_HORIZONS = marker_horizons(_NOW - 90 * _DAY, _NOW, turn_timeout_s=60)


@pytest.mark.parametrize(
    ("marker", "age", "thread_exists", "expected"),
    [
        (IDLE, 100 * _DAY, True, True),  # older than the cut-off: its turns are older than the history kept
        (PENDING_K, 100 * _DAY, True, True),  # even a turn never answered: a waiter ends as on a timeout
        (IDLE, 2 * _DAY, True, False),  # the thread lives: the answered ids still guard redeliveries
        (IDLE, 2 * _DAY, False, True),  # the thread is gone, past the grace
        (ANSWERED_K, 2 * _DAY, False, True),  # gone; its pending turn was answered
        (PENDING_K, 2 * _DAY, False, False),  # gone but a turn is pending: someone may wait on it
        (IDLE, timedelta(hours=23), False, False),  # within the grace: a first turn has no thread row yet
        (PENDING_K, timedelta(minutes=1), False, False),
        (IDLE, None, True, True),  # no write time at all: nothing shows it is recent
    ],
)
def test_marker_expires(
    marker: TurnMarker, age: timedelta | None, thread_exists: bool, expected: bool
) -> None:
    """Which markers prune may delete: old ones, and idle ones of gone threads past the grace."""
    last_write = None if age is None else _NOW - age
    assert marker_expires(marker, last_write, thread_exists=thread_exists, horizons=_HORIZONS) is expected


@pytest.mark.parametrize(
    ("cutoff", "timeout_s", "stale_before", "gone_before"),
    [
        (_NOW - 90 * _DAY, 60, _NOW - 90 * _DAY, _NOW - MARKER_GRACE),
        (_NOW, 60, _NOW - MARKER_GRACE, _NOW - MARKER_GRACE),  # `--before now`: the grace still holds
        (_NOW, 86_400, _NOW - 2 * _DAY, _NOW - 2 * _DAY),  # a turn timeout over half a day widens it
    ],
)
def test_marker_horizons(
    cutoff: datetime, timeout_s: float, stale_before: datetime, gone_before: datetime
) -> None:
    """Neither horizon is ever closer to now than the grace."""
    assert marker_horizons(cutoff, _NOW, timeout_s) == MarkerHorizons(stale_before, gone_before)
