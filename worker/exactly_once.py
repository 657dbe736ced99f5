"""The worker SDK's exactly-once side (`processing_guarantee="exactly-once"`), as `worker-ts`'s
`src/transactions.ts` is the TypeScript worker's.

Each response is filed under its enriched record's offset (`consumers.runtime.emit.FileUnderOffset`), and at
the end of the batch the answered responses of each partition go out with that partition's consumed offset in
one Kafka transaction (`producers.transactions.PartitionTransactions`: a producer per owned partition,
transactional id `{group}:{enriched topic}:{partition}`, as the service's). A partition is read only once its
producer is open (its previous holder fenced) and it is positioned at the offset committed after that
(`open`): records fetched before are handed back (`only_ready`). A commit whose answer does not come in time
is settled on the same producer before anything is sent again, never taken for an abort (`commit`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from consumers.runtime.retry import is_outage
from message_history.errors import RetriableError
from producers.transactional import HeldOutput, commit_failure
from producers.transactions import PartitionTransactions, Refused

log = logging.getLogger(__name__)


class WorkerTransactions:
    """The worker's partitions under exactly-once: their producers, held responses and readiness."""

    def __init__(
        self,
        options: Mapping[str, Any],
        *,
        group_id: str,
        stop: asyncio.Event,
        delay: Callable[[int], float],
        refused: Refused,
        commit_timeout_s: float,
    ) -> None:
        """`delay(attempt)`: the wait before a retry; `refused`: what replaces a response the broker
        refused for its size (a failed turn's); `commit_timeout_s`: one try at a transaction, past it the
        commit is in doubt (settled by the next try)."""
        self.partitions = PartitionTransactions.for_client(options, group_id=group_id, path="worker")
        self.partitions.refused = refused
        self._stop = stop
        self._delay = delay
        self._commit_timeout_s = commit_timeout_s
        self._ready: set[TopicPartition] = set()  # partitions fenced, at their committed offset
        self._consumer: AIOKafkaConsumer | None = None

    def attach(self, consumer: AIOKafkaConsumer) -> None:
        """The consumer whose partitions these are (its committed offsets settle a commit in doubt)."""
        self._consumer = consumer
        self.partitions.read_committed = consumer.committed

    async def open(self, assigned: set[TopicPartition]) -> None:
        """A transactional producer per new partition (fencing its previous holder), then the partition
        starts from the offset committed after that (an earlier read could be stale)."""
        consumer = self._consumer
        if consumer is None or not assigned:
            return
        attempt = 0
        while True:
            try:
                await self.partitions.open_at_committed(assigned, consumer.seek)
                self._ready |= assigned  # no await since the seeks: nothing fetched before is taken after
                return  # noqa: TRY300 -- the retry loop's exit
            except KafkaError as exc:  # the partitions cannot be read safely before their ids are fenced
                if not is_outage(exc) or self._stop.is_set():
                    raise
                attempt += 1
                log.warning(
                    "transactional producers not ready; retrying", extra={"error": type(exc).__name__}
                )
                await asyncio.sleep(self._delay(attempt))

    async def close(self, revoked: set[TopicPartition] | None = None) -> None:
        """Let go of `revoked` (None: all): their held responses dropped, the next owner answers again."""
        self._ready = set() if revoked is None else self._ready - revoked
        await self.partitions.close(revoked)

    def only_ready(
        self, fetched: dict[TopicPartition, list[ConsumerRecord]]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of a partition whose producer is not open yet (its assignment's listener still runs)
        are handed back: they may come from an offset read before the previous owner's last commit."""
        ready: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp, recs in fetched.items():
            if tp in self._ready:
                ready[tp] = recs
            elif recs and self._consumer is not None and tp in self._consumer.assignment():
                self._consumer.seek(tp, recs[0].offset)
        return ready

    def hold(self, record: ConsumerRecord, outputs: list[HeldOutput], source: object) -> None:
        """File the outputs of answering `record` (its response, filed by `consumers.runtime.emit`) under its
        offset, until the transaction committing it."""
        tp = TopicPartition(record.topic, record.partition)
        self.partitions.hold(tp, record.offset, outputs, source)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Each partition's held responses and its offset in one transaction, retried while Kafka is down
        (until stopped: then the next owner answers those turns again, none of them visible twice). A commit
        whose answer did not come in time is in doubt: the next try settles it (same producer) before
        anything is sent again, so a response is never committed twice. A missing ACL is logged at ERROR
        and retried; any other refusal (neither retriable nor fencing) is raised: the worker stops."""
        transactions = self.partitions
        for tp, offset in offsets.items():
            attempt = 0
            while True:
                try:
                    await asyncio.wait_for(transactions.commit(tp, offset), self._commit_timeout_s)
                    break
                except (KafkaError, TimeoutError, RetriableError) as exc:
                    failure = commit_failure(exc)
                    if failure == "systemic":
                        raise
                    if self._stop.is_set():
                        log.warning(
                            "transaction not committed: its turns go to the next owner",
                            extra={"error": type(exc).__name__, "in_doubt": tp in transactions.in_doubt()},
                        )
                        break
                    if failure == "unauthorized":
                        log.error(  # noqa: TRY400 -- an ACL to grant, not a traceback to read
                            "Kafka authorization failed for a transaction: grant the ACLs; retrying",
                            extra={"error": type(exc).__name__, "detail": str(exc)[:300]},
                        )
                    attempt += 1
                    await asyncio.sleep(self._delay(attempt))
