"""`producers.transactions` without Kafka: which held outputs go into which partition's transaction.

A fake transactional producer records each committed transaction (the integration tests in
`tests/integration/test_exactly_once.py` show the same on the real broker). The rule under test: an output is
only ever committed with an offset that covers its input, in input order, and what a failed transaction held
is neither lost nor, when that transaction landed after all, produced twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced

from message_history.settings import Settings
from producers import transactions
from producers.transactions import HeldOutput, HoldingProducer, PartitionTransactions, held_outputs

pytestmark = pytest.mark.timeout(30)

TP = TopicPartition("in", 0)


class FakeProducer:
    """Records transactions; `fail` makes the next commit raise that error."""

    def __init__(self, log: list[tuple[list[bytes], dict[TopicPartition, int]]]) -> None:
        self.log = log
        self.fail: BaseException | None = None
        self._sent: list[bytes] = []
        self._offsets: dict[TopicPartition, int] = {}

    async def begin_transaction(self) -> None:
        self._sent, self._offsets = [], {}

    async def send(self, topic: str, *, key: bytes | None, value: bytes, headers: Any) -> asyncio.Future[Any]:
        self._sent.append(value)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group: str) -> None:
        self._offsets = dict(offsets)

    async def commit_transaction(self) -> None:
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        self.log.append((self._sent, self._offsets))

    async def abort_transaction(self) -> None:
        self._sent, self._offsets = [], {}

    async def stop(self) -> None:
        return None


@pytest.fixture
def committed(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[FakeProducer]]:
    log: list[tuple[list[bytes], dict[TopicPartition, int]]] = []
    made: list[FakeProducer] = []

    async def open_fake(options: Any, transactional_id: str) -> FakeProducer:
        made.append(FakeProducer(log))
        return made[-1]

    monkeypatch.setattr(transactions, "open_transactional", open_fake)
    return log, made


def _out(value: str) -> list[HeldOutput]:
    return [HeldOutput("out", b"k", value.encode(), ())]


async def _nothing_committed(tp: TopicPartition) -> int | None:
    return None


async def test_outputs_above_the_watermark_stay_held_and_go_in_input_order(
    committed: tuple[list[Any], list[FakeProducer]],
) -> None:
    """Offsets 10..13 done out of order while 12 waits (a parked request): the commit at watermark 12 carries
    10 and 11 only; 13 goes with the commit that covers it, after 12."""
    log, _ = committed
    tx = PartitionTransactions(Settings(), path="recall")
    await tx.open([TP])
    tx.hold(TP, 13, _out("r13"))
    tx.hold(TP, 11, _out("r11"))
    tx.hold(TP, 10, _out("r10"))
    assert await tx.commit(TP, 12, _nothing_committed)
    tx.hold(TP, 12, _out("r12"))
    assert await tx.commit(TP, 14, _nothing_committed)
    assert log == [([b"r10", b"r11"], {TP: 12}), ([b"r12", b"r13"], {TP: 14})]
    assert tx.held() == 0


async def test_a_failed_transaction_keeps_its_outputs_and_one_that_landed_is_not_sent_again(
    committed: tuple[list[Any], list[FakeProducer]],
) -> None:
    log, made = committed
    tx = PartitionTransactions(Settings(), path="persist")
    await tx.open([TP])
    tx.hold(TP, 0, _out("a"))
    made[-1].fail = KafkaConnectionError()
    with pytest.raises(KafkaConnectionError):
        await tx.commit(TP, 1, _nothing_committed)
    assert tx.held() == 1  # kept for the next commit, which uses a fresh producer
    tx.hold(TP, 1, _out("b"))
    assert await tx.commit(TP, 2, _nothing_committed)
    assert log == [([b"a", b"b"], {TP: 2})]
    assert len(made) == 2

    # a commit cut off (its error raised) that landed all the same: the next one asks the group first
    tx.hold(TP, 2, _out("c"))
    made[-1].fail = KafkaConnectionError()
    with pytest.raises(KafkaConnectionError):
        await tx.commit(TP, 3, _nothing_committed)

    async def landed(tp: TopicPartition) -> int | None:
        return 3

    tx.hold(TP, 3, _out("d"))
    assert await tx.commit(TP, 4, landed)
    assert log[-1] == ([b"d"], {TP: 4})  # "c" is not produced twice


async def test_a_fenced_or_revoked_partition_publishes_nothing_more(
    committed: tuple[list[Any], list[FakeProducer]],
) -> None:
    log, made = committed
    tx = PartitionTransactions(Settings(), path="recall")
    await tx.open([TP])
    tx.hold(TP, 0, _out("zombie"))
    made[-1].fail = ProducerFenced()
    assert not await tx.commit(TP, 1, _nothing_committed)
    tx.hold(TP, 1, _out("late"))
    assert not await tx.commit(TP, 2, _nothing_committed)  # no new producer: that would fence the owner
    assert log == []
    assert len(made) == 1
    await tx.open([TP])  # assigned again: a fresh start
    tx.hold(TP, 5, _out("owner"))
    assert await tx.commit(TP, 6, _nothing_committed)
    await tx.close([TP])
    assert not await tx.commit(TP, 7, _nothing_committed)
    assert log == [([b"owner"], {TP: 6})]


async def test_the_holding_producer_resolves_with_the_output_and_refuses_what_kafka_would() -> None:
    holding = HoldingProducer()
    ack = await holding.send("out", key=b"k", value=b"v", headers=[("h", b"1")])
    assert held_outputs(await ack) == [HeldOutput("out", b"k", b"v", (("h", b"1"),))]
    too_large = await holding.send("out", key=b"k", value=b"x" * (transactions.MAX_REQUEST_BYTES + 1))
    with pytest.raises(MessageSizeTooLargeError):
        await too_large
