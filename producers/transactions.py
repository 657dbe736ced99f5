"""Exactly-once (`MESSAGE_HISTORY_PROCESSING_GUARANTEE=exactly-once`): outputs held per input record, then
produced with the input partition's offset in one Kafka transaction, per input partition.

`PartitionTransactions` owns one `Transactional` (`producers.transactional`: one transactional producer and
how its last transaction ended, the one place where a transaction is run) per input partition, with the
transactional id `transactional_id(group, topic, partition)` (the scheme Kafka Streams used before KIP-447:
aiokafka has no group metadata fencing). It is created when the partition is assigned: its `InitProducerId`
bumps the epoch, which fences any zombie still holding the id and completes its open transaction, so the
committed offset read afterwards is final. `commit` produces a partition's held outputs below the new
watermark and commits that watermark in one transaction; outputs of records above it stay held for a later
one. A commit in doubt is settled first, on the same producer (`Transactional.settle`), never guessed.

The held outputs, the producer machinery and what a failed transaction means are `producers.transactional`'s;
the names other packages still import from here (`__all__`) stay importable from here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from message_history import metrics
from message_history.errors import OutputsRefusedAgainError, TransactionInDoubtError
from message_history.settings import Settings
from producers.transactional import (
    FENCED,
    UNAUTHORIZED,
    HeldOutput,
    OutputRefusedError,
    Transactional,
    commit_failure,
    fence_legacy,
    legacy_transactional_id,
    open_transactional,
    producer_options,
    stop_quietly,
    transactional_id,
)

__all__ = [
    "DEFAULT_MAX_HELD_OUTPUTS",
    "UNAUTHORIZED",
    "HeldOutput",
    "PartitionTransactions",
    "Refused",
    "Transactional",
    "commit_failure",
    "open_transactional",
    "producer_options",
    "transactional_id",
]

log = logging.getLogger(__name__)


Refused = Callable[[TopicPartition, int, object, BaseException], Awaitable[list[HeldOutput]]]
"""What replaces the outputs of the input record (partition, offset, its source) whose output the broker
refused for its size: its dead letter (the service), a failed-turn response (the worker SDK); held."""


class PartitionTransactions:
    """A transactional producer per owned input partition of one path (see the module docstring)."""

    def __init__(self, settings: Settings, *, path: str) -> None:
        self._setup(
            producer_options(settings, client_id=f"message-history-{path}-tx"), settings.group_id, path
        )
        self.max_held = settings.max_held_outputs

    @classmethod
    def for_client(
        cls, options: Mapping[str, Any], *, group_id: str, path: str, replay: bool = False
    ) -> PartitionTransactions:
        """For a client configured by its own options (the worker SDK, replay), not by the service's
        settings. `replay`: a replay's transactions (see `transactional_id`), which commit no offset (a
        replay has no group: its resume point moves past what committed) and fence no legacy id (the live
        service's)."""
        self = cls.__new__(cls)
        self._setup(dict(options), group_id, path, replay=replay)
        return self

    def _setup(self, options: dict[str, Any], group_id: str, path: str, *, replay: bool = False) -> None:
        self._options = options
        self._path = path
        self.group_id = group_id
        self.replay = replay
        self.max_held = DEFAULT_MAX_HELD_OUTPUTS
        self.refused: Refused | None = None  # None: a refused output is raised (systemic)
        # the group's committed offset of an input partition: settles a commit whose producer failed
        self.read_committed: Callable[[TopicPartition], Awaitable[int | None]] | None = None
        self._owned: set[TopicPartition] = set()  # assigned here, and not fenced since
        self._producers: dict[TopicPartition, Transactional] = {}
        self._held: dict[TopicPartition, dict[int, list[HeldOutput]]] = {}  # per input offset, not committed
        self._sources: dict[TopicPartition, dict[int, object]] = {}  # the input of each held offset
        self._doubt: dict[TopicPartition, int] = {}  # the offset a commit in doubt would commit
        self._careful: set[TopicPartition] = set()  # an output was refused: send one by one
        self._opening: dict[TopicPartition, asyncio.Future[AIOKafkaProducer]] = {}

    def transactional_id(self, tp: TopicPartition) -> str:
        return transactional_id(self.group_id, tp.topic, tp.partition, replay=self.replay)

    def hold(self, tp: TopicPartition, offset: int, outputs: list[HeldOutput], source: object = None) -> None:
        """File the outputs of a record that is done (and the record: its dead letter if the broker
        refuses an output), until the transaction committing its offset."""
        if outputs and tp in self._owned:
            self._held.setdefault(tp, {})[offset] = outputs
            if source is not None:
                self._sources.setdefault(tp, {})[offset] = source

    def held(self) -> int:
        """Outputs held over all partitions (tests, metrics)."""
        return sum(len(o) for by_offset in self._held.values() for o in by_offset.values())

    def full(self) -> bool:
        """Held outputs at their cap (`MESSAGE_HISTORY_MAX_HELD_OUTPUTS`): intake pauses until commits drain
        them (commits failing for good must not grow memory without bound)."""
        return self.held() >= self.max_held

    def in_doubt(self) -> list[TopicPartition]:
        """Partitions whose last commit's answer has not been seen (tests, logs)."""
        return sorted(self._doubt, key=lambda tp: (tp.topic, tp.partition))

    def _take_below(self, tp: TopicPartition, offset: int) -> list[int]:
        return sorted(o for o in self._held.get(tp, {}) if o < offset)

    def _drop_below(self, tp: TopicPartition, offset: int) -> list[HeldOutput]:
        return self._drop(tp, self._take_below(tp, offset))

    def _drop(self, tp: TopicPartition, offsets: list[int]) -> list[HeldOutput]:
        """The outputs held at `offsets` (in that order), no longer held; an offset no longer held (its
        partition let go of meanwhile) has none."""
        held, sources = self._held.get(tp, {}), self._sources.get(tp, {})
        dropped: list[HeldOutput] = []
        for o in offsets:
            dropped.extend(held.pop(o, ()))
            sources.pop(o, None)
        return dropped

    async def open(self, partitions: Iterable[TopicPartition]) -> None:
        """Own `partitions`: a producer each, its id initialised (fencing the id's previous holder)."""
        partitions = list(partitions)
        self._owned.update(partitions)
        await asyncio.gather(*(self._open(tp) for tp in partitions if tp not in self._producers))

    async def open_at_committed(
        self, partitions: Iterable[TopicPartition], seek: Callable[[TopicPartition, int], None]
    ) -> None:
        """`open`, then each partition positioned (`seek`) at the group's offset committed after that
        (`read_committed`): the fencing completed any transaction its previous holder left open, so this
        offset is final, where one read before could be stale (no KIP-447 here). What `open` or the read
        raises is raised: retrying is the caller's. No await after the last seek."""
        owned = sorted(partitions, key=lambda tp: tp.partition)
        await self.open(owned)
        read = self.read_committed
        if read is None:
            raise RuntimeError("no committed offset reader: set `read_committed` before opening")
        for tp in owned:
            offset = await read(tp)
            if offset is not None:
                seek(tp, offset)

    async def _open(self, tp: TopicPartition) -> None:
        # one opening per partition at a time: a second producer's InitProducerId would fence the first
        opening = self._opening.get(tp)
        if opening is None:
            opening = self._opening[tp] = asyncio.ensure_future(self._init(tp))
            opening.add_done_callback(lambda _: self._opening.pop(tp, None))
        producer = await asyncio.shield(opening)
        if tp not in self._owned:  # let go of while it opened (a revoke)
            await stop_quietly(producer)
            return
        self._producers[tp] = Transactional(producer)

    async def _init(self, tp: TopicPartition) -> AIOKafkaProducer:
        if not self.replay:
            await fence_legacy(self._options, legacy_transactional_id(self.group_id, tp.topic, tp.partition))
        return await open_transactional(self._options, self.transactional_id(tp))

    def owns(self, tp: TopicPartition) -> bool:
        """True while `tp` is assigned here and not fenced since: its offsets are ours to commit."""
        return tp in self._owned

    async def close(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Let go of `partitions` (None: all): their producers stopped (the broker completes what they left
        open: a commit in doubt lands or not, and the next owner's InitProducerId waits for it), their held
        outputs dropped (the next owner redoes those records). A late commit for one of them does nothing:
        only `open` (a new assignment) takes a partition again."""
        chosen = list(self._owned | set(self._producers)) if partitions is None else list(partitions)
        for tp in chosen:
            self._owned.discard(tp)
            self._held.pop(tp, None)
            self._sources.pop(tp, None)
            self._doubt.pop(tp, None)
            self._careful.discard(tp)
        await self._stop_producers(chosen)

    async def _stop_producers(self, partitions: Iterable[TopicPartition]) -> None:
        producers = [p for tp in partitions if (p := self._producers.pop(tp, None)) is not None]
        await asyncio.gather(*(p.stop() for p in producers))

    async def commit(self, tp: TopicPartition, offset: int) -> bool:
        """Produce the outputs held for `tp` below `offset` (in input order) and commit `offset`, in one
        transaction. True when committed; False when the partition is not ours (revoked, or this instance
        was fenced: the partition is someone else's now; its held outputs are dropped).

        A commit in doubt (the caller stopped waiting for its answer, the last time) is settled first, on
        the same producer: committed, its outputs are dropped from the held ones (never sent again);
        aborted, they go in this transaction. Raises the error of a transaction that failed otherwise
        (`commit_failure` says what it means; the outputs stay held), and the caller's cancellation (the
        commit then stays in doubt, for the next call to settle)."""
        for _ in range(_MAX_REFUSALS):
            if tp not in self._owned:
                return False
            tx = await self._producer(tp)
            if tx is None:
                return False  # let go of meanwhile
            try:
                if await self._settle_lost(tp, tx, offset) or await self._settle(tp, tx, offset):
                    return True
                if tx.broken:
                    continue  # replaced by `_producer`, next round
                return await self._transact(tp, tx, offset)
            except OutputRefusedError as exc:
                await self._replace_refused(tp, exc)
            except FENCED as exc:
                log.warning(
                    "transaction fenced: another instance owns the partition now; its outputs are dropped",
                    extra={"path": self._path, "partition": tp.partition, "error": type(exc).__name__},
                )
                await self.close([tp])
                return False
        # progress is kept (refused outputs replaced): the next commit goes on from here
        raise OutputsRefusedAgainError(
            f"outputs of {tp.topic}[{tp.partition}] refused {_MAX_REFUSALS} rounds"
        )

    async def _producer(self, tp: TopicPartition) -> Transactional | None:
        tx = self._producers.get(tp)
        if tx is not None and tx.broken and not tx.pending:
            # a fatal error: a fresh producer, whose InitProducerId completes what the old one left open
            await self._stop_producers([tp])
            tx = None
        if tx is None:
            await self._open(tp)
            tx = self._producers.get(tp)
        return tx

    async def _settle(self, tp: TopicPartition, tx: Transactional, offset: int) -> bool:
        """Settle the last transaction's end; True when that already committed `offset` (or past it)."""
        if not tx.pending:
            return False
        doubted = self._doubt.get(tp)
        if doubted is not None:
            log.debug(
                "commit in doubt: waiting for the broker's answer before sending anything again",
                extra={"path": self._path, "partition": tp.partition, "offset": doubted},
            )
        try:
            committed = await tx.settle()
        except asyncio.CancelledError:
            raise
        except TransactionInDoubtError:
            raise  # still in doubt: `_settle_lost` reads what landed, once a new producer completed it
        except BaseException:
            self._doubt.pop(tp, None)  # the broker answered: refused, so not committed
            raise
        self._doubt.pop(tp, None)
        if committed and doubted is not None:
            return self._doubt_committed(tp, doubted, offset, "commit in doubt settled: it committed")
        return False

    async def _settle_lost(self, tp: TopicPartition, tx: Transactional, offset: int) -> bool:
        """A commit in doubt whose producer failed: `tx` is the new producer, whose InitProducerId completed
        it (committed if the broker had it, aborted otherwise); the group's committed offset says which.
        True when that committed `offset` (or past it). The rare path: Kafka before KIP-447 may show the
        offset a moment late (no `require_stable` fetch in aiokafka), the window documented."""
        doubted = self._doubt.get(tp)
        if doubted is None or tx.pending:
            return False
        if self.read_committed is None:
            raise KafkaError("a commit in doubt cannot be settled: no committed offset reader")
        landed = await self.read_committed(tp)
        del self._doubt[tp]
        if landed is not None and landed >= doubted:
            said = "commit in doubt settled (read back): it committed"
            return self._doubt_committed(tp, doubted, offset, said)
        return False

    def _doubt_committed(self, tp: TopicPartition, doubted: int, offset: int, message: str) -> bool:
        """The commit in doubt of `doubted` did land: its outputs are out (never sent again); True when it
        committed `offset` (or past it)."""
        self._produced(self._drop_below(tp, doubted))
        log.info(message, extra={"path": self._path, "partition": tp.partition, "offset": doubted})
        return doubted >= offset

    async def _transact(self, tp: TopicPartition, tx: Transactional, offset: int) -> bool:
        held = self._held.get(tp, {})
        below = self._take_below(tp, offset)  # sorted once: sent in this order, then dropped
        outputs = [output for o in below for output in held[o]]
        if self.replay and not outputs:
            return True  # nothing to send and no offset to commit: no transaction
        group = None if self.replay else ({tp: offset}, self.group_id)
        try:
            await tx.run(outputs, offsets=group, one_by_one=tp in self._careful)
        except BaseException:
            if tx.in_doubt or tx.lost:
                self._doubt[tp] = offset  # asked, answer not seen: the next call waits for it (or reads)
            raise
        self._produced(self._drop(tp, below))
        self._careful.discard(tp)
        return True

    async def _replace_refused(self, tp: TopicPartition, refused: OutputRefusedError) -> None:
        """An output refused for its size: first find which (one by one), then its record's outputs are
        replaced by what `refused` says (its dead letter); no `refused`: systemic."""
        if tp not in self._careful:
            self._careful.add(tp)  # a batch of several may be refused where each record fits
            return
        held, sources = self._held.get(tp, {}), self._sources.get(tp, {})
        offset = next((o for o, outs in held.items() if any(x is refused.output for x in outs)), None)
        if offset is None or self.refused is None:
            raise refused.cause
        log.error(
            "an output the broker refused for its size: its record is dead-lettered",
            extra={
                "path": self._path,
                "partition": tp.partition,
                "offset": offset,
                "topic": refused.output.topic,
            },
        )
        replacement = await self.refused(tp, offset, sources.get(offset), refused.cause)
        if any(r.topic == refused.output.topic and r.value == refused.output.value for r in replacement):
            replacement = []  # never the same again
        held[offset] = replacement

    @staticmethod
    def _produced(outputs: list[HeldOutput]) -> None:
        for topic, count in Counter(o.topic for o in outputs).items():
            metrics.RECORDS_PRODUCED.labels(topic=topic).inc(count)  # committed: now readers see them


_MAX_REFUSALS = 64  # refused outputs replaced within one commit call (each costs an aborted transaction)
DEFAULT_MAX_HELD_OUTPUTS = 100_000
