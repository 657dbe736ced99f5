"""The turn barrier's Kafka side: how far persist is on each responses partition, and where it must get.

A request fetched from `agent.requests` partition p may be recalled once the persist side has persisted
everything below the end offset that `agent.responses` partition p had when the request's batch was fetched:
the thread's responses are keyed like its requests, so with equal partition counts they all sit there.

Progress is the furthest of two reports. In process: the persist loop's done watermark when this instance
owns the partition (fresh, no round trip). Across instances: the group's committed offset on the responses
partition (both paths share the group id), which trails the other instance's work by about one commit
interval. Per batch: one ListOffsets for the batch's partitions and, beside it, one OffsetFetch per
partition this instance does not persist (afterwards, also for one it persists but has not caught up on).
Nothing waits when the persist side is caught up. A look-up that fails is an outage
(`BarrierUnavailableError`): the batch is retried, never recalled without the barrier, never dead-lettered.

A partition whose persist owner is gone (dead, or being revoked) has no watermark here and a committed
offset that does not move: its progress comes back only with the owner the next rebalance gives it, which
reads from that committed offset (docs/operations-stream.md, section 6: the session timeout bounds it).
Nothing here holds a revoke: a wait ends at any await when its task is cancelled, a look-up in flight
included, and leaves the partition's shared look-up free for the waits after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from message_history.core.turn_rules import best_progress, lagging, partition_mismatch
from message_history.errors import BarrierUnavailableError, StartupError, WaitInterruptedError
from message_history.settings import Settings
from producers.connection import all_topic_partitions, kafka_options

log = logging.getLogger(__name__)

LocalProgress = Callable[[int], "int | None"]
"""Next offset the in-process persist loop has not persisted on a responses partition; None = not owned."""

_METADATA_REFRESH_S = 5.0  # how often a missing responses topic (or its partition count) is looked up again


def build_barrier_consumer(settings: Settings) -> AIOKafkaConsumer:
    """A consumer that never subscribes: the group id only to read the group's committed offsets."""
    return AIOKafkaConsumer(
        **kafka_options(settings, client_id="message-history-barrier"),
        group_id=settings.group_id,
        enable_auto_commit=False,
        isolation_level="read_committed",  # end offsets are the last stable offsets, what persist can read
    )


class TurnBarrier:
    """Persist progress against the responses topic's end offsets, read with a started `consumer`
    (`open_barrier` starts and stops it)."""

    poll_s = 0.01  # how often a wait reads the in-process watermark
    remote_poll_s = 0.05  # ... and the group's committed offset (one OffsetFetch per lagging partition)

    def __init__(self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, settings: Settings) -> None:
        self._consumer = consumer
        self._admin = admin
        self._requests_topic = settings.requests_topic
        self._responses_topic = settings.responses_topic
        self._timeout = max(5.0, settings.session_timeout_ms / 1000)  # one look-up's limit
        self.local: LocalProgress = lambda _partition: None
        self._partitions: set[int] | None = None
        self._checked_at = float("-inf")
        self._committed: dict[int, tuple[float, int | None]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    # --- partition counts ---

    async def check_partitions(self) -> None:
        """Refuse (`StartupError`) when both topics exist with different partition counts."""
        await self._responses_partitions(refresh=True)

    async def _responses_partitions(self, *, refresh: bool = False) -> set[int] | None:
        """The responses topic's partitions (None while it does not exist), counts checked on each refresh."""
        now = time.monotonic()
        if self._partitions is not None and not refresh:
            return self._partitions
        if not refresh and now - self._checked_at < _METADATA_REFRESH_S:
            return None
        self._checked_at = now
        try:
            async with asyncio.timeout(self._timeout):
                partitions = await all_topic_partitions(self._admin)
        except (KafkaError, TimeoutError) as exc:
            raise BarrierUnavailableError(f"barrier: metadata look-up failed: {type(exc).__name__}") from exc
        requests = partitions.get(self._requests_topic)
        responses = partitions.get(self._responses_topic)
        if partition_mismatch(len(requests) if requests else None, len(responses) if responses else None):
            raise StartupError(
                f"MESSAGE_HISTORY_BARRIER=on needs {self._requests_topic!r} and {self._responses_topic!r} to "
                f"have the same number of partitions (they have {len(requests or ())} and "
                f"{len(responses or ())}): a thread's responses must sit on the partition number of its "
                "requests. Give both topics the same count (kafka-topics.sh --alter --partitions N on the "
                "smaller one; the Helm chart sets one count for both), or set MESSAGE_HISTORY_BARRIER=off."
            )
        if responses:
            self._partitions = set(responses)
        elif requests:
            log.info("barrier: the responses topic does not exist yet; nothing to wait for")
        return self._partitions

    # --- per batch ---

    async def behind(self, partitions: Iterable[int]) -> dict[int, int]:
        """Of the requests' `partitions`, those whose persist progress is below the responses end offset now:
        {partition: end offset to reach}. One ListOffsets; OffsetFetch only where the local watermark lags."""
        wanted = sorted(set(partitions))
        known = await self._responses_partitions()
        if known and any(p not in known for p in wanted):
            # partitions were added to one topic since the last look: check the counts again (may refuse)
            known = await self._responses_partitions(refresh=True)
        if not known:
            return {}
        tps = [TopicPartition(self._responses_topic, p) for p in wanted if p in known]
        if not tps:
            return {}
        # partitions persisted elsewhere: their committed offsets are read beside the end offsets
        remote = [tp.partition for tp in tps if self.local(tp.partition) is None]
        try:
            async with asyncio.timeout(self._timeout):
                ends, committed = await asyncio.gather(
                    self._consumer.end_offsets(tps), self._fetch_committed(remote)
                )
        except (KafkaError, TimeoutError) as exc:
            raise BarrierUnavailableError(
                f"barrier: end offsets look-up failed: {type(exc).__name__}"
            ) from exc
        by_partition = {tp.partition: int(end) for tp, end in ends.items()}
        progress = {p: best_progress(self.local(p), committed.get(p)) for p in by_partition}
        behind = lagging(by_partition, progress)
        late = [p for p in behind if p not in committed]  # owned here but behind: maybe committed further
        if late:
            more = await self._fetch_committed(late)
            behind = lagging(behind, {p: best_progress(self.local(p), more.get(p)) for p in behind})
        return behind

    async def reach(
        self, partition: int, target: int, timeout_s: float, stop: asyncio.Event | None = None
    ) -> bool:
        """Wait until the persist progress of `partition` reaches `target`; False after `timeout_s`.

        The in-process watermark is read every `poll_s`, the committed offset every `remote_poll_s` (one
        look-up shared by every lane waiting on the partition). Raises `WaitInterruptedError` on `stop`.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            local = self.local(partition)
            if local is not None and local >= target:
                return True
            committed = await self._committed_cached(partition)
            if committed is not None and committed >= target:
                return True
            now = time.monotonic()
            if stop is not None and stop.is_set():
                raise WaitInterruptedError(f"stopping while partition {partition} waited for persist")
            if now >= deadline:
                return False
            await asyncio.sleep(min(self.poll_s, deadline - now))

    async def _committed_cached(self, partition: int) -> int | None:
        lock = self._locks.setdefault(partition, asyncio.Lock())
        async with lock:
            at, value = self._committed.get(partition, (float("-inf"), None))
            if time.monotonic() - at < self.remote_poll_s:
                return value
            value = (await self._fetch_committed([partition])).get(partition)
            self._committed[partition] = (time.monotonic(), value)
            return value

    async def _fetch_committed(self, partitions: list[int]) -> dict[int, int | None]:
        if not partitions:
            return {}
        tps = [TopicPartition(self._responses_topic, p) for p in partitions]
        try:
            async with asyncio.timeout(self._timeout):
                values = await asyncio.gather(*(self._consumer.committed(tp) for tp in tps))
        except (KafkaError, TimeoutError) as exc:
            raise BarrierUnavailableError(
                f"barrier: committed offsets look-up failed: {type(exc).__name__}"
            ) from exc
        return {tp.partition: (int(v) if v is not None else None) for tp, v in zip(tps, values, strict=True)}


@contextlib.asynccontextmanager
async def open_barrier(settings: Settings) -> AsyncIterator[TurnBarrier]:
    """The barrier for `settings` with its own client, partition counts checked (refuses to start when they
    differ); the client stops on the way out."""
    consumer = build_barrier_consumer(settings)
    admin = AIOKafkaAdminClient(**kafka_options(settings, client_id="message-history-barrier-admin"))
    async with contextlib.AsyncExitStack() as stack:
        await consumer.start()
        stack.push_async_callback(consumer.stop)
        await admin.start()
        stack.push_async_callback(admin.close)
        barrier = TurnBarrier(consumer, admin, settings)
        await barrier.check_partitions()
        yield barrier
