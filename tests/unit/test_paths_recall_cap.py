"""The cap on rows read for one request (`MAX_ROWS_PER_REQUEST`) on the recall path (tests/paths.py): a
request asking more than the cap, or a thread longer than it, gets the newest rows up to the cap and
`history.truncated: true`; a recall the cap does not cut looks as it always did."""

from __future__ import annotations

from typing import Any

import pytest

from message_history.settings import Settings
from storage.protocol import BatchHistoryStorage
from tests.paths import RESOURCE, Paths, assistant, request, response, user

CAP = 100
HUGE = 2**53 - 1  # the largest lastMessages the schema takes


async def seeded(turns: int, thread: str = "t1", storage: BatchHistoryStorage | None = None) -> Paths:
    """A thread of `turns` stored turns (`u{i}`, `a{i}`: 2 rows each) under a cap of `CAP` rows."""
    paths = Paths(Settings(max_rows_per_request=CAP), storage=storage)
    responses = [
        response(
            thread,
            input=[user(f"u{i}", f"question {i}", 10 * i)],
            output=[assistant(f"a{i}", f"answer {i}", 10 * i + 1)],
            resource=RESOURCE,
            request_id=f"seed{i}",
            seconds=10 * i + 2,
        )
        for i in range(turns)
    ]
    await paths.persist(*responses)
    return paths


def _memory_ids(event: dict[str, Any]) -> list[str]:
    return [m["id"] for m in event["messages"] if m["source"] == "memory"]


def _newest(turns: int, rows: int) -> list[str]:
    every = [f"{kind}{i}" for i in range(turns) for kind in ("u", "a")]
    return every[-rows:]


@pytest.mark.parametrize(
    ("turns", "memory", "recalled", "limit", "truncated"),
    [
        pytest.param(60, {"lastMessages": HUGE}, CAP, CAP, True, id="huge-lastMessages-longer-thread"),
        pytest.param(60, {"lastMessages": CAP + 1}, CAP, CAP, True, id="one-over-the-cap"),
        pytest.param(60, {"lastMessages": CAP}, CAP, CAP, False, id="asks-the-cap"),
        pytest.param(50, {"lastMessages": HUGE}, CAP, CAP, False, id="thread-of-exactly-the-cap"),
        pytest.param(10, {"lastMessages": HUGE}, 20, CAP, False, id="short-thread"),
        pytest.param(60, None, 40, 40, False, id="default-40"),
    ],
)
async def test_a_count_recall_reads_at_most_the_cap(
    turns: int, memory: dict[str, Any] | None, recalled: int, limit: int, truncated: bool
) -> None:
    paths = await seeded(turns)
    batch = await paths.recall(request("t1", [user("in", "next?", 10_000)], memory=memory, request_id="q1"))
    event = batch.event(0)
    assert _memory_ids(event) == _newest(turns, recalled)
    assert (event["history"]["recalled"], event["history"]["limit"]) == (recalled, limit)
    assert event["history"].get("truncated", False) is truncated
    assert ("truncated" in event["history"]) is truncated  # absent unless true


async def test_a_capped_request_cuts_only_its_own_recall() -> None:
    """In one batch, a huge lastMessages on one thread is capped; another thread's request is untouched."""
    paths = await seeded(60)
    for i in range(3):
        await paths.persist(
            response("t2", input=[user(f"x{i}", "hi", i)], output=[], resource=RESOURCE, request_id=f"s2-{i}")
        )
    batch = await paths.recall(
        request("t1", [user("in1", "next?", 10_000)], memory={"lastMessages": HUGE}, request_id="q1"),
        request("t2", [user("in2", "next?", 10_000)], memory={"lastMessages": 5}, request_id="q2"),
    )
    assert batch.event(0)["history"]["truncated"] is True
    assert len(_memory_ids(batch.event(0))) == CAP
    assert _memory_ids(batch.event(1)) == ["x0", "x1", "x2"]
    assert "truncated" not in batch.event(1)["history"]


@pytest.mark.parametrize(
    ("turns", "truncated"),
    [
        pytest.param(300, True, id="thread-past-the-cap"),
        pytest.param(30, False, id="thread-under-the-cap"),
    ],
)
async def test_a_token_budget_recall_stops_paging_at_the_cap(turns: int, truncated: bool) -> None:
    """A budget no thread fills and a huge count cap: the pages stop at the cap and the event says so."""
    paths = await seeded(turns)
    memory = {"lastMessages": HUGE, "maxTokens": 10_000_000}
    batch = await paths.recall(request("t1", [user("in", "next?", 100_000)], memory=memory, request_id="q1"))
    event = batch.event(0)
    recalled = _memory_ids(event)
    assert event["history"].get("truncated", False) is truncated
    assert len(recalled) <= CAP
    assert recalled == _newest(turns, len(recalled))  # the newest rows, oldest first
    if not truncated:
        assert len(recalled) == 2 * turns
