"""Parked records, settled later: a record a path parked (a recall request waiting in its thread's lane,
`consumers.parking`) is taken out of its batch's attempt and settles in the background, so the loop fetches
on; its partition's commit stops below it until it is done. A dead letter Kafka does not acknowledge is
tried again by the one retry loop; a revoke or a shutdown drops the lanes and their settlements (the records
stay uncommitted, for the partition's next owner).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiokafka import ConsumerRecord, TopicPartition

from consumers.contract import Done, Lanes, Parked, Refused, Result
from consumers.offsets import PartitionOffsets
from consumers.runtime.intake import partition_of
from consumers.runtime.retry import Backoff, Failure, retry_batch, wait_to_retry

log = logging.getLogger(__name__)

Item = tuple[ConsumerRecord, PartitionOffsets]
Settle = Callable[[list[Item], Sequence[Done | Refused]], Awaitable[list[Item]]]
"""One try at settling items with their outcomes; returns those whose outputs failed for an outage."""


@dataclass(slots=True, kw_only=True, eq=False)
class Settlement:
    """The parked records of one loop, settling in the background, per partition."""

    path: str
    topic: str
    settle: Settle
    still_ours: Callable[[list[Item]], list[Item]]
    backoff: Backoff
    stopping: Callable[[], bool]
    _settling: dict[TopicPartition, set[asyncio.Task[None]]] = field(default_factory=dict, init=False)
    _parkings: set[Lanes] = field(default_factory=set, init=False)  # the lanes those records wait in
    # a bug met while settling one: the loop raises it
    failure: BaseException | None = field(default=None, init=False)

    def full(self) -> bool:
        """True when the lanes hold as many parked requests as they may."""
        return any(parking.full() for parking in self._parkings)

    def parked(self) -> int:
        return sum(len(parking) for parking in self._parkings)

    def take_parked(
        self, pending: list[Item], results: Sequence[Result]
    ) -> tuple[list[Item], list[Done | Refused]]:
        """Take the parked records (`Parked` results) out of an attempt: each settles in the background.
        Returns the rest, to settle now."""
        now: list[Item] = []
        answers: list[Done | Refused] = []
        for item, result in zip(pending, results, strict=True):
            match result:
                case Parked():
                    self._park(item, result)
                case Done() | Refused():
                    now.append(item)
                    answers.append(result)
        return now, answers

    def _park(self, item: Item, parked: Parked) -> None:
        self._parkings.add(parked.lanes)
        tp = partition_of(item[0])
        task = asyncio.ensure_future(self._settle_parked(item, parked))
        self._settling.setdefault(tp, set()).add(task)
        task.add_done_callback(functools.partial(self._parked_settled, tp))

    async def _settle_parked(self, item: Item, parked: Parked) -> None:
        """Once a parked record's work ran: done (the watermark moves) or a dead letter; a dead letter Kafka
        does not acknowledge is tried again by the retry loop. A dropped lane leaves the record unsettled."""
        try:
            outcome = await asyncio.shield(parked.settled)
        except asyncio.CancelledError:
            return  # its lane was dropped (revoke, shutdown): the next owner reads it again
        await retry_batch(
            [item],
            lambda items: self.settle(items, [outcome]),
            backoff=self.backoff,
            wait=self._wait,
            keep=self.still_ours,
        )

    async def _wait(self, failure: Failure[Item]) -> bool:
        await wait_to_retry(self.path, "kafka", failure.delay)
        return self.stopping()

    def _parked_settled(self, tp: TopicPartition, task: asyncio.Task[None]) -> None:
        tasks = self._settling.get(tp)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._settling[tp]
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()  # neither an outage nor bad input: the loop raises it

    async def drop(self, partitions: set[TopicPartition] | None) -> None:
        """Cancel the parked work of `partitions` (None: all) and its settlements: those records stay
        uncommitted, and the partition's next owner reads them again. Never waits for a barrier or a turn."""
        numbers = (
            None if partitions is None else {tp.partition for tp in partitions if tp.topic == self.topic}
        )
        dropped = 0
        for parking in self._parkings:
            dropped += await parking.cancel(numbers)
        tasks = [
            task
            for tp, settling in self._settling.items()
            if partitions is None or tp in partitions
            for task in settling
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if dropped:
            log.info(
                "parked requests dropped; the partition's next owner reads them again",
                extra={"path": self.path, "records": dropped},
            )
