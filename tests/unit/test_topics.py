"""`message-history topics`: which partition counts are refused (the pure part; the Kafka part is in
tests/integration/test_turn_barrier.py)."""

from __future__ import annotations

import pytest

from message_history.app.topics import verdict

INPUTS = ("rq", "rs")


@pytest.mark.parametrize(
    ("counts", "wanted", "problems"),
    [
        ({"rq": 4, "rs": 4, "en": 4}, None, 0),
        ({"rq": 4, "rs": 2}, None, 1),  # the barrier's refusal
        ({"rq": 4, "rs": None}, None, 0),  # a missing topic is not a mismatch (yet)
        ({"rq": 4, "rs": 4, "en": 6}, 4, 1),  # an existing topic with another count than asked
        ({"rq": 4, "rs": 2}, 4, 2),
        ({"rq": None, "rs": None}, 3, 0),
    ],
)
def test_verdict(counts: dict[str, int | None], wanted: int | None, problems: int) -> None:
    """Unequal input topics, or a topic with another count than `--partitions`, is a problem each."""
    found = verdict(counts, INPUTS, wanted)
    assert len(found) == problems
    if counts.get("rq") and counts.get("rs") and counts["rq"] != counts["rs"]:
        assert "MESSAGE_HISTORY_BARRIER=off" in found[0]
