"""`schemas.stored_rows`: every row shape a published Mastra writes, read as Mastra 1.71 reads it, and every
row no Mastra would read refused with its reason class (table tests; the real server:
tests/integration/test_unreadable_rows.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from message_history.errors import FatalStorageError, InvalidInputError, UnreadableRowError
from schemas.messages import Message
from schemas.stored_rows import REASONS, read_message

T = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)


def row(**fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": "m1",
        "thread_id": "t1",
        "resourceId": "r1",
        "role": "user",
        "type": "v2",
        "createdAt": T,
        "content": json.dumps({"format": 2, "parts": [{"type": "text", "text": "hi"}]}),
    }
    for key, value in fields.items():
        if value is ...:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


def wire(doc: dict[str, Any]) -> dict[str, Any]:
    return read_message(doc).wire()


def content(doc: dict[str, Any]) -> dict[str, Any]:
    out = wire(doc)["content"]
    assert isinstance(out, dict)
    return out


# --- rows Mastra reads ---------------------------------------------------------------------------------

V1_TOOL_CALL = [
    {"type": "text", "text": "let me look"},
    {"type": "tool-call", "toolCallId": "c1", "toolName": "search", "args": {"q": "x"}},
]
V1_TOOL_RESULT = [{"type": "tool-result", "toolCallId": "c1", "toolName": "search", "result": {"n": 1}}]

READ: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "v2 row as written",
        row(),
        {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]}},
    ),
    ("v2 row, type kept", row(type="text"), {"type": "text"}),
    (
        "v2 content as a sub-document",
        row(content={"format": 2, "parts": [{"type": "text", "text": "sub"}]}),
        {"content": {"format": 2, "parts": [{"type": "text", "text": "sub"}]}},
    ),
    (
        "v1 plain text (not JSON), type dropped",
        row(content="plain", type="text"),
        {
            "type": None,
            "content": {"format": 2, "parts": [{"type": "text", "text": "plain"}], "content": "plain"},
        },
    ),
    (
        "v1 JSON string",
        row(content='"quoted"'),
        {"content": {"format": 2, "parts": [{"type": "text", "text": "quoted"}], "content": "quoted"}},
    ),
    (
        "v1 assistant tool call with text",
        row(role="assistant", type="tool-call", content=json.dumps(V1_TOOL_CALL)),
        {
            "role": "assistant",
            "content": {
                "format": 2,
                "parts": [
                    {"type": "text", "text": "let me look"},
                    {
                        "type": "tool-invocation",
                        "toolInvocation": {
                            "state": "call",
                            "toolCallId": "c1",
                            "toolName": "search",
                            "args": {"q": "x"},
                        },
                    },
                ],
            },
        },
    ),
    (
        "v1 tool row becomes an assistant result, args {} (Mastra adds a page newest first)",
        row(role="tool", type="tool-result", content=json.dumps(V1_TOOL_RESULT)),
        {
            "role": "assistant",
            "type": None,
            "content": {
                "format": 2,
                "parts": [
                    {
                        "type": "tool-invocation",
                        "toolInvocation": {
                            "state": "result",
                            "toolCallId": "c1",
                            "toolName": "search",
                            "result": {"n": 1},
                            "args": {},
                        },
                    }
                ],
                "toolInvocations": [
                    {
                        "state": "result",
                        "toolCallId": "c1",
                        "toolName": "search",
                        "result": {"n": 1},
                        "args": {},
                    }
                ],
            },
        },
    ),
    (
        "v1 result beside its call: the call's args; text after a tool part gets a step-start",
        row(
            role="assistant",
            content=json.dumps(
                [
                    {"type": "tool-call", "toolCallId": "c2", "toolName": "f", "args": {"a": 1}},
                    {"type": "tool-result", "toolCallId": "c2", "toolName": "f", "result": None},
                    {"type": "text", "text": "done", "providerOptions": {"x": {"y": 1}}},
                ]
            ),
        ),
        {
            "content": {
                "format": 2,
                "parts": [
                    {
                        "type": "tool-invocation",
                        "toolInvocation": {
                            "state": "call",
                            "toolCallId": "c2",
                            "toolName": "f",
                            "args": {"a": 1},
                        },
                    },
                    {
                        "type": "tool-invocation",
                        "toolInvocation": {
                            "state": "result",
                            "toolCallId": "c2",
                            "toolName": "f",
                            "result": "",
                            "args": {"a": 1},
                        },
                    },
                    {"type": "step-start"},
                    {"type": "text", "text": "done", "providerMetadata": {"x": {"y": 1}}},
                ],
                "toolInvocations": [
                    {"state": "result", "toolCallId": "c2", "toolName": "f", "result": "", "args": {"a": 1}}
                ],
            },
        },
    ),
    (
        "v1 reasoning, redacted reasoning, image, file; unknown part types and non-objects dropped",
        row(
            role="assistant",
            content=json.dumps(
                [
                    {"type": "reasoning", "text": "think", "signature": "sig"},
                    {"type": "redacted-reasoning", "data": "xx"},
                    {"type": "image", "image": "https://x.org/a.png", "mimeType": "image/png"},
                    {"type": "file", "data": "data:text/plain;base64,aGk=", "mimeType": "application/x"},
                    {"type": "file", "data": "aGk="},
                    {"type": "mystery", "text": "dropped"},
                    7,
                    "s",
                ]
            ),
        ),
        {
            "content": {
                "format": 2,
                "parts": [
                    {
                        "type": "reasoning",
                        "reasoning": "think",
                        "details": [{"type": "text", "text": "think", "signature": "sig"}],
                    },
                    {"type": "reasoning", "reasoning": "", "details": [{"type": "redacted", "data": "xx"}]},
                    {"type": "file", "data": "https://x.org/a.png", "mimeType": "image/png"},
                    {"type": "file", "data": "data:text/plain;base64,aGk=", "mimeType": "text/plain"},
                    {"type": "file", "data": "aGk=", "mimeType": "image/png"},
                ],
            },
        },
    ),
    (
        "v1 empty texts dropped beside others, kept when all are empty",
        row(content=json.dumps([{"type": "text", "text": ""}, {"type": "text", "text": "a"}])),
        {"content": {"format": 2, "parts": [{"type": "text", "text": "a"}]}},
    ),
    (
        "v1 only empty texts",
        row(content=json.dumps([{"type": "text", "text": ""}])),
        {"content": {"format": 2, "parts": [{"type": "text", "text": ""}]}},
    ),
    ("v1 empty array: no parts", row(content="[]"), {"content": {"format": 2, "parts": []}}),
    # Mastra's MessageList drops a memory system row on `add`; the service reads it, then drops it
    # (docs/rules.md#r4)
    ("v1 system row", row(role="system", content="be brief"), {"role": "system"}),
    (
        "legacy ISO string createdAt",
        row(createdAt="2025-01-01T11:00:00.000Z"),
        {"createdAt": "2025-01-01T11:00:00.000Z"},
    ),
    ("extra fields kept", row(_mh_extra=json.dumps({"custom": [1, 2]})), {"custom": [1, 2]}),
    ("extra unknown row fields ignored", row(foo="bar", _id="x"), {"id": "m1"}),
    ("_mh_extra not JSON: ignored, as Mastra never reads it", row(_mh_extra="{"), {"id": "m1"}),
    ("_mh_extra not an object: ignored", row(_mh_extra="[1]"), {"id": "m1"}),
    (
        "format-2 parts that are not objects are dropped, as Mastra hydrates them",
        row(content='{"format":2,"parts":[5,{"type":"text","text":"a"},null]}'),
        {"content": {"format": 2, "parts": [{"type": "text", "text": "a"}]}},
    ),
]


@pytest.mark.parametrize(("doc", "expected"), [(d, e) for _, d, e in READ], ids=[n for n, _, _ in READ])
def test_rows_mastra_reads(doc: dict[str, Any], expected: dict[str, Any]) -> None:
    out = wire(doc)
    assert {key: out.get(key) for key in expected} == expected


def test_v1_tool_row_without_the_conversion_was_refused() -> None:
    """Without the conversion, a v1 tool row does not validate as a message: the old path raised
    FatalStorageError for it, which stopped the service (issue 31)."""
    doc = row(role="tool", content=json.dumps(V1_TOOL_RESULT))
    with pytest.raises(ValidationError):
        Message.model_validate({"id": "m1", "role": "tool", "createdAt": T, "content": V1_TOOL_RESULT})
    assert read_message(doc).role == "assistant"


# --- rows no Mastra reads -------------------------------------------------------------------------------

DEEP = "[" * 5000 + "]" * 5000

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("role missing", row(role=...), "role"),
    ("role unknown", row(role="bot"), "role"),
    ("role unknown, v1", row(role="bot", content="hi"), "role"),
    ("role tool on a v2 row", row(role="tool"), "role"),
    ("content a JSON number", row(content="5"), "content"),
    ("content a BSON number", row(content=5), "content"),
    ("content null", row(content=None), "content"),
    ("content missing", row(content=...), "content"),
    ("content true", row(content="true"), "content"),
    ("content an object without format 2", row(content='{"parts": []}'), "content"),
    ("parts not a list", row(content='{"format":2,"parts":"x"}'), "content"),
    ("parts missing", row(content='{"format":2}'), "content"),
    ("a v1 part null", row(content="[null]"), "content"),
    (
        "a v1 tool call without args",
        row(content='[{"type":"tool-call","toolCallId":"c"},{"type":"tool-result","toolCallId":"c"}]'),
        "content",
    ),
    ("lone surrogate", row(content='{"format":2,"parts":[{"type":"text","text":"\\ud800"}]}'), "text"),
    ("lone surrogate, v1", row(content='["\\udfff"]'), "text"),
    ("id an int", row(id=7), "id"),
    ("id missing", row(id=...), "id"),
    ("id null", row(id=None), "id"),
    ("type 5", row(type=5), "type"),
    ("createdAt yesterday", row(createdAt="yesterday"), "createdAt"),
    ("createdAt null", row(createdAt=None), "createdAt"),
    ("createdAt missing", row(createdAt=...), "createdAt"),
    ("createdAt year 20000 as text", row(createdAt="20000-01-01T00:00:00Z"), "createdAt"),
    ("createdAt a number", row(createdAt=1735729200000), "createdAt"),
    ("content nested past the JSON parser's limit", row(content=DEEP), "nesting"),
]


@pytest.mark.parametrize(("doc", "reason"), [(d, r) for _, d, r in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_rows_no_mastra_reads_are_refused_with_their_reason(doc: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnreadableRowError) as caught:
        read_message(doc)
    error = caught.value
    assert error.reason == reason
    assert error.reason in REASONS
    # a dead letter, never systemic: it names the collection, the row and the thread
    assert isinstance(error, InvalidInputError)
    assert not isinstance(error, FatalStorageError)
    assert not error.retriable
    assert "mastra_messages" in str(error)
    assert repr(doc.get("id")) in str(error)
    assert "'t1'" in str(error)
