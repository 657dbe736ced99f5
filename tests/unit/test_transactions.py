"""`producers.transactions` without Kafka: which held outputs go into which partition's transaction, and what
a failed one means.

A fake broker records each committed transaction (the integration tests in
`tests/integration/test_exactly_once.py` and `test_exactly_once_outage.py` show the same on the real broker).
The rules under test: an output is only ever committed with an offset that covers its input, in input order;
what a failed transaction held is neither lost nor, when that transaction landed after all, produced twice;
a commit whose answer did not come is settled, never guessed; authorization is not fencing; a refused output
is its record's dead letter; the transactional id is one-to-one.
"""

from __future__ import annotations

import asyncio
import string
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InvalidProducerEpoch,
    InvalidTxnState,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotCoordinatorError,
    ProducerFenced,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedVersionError,
)
from hypothesis import given
from hypothesis import strategies as st

from consumers.runtime.retry import is_outage
from message_history.errors import TransactionInDoubtError, TransactionNotCommittedError
from message_history.settings import Settings
from producers import transactions
from producers.transactional import (
    HeldOutput,
    commit_failure,
    parse_transactional_id,
    transactional_id,
)
from producers.transactions import PartitionTransactions

pytestmark = pytest.mark.timeout(30)

TP = TopicPartition("in", 0)
BOUND_S = 0.05  # how long a caller waits for a commit's answer in these tests


class FakeBroker:
    """What readers see: the committed transactions, in order. `down`: a commit reaches the broker and is
    committed, but its answer is lost until `back()` (a broker restarting mid-commit); `answer` overrides
    the answer (an error the broker gives instead of committing); `too_large`: values it refuses for size."""

    def __init__(self) -> None:
        self.committed: list[tuple[list[bytes], dict[TopicPartition, int]]] = []
        self.down = False
        self.answer: BaseException | None = None
        self.too_large: set[bytes] = set()
        self.send_error: BaseException | None = None
        self.lose: str | None = None  # "after" / "before": the producer fails after / before the commit lands
        self.offsets: dict[TopicPartition, int] = {}
        self._unanswered: list[asyncio.Future[None]] = []

    def back(self) -> None:
        self.down = False
        for waiter in self._unanswered:
            if not waiter.done():
                waiter.set_result(None)  # EndTxn retried by the same producer: committed already, NONE
        self._unanswered.clear()

    def end(self, sent: list[bytes], offsets: dict[TopicPartition, int]) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.answer is not None:
            error, self.answer = self.answer, None
            waiter.set_exception(error)
            return waiter
        lose, self.lose = self.lose, None
        if lose != "before":
            self.committed.append((sent, offsets))
            self.offsets.update(offsets)
        if lose is not None:  # the sender died (aiokafka's bare KafkaError), no answer seen
            waiter.set_exception(KafkaError("Unexpected error during batch delivery"))
            return waiter
        if self.down:
            self._unanswered.append(waiter)
        else:
            waiter.set_result(None)
        return waiter


class FakeProducer:
    """aiokafka's transactional producer as the module uses it: `commit_transaction` waits (shielded) for the
    broker's answer to EndTxn, which the sender retries until one comes."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.stopped = False
        self._sent: list[bytes] = []
        self._offsets: dict[TopicPartition, int] = {}
        self._batch: list[bytes] = []

    async def begin_transaction(self) -> None:
        self._sent, self._offsets = [], {}

    async def send(self, topic: str, *, key: bytes | None, value: bytes, headers: Any) -> asyncio.Future[Any]:
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.broker.send_error is not None:
            error, self.broker.send_error = self.broker.send_error, None
            ack.set_exception(error)
        elif value in self.broker.too_large:
            ack.set_exception(MessageSizeTooLargeError())
        else:
            self._sent.append(value)
            ack.set_result(None)
        return ack

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group: str) -> None:
        self._offsets = dict(offsets)

    async def commit_transaction(self) -> None:
        await asyncio.shield(self.broker.end(self._sent, self._offsets))

    async def abort_transaction(self) -> None:
        self._sent, self._offsets = [], {}

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    broker = FakeBroker()

    async def open_fake(options: Any, transactional_id: str) -> FakeProducer:
        return FakeProducer(broker)

    async def no_legacy(options: Any, legacy_id: str) -> None:
        return None

    monkeypatch.setattr(transactions, "open_transactional", open_fake)
    monkeypatch.setattr(transactions, "fence_legacy", no_legacy)
    return broker


def _out(value: str) -> list[HeldOutput]:
    return [HeldOutput("out", b"k", value.encode(), ())]


def _values(broker: FakeBroker) -> list[bytes]:
    return [value for sent, _ in broker.committed for value in sent]


async def _commit(tx: PartitionTransactions, offset: int) -> bool:
    return await asyncio.wait_for(tx.commit(TP, offset), BOUND_S)


async def _opened(path: str = "recall", broker: FakeBroker | None = None) -> PartitionTransactions:
    tx = PartitionTransactions(Settings(), path=path)
    if broker is not None:
        known = broker

        async def read_committed(tp: TopicPartition) -> int | None:
            return known.offsets.get(tp)

        tx.read_committed = read_committed
    await tx.open([TP])
    return tx


async def test_outputs_above_the_watermark_stay_held_and_go_in_input_order(broker: FakeBroker) -> None:
    """Offsets 10..13 done out of order while 12 waits (a parked request): the commit at watermark 12 carries
    10 and 11 only; 13 goes with the commit that covers it, after 12."""
    tx = await _opened()
    tx.hold(TP, 13, _out("r13"))
    tx.hold(TP, 11, _out("r11"))
    tx.hold(TP, 10, _out("r10"))
    assert await tx.commit(TP, 12)
    tx.hold(TP, 12, _out("r12"))
    assert await tx.commit(TP, 14)
    assert broker.committed == [([b"r10", b"r11"], {TP: 12}), ([b"r12", b"r13"], {TP: 14})]
    assert tx.held() == 0


async def _guessing_commit(
    broker: FakeBroker, producer: FakeProducer, held: list[bytes], offset: int
) -> bool:
    """The rule before this fix, as it behaved: a commit that timed out was taken for an abort, the producer
    replaced and every held output sent again in a new transaction."""
    await producer.begin_transaction()
    for value in held:
        await producer.send("out", key=b"k", value=value, headers=[])
    await producer.send_offsets_to_transaction({TP: offset}, "g")
    try:
        await asyncio.wait_for(producer.commit_transaction(), BOUND_S)
    except TimeoutError:
        return False
    return True


async def test_a_commit_that_timed_out_but_landed_is_sent_once_not_guessed_aborted(
    broker: FakeBroker,
) -> None:
    """The broker restarts mid-commit: the commit lands, its answer does not come in time. The old rule
    (guess: aborted, send again) makes a read_committed reader see the output twice; settling the commit on
    the same producer first sends it once."""
    broker.down = True
    assert not await _guessing_commit(broker, FakeProducer(broker), [b"a"], 1)
    broker.back()
    assert await _guessing_commit(broker, FakeProducer(broker), [b"a", b"b"], 2)
    assert _values(broker).count(b"a") == 2  # the duplicate the issue saw

    broker.committed.clear()
    tx = await _opened()
    tx.hold(TP, 0, _out("a"))
    broker.down = True
    with pytest.raises(TimeoutError):
        await _commit(tx, 1)
    assert tx.in_doubt() == [TP]
    tx.hold(TP, 1, _out("b"))
    with pytest.raises(TimeoutError):  # still no answer: nothing is sent meanwhile
        await _commit(tx, 2)
    assert _values(broker) == [b"a"]
    broker.back()
    assert await _commit(tx, 2)
    assert _values(broker) == [b"a", b"b"]
    assert broker.committed[-1][1] == {TP: 2}
    assert tx.in_doubt() == []
    assert tx.held() == 0


async def test_a_commit_in_doubt_that_covers_the_next_watermark_needs_no_new_transaction(
    broker: FakeBroker,
) -> None:
    tx = await _opened()
    tx.hold(TP, 0, _out("a"))
    broker.down = True
    with pytest.raises(TimeoutError):
        await _commit(tx, 1)
    broker.back()
    assert await _commit(tx, 1)  # the revoke's commit of the same watermark: settled, nothing sent again
    assert broker.committed == [([b"a"], {TP: 1})]


async def test_a_commit_the_broker_refused_as_not_committable_is_sent_again(broker: FakeBroker) -> None:
    """Known aborted (the broker answered InvalidTxnState): the outputs go in the next transaction, once, on
    a fresh producer."""
    tx = await _opened()
    tx.hold(TP, 0, _out("a"))
    broker.answer = InvalidTxnState()
    with pytest.raises(TransactionNotCommittedError):
        await _commit(tx, 1)
    assert commit_failure(TransactionNotCommittedError()) == "outage"  # retried, known not committed
    assert tx.held() == 1
    assert await _commit(tx, 1)
    assert _values(broker) == [b"a"]


async def test_a_failure_before_the_commit_is_an_abort_and_the_outputs_go_again(broker: FakeBroker) -> None:
    tx = await _opened()
    tx.hold(TP, 0, _out("a"))
    broker.send_error = KafkaConnectionError()
    with pytest.raises(KafkaConnectionError):
        await _commit(tx, 1)
    assert tx.in_doubt() == []  # no commit was asked: known not committed
    tx.hold(TP, 1, _out("b"))
    assert await _commit(tx, 2)
    assert broker.committed == [([b"a", b"b"], {TP: 2})]


async def test_a_fenced_or_revoked_partition_publishes_nothing_more(broker: FakeBroker) -> None:
    tx = await _opened()
    tx.hold(TP, 0, _out("zombie"))
    broker.answer = ProducerFenced()
    assert not await tx.commit(TP, 1)
    tx.hold(TP, 1, _out("late"))
    assert not await tx.commit(TP, 2)  # no new producer: that would fence the owner
    assert broker.committed == []
    await tx.open([TP])  # assigned again: a fresh start
    tx.hold(TP, 5, _out("owner"))
    assert await tx.commit(TP, 6)
    await tx.close([TP])
    assert not await tx.commit(TP, 7)
    assert broker.committed == [([b"owner"], {TP: 6})]


@pytest.mark.parametrize(
    "error",
    [
        TransactionalIdAuthorizationFailed("g:in:0"),
        GroupAuthorizationFailedError(),
        TopicAuthorizationFailedError({"out"}),
    ],
)
async def test_an_authorization_failure_is_not_fencing(broker: FakeBroker, error: Exception) -> None:
    """The partition stays ours and its outputs held (today it was dropped silently, as if fenced); the
    caller reports it (not ready, ERROR, alert) and retries once the ACL is granted."""
    tx = await _opened()
    tx.hold(TP, 0, _out("a"))
    broker.answer = error
    with pytest.raises(type(error)):
        await _commit(tx, 1)
    assert commit_failure(error) == "unauthorized"
    assert tx.owns(TP)
    assert tx.held() == 1
    assert await _commit(tx, 1)  # granted: the same outputs, once
    assert _values(broker) == [b"a"]


@pytest.mark.parametrize(
    ("error", "meaning"),
    [
        (ProducerFenced(), "fenced"),
        (InvalidProducerEpoch(), "fenced"),
        (TransactionalIdAuthorizationFailed("x"), "unauthorized"),
        (GroupAuthorizationFailedError(), "unauthorized"),
        (TopicAuthorizationFailedError({"t"}), "unauthorized"),
        (ClusterAuthorizationFailedError(), "unauthorized"),
        (KafkaConnectionError(), "outage"),
        (KafkaTimeoutError(), "outage"),
        (NotCoordinatorError(), "outage"),
        (TimeoutError(), "outage"),
        (InvalidTxnState(), "systemic"),
        (UnsupportedVersionError(), "systemic"),
        (RecordTooLargeError(), "systemic"),  # reached the caller: no record to blame (see refused below)
    ],
)
def test_what_a_failed_transaction_means(error: BaseException, meaning: str) -> None:
    assert commit_failure(error) == meaning


async def test_an_output_the_broker_refuses_is_replaced_by_its_records_dead_letter(
    broker: FakeBroker,
) -> None:
    """The output topic's max.message.bytes is below the record: the batch is retried one by one to find the
    record, whose outputs become its dead letter; the others go as usual (not a stalled partition)."""
    tx = await _opened()
    calls: list[tuple[int, object]] = []

    async def dead_letter(
        tp: TopicPartition, offset: int, source: object, error: BaseException
    ) -> list[HeldOutput]:
        calls.append((offset, source))
        return _out(f"dead letter of {offset}")

    tx.refused = dead_letter
    tx.hold(TP, 0, _out("ok0"), "record 0")
    tx.hold(TP, 1, _out("huge"), "record 1")
    tx.hold(TP, 2, _out("ok2"), "record 2")
    broker.too_large = {b"huge"}
    assert await _commit(tx, 3)
    assert calls == [(1, "record 1")]
    assert broker.committed == [([b"ok0", b"dead letter of 1", b"ok2"], {TP: 3})]


async def test_a_refused_output_with_nothing_to_replace_it_is_raised_not_retried_forever(
    broker: FakeBroker,
) -> None:
    tx = await _opened()
    tx.hold(TP, 0, _out("huge"))
    broker.too_large = {b"huge"}
    with pytest.raises(MessageSizeTooLargeError):
        await _commit(tx, 1)
    assert commit_failure(MessageSizeTooLargeError()) == "systemic"


async def test_held_outputs_have_a_cap(broker: FakeBroker) -> None:
    tx = await _opened()
    tx.max_held = 2
    tx.hold(TP, 0, _out("a"))
    assert not tx.full()
    tx.hold(TP, 1, _out("b"))
    assert tx.full()  # the loop pauses intake here
    assert await _commit(tx, 2)
    assert not tx.full()


@pytest.mark.parametrize(
    ("group", "topic", "partition", "replay", "expected"),
    [
        ("a-b", "c", 0, False, "a-b:c:0"),
        ("a", "b-c", 0, False, "a:b-c:0"),  # was "a-b-c-0" for both
        ("message-history", "agent.requests", 11, False, "message-history:agent.requests:11"),
        ("g:x", "t", 3, False, "g:x:t:3"),  # a colon in the group id: the last two still split
        ("g", "t", 3, True, "g:t:3:replay"),
        ("g:t:3", "replay", 0, False, "g:t:3:replay:0"),  # not the replay id of group g
    ],
)
def test_the_transactional_id_is_one_to_one(
    group: str, topic: str, partition: int, replay: bool, expected: str
) -> None:
    assert transactional_id(group, topic, partition, replay=replay) == expected
    assert parse_transactional_id(expected) == (group, topic, partition, replay)
    assert expected.startswith(group)  # a prefixed ACL on the group id covers it


@given(
    group=st.text(min_size=1, max_size=20),
    topic=st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=20),
    partition=st.integers(min_value=0, max_value=10_000),
    replay=st.booleans(),
)
def test_the_transactional_id_splits_back_whatever_the_group_id_holds(
    group: str, topic: str, partition: int, replay: bool
) -> None:
    value = transactional_id(group, topic, partition, replay=replay)
    assert parse_transactional_id(value) == (group, topic, partition, replay)


@pytest.mark.parametrize("landed", [True, False])
async def test_a_commit_whose_producer_failed_before_the_answer_is_read_back_not_guessed(
    broker: FakeBroker, landed: bool
) -> None:
    """aiokafka's sender can die mid-commit (a bare KafkaError): that producer can no longer settle it. A
    new producer (its InitProducerId completes the transaction) and the group's committed offset settle it:
    landed, nothing is sent again; not landed, the outputs go once."""
    tx = await _opened(broker=broker)
    tx.hold(TP, 0, _out("a"))
    broker.lose = "after" if landed else "before"
    with pytest.raises(TransactionInDoubtError):
        await _commit(tx, 1)
    assert tx.in_doubt() == [TP]
    assert commit_failure(TransactionInDoubtError()) == "outage"
    tx.hold(TP, 1, _out("b"))
    assert await _commit(tx, 2)
    assert _values(broker) == [b"a", b"b"]
    assert broker.offsets == {TP: 2}


def test_a_bare_kafka_error_is_classified_by_its_cause() -> None:
    wrapped = KafkaError("FindCoordinator failed")
    wrapped.__cause__ = KafkaConnectionError("Connection closed")
    assert commit_failure(wrapped) == "outage"
    assert commit_failure(KafkaError("no cause")) == "systemic"


async def test_open_at_committed_seeks_to_the_offset_read_after_the_fencing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each partition's producer is opened (its previous holder fenced) before its committed offset is
    read, and the partition is positioned there; one with nothing committed is left where it is."""
    events: list[str] = []
    broker = FakeBroker()

    async def open_fake(options: Any, transactional_id: str) -> FakeProducer:
        events.append(f"open {transactional_id}")
        return FakeProducer(broker)

    async def no_legacy(options: Any, legacy_id: str) -> None:
        return None

    monkeypatch.setattr(transactions, "open_transactional", open_fake)
    monkeypatch.setattr(transactions, "fence_legacy", no_legacy)
    committed = {TopicPartition("in", 1): 7}

    async def read_committed(tp: TopicPartition) -> int | None:
        events.append(f"read {tp.partition}")
        return committed.get(tp)

    seeks: list[tuple[TopicPartition, int]] = []
    tx = PartitionTransactions(Settings(), path="recall")
    tx.read_committed = read_committed
    await tx.open_at_committed([TopicPartition("in", 1), TP], lambda tp, o: seeks.append((tp, o)))

    assert events[2:] == ["read 0", "read 1"]  # both producers opened first
    assert sorted(events[:2]) == [
        f"open {tx.transactional_id(TP)}",
        f"open {tx.transactional_id(TopicPartition('in', 1))}",
    ]
    assert seeks == [(TopicPartition("in", 1), 7)]
    assert tx.owns(TP)
    assert tx.owns(TopicPartition("in", 1))


async def test_a_replays_transactions_commit_outputs_only_fence_no_live_id_and_settle_a_commit_in_doubt(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay (`for_client(..., replay=True)`, no group): its own ids, no live legacy id fenced,
    no offset in the transaction, no empty transaction; a commit whose answer did not come is settled on the
    same producer, its outputs never sent again (what `ReplayTransactions` did, now the service's code)."""
    opened: list[str] = []
    fenced: list[str] = []

    async def open_fake(options: Any, transactional_id: str) -> FakeProducer:
        opened.append(transactional_id)
        return FakeProducer(broker)

    async def fence(options: Any, legacy_id: str) -> None:
        fenced.append(legacy_id)

    monkeypatch.setattr(transactions, "open_transactional", open_fake)
    monkeypatch.setattr(transactions, "fence_legacy", fence)
    tx = PartitionTransactions.for_client({}, group_id="g", path="replay", replay=True)
    await tx.open([TP])
    assert await tx.commit(TP, 5)  # nothing held: no transaction
    tx.hold(TP, 5, _out("r5"))
    broker.down = True
    with pytest.raises(TimeoutError):
        await _commit(tx, 6)
    broker.back()
    tx.hold(TP, 6, _out("r6"))
    assert await tx.commit(TP, 7)
    assert (opened, fenced) == (["g:in:0:replay"], [])
    assert broker.committed == [([b"r5"], {}), ([b"r6"], {})]


async def test_a_replays_commit_whose_producer_died_before_the_answer_is_not_sent_again(
    broker: FakeBroker,
) -> None:
    """No group, so nothing to read back: the next try refuses (not an outage: the replay stops before the
    batch, resumable) instead of sending outputs that may have landed (the broker has them once)."""
    tx = PartitionTransactions.for_client({}, group_id="g", path="replay", replay=True)
    await tx.open([TP])
    tx.hold(TP, 5, _out("r5"))
    broker.lose = "after"
    with pytest.raises(TransactionInDoubtError):
        await _commit(tx, 6)
    with pytest.raises(KafkaError, match="cannot be settled") as refused:
        await _commit(tx, 6)
    assert not is_outage(refused.value)
    assert _values(broker) == [b"r5"]
