"""One transactional producer and what exactly-once holds: the machinery `producers.transactions`
(`PartitionTransactions`), the worker SDK and replay all run their transactions through.

* `HeldOutput`: one output held until its input's offset is committed with it (exactly-once outputs are
  filed by `consumers.runtime.emit.FileUnderOffset`, then held per offset by `producers.transactions`).
* `Transactional`: one transactional producer and how its last transaction ended. The one place where a
  transaction is run. A commit whose answer did not come in time (broker restarting, connection lost) is
  *in doubt*, never taken for an abort: the same producer keeps asking (aiokafka's sender retries EndTxn
  until the broker answers, and EndTxn(commit) of the same producer epoch is idempotent), and the next call
  waits for that answer (`settle`) before anything is sent again. Only a transaction known to be aborted (no
  commit was asked, or the broker refused it) has its outputs sent again.
* What a failed transaction means (`commit_failure`), the transactional ids (`transactional_id`), and
  opening (`open_transactional`, `fence_legacy`) and stopping (`stop_quietly`) a transactional producer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
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
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from message_history.errors import (
    RetriableError,
    TransactionInDoubtError,
    TransactionNotCommittedError,
)
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.output import (
    MAX_BATCH_BYTES,
    OUTPUT_TOO_LARGE,
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
        await stop_quietly(self.producer)


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
        await stop_quietly(producer)
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
    await stop_quietly(producer)


async def stop_quietly(producer: AIOKafkaProducer) -> None:
    """Stop a transactional producer, bounded; the broker aborts what it left open."""
    try:
        await asyncio.wait_for(producer.stop(), _CLOSE_S)
    except Exception as exc:  # noqa: BLE001 -- closing on the way out; the broker aborts what is left open
        log.debug("transactional producer did not stop cleanly", extra={"error": type(exc).__name__})
