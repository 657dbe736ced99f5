"""Exactly-once (`MESSAGE_HISTORY_PROCESSING_GUARANTEE=exactly-once`): outputs held per input record, then
produced with the input partition's offset in one Kafka transaction.

Three parts:

* `HoldingProducer` stands in for the shared `OutputProducer`: `send` keeps the record (a `HeldOutput`) and
  returns a future already resolved with it, so a path's acknowledgement of a record resolves with the
  outputs it caused; the loop files them under the record's offset.
* `Transactional`: one transactional producer and how its last transaction ended. The one place where a
  transaction is run (the service's loops, the worker SDK and replay all call it). A commit whose answer did
  not come in time (broker restarting, connection lost) is *in doubt*, never taken for an abort: the same
  producer keeps asking (aiokafka's sender retries EndTxn until the broker answers, and EndTxn(commit) of the
  same producer epoch is idempotent), and the next call waits for that answer (`settle`) before anything is
  sent again. Only a transaction known to be aborted (no commit was asked, or the broker refused it) has its
  outputs sent again.
* `PartitionTransactions` owns one `Transactional` per input partition, with the transactional id
  `transactional_id(group, topic, partition)` (the scheme Kafka Streams used before KIP-447: aiokafka has no
  group metadata fencing). It is created when the partition is assigned: its `InitProducerId` bumps the
  epoch, which fences any zombie still holding the id and completes its open transaction, so the committed
  offset read afterwards is final. `commit` produces a partition's held outputs below the new watermark and
  commits that watermark in one transaction; outputs of records above it stay held for a later one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    BrokerResponseError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InvalidProducerEpoch,
    InvalidTxnState,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    KafkaUnavailableError,
    MessageSizeTooLargeError,
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from message_history import metrics
from message_history.errors import (
    OutputsRefusedAgainError,
    RetriableError,
    TransactionInDoubtError,
    TransactionNotCommittedError,
)
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import (
    MAX_BATCH_BYTES,
    MAX_REQUEST_BYTES,
    OUTPUT_TOO_LARGE,
    Headers,
    OutputProducer,
    compression_type,
)

log = logging.getLogger(__name__)

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


FENCED = (ProducerFenced, InvalidProducerEpoch)
"""Another producer holds this partition's transactional id now: this instance lost the partition."""

UNAUTHORIZED = (
    TransactionalIdAuthorizationFailed,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    ClusterAuthorizationFailedError,
)
"""The broker refuses this principal (ACLs): not fencing, nobody else holds the partition; an operator
must grant the ACLs (docs/security.md), meanwhile the path is not ready."""

CommitFailure = Literal["fenced", "unauthorized", "outage", "systemic"]


def commit_failure(error: BaseException) -> CommitFailure:
    """What a failed transaction means, for the caller's decision (pure).

    `fenced`: the partition is another instance's (drop it, its held outputs with it). `unauthorized`: an
    ACL is missing (not ready, ERROR, alert; retried, intake paused once the held outputs are at their cap).
    `outage`: Kafka down or slow, or a commit in doubt (a timeout): retried, the doubt settled first.
    `systemic`: any other refusal (neither retriable nor fencing): stop with a clear error, never retried at
    every commit.
    """
    while type(error) is KafkaError and error.__cause__ is not None:
        error = error.__cause__  # aiokafka wraps some failures in a bare KafkaError: the cause says what
    if isinstance(error, FENCED):
        return "fenced"
    if isinstance(error, UNAUTHORIZED):
        return "unauthorized"
    if is_retriable(error):
        return "outage"
    return "systemic"


def is_retriable(error: BaseException) -> bool:
    """Kafka down or slow (connection, timeout, a retriable broker error): the same call may succeed later."""
    if isinstance(error, (TimeoutError, ConnectionError, RetriableError)):
        return True
    return isinstance(error, KafkaError) and (
        bool(getattr(error, "retriable", False))
        or isinstance(error, (KafkaConnectionError, KafkaTimeoutError, KafkaUnavailableError))
    )


_REPLAY_SUFFIX = ":replay"


def transactional_id(group_id: str, topic: str, partition: int, *, replay: bool = False) -> str:
    """`{group}:{topic}:{partition}` (replay: `...:replay`), one id per input partition, unambiguous.

    A topic name has only `[a-zA-Z0-9._-]` and a partition only digits, so the last two `:` separate them from
    the group id, whatever the group id holds (the old `{group}-{topic}-{partition}` joined group `a-b` topic
    `c` and group `a` topic `b-c` into one id). The group id comes first and verbatim: a prefixed ACL on the
    group id covers every id (docs/security.md)."""
    base = f"{group_id}:{topic}:{partition}"
    return base + _REPLAY_SUFFIX if replay else base


def parse_transactional_id(value: str) -> tuple[str, str, int, bool]:
    """(group, topic, partition, replay) of a `transactional_id` (tests: the join is one-to-one)."""
    replay = value.endswith(_REPLAY_SUFFIX)
    if replay:
        value = value[: -len(_REPLAY_SUFFIX)]
    group, topic, partition = value.rsplit(":", 2)
    return group, topic, int(partition), replay


def legacy_transactional_id(group_id: str, topic: str, partition: int) -> str:
    """The id before 0.x's escaping: fenced once when a partition is opened, so that an instance of the
    previous version still holding the partition (a zombie during a rolling upgrade) is fenced too."""
    return f"{group_id}-{topic}-{partition}"


class OutputRefusedError(Exception):
    """The broker refused one output of a transaction for its size (the topic's `max.message.bytes`): a
    property of that record. Control flow inside this module: the caller replaces the record's outputs."""

    def __init__(self, output: HeldOutput, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.output = output
        self.cause = cause


class Transactional:
    """One transactional producer and how its last transaction ended (see the module docstring).

    `run` sends the outputs (and the offsets), then asks the commit; it returns once Kafka answered. When the
    caller stops waiting (a timeout, shutdown), the transaction's end stays pending on this producer:
    `in_doubt` while a commit was asked. `settle` waits for that end before anything else is sent: True
    committed, False aborted (no commit was asked, or the broker refused it as not committable). `broken`
    says the producer cannot go on (a fatal error): the caller stops it and opens a new one, whose
    InitProducerId completes what this one left.
    """

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._ending: asyncio.Future[None] | None = None
        self._committing = False
        self.broken = False
        self.lost = False  # a commit was asked and the producer failed before its answer

    @property
    def in_doubt(self) -> bool:
        """A commit was asked and its answer has not been seen."""
        return self._ending is not None and self._committing

    @property
    def pending(self) -> bool:
        """The last transaction's end (commit or abort) has not been seen."""
        return self._ending is not None

    async def settle(self) -> bool | None:
        """Wait for the end of the last transaction: True committed, False aborted, None nothing pending.
        Raises the broker's refusal of a commit (fencing, authorization, other: the commit did not happen);
        a cancellation leaves it pending (still in doubt)."""
        ending = self._ending
        if ending is None:
            return None
        committing = self._committing
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            if not ending.cancelled():
                raise  # our caller gave up waiting: the end stays pending, settled by the next call
            # nothing here cancels it (a producer is stopped only once settled): unknown, so never guessed
            self._ending, self.broken = None, True
            raise KafkaError("the transaction's end was cancelled: its outcome is unknown") from None
        except Exception as exc:
            self._ending, self.broken = None, True  # aiokafka's producer is in a fatal state: replace it
            if not committing or isinstance(exc, InvalidTxnState):
                return False  # no commit was asked, or the broker says the transaction cannot commit
            if not isinstance(exc, (BrokerResponseError, ProducerFenced)):
                # the producer died (its sender failed) after the commit was asked, before any answer: it
                # cannot settle it any more; only a new producer's InitProducerId and a read of what
                # landed can (`PartitionTransactions`)
                self.lost = True
                raise TransactionInDoubtError(
                    f"the producer failed before the commit's answer: {exc!r}"
                ) from exc
            raise
        self._ending = None
        return committing

    async def run(
        self,
        outputs: Sequence[HeldOutput],
        *,
        offsets: tuple[dict[TopicPartition, int], str] | None = None,
        one_by_one: bool = False,
    ) -> None:
        """`outputs` (and, given, `offsets` for a group) in one transaction, returning once committed.

        Raises `OutputRefusedError` when the broker refused an output for its size (the transaction is
        aborted; `one_by_one` sends each output in its own batch, so the refusal names one record), the
        error of a failure before the commit (aborted), the broker's refusal of the commit, or, when the
        caller stops waiting for the commit's answer, the cancellation (the commit is then in doubt)."""
        if self._ending is not None:
            raise RuntimeError("the last transaction is not settled: call `settle` first")
        producer = self.producer
        await producer.begin_transaction()
        try:
            await _send_all(producer, outputs, one_by_one=one_by_one)
            if offsets is not None:
                await producer.send_offsets_to_transaction(*offsets)
        except BaseException as exc:
            self._end(commit=False)  # no commit was asked: known not committed, whatever happens next
            if isinstance(exc, OutputRefusedError):
                self.broken = True  # the refused batch used sequence numbers: a fresh producer (new epoch)
            raise
        self._end(commit=True)
        if not await self.settle():
            raise TransactionNotCommittedError(
                "the broker answered the commit: not committable (InvalidTxnState)"
            )

    def _end(self, *, commit: bool) -> None:
        end = self.producer.commit_transaction() if commit else self.producer.abort_transaction()
        self._ending = asyncio.ensure_future(end)
        self._ending.add_done_callback(_retrieve)
        self._committing = commit

    async def stop(self) -> None:
        """Stop the producer, bounded; the broker completes what it left open (the next InitProducerId)."""
        await _stop(self.producer)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # seen by `settle`; no "exception was never retrieved" when it is not


async def _send_all(producer: AIOKafkaProducer, outputs: Sequence[HeldOutput], *, one_by_one: bool) -> None:
    """Send `outputs` and wait for every acknowledgement; `OutputRefusedError` for one refused for its size
    (the first, in order). Every acknowledgement is waited for before raising: none is left in flight."""
    acks: list[asyncio.Future[Any]] = []
    for output in outputs:
        try:
            ack = await producer.send(
                output.topic, key=output.key, value=output.value, headers=list(output.headers)
            )
        except OUTPUT_TOO_LARGE as exc:
            ack = asyncio.get_running_loop().create_future()
            ack.set_exception(exc)
        acks.append(ack)
        if one_by_one:
            await asyncio.wait([ack])  # its own batch: a refusal names this record alone
    # shielded: a caller that stops waiting must not cancel aiokafka's batch futures
    results = await asyncio.shield(asyncio.gather(*acks, return_exceptions=True))
    for output, result in zip(outputs, results, strict=True):
        if isinstance(result, OUTPUT_TOO_LARGE):
            raise OutputRefusedError(output, result)
    for result in results:
        if isinstance(result, BaseException):
            raise result


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
    def for_client(cls, options: Mapping[str, Any], *, group_id: str, path: str) -> PartitionTransactions:
        """For a client configured by its own options (the worker SDK), not by the service's settings."""
        self = cls.__new__(cls)
        self._setup(dict(options), group_id, path)
        return self

    def _setup(self, options: dict[str, Any], group_id: str, path: str) -> None:
        self._options = options
        self._path = path
        self.group_id = group_id
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
        return transactional_id(self.group_id, tp.topic, tp.partition)

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
        held, sources = self._held.get(tp, {}), self._sources.get(tp, {})
        dropped: list[HeldOutput] = []
        for o in self._take_below(tp, offset):
            dropped.extend(held.pop(o))
            sources.pop(o, None)
        return dropped

    async def open(self, partitions: Iterable[TopicPartition]) -> None:
        """Own `partitions`: a producer each, its id initialised (fencing the id's previous holder)."""
        partitions = list(partitions)
        self._owned.update(partitions)
        await asyncio.gather(*(self._open(tp) for tp in partitions if tp not in self._producers))

    async def _open(self, tp: TopicPartition) -> None:
        # one opening per partition at a time: a second producer's InitProducerId would fence the first
        opening = self._opening.get(tp)
        if opening is None:
            opening = self._opening[tp] = asyncio.ensure_future(self._init(tp))
            opening.add_done_callback(lambda _: self._opening.pop(tp, None))
        producer = await asyncio.shield(opening)
        if tp not in self._owned:  # let go of while it opened (a revoke)
            await _stop(producer)
            return
        self._producers[tp] = Transactional(producer)

    async def _init(self, tp: TopicPartition) -> AIOKafkaProducer:
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
            self._produced(self._drop_below(tp, doubted))  # out already: never sent again
            log.info(
                "commit in doubt settled: it committed",
                extra={"path": self._path, "partition": tp.partition, "offset": doubted},
            )
            return doubted >= offset
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
            self._produced(self._drop_below(tp, doubted))
            log.info(
                "commit in doubt settled (read back): it committed",
                extra={"path": self._path, "partition": tp.partition, "offset": doubted},
            )
            return doubted >= offset
        return False

    async def _transact(self, tp: TopicPartition, tx: Transactional, offset: int) -> bool:
        held = self._held.get(tp, {})
        outputs = [output for o in self._take_below(tp, offset) for output in held[o]]
        try:
            await tx.run(outputs, offsets=({tp: offset}, self.group_id), one_by_one=tp in self._careful)
        except BaseException:
            if tx.in_doubt or tx.lost:
                self._doubt[tp] = offset  # asked, answer not seen: the next call waits for it (or reads)
            raise
        self._produced(self._drop_below(tp, offset))
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
    _patient_coordinator_lookup(producer)
    try:
        await producer.start()
        # an empty transaction waits for InitProducerId (the fencing) and ends without a broker request
        await producer.begin_transaction()
        await producer.abort_transaction()
    except BaseException:
        await _stop(producer)
        raise
    return producer


def _patient_coordinator_lookup(producer: AIOKafkaProducer) -> None:
    """aiokafka's sender retries a coordinator lookup that failed for a node not ready or a timeout, but a
    connection closed under it (a broker stopping) is wrapped in a bare `KafkaError` that ends the sender:
    every later step fails and a commit asked meanwhile can no longer be settled by this producer. Retried
    here as the other connection failures are (aiokafka is pinned: `deploy/constraints.txt`)."""
    sender: Any = producer._sender
    find = sender._find_coordinator

    async def find_coordinator(coordinator_type: Any, coordinator_key: str) -> Any:
        while True:
            try:
                return await find(coordinator_type, coordinator_key)
            except KafkaError as exc:
                if type(exc) is not KafkaError or not is_retriable(exc.__cause__ or exc):
                    raise
                await asyncio.sleep(sender._retry_backoff)

    sender._find_coordinator = find_coordinator


async def fence_legacy(options: Mapping[str, Any], legacy_id: str) -> None:
    """Fence `legacy_id` (InitProducerId, then stop): a zombie of the previous version holding it cannot
    commit any more, and its open transaction is completed. Best effort where the ACLs do not grant it."""
    try:
        producer = await open_transactional(options, legacy_id)
    except TransactionalIdAuthorizationFailed:
        log.debug(
            "the previous version's transactional id is not granted: not fenced", extra={"id": legacy_id}
        )
        return
    await _stop(producer)


async def stop_quietly(producer: AIOKafkaProducer) -> None:
    """Stop a transactional producer, bounded; the broker aborts what it left open."""
    await _stop(producer)


async def _stop(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), _CLOSE_S)
    except Exception as exc:  # noqa: BLE001 -- closing on the way out; the broker aborts what is left open
        log.debug("transactional producer did not stop cleanly", extra={"error": type(exc).__name__})
