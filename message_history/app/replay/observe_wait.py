"""`replay --observe` waits for the observations it asks for, so that what it rebuilds is deterministic.

The live persist path decides a thread's observation on the last of its turns in a batch, and never waits
for the answer: replayed, where a cycle starts would depend on `--batch-size` and where it ends on how fast
the observer answers. So a replay with `--observe` hands the persist path one record at a time, and after a
record whose save sent work (`ObservationEmitter`'s `on_work`) it waits, before the partition's next record,
until the observed path (the live service, beside the replay) has settled that claim: read back from
`mastra_observational_memory` by the claim's row and cycle. Each cycle then starts at the turn whose save
passed the threshold and covers exactly the messages before it, whatever the batch size or concurrency
(threads stay on their partition; other partitions go on meanwhile). Exactly once, the wait comes after the
record's transaction committed: the work is out before anyone waits for its answer.

The wait is bounded (`--observe-wait-s`, default `OBSERVATION_TIMEOUT_S`): past it the replay stops with an
`ObservationWaitError` naming the thread and the claim, and resumes at that record (its turn, claiming
again, sends the same claim's work again: `consumers.observe_emit`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from message_history.app.replay.plan import Counts
from message_history.errors import MessageHistoryError
from producers.output import Positioned
from storage.observational import Claim, ClaimOutcome

POLL_S = 0.1
# a reflection's answer settles its claim, then inserts the next generation (`apply_reflection`): a settled
# claim without that row is given this long to show it before it counts as released (the observer failed)
REFLECTION_GRACE_S = 2.0


class ObservationWaitError(MessageHistoryError):
    """An observation the replay sent was not settled within `--observe-wait-s`: the replay stops."""


class ClaimReader(Protocol):
    """The part of `storage.observational.MongoObservationalStore` the wait reads."""

    async def claim_outcome(self, claim: Claim) -> ClaimOutcome: ...


@dataclass(frozen=True, slots=True)
class Pending:
    """A claim whose work a replayed record sent: the thread and where the record is."""

    claim: Claim
    thread_id: str
    partition: int
    offset: int


Sleep = Callable[[float, asyncio.Event], Awaitable[bool]]


@dataclass(slots=True)
class ObservationWaits:
    """The claims each partition's last record sent (`noted`, the emitter's `on_work`), and the wait for them
    (`settle`); `counts.observing` says how many are being waited for, `counts.observations` how many were
    settled."""

    rows: ClaimReader
    counts: Counts
    _: KW_ONLY
    wait_s: float
    sleep: Sleep
    clock: Callable[[], float] = time.monotonic
    poll_s: float = POLL_S
    grace_s: float = REFLECTION_GRACE_S
    _noted: dict[int, dict[Claim, Pending]] = field(default_factory=dict, init=False)

    def noted(self, record: Positioned, claim: Claim, thread_id: str) -> None:
        """The emitter sent `claim`'s work under `record` (once per claim: a retried send is the same)."""
        self._noted.setdefault(record.partition, {})[claim] = Pending(
            claim, thread_id, record.partition, record.offset
        )

    def forget(self, partition: int) -> None:
        """Drop what `partition`'s last record noted (it is redone: its claims will be noted again)."""
        self._noted.pop(partition, None)

    async def settle(self, partition: int, stop: asyncio.Event) -> bool:
        """Wait until every claim `partition`'s last record sent is settled. False when `stop` came first;
        raises `ObservationWaitError` past `wait_s`."""
        pending = list(self._noted.pop(partition, {}).values())
        if not pending:
            return True
        waiting = len(pending)
        self.counts.observing += waiting
        try:
            for item in pending:
                if not await self._one(item, stop):
                    return False
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
                raise ObservationWaitError(
                    f"thread {item.thread_id!r}: its {claim.kind} claim (row {claim.record_id}, generation "
                    f"{claim.generation}, cycle {claim.cycle}), sent by partition {item.partition} offset "
                    f"{item.offset}, was not settled within {self.wait_s:g} s (--observe-wait-s): are the "
                    "service's observed path and an observer running? Run the same command again to resume "
                    "from that record"
                )
            if await self.sleep(self.poll_s, stop):
                return False
