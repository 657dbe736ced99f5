"""What the loop makes of a failed transaction (exactly-once), with the fake broker of `test_transactions`:
a missing ACL is not fencing (not ready, naming authorization; ready again once granted), a refusal that is
neither retriable nor fencing stops the loop instead of being retried at every commit."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import InvalidTxnState, TransactionalIdAuthorizationFailed, UnsupportedVersionError

from consumers.consumer import LoopOptions
from consumers.loop import StreamLoop
from consumers.runtime.intake import HELD
from message_history import metrics
from message_history.settings import Settings
from producers import transactions as transactions_module
from producers.transactional import HeldOutput
from producers.transactions import PartitionTransactions
from tests.unit.test_transactions import FakeBroker, broker  # noqa: F401 -- the fixture

pytestmark = pytest.mark.timeout(30)

TP = TopicPartition("in", 0)


class RecordingHealth:
    def __init__(self) -> None:
        self.ready: dict[str, tuple[bool, str]] = {}

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None:
        self.ready[component] = (ready, reason)

    def beat(self, component: str) -> None:
        return None


async def _loop(health: RecordingHealth) -> tuple[StreamLoop, PartitionTransactions]:
    transactions = PartitionTransactions(Settings(), path="recall")
    await transactions.open([TP])
    stub: Any = object()
    consumer: Any = type("Consumer", (), {"committed": None})()
    loop = StreamLoop(
        path="recall",
        topic="in",
        consumer=consumer,
        handler=stub,
        dead_letters=stub,
        health=health,
        options=LoopOptions.from_settings(Settings()),
        output=transactions,
    )
    return loop, transactions


def _failures(error_type: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "message_history_kafka_authorization_failures_total", {"path": "recall", "error_type": error_type}
    )
    return value or 0.0


async def test_a_missing_acl_makes_the_path_not_ready_and_keeps_the_partition(
    broker: FakeBroker,  # noqa: F811 -- the fixture
) -> None:
    health = RecordingHealth()
    loop, transactions = await _loop(health)
    transactions.hold(TP, 0, [HeldOutput("out", b"k", b"a", ())])
    before = _failures("TransactionalIdAuthorizationFailed")
    broker.answer = TransactionalIdAuthorizationFailed("g:in:0")
    assert await loop._checkpoint._write({TP: 1}, "interval") == {}
    ready, reason = health.ready["recall"]
    assert not ready
    assert "authorization" in reason
    assert _failures("TransactionalIdAuthorizationFailed") == before + 1
    assert transactions.owns(TP)  # not fenced: nobody else holds it
    assert loop._checkpoint.failure is None  # not a stop: an ACL to grant

    assert await loop._checkpoint._write({TP: 1}, "interval") == {TP: 1}  # granted
    assert health.ready["recall"] == (True, "")
    assert [v for sent, _ in broker.committed for v in sent] == [b"a"]


@pytest.mark.parametrize("error", [UnsupportedVersionError(), InvalidTxnState()])
async def test_a_refusal_neither_retriable_nor_fencing_stops_the_loop_one_not_committed_is_retried(
    broker: FakeBroker,  # noqa: F811 -- the fixture
    error: Exception,
) -> None:
    health = RecordingHealth()
    loop, transactions = await _loop(health)
    transactions.hold(TP, 0, [HeldOutput("out", b"k", b"a", ())])
    broker.answer = error
    assert await loop._checkpoint._write({TP: 1}, "interval") == {}
    if isinstance(error, InvalidTxnState):  # "not committable": known not committed, retried, sent once
        assert loop._checkpoint.failure is None
        assert await loop._checkpoint._write({TP: 1}, "interval") == {TP: 1}
    else:
        assert loop._checkpoint.failure is error  # `run` raises it: the loop stops with it


async def test_producers_that_cannot_be_opened_stop_the_loop_not_stall_its_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Raised out of the rebalance listener, aiokafka would log it and keep the partitions assigned but
    never read (a stall): the loop keeps it for `run` to raise."""

    async def refused(options: Any, transactional_id: str) -> Any:
        raise UnsupportedVersionError()

    async def no_legacy(options: Any, legacy_id: str) -> None:
        return None

    monkeypatch.setattr(transactions_module, "open_transactional", refused)
    monkeypatch.setattr(transactions_module, "fence_legacy", no_legacy)
    health = RecordingHealth()
    stub: Any = object()
    consumer: Any = type("Consumer", (), {"committed": None})()
    loop = StreamLoop(
        path="recall",
        topic="in",
        consumer=consumer,
        handler=stub,
        dead_letters=stub,
        health=health,
        options=LoopOptions.from_settings(Settings()),
        output=PartitionTransactions(Settings(), path="recall"),
    )
    with pytest.raises(UnsupportedVersionError):
        await loop._checkpoint.assigned({TP})
    assert isinstance(loop._checkpoint.failure, UnsupportedVersionError)


class PausingConsumer:
    """What `Intake.wait_polling` uses: every assigned partition is paused while the loop waits."""

    def __init__(self) -> None:
        self.paused_now: set[TopicPartition] = set()
        self.polls = 0
        self.committed = None

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused_now.update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_now)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused_now.difference_update(partitions)

    async def getmany(self, timeout_ms: int = 0, **_: Any) -> dict[TopicPartition, list[Any]]:
        self.polls += 1
        await asyncio.sleep(0.01)
        return {}


async def test_held_outputs_at_their_cap_pause_intake_until_commits_drain_them(
    broker: FakeBroker,  # noqa: F811 -- the fixture
) -> None:
    consumer = PausingConsumer()
    stub: Any = object()
    transactions = PartitionTransactions(Settings(), path="recall")
    transactions.max_held = 2
    await transactions.open([TP])
    loop = StreamLoop(
        path="recall",
        topic="in",
        consumer=cast(Any, consumer),
        handler=stub,
        dead_letters=stub,
        health=RecordingHealth(),
        options=LoopOptions.from_settings(Settings()),
        output=transactions,
    )
    transactions.hold(TP, 0, [HeldOutput("out", b"k", b"a", ())])
    transactions.hold(TP, 1, [HeldOutput("out", b"k", b"b", ())])
    stop = asyncio.Event()
    waiting = asyncio.create_task(loop._wait_for_room(HELD, transactions.full, stop, "held at cap", 2))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # intake paused: only paused polls, to stay in the group
    assert consumer.paused_now == {TP}
    assert consumer.polls > 0
    assert await transactions.commit(TP, 2)  # a commit drains them
    await asyncio.wait_for(waiting, 5)
    assert consumer.paused_now == set()  # intake resumed
