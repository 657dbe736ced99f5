"""Resource scope's `<other-conversation>` lines: each part as Mastra's `formatMessagesForObserver` writes it.

Byte-for-byte equality with Mastra itself is `tests/interop/test_mastra_om_interop.py`; here: the rules as a
table (JavaScript number, key-order and string forms; tool exchanges; attachments), rows written by hand
(wrong types, BSON values) and the bounds on work, with hypothesis for open-ended input.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from message_history.core import observer_parts
from message_history.core.observation_others import format_messages_for_observer, other_conversations
from message_history.core.observer_parts import format_tool_arguments, format_tool_result
from message_history.core.tokens import estimate_token_count
from tests.zones import local_zone

_AT = "2025-03-01T09:05:00.000Z"


def _message(*parts: Any, role: str = "assistant", ident: str = "m1", **content: Any) -> dict[str, Any]:
    return {
        "id": ident,
        "role": role,
        "createdAt": _AT,
        "content": {"format": 2, "parts": list(parts), **content},
    }


def _tool(state: str, call: Any = "c1", name: Any = "weather", **fields: Any) -> dict[str, Any]:
    invocation = {"state": state, "toolCallId": call, "toolName": name, **fields}
    return {"type": "tool-invocation", "toolInvocation": invocation}


def _body(*parts: Any) -> str:
    """The lines after the date header and the first line's time label."""
    text = format_messages_for_observer([_message(*parts)])
    return text.removeprefix("Mar 1 2025:\n").replace(" (9:05 AM)", "", 1)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"city": "Paris", "days": 3}, 'city: "Paris"\ndays: 3'),
        (1.0, "1"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (2**70, "1.1805916207174113e+21"),
        (-0.0, "-0"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (None, "null"),
        (True, "true"),
        ("é 🍵", '"é 🍵"'),
        ('a"b\\c\n\x01', '"a\\"b\\\\c\\n\\u0001"'),
        ({}, "arguments: [empty object]"),
        ([], "arguments: [empty array]"),
        # integer-like keys first, ascending, as JavaScript orders an object's keys; a key not a string
        ({"b": 1, "2": 2, "a": 3, "1": 4, 10: 5}, '["1"]: 4\n["2"]: 2\n["10"]: 5\nb: 1\na: 3'),
        ({"01": 1, "with space": 2, "$ok": 3}, '["01"]: 1\n["with space"]: 2\n$ok: 3'),
        ({"k" * 200: 1}, f"{'k' * 50}…[90 chars; 98e2a5bd]…{'k' * 60}: 1"),
        ({"a": {"b": [1]}}, "a: <object>\na.b: <array, 1 item>\na.b[0]: 1"),
        # BSON values: as the JSON a row of Mastra's holds
        (datetime(2025, 3, 1, 9, 5, tzinfo=UTC), '"2025-03-01T09:05:00.000Z"'),
        (b"\x00\x01", '"AAE="'),
        (bson.ObjectId("6b15c595ca2918a90454614f"), '"6b15c595ca2918a90454614f"'),
    ],
)
def test_tool_arguments(args: Any, expected: str) -> None:
    assert format_tool_arguments(args, 500) == expected


def test_tool_arguments_depth_width_and_long_strings() -> None:
    deep: Any = 7
    for _ in range(8):
        deep = [deep]
    assert format_tool_arguments(deep, 500).endswith(
        "[0][0][0][0][0][0]: <array, 1 item> [max depth reached]"
    )
    wide = format_tool_arguments({f"k{i}": i for i in range(30)}, 500)
    assert wide.splitlines()[0] == "fields: ... [additional entries omitted]"
    assert len(wide.splitlines()) == 21
    text = format_tool_arguments({"q": "x" * 2000}, 500)
    assert text.startswith("q: <string, 2000 characters; preview size-limited>\nLarge string previews")
    assert text.endswith(" characters omitted]")
    assert len(text) <= 500


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            {"a": 1.0, "b": [1, 2], "c": {}, "d": []},
            '{\n  "a": 1,\n  "b": [\n    1,\n    2\n  ],\n  "c": {},\n  "d": []\n}',
        ),
        ({"2": "b", "x": math.nan, "1": None}, '{\n  "1": null,\n  "2": "b",\n  "x": null\n}'),
        ("plain text", "plain text"),
        (
            {"encryptedContent": "e" * 300},
            '{\n  "encryptedContent": "[stripped encryptedContent: 300 characters]"\n}',
        ),
        ({"encryptedContent": "e" * 3}, '{\n  "encryptedContent": "eee"\n}'),
        (datetime(2025, 3, 1, 9, 5, tzinfo=UTC), "2025-03-01T09:05:00.000Z"),
    ],
)
def test_tool_results(result: Any, expected: str) -> None:
    assert format_tool_result(result) == expected


def test_a_long_result_is_cut_at_5000_tokens() -> None:
    text = format_tool_result("word " * 10_000)
    head, note = text.rsplit("\n", 1)
    # a word is a token, spaces none, the note 8: 4 992 words kept, 5 008 cut (whole words only)
    assert note == "... [truncated ~5008 tokens]"
    assert head == "word " * 4992


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        # a call and its result: the call line at the first part, the outcome at the terminal one
        (
            [_tool("call", args={"city": "Paris"}), _tool("result", result={"t": 21.5})],
            'Tool Call weather: city: "Paris"\nTool Result weather: {\n  "t": 21.5\n}',
        ),
        # the terminal part's arguments win
        (
            [_tool("result", args={"q": 1}, result="")],
            "Tool Call weather: q: 1\nTool Result weather: [empty result]",
        ),
        ([_tool("call")], "Tool Call weather: [arguments unavailable]"),
        (
            [_tool("output-error", errorText=" ")],
            "Tool Call weather: [arguments unavailable]\nTool Error weather: Tool execution failed",
        ),
        (
            [_tool("result", isError=True, errorText="boom")],
            "Tool Call weather: [arguments unavailable]\nTool Error weather: boom",
        ),
        (
            [_tool("output-denied", approval={"reason": "no"})],
            "Tool Call weather: [arguments unavailable]\nTool Denied weather: no",
        ),
        # a state neither call nor outcome, alone: a call line of its own
        ([_tool("input-streaming", args=[1])], "Tool Call weather: [0]: 1"),
        (
            [_tool("call", name=None, args=1), _tool("call", call=2, name=1.0)],
            "Tool Call null: 1\nTool Call 1: [arguments unavailable]",
        ),
        # modelOutput in place of the result; attachment blocks as placeholders
        (
            [{**_tool("result", result="raw"), "providerMetadata": {"mastra": {"modelOutput": "model"}}}],
            "Tool Call weather: [arguments unavailable]\nTool Result weather: model",
        ),
        (
            [
                _tool(
                    "result",
                    result={"type": "content", "value": [{"type": "image-url", "url": "https://h/a/c.png"}]},
                )
            ],
            "Tool Call weather: [arguments unavailable]\nTool Result weather: {\n"
            '  "type": "content",\n  "value": [\n    {\n      "type": "image-url",\n'
            '      "placeholder": "[Image #1: c.png]"\n    }\n  ]\n}',
        ),
        # attachments: numbered per kind, labelled by file name, else the URL's last segment, else the type
        (
            [
                {"type": "image", "image": "data:image/png;base64,AA"},
                {"type": "file", "data": "https://h/x/report%20v2.pdf?a=1", "mimeType": "application/pdf"},
                {"type": "file", "data": "https://h/pic.JPG"},
                {"type": "file", "data": "AAAA", "mimeType": "text/plain", "filename": " notes.txt "},
                {"type": "image", "image": "https://h/%zz", "mimeType": "image/png"},
            ],
            "Image: [Image #1]\nFile: [File #1: report v2.pdf]\nFile: [Image #2: pic.JPG]\n"
            "File: [File #2: notes.txt]\nImage: [Image #3: image/png]",
        ),
    ],
)
def test_parts(parts: list[Any], expected: str) -> None:
    assert _body(*parts) == expected


def test_one_call_across_messages_is_written_once() -> None:
    first = _message(_tool("call", args={"q": "tea"}), ident="m1")
    second = _message(_tool("result", result="found"), ident="m2")
    text = format_messages_for_observer([first, second])
    assert text == 'Mar 1 2025:\nTool Call weather (9:05 AM): q: "tea"\nTool Result weather: found'


def test_a_temporal_gap_marker_is_its_text() -> None:
    marker = _message(
        ident="__temporal_1", metadata={"reminderType": "temporal-gap", "gapText": "3 hours later"}
    )
    assert format_messages_for_observer([marker]) == "Mar 1 2025:\n(9:05 AM): 3 hours later"


_HOSTILE_PARTS: list[Any] = [
    None,
    "text",
    {"type": "text", "text": 5},
    {"type": "text"},
    {"type": "reasoning", "reasoning": ["x"]},
    {"type": "tool-invocation", "toolInvocation": "call"},
    {"type": "tool-invocation"},
    {"type": "file", "data": "x", "filename": 5},
    {"type": "image", "image": 5, "mimeType": 7},
    _tool("call", call={"a": 1}, name=["a", ["b"]], args={1: b"x", 2.5: datetime(2025, 1, 1)}),
    _tool(
        "result",
        call=None,
        result={"d": bson.Decimal128("1.5"), "o": bson.ObjectId("6b15c595ca2918a90454614f")},
    ),
    _tool("output-error", call=math.nan, errorText=5, approval="x"),
]


def test_rows_written_by_hand_never_raise_and_leave_out_only_what_mastra_cannot_render() -> None:
    text = _body({"type": "text", "text": "before"}, *_HOSTILE_PARTS, {"type": "text", "text": "after"})
    lines = text.splitlines()
    assert lines[0] == "Assistant: before"
    assert lines[-1] == "Assistant: after"
    assert "Image: [Image #1: 7]" in lines  # a number where a type is: as String() writes it
    assert 'Tool Call a,b: ["1"]: "eA=="' in lines
    assert '  "d": "1.5",' in lines
    assert "Tool Error output-error" not in text
    assert "Tool Call undefined: [arguments unavailable]" in lines  # a string `toolInvocation`, as in Mastra
    assert not any(line.rsplit(": ", 1)[-1] == "5" for line in lines)  # the numeric text is left out


def test_other_conversations_blocks() -> None:
    blocks = other_conversations(
        {"t2": [_message(_tool("call", args=1))], "t3": [_message({"type": "step-start"})]}
    )
    assert (
        blocks
        == '<other-conversation id="t2">\nMar 1 2025:\nTool Call weather (9:05 AM): 1\n</other-conversation>'
    )


# --- the process's zone ------------------------------------------------------------------------------------


def _at(*moments: str) -> str:
    texts = [{"type": "text", "text": f"n{i}"} for i in range(len(moments))]
    messages = [
        {"id": f"m{i}", "role": "user", "createdAt": at, "content": {"format": 2, "parts": [texts[i]]}}
        for i, at in enumerate(moments)
    ]
    return format_messages_for_observer(messages)


@pytest.mark.parametrize(
    ("zone", "moments", "expected"),
    [
        ("UTC", ["2025-03-01T03:30:00Z"], "Mar 1 2025:\nUser (3:30 AM): n0"),
        # the evening before in New York: the date header is the local day's
        ("America/New_York", ["2025-03-01T03:30:00Z"], "Feb 28 2025:\nUser (10:30 PM): n0"),
        ("Asia/Kolkata", ["2025-03-01T20:00:00Z"], "Mar 2 2025:\nUser (1:30 AM): n0"),
        # each instant at its own offset: 1:30 EST, then 3:30 EDT an hour later (summer time begins)
        (
            "America/New_York",
            ["2025-03-09T06:30:00Z", "2025-03-09T07:30:00Z"],
            "Mar 9 2025:\nUser (1:30 AM): n0\nUser (3:30 AM): n1",
        ),
        # a local time before Python's year 1: written in UTC
        ("America/New_York", ["0001-01-01T01:00:00Z"], "Jan 1 1:\nUser (1:00 AM): n0"),
    ],
    ids=["utc", "new-york-day-before", "kolkata-half-hour", "summer-time", "out-of-range"],
)
def test_dates_and_times_are_in_the_process_zone(zone: str, moments: list[str], expected: str) -> None:
    """As Mastra's `formatObserverDate` / `formatObserverTime` (`toLocaleDateString`, `getDate`, ...) in a
    process with `TZ` set; the suite's own zone (UTC) is back after."""
    with local_zone(zone):
        assert _at(*moments) == expected
    assert _at("2025-03-01T03:30:00Z") == "Mar 1 2025:\nUser (3:30 AM): n0"  # UTC again


# --- bounds ------------------------------------------------------------------------------------------------


def _seconds(render: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        render()
        best = min(best, time.perf_counter() - start)
    return best


def test_huge_deep_and_wide_inputs_are_bounded() -> None:
    """MB-sized arguments and results, thousands of levels, a wide object: each part in well under seconds."""
    deep: Any = "bottom"
    for _ in range(50_000):
        deep = {"a": deep}
    parts = [
        _tool("call", call="1", args={"q": "x" * 3_000_000}),
        _tool("call", call="2", args=deep),
        _tool("call", call="3", args={f"k{i}": i for i in range(200_000)}),
        _tool("result", call="4", result="word " * 600_000),
        _tool("result", call="5", result={"a": ["é " * 500_000]}),
    ]
    start = time.perf_counter()
    text = _body(*parts)
    assert time.perf_counter() - start < 10
    assert len(text) < 5000
    assert text.count("Tool Result") == 2


def test_a_result_past_the_serialization_bound_is_left_out() -> None:
    """The guard: nesting 3 000 deep indents to ~9M characters; without `MAX_SERIALIZED` that text is built
    whole (and at 50 000 levels, 2.5G); with it the part stops at the bound and is left out."""
    deep: Any = 1
    for _ in range(3000):
        deep = [deep]
    text = _body(_tool("result", result=deep), {"type": "text", "text": "after"})
    assert text == "Assistant: after"  # the whole part, its call line too
    shallow: Any = 1
    for _ in range(500):
        shallow = [shallow]
    assert "Tool Result weather: [\n  [\n" in _body(_tool("result", result=shallow))


def test_work_grows_about_linearly() -> None:
    """A result 4× as long costs well under 16× (a quadratic cost would)."""
    small, large = "wörd " * 100_000, "wörd " * 400_000
    assert (
        _seconds(lambda: format_tool_result(large)) < 8 * _seconds(lambda: format_tool_result(small)) + 0.05
    )


# --- properties --------------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.binary(max_size=20),
    st.datetimes(),
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.text(max_size=20), st.integers(), st.floats())
    return st.one_of(st.lists(inner, max_size=25), st.dictionaries(keys, inner, max_size=25))


_values = st.recursive(_scalars, _containers, max_leaves=80)
_part = st.one_of(
    _values,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "reasoning", "tool-invocation", "file", "image", "x"])},
        optional={
            "text": _values,
            "reasoning": _values,
            "toolInvocation": st.one_of(
                _values,
                st.fixed_dictionaries(
                    {
                        "state": st.sampled_from(
                            ["call", "partial-call", "result", "output-error", "output-denied"]
                        ),
                        "toolCallId": st.one_of(st.sampled_from(["c1", "c2"]), _scalars),
                    },
                    optional={
                        "toolName": _values,
                        "args": _values,
                        "result": _values,
                        "isError": _values,
                        "errorText": _values,
                        "approval": _values,
                    },
                ),
            ),
            "data": _values,
            "image": _values,
            "mimeType": _values,
            "filename": _values,
            "createdAt": _values,
            "providerMetadata": _values,
        },
    ),
)
_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]), "createdAt": st.sampled_from([_AT, None, 5])},
        optional={
            "id": _values,
            "content": st.one_of(_values, st.fixed_dictionaries({"parts": st.lists(_part)})),
        },
    ),
    max_size=5,
)


def _bound(messages: list[dict[str, Any]]) -> int:
    """Per part at most two lines of 500 characters plus notes, titles (a tool's name, unbounded in Mastra
    too) and date headers."""
    parts = sum(
        len(m["content"]["parts"])
        for m in messages
        if isinstance(m.get("content"), dict) and isinstance(m["content"].get("parts"), list)
    )
    return (parts + len(messages)) * 2 * 700 + len(repr(messages))


@settings(max_examples=300, deadline=None)
@given(_messages)
def test_any_rows_render_without_raising_within_bounds(messages: list[dict[str, Any]]) -> None:
    text = format_messages_for_observer(messages)
    assert len(text) <= _bound(messages)


@settings(max_examples=200, deadline=None)
@given(_values, st.integers(min_value=1, max_value=600))
def test_tool_arguments_fit_the_limit(args: Any, limit: int) -> None:
    text = format_tool_arguments(args, limit)
    assert observer_parts._len16(text) <= limit


@settings(max_examples=200, deadline=None)
@given(_values)
def test_tool_results_stay_within_5000_tokens(result: Any) -> None:
    try:
        text = format_tool_result(result)
    except observer_parts.UnrenderableError:
        return
    assert estimate_token_count(text) <= 5000
