"""Exactly-once through a broker outage, on a test-owned broker (`private_kafka`) stopped and frozen
mid-commit; read `read_committed`: nothing twice, nothing lost.

A `commit_transaction` that gets no answer in time is ambiguous: the broker may have committed it. The first
test shows it on the real broker (a commit whose answer a frozen broker never sent landed, and sending its
outputs again, as the rule before this fix did, makes a reader see them twice), and that settling it on the
same producer (`producers.transactions.Transactional`) sends them once. The others run the service and the
worker SDK through a stopped and a frozen broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from producers.transactions import HeldOutput, PartitionTransactions, Transactional, open_transactional
from tests.integration.private_kafka import PrivateKafka, private_kafka  # noqa: F401 -- the fixture
from tests.integration.stream_helpers import read_topic
from tests.integration.test_service_kafka_outage import _make_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

COMMITTED = "read_committed"


def _out(topic: str, value: str) -> list[HeldOutput]:
    return [HeldOutput(topic, b"k", value.encode(), ())]


async def _committed_offset(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(tp)
        return offset
    finally:
        await consumer.stop()


async def _values(bootstrap: str, topic: str, want: int) -> list[bytes]:
    records = await read_topic(bootstrap, topic, until=lambda rs: len(rs) >= want, isolation_level=COMMITTED)
    with contextlib.suppress(AssertionError):  # anything more than `want` (a duplicate) shows up too
        records = await read_topic(
            bootstrap, topic, until=lambda rs: len(rs) > want, isolation_level=COMMITTED, timeout_s=3
        )
    return [r.value for r in records if r.value is not None]


def _cut_off_commit(tx: Transactional, cut: Callable[[], None]) -> None:
    """The broker is cut (`cut`, in a thread) as the next commit of `tx` is asked: it answers nothing."""
    producer: Any = tx.producer
    ask = producer.commit_transaction

    async def cut_then_commit() -> None:
        producer.commit_transaction = ask
        await asyncio.to_thread(cut)  # frozen: EndTxn waits in its socket buffer; stopped: it is retried
        await ask()

    producer.commit_transaction = cut_then_commit


@pytest.mark.parametrize("fault", ["freeze", "stop"])
async def test_a_commit_cut_off_mid_answer_is_settled_not_sent_again(
    private_kafka: PrivateKafka,  # noqa: F811 -- the fixture
    fault: str,
) -> None:
    kafka = private_kafka
    bootstrap = kafka.bootstrap
    await _make_topics(bootstrap, ["in", "out"])
    tp = TopicPartition("in", 0)
    group = f"eos-doubt-{fault}"
    tx = PartitionTransactions.for_client({"bootstrap_servers": bootstrap}, group_id=group, path="test")
    await tx.open([tp])
    tx.hold(tp, 0, _out("out", "a"))
    assert await tx.commit(tp, 1)

    tx.hold(tp, 1, _out("out", "b"))
    cut, heal = (kafka.freeze, kafka.thaw) if fault == "freeze" else (kafka.stop, kafka.start)
    _cut_off_commit(tx._producers[tp], cut)  # the producer the partition commits with
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(tx.commit(tp, 2), 5)
    assert tx.in_doubt() == [tp]  # asked, no answer: not taken for an abort
    await asyncio.to_thread(heal)
    tx.hold(tp, 2, _out("out", "c"))
    assert await asyncio.wait_for(tx.commit(tp, 3), 120)
    await tx.close()

    assert Counter(await _values(bootstrap, "out", 3)) == {b"a": 1, b"b": 1, b"c": 1}
    assert await _committed_offset(bootstrap, group, tp) == 3


async def test_a_commit_a_frozen_broker_never_answered_had_landed(
    private_kafka: PrivateKafka,  # noqa: F811 -- the fixture
) -> None:
    """Why a timeout is never taken for an abort: the answer of a commit that the frozen broker received
    never came in time, yet it committed; a new producer that sends the outputs again (the rule before this
    fix) makes a read_committed reader see them twice."""
    kafka = private_kafka
    bootstrap = kafka.bootstrap
    await _make_topics(bootstrap, ["in", "out"])
    options = {"bootstrap_servers": bootstrap}
    first = Transactional(await open_transactional(options, "guess:in:0"))
    _cut_off_commit(first, kafka.freeze)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(first.run(_out("out", "b")), 5)
    kafka.thaw()
    await asyncio.sleep(2)  # the frozen broker reads what waited in its socket buffers: the commit
    await first.stop()
    # the old rule: "aborted", a fresh producer (its InitProducerId completes what was open), sent again
    again = Transactional(await open_transactional(options, "guess:in:0"))
    await again.run(_out("out", "b"))
    await again.stop()
    assert Counter(await _values(bootstrap, "out", 1)) == {b"b": 2}


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)
