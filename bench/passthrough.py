"""B1: the ceiling for moving the events: consume and produce the same bytes, with nothing in between.

Shaped like the service's loop at its best: `getmany` batches of up to `batch` records, every record sent
without awaiting it (the producer lingers and batches as the service's does: `acks=all`, idempotent, same
linger and batch size; `config["linger_ms"]` overrides the linger), the batch's acknowledgements gathered,
then the batch's offsets committed in the background. Headers are passed through, so the harness can match
outputs to inputs.

With `config["contract"]` (the idle line's third process): before forwarding a record, the MongoDB trips the
service's contract asks of its turn (`bench.contract`), the turn named by the record's `bench-contract`
header, its path by the topic (`contract.recall_topic`, else persist): for a recall, the three finds together,
then the record sent with the busy mark beside it (the service marks after handing over its output); for a
persist, the three finds, then the two bulks, then the record sent. The commands are built from the header
(a few microseconds), the threads' stored `_id`s read at start, the messages' contents made once: no model of
ours. Its messages get ids of their own (`:fwd` after the turn's) and a time a millisecond after the turn's
assistant message, so they are new rows and their thread's `updatedAt` moves, as with the service's write.
It reads `config["in_topics"]` when given (the idle contract forwarder's two: one per path), else `in_topic`
(the contract stream lines, `bench.lines`: one path, a batch of `getmany` at a time, as B1).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient

from bench import contract
from bench.workload import Workload
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import MAX_BATCH_BYTES

_RAW: Final[CodecOptions[RawBSONDocument]] = CodecOptions(document_class=RawBSONDocument)
# the contract forwarder's messages: just after the turn's assistant message (a second after its request)
_LATER: Final = timedelta(seconds=1, milliseconds=1)


async def run(config: dict[str, Any], stop: asyncio.Event) -> None:
    """Pass records from `config["in_topic"]` to `config["out_topic"]` until `stop` is set."""
    settings = Settings()
    consumer = AIOKafkaConsumer(
        *(config.get("in_topics") or [config["in_topic"]]),
        **kafka_options(settings, client_id="bench-b1"),
        group_id=config["group_id"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",  # as the service: the harness releases its backlog atomically
        max_poll_records=config["batch"],
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    producer = AIOKafkaProducer(
        **kafka_options(settings, client_id="bench-b1"),
        acks="all",
        enable_idempotence=True,
        # the service's linger unless told (the idle line's forwarder is the floor: no linger at all)
        linger_ms=int(config.get("linger_ms", settings.linger_ms)),
        max_batch_size=MAX_BATCH_BYTES,
        max_request_size=16 * 1024 * 1024,
    )
    trips = await _ContractTrips.open(config["contract"], settings) if config.get("contract") else None
    await consumer.start()
    await producer.start()
    commit: asyncio.Task[None] | None = None
    uncommitted: dict[Any, int] = {}
    out = config["out_topic"]
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=config["batch"])
            if not batch:
                continue
            after: list[Awaitable[Any]] = []
            if trips is not None:  # the contract's trips before the output, its busy marks beside it
                after = await trips.before_send([rec for records in batch.values() for rec in records])
            acks = [
                await producer.send(out, value=rec.value, key=rec.key, headers=list(rec.headers or ()))
                for records in batch.values()
                for rec in records
            ]
            await asyncio.gather(*acks, *after)
            uncommitted.update({tp: records[-1].offset + 1 for tp, records in batch.items() if records})
            if commit is None or commit.done():  # one commit in flight at a time; the next one catches up
                commit = asyncio.create_task(consumer.commit(dict(uncommitted)))
                uncommitted.clear()
    finally:
        if commit is not None:
            with contextlib.suppress(Exception):
                await commit
        await producer.stop()
        await consumer.stop()
        if trips is not None:
            await trips.close()


class _ContractTrips:
    """The MongoDB trips of the contract, per batch of records, on a raw-coded client of its own."""

    def __init__(self, config: dict[str, Any], client: AsyncMongoClient[Any], keys: dict[str, Any]) -> None:
        self._client = client
        self._db = client[config["db"]].with_options(codec_options=_RAW)
        self._recall_topic = config["recall_topic"]
        self._limit = int(config["limit"])
        self._keys = keys
        body = "x" * int(config["message_bytes"])
        self._contents = (contract.stored_content(body), contract.stored_content(body[::-1]))

    @classmethod
    async def open(cls, config: dict[str, Any], settings: Settings) -> _ContractTrips:
        client: AsyncMongoClient[Any] = AsyncMongoClient(
            settings.mongodb_uri.get_secret_value(), tz_aware=True
        )
        w = Workload(**config["workload"])  # not the ids themselves: 10,000 of them pass one argv's 128 KiB
        keys = await contract.thread_keys(client[config["db"]], [w.thread_id(i) for i in range(w.threads)])
        return cls(config, client, keys)

    async def before_send(self, records: Sequence[Any]) -> list[Awaitable[Any]]:
        """The trips before the output; what is to run beside its send (the recall's busy marks)."""
        recall = [t for rec in records if rec.topic == self._recall_topic and (t := _turn(rec)) is not None]
        persist = [t for rec in records if rec.topic != self._recall_topic and (t := _turn(rec)) is not None]
        after: list[Awaitable[Any]] = []
        if recall:
            plan = contract.recall_plan(recall, self._limit, datetime.now(UTC))
            await contract.recall_finds(self._db, plan)
            after.append(asyncio.ensure_future(contract.busy_marks(self._db, plan)))
        if persist:
            moved = [replace(t, created_at=t.created_at + _LATER) for t in persist]
            contents = [self._contents] * len(moved)
            writes = contract.persist_plan(moved, contents, self._keys, suffix=":fwd")
            await contract.persist_trips(self._db, writes)
        return after

    async def close(self) -> None:
        await self._client.close()


def _turn(record: Any) -> contract.Turn | None:
    return contract.turn_from_header(record.headers)
