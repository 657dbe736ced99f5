"""The emit channel (`consumers.runtime.emit`): what a path's outputs go through. Exactly-once files a
record's outputs under its offset, one per topic (emitted again, it replaces the one before; a dead letter
replaces them all), refuses what Kafka would refuse for its size, and forgets what a revoke lets go of;
at-least-once sends at once and hands back Kafka's acknowledgement unawaited (the pipelining). Pure: fake
records and producers, no broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from consumers.consumer import LoopOptions
from consumers.contract import Done, Emit, Record, Result
from consumers.offsets import OffsetTracker
from consumers.runtime.checkpoint import Checked, ExactlyOnce
from consumers.runtime.containment import Contained
from consumers.runtime.emit import FileUnderOffset, SendNow
from consumers.runtime.retry import Backoff
from message_history.app.health import Health
from message_history.settings import Settings
from producers.output import MAX_REQUEST_BYTES, Headers
from producers.transactional import HeldOutput
from producers.transactions import PartitionTransactions

pytestmark = pytest.mark.timeout(10)

POISON = b"poison"


def _record(offset: int, value: bytes = b"v", partition: int = 0) -> Any:
    return SimpleNamespace(topic="in", partition=partition, offset=offset, key=b"t", value=value, headers=[])


async def test_an_output_is_filed_under_its_record_and_its_future_is_resolved_at_once() -> None:
    filed = FileUnderOffset()
    sent = await filed(_record(3), "out", key=b"k", value=b"a", headers=[("h", b"1")])
    assert sent.done()
    assert sent.result() is None
    assert filed.take(_record(3)) == [HeldOutput("out", b"k", b"a", (("h", b"1"),))]
    assert filed.take(_record(3)) == []  # taken once
    assert filed.take(_record(4)) == []  # a record that emitted nothing has no outputs


async def test_an_output_emitted_again_for_its_record_replaces_the_one_before() -> None:
    """An attempt made again (a split batch, an outage retry) or the record's dead letter instead of its
    event: the record's outputs are the last attempt's, once."""
    filed = FileUnderOffset()
    await filed(_record(0), "out", key=b"k", value=b"first try")
    await filed(_record(0), "out", key=b"k", value=b"second try")
    await filed(_record(0, partition=1), "out", key=b"k", value=b"another partition")
    assert filed.take(_record(0)) == [HeldOutput("out", b"k", b"second try", ())]
    assert filed.take(_record(0, partition=1)) == [HeldOutput("out", b"k", b"another partition", ())]


async def test_a_record_keeps_one_output_per_topic_and_its_dead_letter_replaces_them_all() -> None:
    """A persisted turn has its event and Observational Memory's work for its thread (two topics): both are
    filed, each replaced by its own next try; a dead letter (`alone`) is the record's only output after it
    (without `alone`, the event filed by an earlier attempt would be committed beside the dead letter)."""
    filed = FileUnderOffset()
    await filed(_record(0), "persisted", key=b"t", value=b"event, first try")
    await filed(_record(0), "observe", key=b"t", value=b"work")
    await filed(_record(0), "persisted", key=b"t", value=b"event")
    assert filed.take(_record(0)) == [
        HeldOutput("persisted", b"t", b"event", ()),
        HeldOutput("observe", b"t", b"work", ()),
    ]
    await filed(_record(1), "persisted", key=b"t", value=b"event")
    await filed(_record(1), "dlq", key=b"t", value=b"dead letter", alone=True)
    assert filed.take(_record(1)) == [HeldOutput("dlq", b"t", b"dead letter", ())]
    await filed(_record(2), "persisted", key=b"t", value=b"event")
    await filed(_record(2), "dlq", key=b"t", value=b"dead letter")  # the guard off: both would go out
    assert len(filed.take(_record(2))) == 2


async def test_an_output_too_large_for_kafka_is_refused_at_once_and_not_filed() -> None:
    filed = FileUnderOffset()
    refused = await filed(_record(0), "out", key=b"k", value=b"x" * (MAX_REQUEST_BYTES + 1))
    with pytest.raises(MessageSizeTooLargeError):
        await refused
    assert filed.filed() == 0


async def test_a_revoke_forgets_what_its_partitions_filed_only() -> None:
    filed = FileUnderOffset()
    for partition in (0, 1):
        await filed(_record(5, partition=partition), "out", key=b"k", value=b"v")
    filed.drop([TopicPartition("in", 0)])
    assert filed.take(_record(5, partition=0)) == []
    assert filed.take(_record(5, partition=1)) != []
    await filed(_record(6), "out", key=b"k", value=b"v")
    filed.drop()
    assert filed.filed() == 0


class _Producer:
    """Buffers each send and acknowledges only when told: `send` returns before Kafka answers."""

    def __init__(self) -> None:
        self.acks: list[asyncio.Future[Any]] = []
        self.sent: list[tuple[str, bytes | None]] = []

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> asyncio.Future[Any]:
        self.sent.append((topic, value))
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        return ack


async def test_at_least_once_sends_at_once_and_hands_back_the_acknowledgement_unawaited() -> None:
    producer = _Producer()
    emit = SendNow(producer)
    first = await emit(_record(0), "out", key=b"k", value=b"a")
    second = await emit(_record(1), "out", key=b"k", value=b"b")
    assert producer.sent == [("out", b"a"), ("out", b"b")]  # both buffered before either is acknowledged
    assert not first.done()
    assert not second.done()
    for ack in producer.acks:
        ack.set_result("metadata")
    assert [await first, await second] == ["metadata", "metadata"]


class _Echo:
    """A path emitting one output per record; its batch work raises when it holds the poison record."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        self.calls += 1
        sent = [await emit(r, "out", key=r.key, value=r.value) for r in records]
        if any(r.value == POISON for r in records):
            raise ZeroDivisionError("division by zero")
        return [Done(ack) for ack in sent]


async def test_records_handled_again_by_a_split_batch_have_their_output_filed_once() -> None:
    """`Contained` handles the records around a poison record again, halving the batch: each record's
    output is filed once, so its transaction produces it once (appending would produce it up to log2(n)
    times)."""
    filed = FileUnderOffset()
    records = [_record(i, POISON if i == 5 else b"v%d" % i) for i in range(8)]
    path = _Echo()
    results = await Contained(path, "recall").handle(records, filed)
    assert path.calls > 2  # the batch was split: records 0-4, 6, 7 were handled more than once
    for record, result in zip(records, results, strict=True):
        outputs = filed.take(record)
        if record.value == POISON:
            assert not isinstance(result, Done)
            continue
        assert outputs == [HeldOutput("out", b"t", record.value, ())]


async def test_exactly_once_holds_what_the_batch_filed_for_a_done_record() -> None:
    """The checkpoint hands each batch its `FileUnderOffset`; a done record's outputs go from there to its
    partition's held outputs, for the transaction committing its offset."""
    transactions = PartitionTransactions(Settings(), path="recall")
    tp = TopicPartition("in", 0)
    await transactions.open([])  # nothing to open: only ownership below
    transactions._owned.add(tp)
    consumer: Any = SimpleNamespace(committed=None)
    checked = Checked("recall", consumer, OffsetTracker(), Health(), LoopOptions.from_settings(Settings()))

    async def refused(record: ConsumerRecord, error: BaseException, emit: Emit) -> object:
        return None

    backoff = Backoff(0.1, 1.0, lambda: 0.5)
    checkpoint = ExactlyOnce(checked, transactions, refused=refused, backoff=backoff, stopping=lambda: False)
    record = _record(7)
    await checkpoint.emit(record, "out", key=b"k", value=b"answer")
    checkpoint.hold(tp, record)
    assert transactions._held == {tp: {7: [HeldOutput("out", b"k", b"answer", ())]}}
    assert transactions.held() == 1
