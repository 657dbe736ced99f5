"""The client-echo filter (`message_history.core.echo`) and the tool-state merge (`core.tool_state`)."""

from __future__ import annotations

from typing import Any

import pytest

from message_history.core.echo import filter_echo, plan_echo
from message_history.core.tool_state import (
    advances,
    client_outcomes,
    continue_assistant,
    is_client_update,
    merge_into_stored,
    merge_response,
)
from schemas.messages import Message
from tests.rule_cases import CONTINUE_CASES, THREAD, ContinueCase, msg, summarize, tool

# --- ranks ------


@pytest.mark.parametrize(
    ("stored", "incoming", "expected"),
    [
        ("partial-call", "call", True),
        ("call", "approval-requested", True),
        ("approval-requested", "approval-responded", True),
        ("approval-responded", "result", True),
        ("call", "output-error", True),
        ("call", "output-denied", True),
        ("call", "call", False),
        ("result", "call", False),  # never backwards
        ("result", "output-error", False),  # terminal states never move
        ("output-denied", "result", False),
        ("approval-responded", "approval-requested", False),
    ],
)
def test_advances(stored: str, incoming: str, expected: bool) -> None:
    """partial-call < call < approval-requested < approval-responded < result/output-error/output-denied."""
    assert advances(stored, incoming) is expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("approval-responded", True),
        ("result", True),
        ("output-error", True),
        ("output-denied", True),
        ("call", False),
        ("approval-requested", False),
        ("partial-call", False),
    ],
)
def test_is_client_update(state: str, expected: bool) -> None:
    """What a client may contribute: an approval answer or an outcome."""
    assert is_client_update(state) is expected


# --- merges ------


def _assistant(id: str, *parts: dict[str, Any], t: int = 1, text: str | None = None) -> Message:
    all_parts = ([{"type": "text", "text": text}] if text is not None else []) + list(parts)
    return msg(id, "assistant", t=t, parts=all_parts)


def test_merge_into_stored_takes_only_advancing_outcomes() -> None:
    """The stored copy wins (text, args); the echo's result for a pending call is folded in."""
    stored = _assistant("a", tool("f", "call", "c1"), tool("g", "result", "c2"), text="stored text")
    echo = _assistant("a", tool("f", "result", "c1"), tool("g", "call", "c2"), text="edited by the client")
    merged = merge_into_stored(stored, echo)
    assert merged is not None
    assert summarize(merged) == ["text:stored text", "tool:result:f", "tool:result:g"]
    assert merged.createdAt == stored.createdAt
    assert merge_into_stored(stored, _assistant("a", tool("g", "call", "c2"))) is None  # nothing advances


def test_client_outcomes_skip_provider_executed_results() -> None:
    """A provider-executed call takes only an approval answer from a client."""
    provider_call = tool("web", "approval-requested", "c1") | {"providerExecuted": True}
    stored = _assistant("a", provider_call)
    assert client_outcomes(stored, _assistant("a", tool("web", "result", "c1"))) == []
    [answer] = client_outcomes(stored, _assistant("a", tool("web", "approval-responded", "c1")))
    assert answer.toolInvocation.state == "approval-responded"


def test_merge_response_result_replaces_call_never_the_reverse() -> None:
    """A response under a stored id: a result replaces a call, a call never overwrites a result."""
    stored = _assistant("a", tool("f", "call", "c1"), tool("g", "result", "c2"))
    response = _assistant("a", tool("f", "result", "c1"), tool("g", "call", "c2"), text="done", t=9)
    merged = merge_response(stored, response)
    # the text leads the response, so Mastra places it first, in a step of its own (the table below)
    assert summarize(merged) == ["step-start", "text:done", "tool:result:f", "tool:result:g"]
    assert merged.createdAt == stored.createdAt


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CONTINUE_CASES])
def test_a_response_merged_into_the_latest_assistant_has_mastras_parts(case: ContinueCase) -> None:
    """A response folded into the latest assistant message (new id or its own): Mastra 1.71's parts, the
    stored id and createdAt."""
    latest = _assistant("a", *case.latest)
    if case.same_id:
        merged = merge_response(latest, _assistant("a", *case.response, t=5))
    else:
        merged = continue_assistant(latest, _assistant("b", *case.response, t=5))
    assert merged.id == "a"
    assert merged.createdAt == latest.createdAt
    assert [p.model_dump(mode="json", exclude_unset=True) for p in merged.content.parts] == case.merged


# --- the client-echo filter ------


def _user(id: str, t: int) -> Message:
    return msg(id, t=t, text=f"user {id}")


@pytest.mark.parametrize(
    ("input_ids", "kept"),
    [
        pytest.param(["u1"], ["u1"], id="one-user-message-unchanged"),
        pytest.param(["u1", "a1", "u2"], ["u2"], id="keep-after-last-assistant"),
        pytest.param(["u1", "a1", "u2", "u3"], ["u2", "u3"], id="user-tail"),
    ],
)
def test_filter_user_tail(input_ids: list[str], kept: list[str]) -> None:
    """Input ending with a user message keeps what follows the last assistant message."""
    messages = [
        _assistant(i, t=n, text="hi") if i.startswith("a") else _user(i, n) for n, i in enumerate(input_ids)
    ]
    plan = plan_echo(messages)
    out = filter_echo(messages, plan, thread_empty=False, stored={}, thread_id=THREAD)
    assert [m.id for m in out] == kept


def test_filter_seeds_an_empty_thread_with_the_whole_input_without_provider_metadata() -> None:
    """An empty thread takes everything, minus provider metadata on the assistant's non-update parts."""
    assistant = msg(
        "a1",
        "assistant",
        t=1,
        parts=[
            {"type": "text", "text": "hi", "providerMetadata": {"x": 1}},
            tool("f", "result", "c1") | {"providerMetadata": {"y": 2}},
        ],
    )
    messages = [_user("u1", 0), assistant, _user("u2", 2)]
    out = filter_echo(messages, plan_echo(messages), thread_empty=True, stored={}, thread_id=THREAD)
    assert [m.id for m in out] == ["u1", "a1", "u2"]
    text, result = out[1].content.parts
    assert "providerMetadata" not in (text.model_extra or {})
    assert (result.model_extra or {}).get("providerMetadata") == {"y": 2}  # a client update keeps it


def test_filter_takes_advancing_tool_results_from_the_assistant_before_the_user_tail() -> None:
    """useChat sends a client tool result on the assistant message before the next user message."""
    stored = _assistant("a1", tool("ask", "call", "c1"), tool("done", "result", "c2"), text="asking")
    echoed = _assistant("a1", tool("ask", "result", "c1"), tool("done", "result", "c2"), text="asking")
    messages = [_user("u1", 0), echoed, _user("u2", 2)]
    plan = plan_echo(messages)
    assert plan.needs == ("a1",)
    out = filter_echo(messages, plan, thread_empty=False, stored={"a1": stored}, thread_id=THREAD)
    assert [m.id for m in out] == ["a1", "u2"]
    assert summarize(out[0]) == ["tool:result:ask"]  # only the call the stored copy still had pending
    not_ours = stored.model_copy(update={"threadId": "other"})
    out = filter_echo(messages, plan, thread_empty=False, stored={"a1": not_ours}, thread_id=THREAD)
    assert [m.id for m in out] == ["u2"]


@pytest.mark.parametrize(
    ("parts", "stored", "kept"),
    [
        pytest.param([tool("f", "result", "c1")], False, ["tool:result:f"], id="trailing-update-kept"),
        pytest.param(
            [{"type": "text", "text": "x"}, tool("f", "result", "c1"), {"type": "data-x", "data": 1}],
            False,
            ["tool:result:f"],
            id="data-parts-skipped",
        ),
        pytest.param([{"type": "text", "text": "x"}], True, [], id="no-update-and-stored-is-empty"),
        pytest.param(
            [{"type": "text", "text": "x"}], False, ["text:x"], id="no-update-not-stored-kept-whole"
        ),
    ],
)
def test_filter_assistant_tail(parts: list[dict[str, Any]], stored: bool, kept: list[str]) -> None:
    """Input ending with an assistant message keeps only its trailing client tool updates."""
    last = msg("a1", "assistant", t=1, parts=parts)
    messages = [_user("u1", 0), last]
    plan = plan_echo(messages)
    out = filter_echo(
        messages, plan, thread_empty=False, stored={"a1": last} if stored else {}, thread_id=THREAD
    )
    if kept and kept[0].startswith("text"):
        assert [m.id for m in out] == ["u1", "a1"]
    else:
        assert [summarize(m) for m in out] == ([kept] if kept else [])
