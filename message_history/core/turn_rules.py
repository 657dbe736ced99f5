"""When a request may be recalled: the turn barrier's and the busy-thread policy's decisions. Pure, no I/O.

Two questions are asked before a request is recalled
(docs/events.md#16-turn-ordering-the-barrier-and-busy-threads):

* **Barrier.** Has the persist side reached, on the responses partition with the request's partition number,
  the end offset that partition had when the request was fetched? Requests and responses are keyed by
  `threadId` and the topics have equal partition counts, so every response of the thread that was already
  written sits below that offset.
* **Busy thread.** Does the thread have an earlier turn enriched and not answered yet (a marker in
  `message_history_turns`)? `enqueue` waits for the answer, `reject` refuses the request, `allow` goes on.

A marker holds the one pending request id of its thread and the ids answered lately, so a request whose
answer came first (a replay, a redelivery after the answer) never marks its thread busy again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

BusyPolicy = Literal["enqueue", "allow", "reject"]
Decision = Literal["go", "wait", "reject"]

ANSWERED_KEPT = 64
"""Answered request ids a marker remembers: enough for every redelivery window seen in practice."""


@dataclass(frozen=True, slots=True)
class TurnMarker:
    """A thread's row in `message_history_turns`: the turn enriched and not answered, and recent answers."""

    pending: str | None = None
    answered: tuple[str, ...] = ()
    pending_since: datetime | None = None  # when the pending turn was enriched (`enrichedAt`); None: unknown
    resource_id: str | None = None  # the resource of the request last marked pending (`resourceId`)

    def enriched(
        self, request_id: str, at: datetime | None = None, resource_id: str | None = None
    ) -> TurnMarker:
        """This marker after `request_id` (of `resource_id`) was enriched at `at` (unchanged when that turn
        was already answered)."""
        if not should_mark(self, request_id):
            return self
        return TurnMarker(
            pending=request_id,
            answered=self.answered,
            pending_since=at,
            resource_id=resource_id or self.resource_id,
        )


def busy_decision(
    marker: TurnMarker | None,
    request_id: str,
    policy: BusyPolicy,
    *,
    abandoned_before: datetime | None = None,
) -> Decision:
    """`go`, `wait` (policy enqueue) or `reject` (policy reject) for `request_id` on its thread's marker.

    A redelivered copy of the pending request itself goes: it must not wait for its own answer. A pending turn
    enriched before `abandoned_before` is abandoned (`is_abandoned`): the thread is not busy any more.
    """
    if policy == "allow" or not is_busy(marker, exclude=request_id, abandoned_before=abandoned_before):
        return "go"
    return "wait" if policy == "enqueue" else "reject"


def is_busy(
    marker: TurnMarker | None, *, exclude: str | None = None, abandoned_before: datetime | None = None
) -> bool:
    """True when the marker names a pending turn (other than `exclude`) that has no answer yet and, with
    `abandoned_before`, is not abandoned."""
    if marker is None or marker.pending is None or marker.pending == exclude:
        return False
    if abandoned_before is not None and is_abandoned(marker, abandoned_before):
        return False
    return marker.pending not in marker.answered


def foreign_pending(
    marker: TurnMarker | None, resource_id: str | None, *, abandoned_before: datetime | None
) -> str | None:
    """The resource with an unanswered turn pending on a thread that has no stored row yet, when it is not
    `resource_id`; else None. Such a thread is that resource's as soon as its turn is saved: a request of
    another resource is refused for ownership before it could wait for, or be refused naming, that turn.

    A pending turn enriched before `abandoned_before` (`is_abandoned`) reserves nothing: it will likely never
    be saved, and a marker must not hold a thread id for another tenant for good."""
    if (
        resource_id is None
        or marker is None
        or marker.resource_id is None
        or not is_busy(marker, abandoned_before=abandoned_before)
    ):
        return None
    return marker.resource_id if marker.resource_id != resource_id else None


def is_abandoned(marker: TurnMarker | None, abandoned_before: datetime) -> bool:
    """True when the marker's pending turn is unanswered and was enriched before `abandoned_before`: its
    worker dropped it (or is gone), and waiting for it (`enqueue`) or refusing the thread's next requests
    (`reject`) would hold the thread for good. A marker without a time is never abandoned."""
    return (
        marker is not None
        and marker.pending is not None
        and marker.pending not in marker.answered
        and marker.pending_since is not None
        and marker.pending_since < abandoned_before
    )


def still_waiting(marker: TurnMarker | None, awaited: str) -> bool:
    """True while `awaited` is the thread's pending turn, unanswered (a newer pending turn ends the wait)."""
    return marker is not None and marker.pending == awaited and awaited not in marker.answered


def should_mark(marker: TurnMarker | None, request_id: str) -> bool:
    """False for a request already answered (a replay or redelivery): marking it would make the thread busy
    until the timeout."""
    return marker is None or request_id not in marker.answered


MARKER_GRACE = timedelta(days=1)
"""How long after its last write a marker is kept even when its thread is gone (see `marker_expires`)."""


@dataclass(frozen=True, slots=True)
class MarkerHorizons:
    """Prune's two instants for the markers: every marker last written before `stale_before` goes; one of
    a thread that is gone goes when it was last written before `gone_before` and names no unanswered turn."""

    stale_before: datetime
    gone_before: datetime


def marker_horizons(cutoff: datetime, now: datetime, turn_timeout_s: float) -> MarkerHorizons:
    """The horizons for a prune with `cutoff` run at `now`: never closer to `now` than the grace.

    The grace (a day, or twice the turn timeout if that is longer) outlives every wait (a wait lasts at most
    the turn timeout) and the redeliveries a restart brings, which a marker's `answered` ids are for. A
    `--before` cut-off in the last day therefore still leaves the last day's markers alone.
    """
    gone_before = now - max(MARKER_GRACE, timedelta(seconds=2 * turn_timeout_s))
    return MarkerHorizons(stale_before=min(cutoff, gone_before), gone_before=gone_before)


def marker_expires(
    marker: TurnMarker, last_write: datetime | None, *, thread_exists: bool, horizons: MarkerHorizons
) -> bool:
    """Whether prune may delete this marker (`last_write`: its newest `enrichedAt` / `answeredAt`).

    * last written before `stale_before`: the turns it describes are older than the history prune deletes;
      a request still waiting on it (a turn never answered) ends its wait with `history.complete: false`,
      which is what its timeout would have given.
    * its thread is gone (no `mastra_threads` row: forgotten, deleted by a Mastra app, or never saved
      because its turns were read-only or failed), it was last written before `gone_before` and it names no
      unanswered turn: nobody waits on it, and a thread seen for the first time has a marker but no row
      yet, which the grace protects (and a busy marker is never removed this way).
    """
    if last_write is None or last_write < horizons.stale_before:
        return True
    return not thread_exists and not is_busy(marker) and last_write < horizons.gone_before


def lagging(ends: Mapping[int, int], progress: Mapping[int, int | None]) -> dict[int, int]:
    """Partitions whose persist progress (next offset to persist; None = unknown) is below the end seen."""
    behind: dict[int, int] = {}
    for partition, end in ends.items():
        done = progress.get(partition)
        if end > 0 and (done is None or done < end):
            behind[partition] = end
    return behind


def best_progress(*candidates: int | None) -> int | None:
    """The furthest of several reports of the same partition's progress (in-process, committed)."""
    known = [c for c in candidates if c is not None and c >= 0]
    return max(known) if known else None


def partition_mismatch(requests: int | None, responses: int | None) -> bool:
    """True when both topics exist and their partition counts differ: the barrier cannot map threads."""
    return requests is not None and responses is not None and requests != responses
