"""A loop's intake: subscribe once the topic exists, fetch, read an unreadable batch record by record, wait
while polling, pause and resume (held by named reasons, in one place), the rebalance listener, and the
positions handed out.

Pausing has one owner (as quix-streams' `PausingManager`): a reason (`OUTAGE`, `PARKED`, `HELD`) holds
every assigned partition paused until it is released; intake resumes only when no reason is left. A
partition assigned meanwhile is paused at once. While held, the loop keeps calling `getmany` on the paused
partitions (`wait_polling`) so that the consumer stays in the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from consumers.consumer import Health, LoopOptions
from consumers.runtime.retry import is_outage, wait_to_retry
from consumers.unreadable import UnreadableRecord, is_unreadable, read_carefully, rewind
from message_history import metrics

log = logging.getLogger(__name__)

OUTAGE = "outage"  # a dependency is down: the batch in hand waits out its backoff
PARKED = "parked"  # parked requests at their cap
HELD = "held"  # exactly-once: held outputs at their cap

_TOPIC_POLL_S = 1.0  # how often a missing input topic is looked for
_TOPIC_REPORT_EVERY_S = 30.0  # how often the wait for it is logged

Fetched: TypeAlias = "ConsumerRecord | UnreadableRecord"


class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type information
    """The rebalance listener: hands aiokafka's callbacks to the loop."""

    def __init__(
        self,
        revoked: Callable[[set[TopicPartition]], Awaitable[None]],
        assigned: Callable[[set[TopicPartition]], Awaitable[None]],
    ) -> None:
        self._revoked = revoked
        self._assigned = assigned

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._assigned(set(assigned))


@dataclass(slots=True, kw_only=True, eq=False)
class Intake:
    """One loop's consumer as a source of batches: what is assigned, what was handed out, what holds it."""

    path: str
    topic: str
    consumer: AIOKafkaConsumer
    health: Health
    options: LoopOptions
    assigned: set[TopicPartition] = field(default_factory=set, init=False)
    # one past the last record fetched, per partition
    _handed_out: dict[TopicPartition, int] = field(default_factory=dict, init=False)
    _holds: set[str] = field(default_factory=set, init=False)  # the reasons intake is paused

    # --- pausing --------------------------------------------------------------------------------------------

    def hold(self, reason: str) -> None:
        """Pause every assigned partition until `reason` is released (and every other reason too)."""
        self._holds.add(reason)
        self._pause_all()

    def release(self, reason: str) -> None:
        """Drop `reason`; intake resumes when it was the last."""
        self._holds.discard(reason)
        if self._holds:
            return
        paused = self.consumer.paused()
        if paused:
            self.consumer.resume(*paused)
        metrics.PAUSED_PARTITIONS.labels(path=self.path).set(0)

    def holds(self, reason: str) -> bool:
        return reason in self._holds

    def _pause_all(self) -> None:
        assigned = self.consumer.assignment()
        if assigned:
            self.consumer.pause(*assigned)
        metrics.PAUSED_PARTITIONS.labels(path=self.path).set(len(assigned))

    # --- rebalances -----------------------------------------------------------------------------------------

    def take(self, assigned: set[TopicPartition]) -> None:
        """New partitions: fetching starts from the committed offset; paused at once while intake is held."""
        self.assigned |= assigned
        for tp in assigned:
            self._handed_out.pop(tp, None)
        if self._holds and assigned:
            self._pause_all()  # the new ones with the others, and the paused-partitions gauge says so

    def owned(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of `partitions` still assigned here."""
        return [tp for tp in partitions if tp in self.assigned]

    def drop(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self._handed_out.pop(tp, None)
        self.assigned -= revoked

    # --- subscribing and fetching ---------------------------------------------------------------------------

    async def subscribe_once_topic_exists(self, stop: asyncio.Event, listener: Listener) -> bool:
        """Join the group only once the input topic exists; False if told to stop while waiting.

        Subscribing to a topic that does not exist yet gets an empty assignment, and when a producer's
        auto-create makes the topic later the consumer only notices at its next metadata refresh (five minutes
        by default): records would sit unread. So wait, not ready, saying why.
        """
        started = time.monotonic()
        next_report = started
        while not stop.is_set():
            try:
                exists = self.topic in await self.consumer.topics()
            except KafkaError:
                # a metadata request that failed (aiokafka raises a bare KafkaError when no broker answers
                # it): not found yet. The commands path polls here for as long as its topic is missing.
                exists = False
            if exists:
                break
            now = time.monotonic()
            if now >= next_report:
                waited = round(now - started)
                log.warning(
                    "input topic does not exist yet (or this principal may not describe it); waiting for it",
                    extra={"path": self.path, "topic": self.topic, "waited_s": waited},
                )
                self.health.set_ready(self.path, False, f"input topic {self.topic!r} does not exist")
                next_report = now + _TOPIC_REPORT_EVERY_S
            self.health.beat(self.path)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _TOPIC_POLL_S)
        if stop.is_set():
            return False
        self.consumer.subscribe([self.topic], listener=listener)
        self.health.set_ready(self.path, True)
        return True

    async def fetch(self) -> list[Fetched]:
        """The next batch of the assigned partitions ([] after a fetch that failed for an outage)."""
        try:
            fetched = await self.consumer.getmany(
                timeout_ms=self.options.poll_timeout_ms, max_records=self.options.max_batch_records
            )
        except KafkaError as exc:
            if not is_outage(exc):
                if is_unreadable(exc):
                    return await self._fetch_carefully(exc)
                raise
            await wait_to_retry(
                self.path,
                "kafka",
                self.options.retry_initial_s,
                "fetch failed, retrying",
                extra={"error": type(exc).__name__},
                logger=log,
            )
            return []
        except Exception as exc:
            if is_outage(exc) or not is_unreadable(exc):
                raise
            return await self._fetch_carefully(exc)
        records: list[Fetched] = []
        for tp, recs in fetched.items():
            if tp not in self.assigned:
                if recs and tp in self.consumer.assignment():
                    self.consumer.seek(tp, recs[0].offset)  # ours, listener not run yet: read them again
                continue  # else revoked meanwhile: the partition's next owner reads them from the commit
            records.extend(recs)
            if recs:
                self._handed_out[tp] = recs[-1].offset + 1
            highwater = self.consumer.highwater(tp)
            if highwater is not None:
                metrics.CONSUMER_LAG.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    max(0, highwater - (recs[-1].offset + 1))
                )
        return records

    async def _fetch_carefully(self, error: BaseException) -> list[Fetched]:
        """After `getmany` failed on a batch it cannot read: rewind, read one record at a time."""
        log.warning(
            "a fetched record batch cannot be read; reading record by record to dead-letter it",
            extra={"path": self.path, "error": type(error).__name__, "reason": str(error)[:200]},
        )
        owned = [tp for tp in self.consumer.assignment() if tp in self.assigned]
        await rewind(self.consumer, owned, self._handed_out)
        records, found = await read_carefully(
            self.consumer,
            owned,
            max_records=self.options.max_batch_records,
            timeout_ms=self.options.poll_timeout_ms,
        )
        for record in records:
            self._handed_out[partition_of(record)] = record.offset + 1
        if found:
            log.warning("unreadable records found", extra={"path": self.path, "records": found[:20]})
        return records

    async def wait_polling(self, seconds: float, stop: asyncio.Event, tick: Callable[[], None]) -> None:
        """Wait `seconds` while polling with every partition paused, so the consumer stays in the group;
        `tick` (the loop's background commit) runs after each poll."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._pause_all()
            self.health.beat(self.path)
            try:
                fetched = await self.consumer.getmany(timeout_ms=max(1, int(min(remaining, 1.0) * 1000)))
            except Exception as exc:
                if not (is_outage(exc) or is_unreadable(exc)):
                    raise
                if not is_outage(exc):  # read again (and dead-lettered) once the wait is over
                    await rewind(self.consumer, self.consumer.assignment(), self._handed_out)
                await asyncio.sleep(min(remaining, self.options.poll_timeout_ms / 1000))
                continue
            owned = self.consumer.assignment()
            for tp, recs in fetched.items():
                # assigned during the wait and not paused yet: hand the records back for later
                if recs and tp in owned:
                    self.consumer.seek(tp, recs[0].offset)
            tick()


def positions(records: Iterable[Fetched]) -> dict[str, str]:
    """`{"topic[partition]": "first-last"}` offsets of a batch, for a log line."""
    ranges: dict[str, tuple[int, int]] = {}
    for record in records:
        key = f"{record.topic}[{record.partition}]"
        low, high = ranges.get(key, (record.offset, record.offset))
        ranges[key] = (min(low, record.offset), max(high, record.offset))
    return {key: f"{low}-{high}" for key, (low, high) in ranges.items()}


def partition_of(record: Fetched) -> TopicPartition:
    return TopicPartition(record.topic, record.partition)
