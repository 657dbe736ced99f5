"""`consumers.runtime.intake.Intake`: pausing held by named reasons, in one place; intake resumes only when
the last reason is released, and a partition assigned while held is paused at once."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition

from consumers.consumer import LoopOptions
from consumers.runtime.intake import HELD, OUTAGE, PARKED, Intake
from message_history import metrics
from message_history.app.health import Health
from message_history.settings import Settings

TP0, TP1 = TopicPartition("rq", 0), TopicPartition("rq", 1)


class FakeConsumer:
    def __init__(self, *assigned: TopicPartition) -> None:
        self._assigned = set(assigned)
        self._paused: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *tps: TopicPartition) -> None:
        self._paused |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused -= set(tps)


def _intake(consumer: FakeConsumer) -> Intake:
    options = LoopOptions.from_settings(Settings())
    fake: Any = consumer
    return Intake(path="recall", topic="rq", consumer=fake, health=Health(), options=options)


def test_intake_resumes_only_when_the_last_reason_is_released() -> None:
    consumer = FakeConsumer(TP0)
    intake = _intake(consumer)
    intake.take({TP0})
    intake.hold(OUTAGE)
    intake.hold(PARKED)
    intake.release(PARKED)  # the parked cap is gone, the outage is not
    assert consumer.paused() == {TP0}
    assert intake.holds(OUTAGE)
    intake.release(OUTAGE)
    assert consumer.paused() == set()


def test_a_partition_assigned_while_held_is_paused_at_once() -> None:
    consumer = FakeConsumer(TP0)
    intake = _intake(consumer)
    intake.take({TP0})
    intake.hold(HELD)
    consumer._assigned.add(TP1)
    intake.take({TP1})
    assert consumer.paused() == {TP0, TP1}
    paused = metrics.REGISTRY.get_sample_value("message_history_paused_partitions", {"path": "recall"})
    assert paused == 2  # the gauge counts the partition paused at its assignment too
    intake.release(HELD)
    assert consumer.paused() == set()
    intake.drop({TP1})
    assert intake.assigned == {TP0}
