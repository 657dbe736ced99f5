"""The monotonic tool-state merge on persist (`tool_state.merge_turn` via `MessageHistory.persist_turn`)."""

from __future__ import annotations

import pytest

from message_history.core.rules import with_source
from message_history.core.tool_state import merge_turn
from message_history.errors import ThreadOwnershipError
from message_history.processor import MessageHistory
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from tests.rule_cases import RESOURCE, THREAD, msg, seed, summarize, tool


def _pending() -> list[Message]:
    return [
        msg("u1", t=1, text="Which file?"),
        msg("a1", "assistant", t=2, parts=[{"type": "text", "text": "Asking."}, tool("ask", "call", "c1")]),
    ]


async def _stored(storage: InMemoryHistoryStorage) -> dict[str, list[str]]:
    rows = await storage.list_messages(THREAD, resource_id=None, limit=None)
    return {m.id or "": summarize(m) for m in reversed(rows)}


async def test_client_result_echo_advances_the_stored_call_and_keeps_the_stored_text() -> None:
    """An echoed assistant message (no `source` tag) only contributes the result of its pending call."""
    storage = InMemoryHistoryStorage()
    await seed(storage, _pending())
    echo = msg(
        "a1", "assistant", t=99, parts=[{"type": "text", "text": "EDITED"}, tool("ask", "result", "c1")]
    )
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD, resource_id=RESOURCE, input=[echo], response=[]
    )
    assert outcome.saved_ids == ["a1"]
    stored = await _stored(storage)
    assert stored["a1"] == ["text:Asking.", "tool:result:ask"]
    [row] = [m for m in await storage.list_messages(THREAD, resource_id=None, limit=None) if m.id == "a1"]
    assert row.createdAt == _pending()[1].createdAt


async def test_an_echo_that_advances_nothing_rewrites_the_stored_copy() -> None:
    """The stored copy wins: a stale echo writes the stored copy again, unchanged (as Mastra re-saves it)."""
    storage = InMemoryHistoryStorage()
    await seed(storage, _pending())
    stale = msg(
        "a1", "assistant", t=2, parts=[{"type": "text", "text": "Asking."}, tool("ask", "partial-call", "c1")]
    )
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD, resource_id=RESOURCE, input=[stale], response=[]
    )
    assert outcome.saved_ids == ["a1"]
    assert (await _stored(storage))["a1"] == ["text:Asking.", "tool:call:ask"]


async def test_a_response_continuing_the_latest_assistant_is_folded_into_it() -> None:
    """No new user input: the response joins the latest assistant message, no new row (docs/rules.md#r11)."""
    storage = InMemoryHistoryStorage()
    await seed(storage, _pending())
    echo = msg("a1", "assistant", t=2, parts=[tool("ask", "result", "c1")])
    answer = msg("a2", "assistant", t=5, text="Here is the summary.")
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD, resource_id=RESOURCE, input=[echo], response=[answer]
    )
    assert outcome.saved_ids == ["a1"]
    stored = await _stored(storage)
    assert set(stored) == {"u1", "a1"}
    assert stored["a1"] == ["text:Asking.", "tool:result:ask", "step-start", "text:Here is the summary."]


async def test_new_user_input_keeps_the_response_its_own_row() -> None:
    """With a new user message in the turn, the response is saved under its own id."""
    storage = InMemoryHistoryStorage()
    await seed(storage, _pending())
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD,
        resource_id=RESOURCE,
        input=[msg("u2", t=4, text="Never mind.")],
        response=[msg("a2", "assistant", t=5, text="OK.")],
    )
    assert outcome.saved_ids == ["u2", "a2"]


async def test_a_response_with_a_stored_id_is_merged_and_never_moves_back() -> None:
    """A result replaces a stored call; a later call for a stored result does not overwrite it."""
    storage = InMemoryHistoryStorage()
    await seed(storage, _pending())
    history = MessageHistory(storage=storage)
    await history.persist_turn(
        thread_id=THREAD,
        resource_id=RESOURCE,
        input=[msg("u2", t=3, text="go")],
        response=[msg("a1", "assistant", t=4, parts=[tool("ask", "result", "c1")])],
    )
    assert (await _stored(storage))["a1"] == ["text:Asking.", "tool:result:ask"]
    await history.persist_turn(
        thread_id=THREAD,
        resource_id=RESOURCE,
        input=[msg("u3", t=6, text="again")],
        response=[msg("a1", "assistant", t=7, parts=[tool("ask", "call", "c1")])],
    )
    assert (await _stored(storage))["a1"] == ["text:Asking.", "tool:result:ask"]


async def test_an_id_of_another_resource_never_overwrites_its_row() -> None:
    """Fail closed: a turn saving a message whose id belongs to another resource's thread is refused."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(
        thread_id="theirs", resource_id="alice", messages=[msg("x1", t=1, thread="theirs", resource="alice")]
    )
    with pytest.raises(ThreadOwnershipError) as refused:
        await MessageHistory(storage=storage).persist_turn(
            thread_id=THREAD, resource_id="mallory", input=[msg("x1", t=2, resource="mallory")], response=[]
        )
    # the refusal (a dead letter's error.message) names the id mallory sent, nothing of alice's
    reason = str(refused.value)
    assert "'x1'" in reason
    assert "alice" not in reason
    assert "theirs" not in reason
    [row] = await storage.list_messages("theirs", resource_id=None, limit=None)
    assert row.resourceId == "alice"


async def test_memory_sourced_input_is_still_never_saved() -> None:
    """Recalled messages the worker echoes back (source 'memory') are never candidates (docs/rules.md#r6)."""
    storage = InMemoryHistoryStorage()
    await seed(storage, _pending())
    recalled = [with_source(m, "memory") for m in _pending()]
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD,
        resource_id=RESOURCE,
        input=[*recalled, msg("u2", t=4, text="next")],
        response=[msg("a2", "assistant", t=5, text="ok")],
    )
    assert outcome.saved_ids == ["u2", "a2"]


def test_merge_turn_table() -> None:
    """The pure rule: new messages pass through; a fold needs an assistant latest and no new user input."""
    stored = {"a1": _pending()[1]}
    new = msg("a2", "assistant", t=5, text="x")
    assert merge_turn([new], response_ids={"a2"}, stored=stored, latest=None) == [new]
    user_latest = msg("u9", t=3)
    assert merge_turn([new], response_ids={"a2"}, stored=stored, latest=user_latest) == [new]
    [folded] = merge_turn([new], response_ids={"a2"}, stored=stored, latest=_pending()[1])
    assert folded.id == "a1"
    older = msg("a0", "assistant", t=1, text="older than the latest")
    assert merge_turn([older], response_ids={"a0"}, stored=stored, latest=_pending()[1]) == [older]
