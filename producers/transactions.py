"""Exactly-once (`MESSAGE_HISTORY_PROCESSING_GUARANTEE=exactly-once`): outputs held per input record, then
produced with the input partition's offset in one Kafka transaction.

Two parts:

* `HoldingProducer` stands in for the shared `OutputProducer`: `send` keeps the record (a `HeldOutput`) and
  returns a future already resolved with it, so a path's acknowledgement of a record resolves with the
  outputs it caused; the loop files them under the record's offset.
* `PartitionTransactions` owns one transactional producer per input partition, with the transactional id
  `{group}-{input topic}-{partition}` (the scheme Kafka Streams used before KIP-447: aiokafka has no group
  metadata fencing). It is created when the partition is assigned: its `InitProducerId` bumps the epoch,
  which fences any zombie still holding the id and completes (aborts) its open transaction, so the committed
  offset read afterwards is final. `commit` produces a partition's held outputs below the new watermark and
  commits that watermark in one transaction; outputs of records above it stay held for a later one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    MessageSizeTooLargeError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from message_history import metrics
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import MAX_BATCH_BYTES, Headers, OutputProducer, compression_type

log = logging.getLogger(__name__)

FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)
"""Another producer holds this partition's transactional id now: this instance lost the partition."""

MAX_REQUEST_BYTES = 1_048_576  # aiokafka's default `max_request_size`, checked by `OutputProducer.send` too
_CLOSE_S = 5.0


@dataclass(frozen=True, slots=True)
class HeldOutput:
    """One output record, held until its input's offset is committed with it."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


class HoldingProducer(OutputProducer):
    """`OutputProducer` whose `send` holds the record instead of sending it (see the module docstring)."""

    def __init__(self, settings: Settings | None = None, *, client_id: str = "") -> None:
        """No client: nothing is sent from here (the arguments only mirror `OutputProducer`'s)."""

    async def __aenter__(self) -> HoldingProducer:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pairs = tuple((k, v) for k, v in headers)
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(pairs))
        if size > MAX_REQUEST_BYTES:  # refused now, as the real producer would: the input is dead-lettered
            future.set_exception(MessageSizeTooLargeError(f"the record is {size} bytes when serialized"))
        else:
            future.set_result(HeldOutput(topic, key, value, pairs))
        return future

    async def flush(self) -> None:
        return None


def held_outputs(outcome: object) -> list[HeldOutput]:
    """The outputs an acknowledgement resolved with (a path's ack resolves with its last send's result)."""
    if isinstance(outcome, HeldOutput):
        return [outcome]
    if isinstance(outcome, (list, tuple)):
        return [o for o in outcome if isinstance(o, HeldOutput)]
    return []


class PartitionTransactions:
    """A transactional producer per owned input partition of one path (see the module docstring)."""

    def __init__(self, settings: Settings, *, path: str) -> None:
        self._setup(
            producer_options(settings, client_id=f"message-history-{path}-tx"), settings.group_id, path
        )

    @classmethod
    def for_client(cls, options: Mapping[str, Any], *, group_id: str, path: str) -> PartitionTransactions:
        """For a client configured by its own options (the worker SDK), not by the service's settings."""
        self = cls.__new__(cls)
        self._setup(dict(options), group_id, path)
        return self

    def _setup(self, options: dict[str, Any], group_id: str, path: str) -> None:
        self._options = options
        self._path = path
        self.group_id = group_id
        self._owned: set[TopicPartition] = set()  # assigned here, and not fenced since
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self._held: dict[TopicPartition, dict[int, list[HeldOutput]]] = {}  # per input offset, not committed
        self._unsure: set[TopicPartition] = set()  # a transaction failed: did it land? ask the group first
        self._opening: dict[TopicPartition, asyncio.Future[AIOKafkaProducer]] = {}

    def transactional_id(self, tp: TopicPartition) -> str:
        return f"{self.group_id}-{tp.topic}-{tp.partition}"

    def hold(self, tp: TopicPartition, offset: int, outputs: list[HeldOutput]) -> None:
        """File the outputs of a record that is done, until the transaction committing its offset."""
        if outputs and tp in self._owned:
            self._held.setdefault(tp, {})[offset] = outputs

    def held(self) -> int:
        """Outputs held over all partitions (tests, metrics)."""
        return sum(len(o) for by_offset in self._held.values() for o in by_offset.values())

    def _take_below(self, tp: TopicPartition, offset: int) -> list[int]:
        return sorted(o for o in self._held.get(tp, {}) if o < offset)

    async def open(self, partitions: Iterable[TopicPartition]) -> None:
        """Own `partitions`: a producer each, its id initialised (fencing the id's previous holder)."""
        partitions = list(partitions)
        self._owned.update(partitions)
        await asyncio.gather(*(self._open(tp) for tp in partitions if tp not in self._producers))

    async def _open(self, tp: TopicPartition) -> None:
        # one opening per partition at a time: a second producer's InitProducerId would fence the first
        opening = self._opening.get(tp)
        if opening is None:
            opening = self._opening[tp] = asyncio.ensure_future(
                open_transactional(self._options, self.transactional_id(tp))
            )
            opening.add_done_callback(lambda _: self._opening.pop(tp, None))
        producer = await asyncio.shield(opening)
        if tp not in self._owned:  # let go of while it opened (a revoke)
            await _stop(producer)
            return
        self._producers[tp] = producer

    def owns(self, tp: TopicPartition) -> bool:
        """True while `tp` is assigned here and not fenced since: its offsets are ours to commit."""
        return tp in self._owned

    async def close(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Let go of `partitions` (None: all): their producers stopped (the broker aborts what they left
        open), their held outputs dropped (the next owner redoes those records). A late commit for one of them
        does nothing: only `open` (a new assignment) takes a partition again."""
        chosen = list(self._owned | set(self._producers)) if partitions is None else list(partitions)
        for tp in chosen:
            self._owned.discard(tp)
            self._held.pop(tp, None)
            self._unsure.discard(tp)
        await self._stop_producers(chosen)

    async def _stop_producers(self, partitions: Iterable[TopicPartition]) -> None:
        producers = [p for tp in partitions if (p := self._producers.pop(tp, None)) is not None]
        await asyncio.gather(*(_stop(p) for p in producers))

    async def commit(
        self,
        tp: TopicPartition,
        offset: int,
        committed: Callable[[TopicPartition], Awaitable[int | None]],
    ) -> bool:
        """Produce the outputs held for `tp` below `offset` (in input order) and commit `offset`, in one
        transaction. True when committed; False when the partition is not ours (revoked, or this instance
        was fenced: the partition is someone else's now; its held outputs are dropped). Raises the error of
        a transaction that failed otherwise (aborted; the outputs stay held, the next commit tries again).

        `committed` reads the group's committed offset: after a failed transaction (a commit cut off by a
        timeout may still have landed) it says which held outputs are already out."""
        if tp not in self._owned:
            return False
        if tp not in self._producers:
            await self._open(tp)  # after a failure: its InitProducerId completes what was left open
            if tp not in self._producers:
                return False  # let go of meanwhile
        if tp in self._unsure:
            landed = await committed(tp)
            self._unsure.discard(tp)
            if landed is not None:
                for done in self._take_below(tp, landed):
                    self._held[tp].pop(done)
                if landed >= offset:
                    return True
        producer = self._producers[tp]
        below = self._take_below(tp, offset)
        held = self._held.get(tp, {})
        outputs = [output for o in below for output in held[o]]
        try:
            await in_transaction(producer, outputs, offsets=({tp: offset}, self.group_id))
        except FENCED as exc:
            log.warning(
                "transaction fenced: another instance owns the partition now; its outputs are dropped",
                extra={"path": self._path, "partition": tp.partition, "error": type(exc).__name__},
            )
            await self.close([tp])
            return False
        except BaseException:
            # whatever state the producer is in now (a commit cut off may even have landed), a fresh one
            # (its InitProducerId completes what is open) is the clean start, opened by the next commit; the
            # caller reads the committed offset then, to learn whether this transaction landed
            self._unsure.add(tp)
            await self._stop_producers([tp])
            raise
        for o in below:
            held.pop(o, None)
        for topic, count in Counter(o.topic for o in outputs).items():
            metrics.RECORDS_PRODUCED.labels(topic=topic).inc(count)  # committed: now readers see them
        return True


def producer_options(settings: Settings, *, client_id: str) -> dict[str, Any]:
    """The service's producer options (connection, linger, batch size, compression), for transactions."""
    return {
        **kafka_options(settings, client_id=client_id),
        "linger_ms": settings.linger_ms,
        "max_batch_size": MAX_BATCH_BYTES,
        "compression_type": compression_type(settings),
    }


async def open_transactional(options: Mapping[str, Any], transactional_id: str) -> AIOKafkaProducer:
    """A started transactional producer whose id is initialised: any earlier holder of the id is fenced and
    its open transaction completed (aborted) by the time this returns."""
    producer = AIOKafkaProducer(
        **options, acks="all", enable_idempotence=True, transactional_id=transactional_id
    )
    try:
        await producer.start()
        # an empty transaction waits for InitProducerId (the fencing) and ends without a broker request
        await producer.begin_transaction()
        await producer.abort_transaction()
    except BaseException:
        await _stop(producer)
        raise
    return producer


async def in_transaction(
    producer: AIOKafkaProducer,
    outputs: Sequence[HeldOutput],
    *,
    offsets: tuple[dict[TopicPartition, int], str] | None = None,
) -> None:
    """`outputs` (and, given, `offsets` for a group) in one transaction; aborted and raised on a failure."""
    await producer.begin_transaction()
    try:
        acks = [
            await producer.send(o.topic, key=o.key, value=o.value, headers=list(o.headers)) for o in outputs
        ]
        await asyncio.gather(*acks)
        if offsets is not None:
            await producer.send_offsets_to_transaction(*offsets)
        await producer.commit_transaction()
    except BaseException:
        with contextlib.suppress(Exception):
            await producer.abort_transaction()
        raise


async def stop_quietly(producer: AIOKafkaProducer) -> None:
    """Stop a transactional producer, bounded; the broker aborts what it left open."""
    await _stop(producer)


async def _stop(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), _CLOSE_S)
    except Exception as exc:  # noqa: BLE001 -- closing on the way out; the broker aborts what is left open
        log.debug("transactional producer did not stop cleanly", extra={"error": type(exc).__name__})
