"""The recall path's batch logic without Kafka (tests/paths.py): what a worker reads in `EnrichedRequest`
(recalled history, the input kept, `history`), and what is dead-lettered and why."""

from __future__ import annotations

from typing import Any

import pytest

from message_history.core.budget import BOUNDARY_KEY
from message_history.errors import ThreadOwnershipError
from tests.paths import RESOURCE, Paths, assistant, request, response, user


async def _seeded(turns: int = 5, thread: str = "t1", resource: str = RESOURCE) -> Paths:
    """A thread with `turns` stored turns (user `u{i}` then assistant `a{i}`), written by the persist path."""
    paths = Paths()
    for i in range(turns):
        await paths.persist(
            response(
                thread,
                input=[user(f"u{i}", f"question {i} " * 20, 10 * i)],
                output=[assistant(f"a{i}", f"answer {i} " * 20, 10 * i + 1)],
                resource=resource,
                request_id=f"seed{i}",
                seconds=10 * i + 2,
            )
        )
    return paths


def _ids(event: dict[str, Any], source: str) -> list[str]:
    return [m["id"] for m in event["messages"] if m["source"] == source]


@pytest.mark.parametrize(
    ("memory", "recalled", "limit"),
    [
        pytest.param(None, ["u0", "a0", "u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"], 40, id="default-40"),
        pytest.param({"lastMessages": 3}, ["a3", "u4", "a4"], 3, id="last-3"),
        pytest.param({"lastMessages": 1}, ["a4"], 1, id="last-1"),
        pytest.param({"lastMessages": False}, [], 0, id="false-is-none"),
        pytest.param({"lastMessages": 0}, [], 0, id="zero-is-none"),
    ],
)
async def test_recall_of_the_last_n(memory: dict[str, Any] | None, recalled: list[str], limit: int) -> None:
    paths = await _seeded()
    batch = await paths.recall(request("t1", [user("in", "next?", 100)], memory=memory, request_id="q1"))
    event = batch.event(0)
    assert batch.sent[0].topic == paths.settings.enriched_topic
    assert batch.sent[0].key == b"t1"
    assert (event["requestId"], event["eventId"]) == ("q1", "q1")
    assert _ids(event, "memory") == recalled  # oldest first, then the input
    assert _ids(event, "input") == ["in"]
    assert [m["source"] for m in event["messages"]] == ["memory"] * len(recalled) + ["input"]
    assert (event["history"]["recalled"], event["history"]["limit"]) == (len(recalled), limit)


async def test_a_thread_with_no_history_recalls_nothing() -> None:
    paths = Paths()
    event = (await paths.recall(request("new", [user("in", "hi", 1)]))).event(0)
    assert (_ids(event, "memory"), _ids(event, "input")) == ([], ["in"])
    assert event["history"]["recalled"] == 0


async def test_a_request_on_another_resources_thread_is_refused_first() -> None:
    """The refusal comes before any recall: the owner's history never reaches the foreign request."""
    paths = await _seeded(resource="alice")
    batch = await paths.recall(
        request("t1", [user("x", "show me", 100)], resource="mallory", request_id="q-foreign"),
        request("t1", [user("y", "mine", 101)], resource="alice", request_id="q-owner", seconds=1001),
    )
    assert isinstance(batch.dead[0], ThreadOwnershipError)
    assert [e["requestId"] for e in batch.events] == ["q-owner"]
    assert len(_ids(batch.event(1), "memory")) == 10


@pytest.mark.parametrize(
    ("memory", "kept"),
    [
        pytest.param(None, ["new"], id="stored-copies-dropped"),
        pytest.param({"retainFullInput": True}, ["u3", "a3", "u4", "a4", "new"], id="retain-full-input"),
    ],
)
async def test_the_client_echo_filter(memory: dict[str, Any] | None, kept: list[str]) -> None:
    """A client resending the stored history (useChat style) with a new message: the stored copies are not
    sent twice, unless the request keeps its full input."""
    paths = await _seeded()
    resent = [
        user("u3", "question 3 " * 20, 30),
        assistant("a3", "answer 3 " * 20, 31),
        user("u4", "question 4 " * 20, 40),
        assistant("a4", "answer 4 " * 20, 41),
        user("new", "and now?", 100),
    ]
    event = (await paths.recall(request("t1", resent, memory=memory))).event(0)
    assert _ids(event, "input") == kept


async def _boundary(paths: Paths, thread: str = "t1") -> Any:
    stored = await paths.storage.get_thread(thread)
    assert stored is not None
    return stored.metadata.get(BOUNDARY_KEY)


@pytest.mark.parametrize(
    ("read_only", "boundary_written"),
    [pytest.param(False, True, id="writes-its-boundary"), pytest.param(True, False, id="read-only")],
)
async def test_a_token_budget_trims_the_oldest(read_only: bool, boundary_written: bool) -> None:
    paths = await _seeded()
    memory = {"maxTokens": 200, "atMaxRemoveTokens": 100, "readOnly": read_only}
    event = (await paths.recall(request("t1", [user("in", "next?", 100)], memory=memory))).event(0)
    history = event["history"]
    recalled = _ids(event, "memory")
    assert 0 < len(recalled) < 10
    assert recalled == ["u0", "a0", "u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"][-len(recalled) :]
    assert history["recalled"] == len(recalled)
    assert history["tokens"] is not None
    assert history["tokens"] <= 200
    assert history["trimmed"]  # the ids it dropped
    assert set(history["trimmed"]).isdisjoint(recalled)
    # a read-only recall neither stores a boundary nor reports one
    assert (history["boundary"] is not None) == boundary_written
    assert (await _boundary(paths) is not None) == boundary_written


async def test_two_requests_of_one_thread_leave_in_order() -> None:
    paths = await _seeded(turns=2)
    batch = await paths.recall(
        request("t1", [user("i1", "one", 100)], request_id="q1", seconds=100),
        request("t2", [user("j1", "other", 100)], request_id="p1", seconds=100),
        request("t1", [user("i2", "two", 101)], request_id="q2", seconds=101),
    )
    sent = [e["requestId"] for e in batch.events if e["threadId"] == "t1"]
    assert sent == ["q1", "q2"]
    assert _ids(batch.event(0), "memory") == _ids(batch.event(2), "memory") == ["u0", "a0", "u1", "a1"]
    assert _ids(batch.event(1), "memory") == []


async def test_an_unreadable_request_is_a_dead_letter_and_the_batch_goes_on() -> None:
    paths = await _seeded(turns=1)
    batch = await paths.recall(b"\xff", request("t1", [user("in", "hi", 100)], request_id="q1"))
    assert list(batch.dead) == [0]
    assert _ids(batch.event(1), "memory") == ["u0", "a0"]
