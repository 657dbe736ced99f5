"""The persist path's batch logic without Kafka (tests/paths.py): what a worker reads in `HistoryPersisted`,
what is stored, what is dead-lettered and why, and the busy markers the batch answers."""

from __future__ import annotations

from typing import Any

import pytest

from consumers import persist
from consumers.collect import PersistBuffer
from message_history import metrics
from message_history.core.persist_plan import NeedsRead
from message_history.errors import MessageIdTakenError, ThreadOwnershipError
from schemas.events import AgentResponse
from schemas.ids import derived_message_id, legacy_message_id
from tests.paths import RESOURCE, Paths, assistant, at, response, user


async def test_a_saved_turn_reports_its_ids_and_the_threads_update() -> None:
    paths = Paths()
    batch = await paths.persist(
        response("t1", input=[user("m1", "hi", 1)], output=[assistant("m2", "hello", 2)], request_id="r1")
    )
    [event] = batch.events
    assert batch.sent[0].topic == paths.settings.persisted_topic
    assert batch.sent[0].key == b"t1"
    assert ("trace", b"agent.responses:0") in batch.sent[0].headers  # the response's headers passed on
    assert {k: event[k] for k in ("requestId", "eventId", "threadId", "resourceId")} == {
        "requestId": "r1",
        "eventId": "r1",
        "threadId": "t1",
        "resourceId": RESOURCE,
    }
    assert event["savedMessageIds"] == ["m1", "m2"]
    assert event["skipped"] is None
    assert event["threadUpdatedAt"] == at(2).replace("+00:00", "Z")
    assert await paths.stored_ids("t1") == ["m1", "m2"]
    assert paths.markers.answered_ids() == {"t1": ["r1"]}


@pytest.mark.parametrize(
    ("turn", "skipped"),
    [
        pytest.param(
            {
                "input": [user("m1", "hi", 1)],
                "output": [assistant("m2", "x", 2)],
                "memory": {"readOnly": True},
            },
            "read-only",
            id="read-only",
        ),
        pytest.param(
            {"input": [user("m1", "hi", 1)], "output": [], "finish_reason": "error"},
            "failed-turn",
            id="failed-turn",
        ),
        pytest.param({"input": [], "output": []}, "nothing-to-save", id="nothing-to-save"),
    ],
)
async def test_a_skipped_turn_says_why_and_stores_nothing(turn: dict[str, Any], skipped: str) -> None:
    paths = Paths()
    batch = await paths.persist(response("t1", request_id="r1", **turn))
    event = batch.event(0)
    assert (event["skipped"], event["savedMessageIds"]) == (skipped, [])
    assert await paths.stored_ids("t1") == []
    assert paths.markers.answered_ids() == {"t1": ["r1"]}  # answered all the same: the thread is not busy


@pytest.mark.parametrize(
    ("forget", "created", "skipped"),
    [
        pytest.param(("thread", "t1"), 10, "forgotten", id="thread-forgotten-after-the-turn"),
        pytest.param(("resource", RESOURCE), 10, "forgotten", id="resource-forgotten-after-the-turn"),
        pytest.param(("thread", "t1"), 1000, "forgotten", id="forgotten-at-the-same-instant"),
        pytest.param(("thread", "t1"), 2000, None, id="new-history-after-the-tombstone"),
        pytest.param(("thread", "other"), 10, None, id="another-thread-forgotten"),
    ],
)
async def test_a_turn_forgotten_since_is_skipped_and_answered(
    forget: tuple[str, str], created: float, skipped: str | None
) -> None:
    paths = Paths()
    kind, forgotten_id = forget
    if kind == "thread":
        paths.tombstones.forget_thread(forgotten_id, 1000)
    else:
        paths.tombstones.forget_resource(forgotten_id, 1000)
    turn = response(
        "t1",
        input=[user("m1", "hi", created)],
        output=[assistant("m2", "x", created + 1)],
        request_id="r1",
        seconds=created,
    )
    batch = await paths.persist(turn)
    event = batch.event(0)
    assert event["skipped"] == skipped
    if skipped == "forgotten":
        assert (event["savedMessageIds"], event["threadUpdatedAt"]) == ([], None)
        assert await paths.stored_ids("t1") == []
    else:
        assert await paths.stored_ids("t1") == ["m1", "m2"]
    assert paths.markers.answered_ids() == {"t1": ["r1"]}
    assert paths.tombstones.reads == 1  # one read for the batch


async def test_forgotten_and_saved_turns_of_one_batch() -> None:
    paths = Paths()
    paths.tombstones.forget_thread("gone", 1000)
    batch = await paths.persist(
        response("gone", input=[user("g1", "hi", 1)], request_id="r-gone", seconds=1),
        response("kept", input=[user("k1", "hi", 1)], request_id="r-kept", seconds=1),
    )
    assert batch.event(0)["skipped"] == "forgotten"
    assert batch.event(1)["savedMessageIds"] == ["k1"]
    assert paths.markers.answered_ids() == {"kept": ["r-kept"], "gone": ["r-gone"]}
    # a forgotten thread's marker was removed by forget: only one still there is touched
    assert paths.markers.calls[0][1] == frozenset({"gone"})


async def test_a_turn_on_another_resources_thread_is_a_dead_letter() -> None:
    paths = Paths()
    await paths.persist(response("t1", input=[user("m1", "mine", 1)], resource="alice", request_id="r1"))
    batch = await paths.persist(
        response("t1", input=[user("m2", "not yours", 2)], resource="mallory", request_id="r2"),
        response("t2", input=[user("m3", "fine", 3)], resource="mallory", request_id="r3"),
    )
    assert isinstance(batch.dead[0], ThreadOwnershipError)
    assert batch.event(1)["savedMessageIds"] == ["m3"]  # the others of the batch go on
    assert [e["requestId"] for e in batch.events] == ["r3"]  # no outcome for the refused one
    assert await paths.stored_ids("t1") == ["m1"]
    assert paths.markers.answered_ids() == {"t1": ["r1"], "t2": ["r3"]}  # a refused turn is not answered


async def test_a_message_id_stored_in_another_thread_is_a_dead_letter() -> None:
    paths = Paths()
    await paths.persist(response("t1", input=[user("m1", "first", 1)], request_id="r1"))
    batch = await paths.persist(
        response("t2", input=[user("m1", "same id, other thread", 2)], request_id="r2")
    )
    assert isinstance(batch.dead[0], MessageIdTakenError)
    assert batch.events == []
    assert await paths.stored_ids("t1") == ["m1"]
    assert await paths.stored_ids("t2") == []


async def test_ids_derived_by_the_service_keep_a_legacy_row() -> None:
    """A message without an id gets the derived id; one already stored in its thread under the pre-0.1.0
    id keeps that id, so a replay updates the old row instead of adding a copy."""
    paths = Paths()
    old = legacy_message_id("r1", "input", 0)
    await paths.persist(response("t1", input=[user(old, "hi", 1)], request_id="r0"))
    batch = await paths.persist(
        response("t1", input=[user(None, "hi", 1)], output=[assistant(None, "yo", 2)], request_id="r1")
    )
    new_response_id = derived_message_id(RESOURCE, "t1", "r1", "response", 0)
    assert batch.event(0)["savedMessageIds"] == [old, new_response_id]
    assert await paths.stored_ids("t1") == [old, new_response_id]


async def test_a_response_delivered_twice_in_one_batch_is_saved_once() -> None:
    paths = Paths()
    turn = response("t1", input=[user("m1", "hi", 1)], output=[assistant("m2", "yo", 2)], request_id="r1")
    batch = await paths.persist(turn, turn)
    assert [e["requestId"] for e in batch.events] == ["r1", "r1"]
    assert batch.event(0)["savedMessageIds"] == batch.event(1)["savedMessageIds"] == ["m1", "m2"]
    assert batch.event(0)["threadUpdatedAt"] == batch.event(1)["threadUpdatedAt"]
    assert await paths.stored_ids("t1") == ["m1", "m2"]


async def test_two_turns_of_one_thread_in_one_batch_are_saved_in_order() -> None:
    paths = Paths()
    batch = await paths.persist(
        response("t1", input=[user("m1", "one", 1)], output=[assistant("m2", "a", 2)], request_id="r1"),
        response("t1", input=[user("m3", "two", 3)], output=[assistant("m4", "b", 4)], request_id="r2"),
        response("t1", input=[], output=[], request_id="r3", seconds=1001),
    )
    assert [e["requestId"] for e in batch.events] == ["r1", "r2", "r3"]
    assert batch.event(0)["threadUpdatedAt"] == at(2).replace("+00:00", "Z")
    assert batch.event(1)["threadUpdatedAt"] == at(4).replace("+00:00", "Z")
    # a skipped turn reports the thread as the batch's earlier turn left it
    assert (batch.event(2)["skipped"], batch.event(2)["threadUpdatedAt"]) == (
        "nothing-to-save",
        at(4).replace("+00:00", "Z"),
    )
    assert await paths.stored_ids("t1") == ["m1", "m2", "m3", "m4"]
    assert paths.markers.answered_ids() == {"t1": ["r1", "r2", "r3"]}


async def test_an_unreadable_response_is_a_dead_letter_and_the_batch_goes_on() -> None:
    paths = Paths()
    batch = await paths.persist(b"{not json", response("t1", input=[user("m1", "hi", 1)], request_id="r1"))
    assert list(batch.dead) == [0]
    assert batch.event(1)["savedMessageIds"] == ["m1"]


async def _redelivery_batch(paths: Paths) -> tuple[list[tuple[bytes | None, bytes | None]], dict[str, Any]]:
    """A thread's stored turn, then a batch whose first turn is that turn redelivered with a new answer (its
    user message is stored, so it continues the latest assistant message, which its plan did not load: a
    plan miss), a later turn of the same thread, and another thread's turn. (sent records, stored rows)"""
    await paths.persist(response("t1", input=[user("u1", "hi", 1)], output=[assistant("a1", "hello", 2)]))
    batch = await paths.persist(
        response("t1", input=[user("u1", "hi", 1)], output=[assistant("a2", "again", 3)], request_id="r1"),
        response("t1", input=[user("u3", "next", 4)], output=[assistant("a4", "ok", 5)], request_id="r2"),
        response("t2", input=[user("v1", "yo", 1)], output=[assistant("v2", "hey", 2)], request_id="r3"),
    )
    rows: dict[str, Any] = {}
    for thread in ("t1", "t2"):
        stored = await paths.storage.list_messages(thread, resource_id=None, limit=None)
        rows[thread] = [m.model_dump(mode="json") for m in stored]
    return [(s.key, s.value) for s in batch.sent], rows


async def test_a_plan_miss_waits_in_its_threads_lane_and_decides_as_the_lanes_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The turns are decided from the batch's reads in one pass, without a task per thread; a turn that
    needs a read (a plan miss) and its thread's later turns go to the lanes. Same events and rows as when
    every turn goes through the lanes, the reference route: the later turn must not run before the miss."""
    misses = metrics.REGISTRY.get_sample_value("message_history_plan_misses_total", {"path": "persist"})
    one_pass = await _redelivery_batch(Paths())
    after = metrics.REGISTRY.get_sample_value("message_history_plan_misses_total", {"path": "persist"})
    assert (after or 0.0) == (misses or 0.0) + 1  # the batch does meet a miss
    decide_now = persist._decide_now
    first: set[int] = set()

    def lanes_only(buffer: PersistBuffer, order: int, response: AgentResponse) -> object:
        if order not in first:  # the one pass: every turn "needs a read" (an empty one), so all go late
            first.add(order)
            return NeedsRead()
        return decide_now(buffer, order, response)

    monkeypatch.setattr(persist, "_decide_now", lanes_only)
    assert await _redelivery_batch(Paths()) == one_pass
