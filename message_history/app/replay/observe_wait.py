"""`replay --observe` waits for the observations it asks for, so that what it rebuilds is deterministic.

The live persist path decides a thread's observation on the last of its turns in a batch, and never waits
for the answer: replayed, where a cycle starts would depend on `--batch-size` and where it ends on how fast
the observer answers. So a replay with `--observe` hands the persist path one record at a time, and after a
record whose save sent work (`ObservationEmitter`'s `on_work`, a claim) it waits, before the next record of
that claim's **lane** (its OM row: `thread:<threadId>`, or `resource:<resourceId>` with resource scope),
until the observed path (the live service, beside the replay) has settled the claim: read back from
`mastra_observational_memory` by the claim's row and cycle. Records of other lanes go on meanwhile (a record
belongs to its thread's lane and its resource's: a resource claim holds every thread of the resource). Each
cycle then starts at the turn whose save passed the threshold and covers exactly the messages before it,
whatever the batch size or concurrency. Exactly once, the wait comes after the claiming record's transaction
committed: the work is out before anyone waits for its answer. At the end of its range a partition waits for
every claim still open, so a replay that finished leaves its rows settled.

The resume point moves past a claiming record whose claim is still open, so a resume (after a stop, a crash,
or the bound below) finds such claims again without any state of its own: the first record of each lane a
run comes to reads that lane's row (`open_claims`) and waits for a live claim found there like one it sent
(a lane already seen in the run uses what it noted: no extra read). A claim its own turn made (`claimedBy`,
a claiming record the previous run did not get past) is not waited for: the turn sends its work again.

The wait is bounded (`--observe-wait-s`, default `OBSERVATION_TIMEOUT_S`): past it the replay stops with an
`ObservationWaitError` naming the thread and the claim, and resumes at the record that waited (which waits
for the claim again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pydantic_core import from_json

from message_history.app.replay.plan import Counts
from message_history.errors import MessageHistoryError
from producers.output import Positioned
from storage.observational import Claim, ClaimOutcome, Kind, ObservationalRecord, lookup_key

POLL_S = 0.1
# a reflection's answer settles its claim, then inserts the next generation (`apply_reflection`): a settled
# claim without that row is given this long to show it before it counts as released (the observer failed)
REFLECTION_GRACE_S = 2.0


class ObservationWaitError(MessageHistoryError):
    """An observation the replay sent was not settled within `--observe-wait-s`: the replay stops."""


class ClaimReader(Protocol):
    """The part of `storage.observational.MongoObservationalStore` the wait reads."""

    async def claim_outcome(self, claim: Claim) -> ClaimOutcome: ...

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None: ...


# --- pure rules --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordLanes:
    """What a responses record may claim on: its lanes (OM row keys) and its request (`claimedBy`)."""

    lanes: tuple[str, ...] = ()
    request_id: str | None = None


NO_LANES = RecordLanes()


def record_lanes(key: bytes | None, value: bytes | None) -> RecordLanes:
    """The lanes of a responses record read conservatively from its key and value: its thread's row
    (the key, which the persist path requires to be the `threadId`) and its resource's (`resourceId`), since
    its scope is not known here. A record that cannot be read holds nothing (the persist path refuses it)."""
    if not key or value is None:
        return NO_LANES
    try:
        thread_id = key.decode()
        doc = from_json(value)
    except ValueError:  # UnicodeDecodeError is one
        return NO_LANES
    if not isinstance(doc, dict):
        return NO_LANES
    resource_id, request_id = doc.get("resourceId"), doc.get("requestId")
    if not isinstance(resource_id, str) or not resource_id:
        return NO_LANES
    return RecordLanes(
        (lookup_key(thread_id, resource_id), lookup_key(None, resource_id)),
        request_id if isinstance(request_id, str) else None,
    )


def lane_row(lane: str) -> tuple[str | None, str]:
    """`(thread_id, resource_id)` that `get` reads `lane`'s row with (the inverse of `lookup_key`)."""
    kind, _, ident = lane.partition(":")
    return (ident, "") if kind == "thread" else (None, ident)


def open_claims(
    row: ObservationalRecord | None, request_id: str | None, now: datetime, timeout: timedelta
) -> list[Claim]:
    """The live claims on `row` a record must wait for: a flag set, not stale (a stale one is the record's
    own to take, as the emitter does), and not made by `request_id`'s turn (that turn sends its work again).
    """
    if row is None or (row.claimed_by is not None and row.claimed_by == request_id):
        return []
    if row.updated_at is None or row.updated_at < now - timeout:
        return []
    flags: tuple[tuple[Kind, bool], ...] = (("observe", row.is_observing), ("reflect", row.is_reflecting))
    return [Claim(row.id, row.generation, row.cycle, kind) for kind, flag in flags if flag]


@dataclass(frozen=True, slots=True)
class Pending:
    """A claim a record waits for: its row's `who` (thread or resource) and where it was sent (`found`: read
    open on the row by the record at `offset`, not sent in this run)."""

    claim: Claim
    who: str
    partition: int
    offset: int
    found: bool = False


@dataclass(slots=True)
class LaneClaims:
    """One partition's open claims by lane, and the lanes it has come to in this run (pure bookkeeping)."""

    open: dict[str, dict[Claim, Pending]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def unseen(self, lanes: Iterable[str]) -> list[str]:
        """The lanes not come to before, now marked as come to."""
        new = [lane for lane in dict.fromkeys(lanes) if lane not in self.seen]
        self.seen.update(new)
        return new

    def note(self, lane: str, pending: Pending) -> None:
        self.seen.add(lane)
        self.open.setdefault(lane, {}).setdefault(pending.claim, pending)

    def holding(self, lanes: Iterable[str]) -> list[Pending]:
        """The open claims on any of `lanes`, each once, in the order they were noted."""
        found: dict[Claim, Pending] = {}
        for lane in lanes:
            found.update(self.open.get(lane, {}))
        return list(found.values())

    def all(self) -> list[Pending]:
        return self.holding(list(self.open))

    def settled(self, claim: Claim) -> None:
        for lane in [lane for lane, claims in self.open.items() if claim in claims]:
            del self.open[lane][claim]
            if not self.open[lane]:
                del self.open[lane]


# --- the wait ----------------------------------------------------------------------------------------------


Sleep = Callable[[float, asyncio.Event], Awaitable[bool]]


@dataclass(slots=True)
class ObservationWaits:
    """Each partition's open claims by lane (`noted`, the emitter's `on_work`; `before`, read on a lane's
    first record), and the wait for them (`before` a record of their lane, `drain` at the range's end);
    `counts.observing` says how many are being waited for, `counts.observations` how many were settled."""

    rows: ClaimReader
    counts: Counts
    _: KW_ONLY
    wait_s: float
    sleep: Sleep
    claim_timeout_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    poll_s: float = POLL_S
    grace_s: float = REFLECTION_GRACE_S
    _lanes: dict[int, LaneClaims] = field(default_factory=dict, init=False)

    def lanes(self, partition: int) -> LaneClaims:
        return self._lanes.setdefault(partition, LaneClaims())

    def noted(self, record: Positioned, claim: Claim, thread_id: str, lane: str) -> None:
        """The emitter sent `claim`'s work (on `lane`'s row) under `record` (a retried send is the same)."""
        who = f"thread {thread_id!r}" if lane.startswith("thread:") else f"resource {lane_row(lane)[1]!r}"
        self.lanes(record.partition).note(lane, Pending(claim, who, record.partition, record.offset))

    async def before(self, record: Positioned, lanes: RecordLanes, stop: asyncio.Event) -> bool:
        """Wait until no claim holds `record`'s lanes (reading the row of each lane not come to before in
        this run). False when `stop` came first; raises `ObservationWaitError` past `wait_s`."""
        book = self.lanes(record.partition)
        for lane in book.unseen(lanes.lanes):
            thread_id, resource_id = lane_row(lane)
            row = await self.rows.get(thread_id, resource_id)
            timeout = timedelta(seconds=self.claim_timeout_s)
            for claim in open_claims(row, lanes.request_id, self.now(), timeout):
                who = f"thread {thread_id!r}" if thread_id is not None else f"resource {resource_id!r}"
                book.note(lane, Pending(claim, who, record.partition, record.offset, found=True))
        return await self._wait(book, book.holding(lanes.lanes), stop)

    async def drain(self, partition: int, stop: asyncio.Event) -> bool:
        """Wait until every claim `partition` knows of is settled (its range is done)."""
        book = self.lanes(partition)
        return await self._wait(book, book.all(), stop)

    async def _wait(self, book: LaneClaims, pending: list[Pending], stop: asyncio.Event) -> bool:
        if not pending:
            return True
        waiting = len(pending)
        self.counts.observing += waiting
        try:
            for item in pending:
                if not await self._one(item, stop):
                    return False
                book.settled(item.claim)
                waiting -= 1
                self.counts.observing -= 1
                self.counts.observations += 1
            return True
        finally:
            self.counts.observing -= waiting

    async def _one(self, item: Pending, stop: asyncio.Event) -> bool:
        started = self.clock()
        released_since: float | None = None
        while True:
            outcome = await self.rows.claim_outcome(item.claim)
            now = self.clock()
            if outcome == "reflected" or (outcome == "settled" and item.claim.kind == "observe"):
                return True
            if outcome == "settled":  # a reflection settled: its next generation follows at once
                released_since = released_since if released_since is not None else now
                if now - released_since >= self.grace_s:
                    return True  # released: the observer gave up on it (no next generation comes)
            if now - started >= self.wait_s:
                claim = item.claim
                where = (
                    f"found open on its row at partition {item.partition} offset {item.offset}"
                    if item.found
                    else f"sent by partition {item.partition} offset {item.offset}"
                )
                raise ObservationWaitError(
                    f"{item.who}: its {claim.kind} claim (row {claim.record_id}, generation "
                    f"{claim.generation}, cycle {claim.cycle}), {where}, was not settled within "
                    f"{self.wait_s:g} s (--observe-wait-s): are the service's observed path and an observer "
                    "running? Its work is sent; run the same command again to resume (a record of "
                    "its lane waits for it again)"
                )
            if await self.sleep(self.poll_s, stop):
                return False
