"""Partition ids per topic from `AIOKafkaAdminClient.describe_topics()` (the barrier, `topics`, `dlq`)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, NodeNotReadyError, TopicAuthorizationFailedError

from producers.connection import all_topic_partitions, topic_partitions


def _topic(name: str, partitions: int, error_code: int = 0) -> dict[str, Any]:
    return {
        "error_code": error_code,
        "topic": name,
        "is_internal": False,
        "partitions": [{"error_code": 0, "partition": p, "leader": 1} for p in range(partitions)],
    }


@pytest.mark.parametrize(
    ("described", "expected"),
    [
        pytest.param([], {}, id="no-topics"),
        pytest.param([_topic("a", 3)], {"a": {0, 1, 2}}, id="one-topic"),
        pytest.param([_topic("a", 4), _topic("b", 2)], {"a": {0, 1, 2, 3}, "b": {0, 1}}, id="two-topics"),
        # UNKNOWN_TOPIC_OR_PARTITION (3) and TOPIC_AUTHORIZATION_FAILED (29): as if the topic were missing
        pytest.param([_topic("a", 0, error_code=3), _topic("b", 1)], {"b": {0}}, id="unknown-topic"),
        pytest.param([_topic("a", 2, error_code=29)], {}, id="not-authorized"),
    ],
)
def test_partitions_per_topic(described: list[dict[str, Any]], expected: dict[str, set[int]]) -> None:
    assert topic_partitions(described) == expected


class _Admin:
    """`describe_topics()` failing with `errors` first (one per call), then answering."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.calls = 0

    async def describe_topics(self) -> list[dict[str, Any]]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return [_topic("a", 2)]


@pytest.mark.parametrize(
    ("errors", "calls", "raised"),
    [
        pytest.param([], 1, None, id="first-broker-answers"),
        pytest.param([NodeNotReadyError(), KafkaConnectionError()], 3, None, id="two-brokers-down"),
        pytest.param([NodeNotReadyError()] * 3, 3, NodeNotReadyError, id="all-tried"),
        pytest.param([TopicAuthorizationFailedError()], 1, TopicAuthorizationFailedError, id="not-retriable"),
    ],
)
async def test_a_broker_that_is_down_is_tried_past(
    errors: list[BaseException], calls: int, raised: type[BaseException] | None
) -> None:
    """The admin client asks one random broker: a retriable error is tried again (up to 3 reads)."""
    admin = _Admin(list(errors))
    if raised is None:
        assert await all_topic_partitions(cast(AIOKafkaAdminClient, admin)) == {"a": {0, 1}}
    else:
        with pytest.raises(raised):
            await all_topic_partitions(cast(AIOKafkaAdminClient, admin))
    assert admin.calls == calls
