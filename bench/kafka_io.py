"""The harness's side of Kafka: topics, preloading input, counting output, and timing single events.

Every input record carries a `bench-seq` header (its index), then the record's own headers if it has any
(the contract stream lines' `bench-contract`); every output the lines produce carries the input's headers
through (the contract's header propagation, which the pass-through and naive lines copy), so an output is
matched to its input without parsing the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.progress import Progress
from message_history.settings import Settings
from producers.connection import kafka_options

SEQ_HEADER = "bench-seq"
Headers = tuple[tuple[str, bytes], ...]
Record = tuple[bytes, bytes] | tuple[bytes, bytes, Headers]  # key, value[, headers of its own]


def record_parts(record: Record, seq: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and the headers to send: the `bench-seq` of `seq`, then the record's own. Pure."""
    own: Headers = record[2] if len(record) == 3 else ()
    return record[0], record[1], [(SEQ_HEADER, str(seq).encode()), *own]


def _options(settings: Settings, client_id: str) -> dict[str, Any]:
    return kafka_options(settings, client_id=client_id)


async def create_topics(settings: Settings, names: Sequence[str], partitions: int) -> None:
    """Create `names` with `partitions` each and wait until every partition has a leader."""
    admin = AIOKafkaAdminClient(**_options(settings, "bench-admin"), request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, partitions, 1) for n in names], timeout_ms=30_000)
        async with asyncio.timeout(60):
            while True:
                described = await admin.describe_topics(list(names))
                ready = all(
                    len(t["partitions"]) == partitions and all(p["leader"] >= 0 for p in t["partitions"])
                    for t in described
                )
                if ready and len(described) == len(names):
                    return
                await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def caught_up_topic(settings: Settings, topic: str, partitions: int, group_id: str) -> None:
    """`topic` with one record per partition, and `group_id`'s offsets committed at its end.

    The turn barrier's steady state: the responses topic is not empty and the persist side (here: the
    group's committed offsets, as when another instance persists) has reached its end.
    """
    await create_topics(settings, [topic], partitions)
    producer = AIOKafkaProducer(**_options(settings, "bench-caught-up"), acks="all")
    await producer.start()
    try:
        sent = [await producer.send(topic, value=b"{}", partition=p) for p in range(partitions)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        **_options(settings, "bench-caught-up"), group_id=group_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.commit(dict(ends))
    finally:
        await consumer.stop()


async def delete_topics(settings: Settings, names: Sequence[str]) -> None:
    """Best effort: a long-lived local broker should not keep the benchmark's gigabytes."""
    if not names:
        return
    admin = AIOKafkaAdminClient(**_options(settings, "bench-admin"), request_timeout_ms=30_000)
    await admin.start()
    try:
        with contextlib.suppress(Exception):
            await admin.delete_topics(list(names), timeout_ms=30_000)
    finally:
        await admin.close()


def seq_of(headers: Iterable[tuple[str, bytes]] | None) -> int | None:
    for key, value in headers or ():
        if key == SEQ_HEADER:
            return int(value)
    return None


async def preload(
    settings: Settings, topic: str, count: int, record: Callable[[int], Record], progress: Progress
) -> tuple[int, float]:
    """Write records `0 .. count-1` in one Kafka transaction; (bytes written, `perf_counter` at the commit).

    Consumers reading committed records (the service, B1 and naive all do) see none of them until the
    commit, then all at once: a backlog released at a known instant, with the line already warm.
    """
    producer = AIOKafkaProducer(
        **_options(settings, "bench-preload"),
        transactional_id=f"bench-preload-{topic}",
        transaction_timeout_ms=600_000,
        linger_ms=20,
        max_batch_size=1024 * 1024,
        max_request_size=16 * 1024 * 1024,
    )
    await producer.start()
    written = 0
    try:
        await producer.begin_transaction()
        pending: list[asyncio.Future[Any]] = []
        for i in range(count):
            key, value, headers = record_parts(record(i), i)
            written += len(value)
            pending.append(await producer.send(topic, value=value, key=key, headers=headers))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
                progress.update(i + 1, count)
        await asyncio.gather(*pending)
        await producer.commit_transaction()
        released = time.perf_counter()
        progress.update(count, count, force=True)
    finally:
        await producer.stop()
    return written, released


class OutputCounter:
    """Counts records on a topic by its end offsets (cheap: no payload is fetched)."""

    def __init__(self, settings: Settings, topic: str, partitions: int) -> None:
        self._consumer = AIOKafkaConsumer(**_options(settings, "bench-counter"), group_id=None)
        self._partitions = [TopicPartition(topic, p) for p in range(partitions)]

    async def __aenter__(self) -> OutputCounter:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def count(self) -> int:
        ends = await self._consumer.end_offsets(self._partitions)
        return int(sum(ends.values()))


class LatencyProbe:
    """Sends records at a fixed rate and times each until its output is readable on the output topic."""

    def __init__(self, settings: Settings, in_topic: str, out_topic: str, partitions: int) -> None:
        self._settings = settings
        self._in = in_topic
        self._partitions = [TopicPartition(out_topic, p) for p in range(partitions)]
        self._sent: dict[int, float] = {}
        self.sent_wall: dict[
            int, float
        ] = {}  # time.time(), for `bench.steps.tail` (one clock with the lines)
        self.read_wall: dict[int, float] = {}
        self.latencies_ms: dict[int, float] = {}
        self.output_bytes = 0
        self.output_count = 0

    async def run(
        self,
        record: Callable[[int], Record],
        *,
        first_seq: int,
        count: int,
        rate: float,
        timeout_s: float,
    ) -> list[float]:
        """Send `count` records (seqs from `first_seq`) at `rate`/s; the latencies that arrived in time."""
        # committed records only: an exactly-once line's output counts once its transaction committed
        consumer = AIOKafkaConsumer(
            **_options(self._settings, "bench-latency"), group_id=None, isolation_level="read_committed"
        )
        producer = AIOKafkaProducer(
            **_options(self._settings, "bench-latency"),
            acks="all",
            linger_ms=0,
            max_request_size=16 * 1024 * 1024,
        )
        await consumer.start()
        await producer.start()
        try:
            consumer.assign(self._partitions)
            await consumer.seek_to_end(*self._partitions)
            for tp in self._partitions:
                await consumer.position(tp)  # resolve the end now, before anything is sent
            reader = asyncio.create_task(self._read(consumer, first_seq, count))
            started = time.perf_counter()
            acks = []
            for j in range(count):
                delay = started + j / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                seq = first_seq + j
                key, value, headers = record_parts(record(j), seq)
                self._sent[seq] = time.perf_counter()
                self.sent_wall[seq] = time.time()
                acks.append(await producer.send(self._in, value=value, key=key, headers=headers))
            await asyncio.gather(*acks)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), timeout_s)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        finally:
            await producer.stop()
            await consumer.stop()
        return list(self.latencies_ms.values())

    async def _read(self, consumer: AIOKafkaConsumer, first_seq: int, count: int) -> None:
        while len(self.latencies_ms) < count:
            batch = await consumer.getmany(timeout_ms=100)
            now, wall = time.perf_counter(), time.time()
            for records in batch.values():
                for rec in records:
                    seq = seq_of(rec.headers)
                    if seq is None or seq in self.latencies_ms or seq not in self._sent:
                        continue
                    self.latencies_ms[seq] = (now - self._sent[seq]) * 1000
                    self.read_wall[seq] = wall
                    self.output_bytes += len(rec.value or b"")
                    self.output_count += 1


async def wait_for_group(settings: Settings, group: str, members: int, timeout_s: float) -> None:
    """Until consumer group `group` is `Stable` with at least `members` members (DescribeGroups every
    200 ms): every instance of a line has joined and the rebalance is over."""
    admin = AIOKafkaAdminClient(**_options(settings, "bench-admin"), request_timeout_ms=30_000)
    await admin.start()
    seen: tuple[str, int] = ("", 0)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                for response in await admin.describe_consumer_groups([group]):
                    for (
                        described
                    ) in response.groups:  # (error, group, state, protocol type, protocol, members)
                        seen = (str(described[2]), len(described[5]))
                if seen[0] == "Stable" and seen[1] >= members:
                    return
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise RuntimeError(
            f"group {group}: {seen[0] or 'unknown'} with {seen[1]} of {members} members"
        ) from None
    finally:
        await admin.close()
