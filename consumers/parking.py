"""Parked requests: a request that must wait holds its own thread's lane, never its batch or its partition.

The recall path *parks* a request that has to wait (the barrier, a busy thread under `enqueue`), and every
later request of that thread, in its batch or a later one, behind it. Parked work runs in one task per lane (a
partition and a thread): its entries one after the other, each to the end (waited, recalled, sent, and its
outputs acknowledged) before the next starts, so a thread's order is kept. The handler answers a parked
record with a `Parked` (`consumers.contract`): the loop does not wait for it before fetching on, and settles
it in the background when it resolves (`Done`: the watermark moves; `Refused`: a dead letter). Until then
the partition's commit stops below the record (`consumers.offsets`), so a crash or a revoke leaves it for
the partition's next owner.

An entry that fails for an outage is tried again in its lane by the one retry loop (`runtime.retry`),
before anything behind it runs; when stopping, it is left unsettled. `cancel` drops the lanes of revoked
partitions (their records are read again by the next owner) or, at shutdown, every lane.

The lanes are bounded: `full()` once `capacity` records are parked; the loop then stops fetching (its
partitions paused, still polling to stay in the group) until parked work finishes. A batch parks whatever
it holds, so the bound may be passed by at most one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from consumers.contract import Ack, Done, Parked, Refused
from consumers.outage_log import OutageLog
from consumers.runtime.retry import Backoff, Failure, is_outage, outage_dependency, retry_batch, wait_to_retry
from consumers.timeouts import TimeoutStrikes
from message_history import metrics
from message_history.errors import InvalidInputError

S = TypeVar("S")

LaneKey = tuple[int, str]
"""(partition, threadId): a mis-keyed thread's records on two partitions are two lanes, each revoked apart."""

Outcome = Done | Refused
"""A parked record's result: `Done` with its acknowledgement already resolved (or failed), or `Refused`."""

Work = Callable[["Lane[S]"], Awaitable[Ack | InvalidInputError]]
"""A parked record's work: waits, recalls and sends; returns the output's acknowledgement or a refusal."""


@dataclass(slots=True)
class Lane(Generic[S]):
    """One thread's parked work, in order, and what its work remembers between entries (`state`)."""

    state: S
    entries: deque[_Entry[S]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


@dataclass(slots=True, eq=False)
class _Entry(Generic[S]):
    work: Work[S]
    outcome: asyncio.Future[Outcome]


class ParkedLanes(Generic[S]):
    """The parked lanes of one path (see the module docstring)."""

    def __init__(
        self, *, path: str, capacity: int, backoff: Backoff, stop: asyncio.Event | None = None
    ) -> None:
        self.path = path
        self.capacity = capacity
        self._backoff = backoff
        self._stop = stop
        self._lanes: dict[LaneKey, Lane[S]] = {}
        self._ended: dict[LaneKey, S] = {}  # lanes ended since the current batch began: their last state
        self._batch: list[tuple[LaneKey, _Entry[S]]] = []  # what the current batch parked
        self._parked = 0
        # set by the service: an entry whose own MongoDB operation keeps timing out is its dead letter
        self.timeouts: TimeoutStrikes | None = None
        # one WARNING per outage for all the parked requests, not one per request and retry
        self._outage_logs = {dep: OutageLog(path, dep) for dep in ("kafka", "mongodb")}

    def __len__(self) -> int:
        """Records parked and not settled yet."""
        return self._parked

    def full(self) -> bool:
        return self._parked >= self.capacity

    def begin_batch(self) -> None:
        """Called before a batch reads its look-ups: the lanes that ended before are visible to them."""
        self._ended.clear()
        self._batch = []

    async def abort_batch(self) -> None:
        """The current batch failed and will be tried again whole: drop what it parked (it parks them again),
        so no parked copy runs unwatched beside the retried one."""
        parked, self._batch = self._batch, []
        by_lane: dict[LaneKey, list[_Entry[S]]] = {}
        for key, entry in parked:
            by_lane.setdefault(key, []).append(entry)
        tasks: list[asyncio.Task[None]] = []
        for key, entries in by_lane.items():
            lane = self._lanes.get(key)
            if lane is None:
                continue
            dropped = [e for e in lane.entries if any(e is d for d in entries)]
            for entry in dropped:
                entry.outcome.cancel()
            self._parked -= len(dropped)
            if lane.entries and lane.entries[0] in dropped:
                # the batch's entries are the lane's tail: its head started, so the whole lane is the batch's
                self._lanes.pop(key)
                lane.entries.clear()
                if lane.task is not None:
                    lane.task.cancel()
                    tasks.append(lane.task)
            else:
                lane.entries = deque(e for e in lane.entries if e not in dropped)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        metrics.PARKED.labels(path=self.path).set(self._parked)

    def holds(self, key: LaneKey) -> bool:
        """True when `key` has parked work, or had some that ended after the current batch began (the batch's
        look-ups may predate that work's effects, so its next request is parked too, to start from the lane's
        last state)."""
        return key in self._lanes or key in self._ended

    def last_state(self, key: LaneKey, default: S) -> S:
        """The state `key`'s lane holds (or ended with during this batch), else `default`."""
        lane = self._lanes.get(key)
        if lane is not None:
            return lane.state
        return self._ended.get(key, default)

    def park(self, key: LaneKey, work: Work[S], state: S) -> Parked:
        """Queue `work` behind the lane's parked work (`state` starts a new lane: the batch's view, unless
        the lane ended during this batch). `work` waits, recalls and sends; it returns the output's
        acknowledgement or a refusal, and raises for an outage (tried again) or a bug (the loop raises it)."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(self._ended.pop(key, state))
        outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        entry = _Entry(work, outcome)
        lane.entries.append(entry)
        self._batch.append((key, entry))
        self._parked += 1
        metrics.PARKED.labels(path=self.path).set(self._parked)
        if lane.task is None:
            lane.task = asyncio.ensure_future(self._run(key, lane))
        return Parked(outcome, self)

    async def cancel(self, partitions: Iterable[int] | None = None) -> int:
        """Drop the lanes of `partitions` (None: every lane): their work stops, their records stay unsettled
        (the loop leaves them uncommitted). Returns how many records were dropped."""
        chosen = None if partitions is None else set(partitions)
        keys = [k for k in self._lanes if chosen is None or k[0] in chosen]
        dropped = 0
        tasks: list[asyncio.Task[None]] = []
        for key in keys:
            lane = self._lanes.pop(key)
            self._ended.pop(key, None)
            for entry in lane.entries:
                if not entry.outcome.done():
                    entry.outcome.cancel()
                    dropped += 1
            self._parked -= len(lane.entries)
            lane.entries.clear()
            if lane.task is not None:
                lane.task.cancel()
                tasks.append(lane.task)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        metrics.PARKED.labels(path=self.path).set(self._parked)
        return dropped

    async def _run(self, key: LaneKey, lane: Lane[S]) -> None:
        while lane.entries:
            entry = lane.entries[0]
            settled = await self._settle(entry, lane, key)
            if not settled:
                return  # stopping during an outage: the record is left for the next owner
            if not lane.entries or lane.entries[0] is not entry:
                return  # dropped by `cancel` while its work was ending (a wait that swallowed the cancel)
            lane.entries.popleft()
            self._parked -= 1
            metrics.PARKED.labels(path=self.path).set(self._parked)
        if self._lanes.get(key) is lane:
            del self._lanes[key]
            self._ended[key] = lane.state

    async def _settle(self, entry: _Entry[S], lane: Lane[S], key: LaneKey) -> bool:
        """Run `entry` to its outcome, trying again after an outage; False when stopped before it ended."""

        async def once(_: list[None]) -> list[None]:
            outcome: Outcome
            try:
                result = await entry.work(lane)
                outcome = (
                    Refused(result)
                    if isinstance(result, InvalidInputError)
                    else Done(_resolved(await result))
                )
            except InvalidInputError as exc:
                outcome = Refused(exc)
            except Exception as exc:
                if not is_outage(exc):
                    outcome = Done(
                        _raising(exc)
                    )  # too large for Kafka, or a bug: the loop's settlement decides
                else:
                    name = f"parked in partition {key[0]}, thread {key[1]!r}"
                    verdict = None if self.timeouts is None else await self.timeouts.judge(entry, exc, name)
                    if verdict is None:
                        raise  # tried again, in this lane, before anything behind it
                    outcome = Refused(verdict)  # its own operation keeps timing out: a dead letter
            if not entry.outcome.done():
                entry.outcome.set_result(outcome)
            return []

        try:
            left = await retry_batch(
                [None], once, backoff=self._backoff, wait=self._wait, recovered=self._recovered
            )
        finally:
            if self.timeouts is not None:
                self.timeouts.forget(entry)
        return not left

    def _recovered(self) -> None:
        for outage_log in self._outage_logs.values():
            outage_log.back()

    async def _wait(self, failure: Failure[None]) -> bool:
        error = failure.error
        dependency = outage_dependency(error)  # labelled as the loop labels its outages
        self._outage_logs[dependency].failed(
            f"{dependency} unavailable: {type(error).__name__}: parked requests retried in their lanes"
        )
        await wait_to_retry(self.path, dependency, failure.delay, sleep=self._sleep)
        return self._stopping()

    async def _sleep(self, delay: float) -> None:
        """The backoff, cut short when the loop stops (and skipped when it has)."""
        if self._stopping():
            return
        with contextlib.suppress(TimeoutError):
            if self._stop is not None:
                await asyncio.wait_for(self._stop.wait(), delay)
            else:
                await asyncio.sleep(delay)

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()


def _resolved(value: object) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _raising(error: BaseException) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future
