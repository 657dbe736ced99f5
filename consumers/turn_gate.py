"""Before a request is recalled: wait for the turns before it (the barrier, the busy-thread policy).

`TurnGate.open_batch` runs once per recall batch, concurrently with the history prefetch: one barrier look-up
for the batch's partitions and one read of the batch's threads' markers. Then each thread's lane asks
`must_wait` (no I/O): a request whose partition is behind or whose thread is busy under `enqueue` is parked
by the recall path in its thread's lane (`consumers.parking`), where `for_parked` gives it a gate of its own
(its batch's barrier target, the marker as its lane last left it, a fresh `turn_timeout_ms` bound) and
`admit` waits; the others are admitted at once, so neither other threads nor later batches wait for it. A
request whose wait ran out goes out with `history.complete: false`. A request that waited is recalled from
MongoDB (`fresh`): the prefetch predates what was persisted meanwhile. A thread whose pending turn is
abandoned (`abandon_after_s`) is not busy, and its request says `complete: false` (that answer is missing).
After recall, `enriched` marks the thread busy (policies enqueue and reject) while the enriched request is
sent; the record is acknowledged once both are durable (`sent`). In a recall batch the marks are held until
the batch's requests are sent, then written together (`write_marks`: one bulk write for the batch), and a
request parked in the batch starts its wait after that write: the wait reads the stored markers. A send
that fails for the record's sake (a dead letter at send time) clears the mark again: that turn will never be
answered.

A wait interrupted by the stop signal, or a marker read that fails, is not the request's fault: `admit`
returns it as `retry`; a parked request's lane tries it again (or, when stopping, leaves it to the
partition's next owner) before anything behind it runs, and in a batch the lane acknowledges the record with
that error, the rest of the thread's requests in the batch do the same (so a thread never runs past a turn
that did not finish), and the loop retries them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from consumers.contract import Ack
from consumers.runtime.containment import containable
from message_history import metrics
from message_history.core.turn_rules import (
    BusyPolicy,
    Decision,
    TurnMarker,
    busy_decision,
    is_abandoned,
    should_mark,
)
from message_history.errors import RetriableError, ThreadBusyError
from message_history.futures import follow, resolved_after
from message_history.settings import Settings

log = logging.getLogger(__name__)


_ABANDON_AFTER_S: Final[float] = Settings.model_fields["abandon_turn_after_ms"].default / 1000


class Barrier(Protocol):
    """What the gate needs of `consumers.barrier.TurnBarrier`."""

    async def behind(self, partitions: Sequence[int]) -> dict[int, int]: ...

    async def reach(
        self, partition: int, target: int, timeout_s: float, stop: asyncio.Event | None = None
    ) -> bool: ...


class TurnMarkers(Protocol):
    """What the gate needs of `storage.turns.MongoTurnMarkers`."""

    async def get_many(self, thread_ids: Sequence[str]) -> dict[str, TurnMarker]: ...

    async def mark(self, thread_id: str, request_id: str, *, resource_id: str | None = None) -> None: ...

    async def wait_answered(
        self, thread_id: str, awaited: str, timeout_s: float, stop: asyncio.Event | None = None
    ) -> TurnMarker | None: ...

    async def release(self, thread_id: str, request_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Admission:
    """The gate's answer for one request."""

    complete: bool = True
    waited_ms: int = 0
    fresh: bool = False  # it, or another request of its partition, waited: read MongoDB, not the prefetch
    refused: ThreadBusyError | None = None
    retry: RetriableError | None = None


GO = Admission()


@dataclass(frozen=True, slots=True)
class TurnGate:
    """The barrier (None = off), the markers (None with policy allow), the policy and the wait bound."""

    barrier: Barrier | None
    markers: TurnMarkers | None
    policy: BusyPolicy
    timeout_s: float
    stop: asyncio.Event | None = None
    abandon_after_s: float = _ABANDON_AFTER_S  # a pending turn unanswered this long no longer makes it busy

    async def open_batch(
        self, requests: Sequence[tuple[int, str]], *, defer_marks: bool = False
    ) -> BatchGate:
        """Look-ups for a batch of (partition, threadId): partitions behind and the threads' markers.

        `defer_marks`: the busy marks `enriched` makes are held until `write_marks` starts them together (one
        bulk write for the batch; the recall path calls it when the batch's requests are all sent)."""
        started = time.monotonic()
        partitions = sorted({p for p, _ in requests})
        behind_task = self.barrier.behind(partitions) if self.barrier else _none_behind()
        markers_task = (
            self.markers.get_many([t for _, t in requests])
            if self.markers is not None and self.policy != "allow"
            else _no_markers()
        )
        behind, markers = await asyncio.gather(behind_task, markers_task)
        abandoned_before = datetime.now(UTC) - timedelta(seconds=self.abandon_after_s)
        return BatchGate(
            self,
            deadline=started + self.timeout_s,
            behind=behind,
            markers=markers,
            abandoned_before=abandoned_before,
            deferred=[] if defer_marks else None,
        )

    def for_parked(
        self, partition: int, target: int | None, thread_id: str, marker: TurnMarker | None
    ) -> BatchGate:
        """The gate of one parked request, built when its lane reaches it: the barrier target its batch saw
        (None: not behind), its thread's marker as its lane last knew it, and a fresh wait bound (a parked
        request waits at most `timeout_s` from when the requests before it on its thread are out)."""
        return BatchGate(
            self,
            deadline=time.monotonic() + self.timeout_s,
            behind={} if target is None else {partition: target},
            markers={} if marker is None else {thread_id: marker},
            abandoned_before=datetime.now(UTC) - timedelta(seconds=self.abandon_after_s),
        )


@dataclass(frozen=True, slots=True)
class _Mark:
    """A busy mark held until the batch's `write_marks`: the future its record's acknowledgement waits on."""

    thread_id: str
    request_id: str
    resource_id: str | None
    held: asyncio.Future[None]


async def _none_behind() -> dict[int, int]:
    return {}


async def _no_markers() -> dict[str, TurnMarker]:
    return {}


@dataclass(slots=True)
class BatchGate:
    """The gate for one batch: what is behind, the markers as this batch changed them, stopped threads."""

    gate: TurnGate
    deadline: float
    behind: dict[int, int]
    markers: dict[str, TurnMarker]
    abandoned_before: datetime | None = None  # pending turns enriched before it are abandoned
    blocked: dict[str, RetriableError] = field(default_factory=dict)
    reached: set[int] = field(default_factory=set)  # partitions the barrier was waited for and reached
    deferred: list[_Mark] | None = None  # marks held for `write_marks` (None: each written at once)

    async def admit(self, partition: int, thread_id: str, request_id: str) -> Admission:
        """Wait (bounded) until the request may be recalled; see the module docstring."""
        blocked = self.blocked.get(thread_id)
        if blocked is not None:
            return Admission(retry=blocked)
        abandoned = self._abandoned(thread_id, request_id)
        if partition not in self.behind and not self._busy(thread_id, request_id):
            if partition in self.reached:
                # the barrier was reached for another request of this batch: the prefetch predates the
                # turns persisted meanwhile, so this request is recalled from MongoDB too
                return Admission(complete=not abandoned, fresh=True)
            return Admission(complete=False) if abandoned else GO
        started = time.monotonic()
        try:
            complete, refused = await self._wait(partition, thread_id, request_id)
        except RetriableError as exc:
            self.blocked[thread_id] = exc
            return Admission(retry=exc)
        waited = time.monotonic() - started
        if refused is not None:
            metrics.TURN_REFUSALS.inc()
            return Admission(refused=refused)
        metrics.TURN_WAIT_SECONDS.observe(waited)
        return Admission(complete=complete and not abandoned, waited_ms=round(waited * 1000), fresh=True)

    def must_wait(self, partition: int, thread_id: str, request_id: str) -> bool:
        """True when `admit` would wait for this request: its partition is behind, or its thread is busy
        under `enqueue` (a `reject` refusal and an abandoned turn need no wait). No I/O: the recall path parks
        such a request in its thread's lane (`consumers.parking`) instead of waiting in its batch."""
        if thread_id in self.blocked:
            return False  # `admit` answers it at once (retry)
        if partition in self.behind:
            return True
        return self._decision(self.markers.get(thread_id), request_id) == "wait"

    def _busy(self, thread_id: str, request_id: str) -> bool:
        return self._decision(self.markers.get(thread_id), request_id) != "go"

    def _decision(self, marker: TurnMarker | None, request_id: str) -> Decision:
        return busy_decision(marker, request_id, self.gate.policy, abandoned_before=self.abandoned_before)

    def _abandoned(self, thread_id: str, request_id: str) -> bool:
        """True (and said in the log) when the thread's pending turn is abandoned: a worker dropped it, or
        never got it; the request goes on without waiting, its history lacking that turn's answer."""
        marker = self.markers.get(thread_id)
        horizon = self.abandoned_before
        # busy by the policy's rule, but past the horizon: the rule's own test, then the age
        if (
            horizon is not None
            and marker is not None
            and busy_decision(marker, request_id, self.gate.policy) != "go"
            and is_abandoned(marker, horizon)
        ):
            log.warning(
                "a turn was never answered: its thread is not busy any more",
                extra={
                    "thread_id": thread_id,
                    "abandoned_request_id": marker.pending,
                    "enriched_at": marker.pending_since.isoformat() if marker.pending_since else None,
                    "request_id": request_id,
                },
            )
            return True
        return False

    async def _wait(
        self, partition: int, thread_id: str, request_id: str
    ) -> tuple[bool, ThreadBusyError | None]:
        gate, complete = self.gate, True
        target = self.behind.get(partition)
        if target is not None and gate.barrier is not None:
            metrics.TURN_WAITS.labels(reason="barrier").inc()
            if await gate.barrier.reach(partition, target, self._left(), gate.stop):
                self.behind.pop(partition, None)
                self.reached.add(partition)
            else:
                metrics.TURN_WAIT_TIMEOUTS.labels(reason="barrier").inc()
                complete = False
        marker = self.markers.get(thread_id)
        decision = self._decision(marker, request_id)
        if decision == "reject" and marker is not None and marker.pending is not None:
            return complete, ThreadBusyError(thread_id, marker.pending)
        if decision == "wait" and marker is not None and marker.pending is not None and gate.markers:
            metrics.TURN_WAITS.labels(reason="busy-thread").inc()
            after = await gate.markers.wait_answered(thread_id, marker.pending, self._left(), gate.stop)
            if after is None:
                metrics.TURN_WAIT_TIMEOUTS.labels(reason="busy-thread").inc()
                complete = False
            else:
                self.markers[thread_id] = after
        return complete, None

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def enriched(
        self, thread_id: str, request_id: str, resource_id: str | None = None
    ) -> asyncio.Future[None] | None:
        """Mark the thread busy with `request_id`: the write starts now, beside the enriched request's send.

        The caller makes it part of the record's acknowledgement, so the record is committed only once the
        mark is durable; the order of the mark and the answer does not matter (see `storage.turns`). The
        batch's own view is updated at once, so the thread's next request in this batch sees it busy.
        """
        gate = self.gate
        if gate.markers is None or gate.policy == "allow":
            return None
        marker = self.markers.get(thread_id)
        if not should_mark(marker, request_id):
            return None  # already answered: a replay or a redelivery
        self.markers[thread_id] = (marker or TurnMarker()).enriched(
            request_id, datetime.now(UTC), resource_id
        )
        if self.deferred is not None:
            held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.deferred.append(_Mark(thread_id, request_id, resource_id, held))
            return held
        return asyncio.ensure_future(gate.markers.mark(thread_id, request_id, resource_id=resource_id))

    def write_marks(self) -> asyncio.Future[Any]:
        """Start the marks `enriched` held (`open_batch(defer_marks=True)`) in one step of the event loop, so
        that they go out as one bulk write (`storage.turns` coalesces what is submitted together; a mark per
        request as it was sent made ~600 bulks of ~3 for a batch of 500). Each held future then settles as
        its write does. Later marks of this gate are written at once. Returns a future done when every one of
        them is settled (never failing: each record's acknowledgement carries its own mark's error)."""
        deferred, self.deferred = self.deferred or [], None
        markers = self.gate.markers
        writes: list[asyncio.Future[None]] = []
        for mark in deferred:
            if mark.held.done():
                continue  # its record was given up meanwhile: nobody waits for this mark
            assert markers is not None  # `enriched` holds marks only where there are markers
            write = asyncio.ensure_future(
                markers.mark(mark.thread_id, mark.request_id, resource_id=mark.resource_id)
            )
            follow(write, mark.held)
            writes.append(write)
        return asyncio.gather(*writes, return_exceptions=True)

    def sent(self, thread_id: str, request_id: str, mark: asyncio.Future[None] | None, ack: Ack) -> Ack:
        """The record's acknowledgement: `ack` (the enriched request's send) once `mark` is durable too.

        When the send fails for the record's sake (Kafka refused the enriched event for its size, say: the
        record becomes a dead letter at send time), no worker will ever answer the turn, so the thread's busy
        mark is cleared before the failure is passed on: its next request must not wait the whole turn
        timeout and go out incomplete. A failed clear fails the record as an outage (retried: the send fails
        again, the clear is written again)."""
        if mark is None:
            return ack
        if not asyncio.isfuture(ack):
            return asyncio.ensure_future(self._sent_or_released(thread_id, request_id, mark, ack))
        return self._sent_by_callbacks(thread_id, request_id, mark, ack)

    def _sent_by_callbacks(
        self, thread_id: str, request_id: str, mark: asyncio.Future[None], ack: asyncio.Future[Any]
    ) -> asyncio.Future[Any]:
        """`_sent_or_released` without a task per record in the common case (a task per record was a few
        percent of the recall path's CPU, as `consumers.contract.ack_after` found for persist): the send's
        result once the mark is durable, by done-callbacks. A send that failed takes the task (the clear
        needs I/O; rare); cancelling the result cancels what it still waits for, as cancelling the task
        would (tests/unit/test_sent_callbacks.py holds the two equal)."""
        out: asyncio.Future[Any] = ack.get_loop().create_future()

        def acked(done: asyncio.Future[Any]) -> None:
            if out.done():
                return
            if done.cancelled() or done.exception() is not None:
                follow(asyncio.ensure_future(self._sent_or_released(thread_id, request_id, mark, done)), out)
            else:
                follow(resolved_after(mark, done.result()), out)

        def cancelled(_: asyncio.Future[Any]) -> None:
            if out.cancelled() and not ack.done():
                ack.cancel()

        ack.add_done_callback(acked)
        out.add_done_callback(cancelled)
        return out

    async def _sent_or_released(
        self, thread_id: str, request_id: str, mark: asyncio.Future[None], ack: Ack
    ) -> object:
        try:
            result = await ack
        except Exception as exc:
            if not containable(exc) or self.gate.markers is None:
                await asyncio.gather(
                    mark, return_exceptions=True
                )  # settled: the send's failure is what counts
                raise
            await mark  # the clear must land after the mark it clears
            await self.gate.markers.release(thread_id, request_id)
            marker = self.markers.get(thread_id)
            if marker is not None and marker.pending == request_id:
                self.markers[thread_id] = dataclasses.replace(marker, pending=None, pending_since=None)
            log.info(
                "the enriched request was not sent: its thread is not busy",
                extra={"thread_id": thread_id, "request_id": request_id, "error_type": type(exc).__name__},
            )
            raise
        await mark
        return result
