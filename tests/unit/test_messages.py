"""`schemas.messages`: Mastra's MastraDBMessage, every part type, unknown fields kept, JS-style timestamps."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.messages import (
    DataPart,
    ErrorPart,
    FilePart,
    Message,
    MessageContent,
    ReasoningPart,
    SourceDocumentPart,
    SourcePart,
    StepStartPart,
    TextPart,
    ToolInvocationPart,
    UnknownPart,
    format_timestamp,
)


def _message(*parts: Any, **extra: Any) -> dict[str, Any]:
    return {
        "id": "m1",
        "role": "assistant",
        "createdAt": "2025-01-01T11:00:01.000Z",
        "threadId": "t1",
        "resourceId": "r1",
        "content": {"format": 2, "parts": list(parts)},
        **extra,
    }


def _tool(state: str, **extra: Any) -> dict[str, Any]:
    invocation = {"state": state, "toolCallId": "call-1", "toolName": "calculator", "args": {"a": 1}, **extra}
    return {"type": "tool-invocation", "toolInvocation": invocation}


PARTS = [
    pytest.param({"type": "text", "text": "hello"}, TextPart, id="text"),
    pytest.param(
        {
            "type": "reasoning",
            "reasoning": "because",
            "details": [
                {"type": "text", "text": "because", "signature": "s"},
                {"type": "redacted", "data": "x"},
            ],
        },
        ReasoningPart,
        id="reasoning",
    ),
    pytest.param(_tool("partial-call"), ToolInvocationPart, id="tool-partial-call"),
    pytest.param(_tool("call"), ToolInvocationPart, id="tool-call"),
    pytest.param(_tool("result", result={"sum": 3}, step=0), ToolInvocationPart, id="tool-result"),
    pytest.param(_tool("result", result=None), ToolInvocationPart, id="tool-result-null"),
    pytest.param(
        _tool("output-error", isError=True, errorText="boom", rawInput={"a": "1"}),
        ToolInvocationPart,
        id="tool-output-error-1.71",
    ),
    pytest.param(
        _tool("approval-requested", approval={"id": "ap-1"}) | {"providerExecuted": True, "title": "Calc"},
        ToolInvocationPart,
        id="tool-approval-requested-1.71",
    ),
    pytest.param(
        {"type": "source", "source": {"sourceType": "url", "id": "s1", "url": "https://x", "title": "X"}},
        SourcePart,
        id="source",
    ),
    pytest.param(
        {"type": "source-document", "sourceId": "d1", "mediaType": "application/pdf", "title": "Doc"},
        SourceDocumentPart,
        id="source-document",
    ),
    pytest.param({"type": "file", "mimeType": "image/png", "data": "iVBORw0KGgo="}, FilePart, id="file"),
    pytest.param({"type": "step-start"}, StepStartPart, id="step-start"),
    pytest.param({"type": "step-start", "model": "gpt-x"}, StepStartPart, id="step-start-model-1.71"),
    pytest.param(
        {"type": "error", "error": {"name": "RateLimit", "message": "slow down"}},
        ErrorPart,
        id="error",
    ),
    pytest.param({"type": "data-progress", "id": "d1", "data": {"pct": 50}}, DataPart, id="data-star"),
    pytest.param({"type": "dynamic-tool", "toolName": "x", "input": [1]}, UnknownPart, id="unknown-kind"),
]


@pytest.mark.parametrize(("part", "model"), PARTS)
def test_every_part_type_validates_and_round_trips(part: dict[str, Any], model: type[Any]) -> None:
    """Each part kind is parsed into its own model and comes back out with the same keys and values."""
    raw = _message(part, {"type": "text", "text": "after"})
    message = Message.model_validate_json(json.dumps(raw))
    assert type(message.content.parts[0]) is model
    assert message.wire() == raw


UNKNOWN_EVERYWHERE = _message(
    {
        "type": "text",
        "text": "hi",
        "providerMetadata": {"openai": {"itemId": "i1"}},
        "createdAt": 1735729201000,
    },
    {
        "type": "tool-invocation",
        "toolInvocation": {
            "state": "result",
            "toolCallId": "c1",
            "toolName": "t",
            "args": {},
            "result": [1, "two", None, {"deep": [True, 1.5]}],
            "futureField": {"x": 1},
        },
        "futurePartField": "kept",
    },
    {"type": "reasoning", "reasoning": "r", "details": [{"type": "text", "text": "r", "future": 1}]},
    {"type": "source", "source": {"sourceType": "url", "id": "s", "url": "u", "providerMetadata": {"a": {}}}},
    {"type": "error", "error": {"name": "E", "message": "m", "stack": "trace"}},
    futureTopLevel={"nested": ["a", {"b": None}]},
    type="v2",
)
UNKNOWN_EVERYWHERE["content"] |= {
    "content": "hi",
    "toolInvocations": [{"state": "result", "toolCallId": "c1", "toolName": "t", "args": {}, "result": 1}],
    "reasoning": "r",
    "annotations": [{"any": "thing"}],
    "experimental_attachments": [{"name": "a.png", "contentType": "image/png", "url": "https://x/a.png"}],
    "metadata": {"mastra": {"sealed": True}, "logicalMessageId": "L1"},
    "providerMetadata": {"anthropic": {"cacheControl": {"type": "ephemeral"}}},
    "futureContentField": 42,
}


def test_unknown_fields_at_every_level_survive_a_round_trip() -> None:
    """Keys the models never name (message, content, part, toolInvocation, details, source, error) stay."""
    message = Message.model_validate_json(json.dumps(UNKNOWN_EVERYWHERE))
    assert message.wire() == UNKNOWN_EVERYWHERE
    assert json.loads(message.model_dump_json(exclude_unset=True)) == UNKNOWN_EVERYWHERE


def test_absent_optional_fields_stay_absent() -> None:
    """A minimal message comes back without null placeholders for the fields it did not have."""
    raw = {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "x"}]}}
    assert Message.model_validate(raw).wire() == raw


def test_legacy_plain_string_content_is_wrapped_as_format_2() -> None:
    """A v1 row's plain-text content becomes `{format: 2, content, parts: [text]}`, as Mastra wraps it."""
    message = Message.model_validate({"role": "user", "content": "plain"})
    assert message.wire()["content"] == {
        "format": 2,
        "content": "plain",
        "parts": [{"type": "text", "text": "plain"}],
    }


def test_content_built_in_python_still_writes_format() -> None:
    """`format: 2` is on the wire even when the content was built in Python without naming it."""
    message = Message(role="user", content=MessageContent(parts=[TextPart(type="text", text="x")]))
    assert message.wire()["content"] == {"format": 2, "parts": [{"type": "text", "text": "x"}]}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("2025-01-01T11:00:00Z", "2025-01-01T11:00:00.000Z", id="no-fraction"),
        pytest.param("2025-01-01T11:00:00.5Z", "2025-01-01T11:00:00.500Z", id="one-digit"),
        pytest.param("2025-01-01T11:00:00.123456Z", "2025-01-01T11:00:00.123Z", id="microseconds-truncated"),
        pytest.param("2025-01-01T11:00:00.999999Z", "2025-01-01T11:00:00.999Z", id="never-rounds-up"),
        pytest.param("2025-01-01T13:00:00.000+02:00", "2025-01-01T11:00:00.000Z", id="offset-to-utc"),
        pytest.param("2025-01-01T11:00:00.000", "2025-01-01T11:00:00.000Z", id="naive-is-utc"),
        pytest.param(1735729200000, "2025-01-01T11:00:00.000Z", id="epoch-ms-number"),
    ],
)
def test_created_at_is_utc_milliseconds_like_javascript(value: Any, expected: str) -> None:
    """`createdAt` is written as `Date.toISOString()` writes it: UTC, exactly three fraction digits, `Z`."""
    message = Message.model_validate({"role": "user", "createdAt": value, "content": "x"})
    assert message.wire()["createdAt"] == expected
    assert message.createdAt is not None
    assert message.createdAt.tzinfo is not None
    assert message.createdAt.microsecond % 1000 == 0


def test_format_timestamp_accepts_aware_and_naive_datetimes() -> None:
    """`format_timestamp` converts any offset to UTC and treats naive values as UTC."""
    aware = datetime(2025, 1, 1, 13, 0, 0, 7000, tzinfo=timezone(timedelta(hours=2)))
    assert format_timestamp(aware) == "2025-01-01T11:00:00.007Z"
    assert format_timestamp(datetime(2025, 1, 1, 11, 0)) == "2025-01-01T11:00:00.000Z"
    assert format_timestamp(datetime(2025, 1, 1, 11, 0, tzinfo=UTC)) == "2025-01-01T11:00:00.000Z"


BAD_MESSAGES = [
    pytest.param({"role": "tool", "content": "x"}, ("role",), id="tool-role"),
    pytest.param({"content": "x"}, ("role",), id="missing-role"),
    pytest.param({"role": "user"}, ("content",), id="missing-content"),
    pytest.param({"role": "user", "content": {"format": 2}}, ("content", "parts"), id="missing-parts"),
    pytest.param(
        {"role": "user", "content": {"format": 3, "parts": []}}, ("content", "format"), id="format-3"
    ),
    pytest.param({"role": "user", "content": 5}, ("content",), id="content-number"),
    pytest.param({"role": "user", "id": 5, "content": "x"}, ("id",), id="numeric-id"),
    pytest.param({"role": "user", "createdAt": "yesterday", "content": "x"}, ("createdAt",), id="bad-date"),
    pytest.param(_message({"text": "no type"}), ("content", "parts", 0), id="part-without-type"),
    pytest.param(_message("just a string"), ("content", "parts", 0), id="part-not-object"),
    pytest.param(_message({"type": "text"}), ("content", "parts", 0, "text", "text"), id="text-without-text"),
    pytest.param(
        _message({"type": "file", "data": "x"}), ("content", "parts", 0, "file", "mimeType"), id="file"
    ),
    pytest.param(
        _message(_tool("finished")),
        ("content", "parts", 0, "tool-invocation", "toolInvocation", "state"),
        id="unknown-tool-state",
    ),
    pytest.param(
        _message({"type": "tool-invocation", "toolInvocation": {"state": "call", "toolName": "t"}}),
        ("content", "parts", 0, "tool-invocation", "toolInvocation", "toolCallId"),
        id="tool-without-call-id",
    ),
    pytest.param(
        _message({"type": "source", "source": {"id": "s"}}),
        ("content", "parts", 0, "source", "source", "sourceType"),
        id="source-without-type",
    ),
    pytest.param(
        _message({"type": "data-"}), ("content", "parts", 0, "data", "type"), id="data-without-name"
    ),
    pytest.param(
        _message({"type": "error", "error": {}}),
        ("content", "parts", 0, "error", "error", "message"),
        id="err",
    ),
    pytest.param(
        _message({"type": "reasoning", "reasoning": 5}),
        ("content", "parts", 0, "reasoning", "reasoning"),
        id="reasoning-not-string",
    ),
    pytest.param(
        _message({"type": "source-document", "sourceId": "d", "mediaType": "text/plain"}),
        ("content", "parts", 0, "source-document", "title"),
        id="source-document-without-title",
    ),
]


@pytest.mark.parametrize(("raw", "loc"), BAD_MESSAGES)
def test_malformed_messages_are_refused_at_the_offending_field(
    raw: dict[str, Any], loc: tuple[Any, ...]
) -> None:
    """A malformed message raises a ValidationError whose first location is the offending field."""
    with pytest.raises(ValidationError) as caught:
        Message.model_validate_json(json.dumps(raw))
    assert caught.value.errors()[0]["loc"] == loc


def test_parsing_does_not_mutate_or_share_the_input() -> None:
    """Validating from a dict leaves that dict as it was (the wire form is rebuilt, not aliased)."""
    raw = copy.deepcopy(UNKNOWN_EVERYWHERE)
    wire = Message.model_validate(raw).wire()
    wire["content"]["parts"][0]["text"] = "changed"
    assert raw == UNKNOWN_EVERYWHERE
