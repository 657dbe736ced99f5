"""The output topics' `max.message.bytes`, read at start: what a DescribeConfigs answer gives, and the batch
size it implies (a batch never over the smallest limit: the broker would refuse records that each fit, and
the idempotent producer's sequence would break). The real broker: `test_exactly_once_outage.py`."""

from __future__ import annotations

import pytest

from producers.output import MAX_BATCH_BYTES, MIN_BATCH_BYTES, batch_bytes, parse_limits


def test_limits_are_read_from_the_topics_the_broker_answered_for() -> None:
    resources = [
        (0, None, 2, "en", [("max.message.bytes", "6144", False, False, False)]),
        (3, "unknown topic", 2, "missing", []),  # not created yet: the broker's default applies
        (29, "not authorized", 2, "secret", []),
        (0, None, 2, "pe", [("max.message.bytes", "1048588", False, True, False)]),
        (0, None, 2, "odd", [("max.message.bytes", None, False, True, True)]),
    ]
    assert parse_limits(resources) == {"en": 6144, "pe": 1048588}


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({}, MAX_BATCH_BYTES),
        ({"pe": 1048588}, MAX_BATCH_BYTES),
        ({"en": 6144, "pe": 1048588}, 6144),
        ({"en": 10}, MIN_BATCH_BYTES),
    ],
)
def test_a_batch_is_never_over_the_smallest_limit(limits: dict[str, int], expected: int) -> None:
    assert batch_bytes(limits) == expected
