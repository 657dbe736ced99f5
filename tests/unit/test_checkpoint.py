"""`consumers.runtime.checkpoint`: what the background commit does with a commit that raises."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from aiokafka import TopicPartition

from consumers.consumer import LoopOptions
from consumers.offsets import OffsetTracker
from consumers.runtime.checkpoint import AtLeastOnce, Checked
from message_history.app.health import Health
from message_history.settings import Settings

pytestmark = pytest.mark.timeout(10)

TP = TopicPartition("rq", 0)


class BuggyConsumer:
    """A consumer whose commit raises what no commit failure is (a bug in how it was called)."""

    def __init__(self) -> None:
        self.commits = 0

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits += 1
        raise AssertionError("offsets must be TopicPartition -> OffsetAndMetadata")


async def test_a_background_commit_that_raises_is_the_loops_failure_not_lost() -> None:
    tracker: OffsetTracker[TopicPartition] = OffsetTracker()
    tracker.track(TP, 0).done(0)
    consumer = BuggyConsumer()
    options = dataclasses.replace(LoopOptions.from_settings(Settings()), commit_interval_s=0.0)
    fake: Any = consumer
    checkpoint = AtLeastOnce(Checked("recall", fake, tracker, Health(), options), fake)
    checkpoint.maybe_commit()
    assert checkpoint._task is not None
    await asyncio.wait([checkpoint._task])
    assert consumer.commits == 1
    assert isinstance(checkpoint.failure, AssertionError)
