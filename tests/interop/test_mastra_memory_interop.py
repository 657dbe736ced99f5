"""Interop with Mastra 1.71's conversation memory, run under Node on the same inputs as ours.

* The default token counter: tokenx's `estimateTokenCount` and `TokenLimiterProcessor`'s per-message and
  system counts, against `message_history.core.tokens`, on a few hundred generated texts and messages of every
  part type: equal as numbers (floats included).
* Token-limited recall: Mastra's `MessageHistory` with a token limit and the memory-only limiter Memory
  wires after it, against our recall, on generated multi-turn conversations with tool calls: the same
  context ids, trimmed ids and stored boundary, turn after turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from message_history.core.budget import BOUNDARY_KEY, TokenBudget, resolve_budget
from message_history.core.rules import with_source
from message_history.core.tokens import count_message, count_system_text, estimate_token_count
from message_history.processor import MessageHistory
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from tests.interop.test_mastra_core_interop import HERE, _run
from tests.memory_cases import conversation, random_messages, random_texts

pytestmark = pytest.mark.interop

V1: Path = HERE / "v1"


def _mastra(command: str, payload: dict[str, Any]) -> Any:
    return _run(V1, "memory.mjs", command, str(V1), stdin=json.dumps(payload).encode())


def test_token_counter_matches_mastra() -> None:
    """Same count for every text, system text and message as Mastra 1.71's own counter."""
    texts = random_texts(seed=7, count=300)
    messages = random_messages(seed=11, count=400)
    out = _mastra("tokens", {"texts": texts, "systems": texts[:50], "messages": messages})
    assert out["version"] == "1.71.0"
    ours_texts = [estimate_token_count(t) for t in texts]
    diffs = [(t, a, b) for t, a, b in zip(texts, ours_texts, out["texts"], strict=True) if a != b]
    assert not diffs, diffs[:5]
    assert [count_system_text(t) for t in texts[:50]] == out["systems"]
    ours = [count_message(Message.model_validate_json(json.dumps(m))) for m in messages]
    diffs_m = [(m, a, b) for m, a, b in zip(messages, ours, out["messages"], strict=True) if a != b]
    assert not diffs_m, diffs_m[:3]
    # The inputs do exercise the floating-point overheads: fractional and negative counts both occur.
    assert any(value != int(value) for value in ours)
    assert any(value < 0 for value in ours)


async def _our_turns(
    turns: list[list[dict[str, Any]]],
    *,
    last_messages: int | bool,
    budget: TokenBudget | None,
    systems: list[str],
    read_only: bool = False,
) -> list[dict[str, Any]]:
    """The same conversation through our processor and in-memory storage, reported like memory.mjs."""
    storage = InMemoryHistoryStorage()
    history = MessageHistory(storage=storage)
    out: list[dict[str, Any]] = []
    for turn in turns:
        messages = [Message.model_validate_json(json.dumps(m)) for m in turn]
        outcome = await history.recall(
            thread_id="t",
            resource_id="r",
            incoming=messages[:1],
            last_messages=last_messages,
            budget=budget,
            system=systems,
            read_only=read_only,
        )
        thread = await storage.get_thread("t")
        stored = (thread.metadata if thread is not None else {}).get(BOUNDARY_KEY)
        out.append(
            {
                "context": [m.id for m, _ in outcome.context],
                "trimmed": outcome.trimmed,
                "boundary": stored,
            }
        )
        await storage.save_messages(thread_id="t", resource_id="r", messages=messages)
    return out


BUDGETS = [
    pytest.param(False, 400, None, [], id="tokens-only-400"),
    pytest.param(False, 1500, 600, [], id="tokens-only-1500-remove-600"),
    pytest.param(12, 800, None, ["You are terse."], id="cap-12-and-800-with-system"),
    pytest.param(6, 5000, 0, [], id="count-cap-binds-first"),
    pytest.param(False, 250, 250, [], id="remove-everything"),
]


@pytest.mark.parametrize(("last_messages", "max_tokens", "at_max", "systems"), BUDGETS)
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_token_limited_recall_matches_mastra(
    seed: int, last_messages: int | bool, max_tokens: float, at_max: float | None, systems: list[str]
) -> None:
    """Turn after turn: the same context, the same trimmed ids and the same stored boundary as Mastra."""
    turns = conversation(seed=seed, turns=25)
    budget = resolve_budget(max_tokens, at_max)
    assert budget is not None
    mastra = _mastra(
        "recall",
        {
            "threadId": "t",
            "resourceId": "r",
            "turns": turns,
            "systems": systems,
            "lastMessages": last_messages,
            "maxTokens": budget.max_tokens,
            "atMaxRemoveTokens": budget.at_max_remove_tokens,
        },
    )
    ours = await _our_turns(turns, last_messages=last_messages, budget=budget, systems=systems)
    trims = 0
    for index, (theirs, mine) in enumerate(zip(mastra["turns"], ours, strict=True)):
        where = f"turn {index}"
        assert sorted(mine["context"]) == sorted(theirs["context"]), where
        assert sorted(mine["trimmed"]) == sorted(theirs["trimmed"]), where
        if theirs["boundary"] is None:
            assert mine["boundary"] is None, where
        else:
            assert mine["boundary"] is not None, where
            assert {**mine["boundary"], "messageIds": sorted(mine["boundary"]["messageIds"])} == {
                **theirs["boundary"],
                "messageIds": sorted(theirs["boundary"]["messageIds"]),
            }, where
        trims += bool(theirs["trimmed"])
    # The conversation does make the limiter trim, and the boundary moves (more than one trim).
    if max_tokens < 2000:
        assert trims >= 2


def _parts_summary(parts: list[dict[str, Any]]) -> list[str]:
    out = []
    for part in parts:
        if part["type"] == "tool-invocation":
            out.append(f"tool:{part['toolInvocation']['toolCallId']}:{part['toolInvocation']['state']}")
        else:
            out.append(part["type"])
    return out


def _one_assistant(turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    user, first, *rest = turn
    merged = json.loads(json.dumps(first))
    for message in rest:
        merged["content"]["parts"].extend(message["content"]["parts"])
    return [user, merged]


def _echo_cases() -> list[dict[str, Any]]:
    """Client echoes of a stored conversation, in every shape the filter distinguishes."""
    cases: list[dict[str, Any]] = []
    for seed in range(6):
        # one assistant message per turn: Mastra's MessageList would fold consecutive ones into one
        # (docs/rules.md#r11), which is not what this test is about
        turns = [_one_assistant(turn) for turn in conversation(seed=100 + seed, turns=4)]
        stored = [m for turn in turns[:3] for m in turn]
        history = [json.loads(json.dumps(m)) for m in stored]
        new_user = turns[3][0]
        # the client advances every pending call of the assistant messages it echoes
        advanced = json.loads(json.dumps(history))
        for message in advanced:
            for part in message["content"]["parts"]:
                invocation = part.get("toolInvocation")
                if invocation and invocation["state"] == "call":
                    invocation["state"] = "result"
                    invocation["result"] = {"client": seed}
        last_assistant = next(m for m in reversed(advanced) if m["role"] == "assistant")
        tail = json.loads(json.dumps(last_assistant))
        tail["content"]["parts"].append(
            {
                "type": "tool-invocation",
                "toolInvocation": {"state": "result", "toolCallId": "late", "toolName": "x", "result": 1},
            }
        )
        for input_ in (
            [*history, new_user],  # useChat: the whole history then the new message
            [*advanced, new_user],  # ... with client tool results on the echoed assistant messages
            history[-2:],  # ends with a stored assistant message: nothing new
            [*history[:-1], tail],  # ends with an assistant message carrying a trailing client result
            [new_user],  # nothing echoed
        ):
            cases.append({"threadId": "t", "resourceId": "r", "stored": stored, "input": input_})
        cases.append({"threadId": "t", "resourceId": "r", "stored": [], "input": [*history, new_user]})
    return cases


async def _our_filter(case: dict[str, Any]) -> list[dict[str, Any]]:
    storage = InMemoryHistoryStorage()
    stored = [Message.model_validate_json(json.dumps(m)) for m in case["stored"]]
    if stored:
        await storage.save_messages(thread_id="t", resource_id="r", messages=stored)
    incoming = [Message.model_validate_json(json.dumps(m)) for m in case["input"]]
    outcome = await MessageHistory(storage=storage).recall(
        thread_id="t", resource_id="r", incoming=incoming, last_messages=False, echo=True
    )
    return [m.wire() for m, source in outcome.context if source == "input"]


async def test_client_echo_filter_matches_mastra() -> None:
    """MemoryInputFilter and ours keep the same messages with the same parts, case by case."""
    cases = _echo_cases()
    mastra = _mastra("filter", {"cases": cases})
    for index, (case, theirs) in enumerate(zip(cases, mastra["cases"], strict=True)):
        mine = await _our_filter(case)
        got = [(m["id"], _parts_summary(m["content"]["parts"])) for m in mine]
        want = [(m["id"], _parts_summary(m["parts"])) for m in theirs]
        assert got == want, f"case {index}"


def _wire(id: str, role: str, ms: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
    created = f"2025-03-01T09:00:{ms // 1000:02d}.{ms % 1000:03d}Z"
    return {"id": id, "role": role, "createdAt": created, "threadId": "t", "resourceId": "r",
            "content": {"format": 2, "parts": parts}}  # fmt: skip


def _tool(state: str, call: str = "c1", **extra: Any) -> dict[str, Any]:
    invocation = {"state": state, "toolCallId": call, "toolName": "ask", "args": {"q": 1}, **extra}
    return {"type": "tool-invocation", "toolInvocation": invocation}


def _transient(id: str, ms: int) -> dict[str, Any]:
    message = _wire(id, "signal", ms, [{"type": "text", "text": "<system-reminder>ping</system-reminder>"}])
    created = message["createdAt"]
    signal = {"type": "reactive", "tagName": "system-reminder", "transient": True}
    message["content"]["metadata"] = {"signal": {**signal, "createdAt": created, "acceptedAt": created}}
    return message


def _persist_cases() -> list[dict[str, Any]]:
    user = _wire("u1", "user", 1000, [{"type": "text", "text": "Which file?"}])
    pending = _wire("a1", "assistant", 2000, [{"type": "text", "text": "Asking."}, _tool("call")])
    answered = _wire(
        "a1", "assistant", 2000, [{"type": "text", "text": "Asking."}, _tool("result", result="x.txt")]
    )
    return [
        {  # a new user message and an answer: two new rows
            "stored": [user, pending],
            "input": [_wire("u2", "user", 3000, [{"type": "text", "text": "Never mind."}])],
            "response": [_wire("a2", "assistant", 4000, [{"type": "text", "text": "OK."}])],
        },
        {  # a client tool result on the stored assistant message, then the model continues: folded in
            "stored": [user, pending],
            "input": [answered],
            "response": [_wire("a2", "assistant", 4000, [{"type": "text", "text": "Reading x.txt."}])],
        },
        {  # useChat: the whole history with the result, then a new user message
            "stored": [user, pending],
            "input": [user, answered, _wire("u2", "user", 3000, [{"type": "text", "text": "And?"}])],
            "response": [_wire("a2", "assistant", 4000, [{"type": "text", "text": "Done."}])],
        },
        {  # transient signals (Mastra 1.71 agent signals) in the input and the response: never saved
            "stored": [user, pending],
            "input": [
                _wire("u2", "user", 3000, [{"type": "text", "text": "Go on."}]),
                _transient("s1", 3001),
            ],
            "response": [
                _transient("s2", 3500),
                _wire("a2", "assistant", 4000, [{"type": "text", "text": "Ok."}]),
            ],
        },
        {  # a stale echo (the call again) cannot move a stored result back
            "stored": [user, answered],
            "input": [user, pending, _wire("u2", "user", 3000, [{"type": "text", "text": "Again?"}])],
            "response": [_wire("a2", "assistant", 4000, [{"type": "text", "text": "Same file."}])],
        },
    ]


async def _our_persist(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The service's steps: recall (with the echo filter), the worker echoing the context back, persist."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(
        thread_id="t",
        resource_id="r",
        messages=[Message.model_validate_json(json.dumps(m)) for m in case["stored"]],
    )
    history = MessageHistory(storage=storage)
    incoming = [Message.model_validate_json(json.dumps(m)) for m in case["input"]]
    recalled = await history.recall(
        thread_id="t", resource_id="r", incoming=incoming, last_messages=40, echo=True
    )
    echoed = [with_source(m, source) for m, source in recalled.context]
    response = [Message.model_validate_json(json.dumps(m)) for m in case["response"]]
    await history.persist_turn(
        thread_id="t", resource_id="r", input=echoed, response=response, finish_reason="stop"
    )
    rows = await storage.list_messages("t", resource_id=None, limit=None)
    return [m.wire() for m in reversed(rows)]


async def test_persisted_rows_match_mastra() -> None:
    """After one turn, the thread's stored rows (ids, parts and tool states) are Mastra's."""
    cases = _persist_cases()
    mastra = _mastra("persist", {"cases": cases})
    for index, (case, theirs) in enumerate(zip(cases, mastra["cases"], strict=True)):
        mine = await _our_persist(case)
        got = [(m["id"], _parts_summary(m["content"]["parts"])) for m in mine]
        want = [(m["id"], _parts_summary(m["parts"])) for m in theirs]
        assert got == want, f"case {index}"
