"""Partition ids per topic from `AIOKafkaAdminClient.describe_topics()` (the barrier, `topics`, `dlq`)."""

from __future__ import annotations

from typing import Any

import pytest

from producers.connection import topic_partitions


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
