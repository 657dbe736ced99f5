"""Mastra 1.71's default token counter (`message_history.core.tokens`), rule by rule.

The numbers below were worked out from tokenx 1.3.0's rules by hand; the interop test checks the same
functions against Mastra's own code on generated input.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from message_history.core.tokens import (
    CountCache,
    count_message,
    count_system_text,
    estimate_token_count,
    estimate_token_count_reference,
    js_stringify,
)
from schemas.messages import Message
from schemas.stored_rows import read_message
from tests.memory_cases import random_texts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("   ", 0),  # whitespace pieces are free
        ("\ufeff", 0),  # JavaScript's \s includes U+FEFF (Python's does not)
        ("\u001f", 1),  # ... and excludes U+001F (Python's includes it)
        ("abc", 1),  # up to 3 UTF-16 units: 1
        ("abcdefg", 2),  # ceil(7 / 6)
        ("3.14", 3),  # split at the '.' first: '3', '.', '14'
        ("1,234,567", 5),
        ("1234567", 1),  # a number is one token, however long
        ("你好世界", 4),  # CJK: one per code point
        ("안녕", 2),
        ("Grüße", 2),  # German: ceil(5 / 3)
        ("żółćżółć", 3),  # Polish: ceil(8 / 3.5)
        ("ÄPFEL", 2),  # case-insensitive: Ä matches ä, ceil(5 / 3)
        ("😀ab", 1),  # 4 UTF-16 units: ceil(4 / 6)
        ("hello, world", 3),  # 'hello' 1, ',' 1, ' ' 0, 'world' 1
        ("a...b", 3),  # 'a' 1, '...' 1, 'b' 1
        ("!!!!!", 3),  # a punctuation run of 5: ceil(5 / 2)
    ],
)
def test_estimate_token_count(text: str, expected: int) -> None:
    """tokenx 1.3.0's segment rules, JavaScript semantics."""
    assert estimate_token_count(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (-2.5, "-2.5"),
        (float("nan"), "null"),
        ({"a": [True, None, "x\n\u001f"]}, '{"a":[true,null,"x\\n\\u001f"]}'),
        ({"ü": "€"}, '{"ü":"€"}'),
    ],
)
def test_js_stringify(value: Any, expected: str) -> None:
    """`JSON.stringify` number and string forms."""
    assert js_stringify(value) == expected


def _message(parts: list[dict[str, Any]], role: str = "user") -> Message:
    return Message.model_validate({"role": role, "content": {"format": 2, "parts": parts}})


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([], 1 + 3.8),  # 'user' alone
        ([{"type": "text", "text": "hello there"}], 3 + 3.8),  # 'userhello' 2, 'there' 1
        (  # a call with object args: the stringified args, and 12 off the overhead
            [
                {
                    "type": "tool-invocation",
                    "toolInvocation": {"state": "call", "toolCallId": "c", "toolName": "f", "args": {"a": 1}},
                }
            ],
            estimate_token_count('userf{"a":1}') + (-12 + 3.8),
        ),
        (  # a result: counts as one more message overhead
            [
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "result",
                        "toolCallId": "c",
                        "toolName": "f",
                        "result": "done",
                    },
                }
            ],
            estimate_token_count("userdone") + (3.8 + 3.8),
        ),
        (  # other tool states append nothing
            [
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "approval-requested",
                        "toolCallId": "c",
                        "toolName": "f",
                        "args": {"a": 1},
                    },
                }
            ],
            1 + 3.8,
        ),
        ([{"type": "file", "mimeType": "image/png", "data": "xxxx"}], 1 + 3.8 + 765),
        ([{"type": "file", "mimeType": "text/plain", "data": "A" * 400}], 1 + 3.8 + 75),  # 300 bytes / 4
        ([{"type": "file", "mimeType": "text/plain", "data": "https://x.org/f"}], 1 + 3.8 + 258),
        ([{"type": "step-start"}], estimate_token_count('user{"type":"step-start"}') + 3.8),
    ],
    ids=["empty", "text", "call", "result", "approval", "image", "bytes", "url", "other-part"],
)
def test_count_message(parts: list[dict[str, Any]], expected: float) -> None:
    """Per-message counting: what is appended, the overheads, media estimates, in Mastra's float order."""
    assert count_message(_message(parts)) == expected


def test_count_message_media_result() -> None:
    """A media result is estimated, not tokenized; its other keys are stringified."""
    message = _message(
        [
            {
                "type": "tool-invocation",
                "toolInvocation": {
                    "state": "result",
                    "toolCallId": "c",
                    "toolName": "f",
                    "result": {"type": "image", "data": "Zm9v" * 1000, "mediaType": "image/png"},
                },
            }
        ]
    )
    expected = estimate_token_count('user{"type":"image","mediaType":"image/png"}') + (-12 + 3.8 + 3.8) + 765
    assert count_message(message) == expected


def test_count_system_text() -> None:
    """A system instruction counts 'system' + its text plus one message overhead."""
    assert count_system_text("Be brief.") == estimate_token_count("systemBe brief.") + 3.8


def test_the_fast_estimator_equals_tokenx_piece_by_piece() -> None:
    """`estimate_token_count` (separators scored by kind) equals scoring every piece with tokenx's rules."""
    for text in random_texts(seed=3, count=2000):
        assert estimate_token_count(text) == estimate_token_count_reference(text), text


def test_count_cache_counts_each_message_once() -> None:
    """The same object is counted once; an equal but distinct object is counted on its own."""
    cache = CountCache()
    first = _message([{"type": "text", "text": "hello there"}])
    assert cache(first) == cache(first) == count_message(first)
    assert len(cache._counts) == 1
    cache(_message([{"type": "text", "text": "hello there"}]))
    assert len(cache._counts) == 2


# --- JSON.stringify without recursion (no depth limit of its own) -------------------------------------------


def _reference_stringify(value: Any) -> str:
    """The former recursive `js_stringify`: the oracle wherever it did not exhaust the stack."""
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(
                f"{json.dumps(str(k), ensure_ascii=False)}:{_reference_stringify(v)}"
                for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(_reference_stringify(v) for v in value) + "]"
    return js_stringify(value)  # a scalar: no recursion either way


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(["{", "[", ""]),
)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=5),
    ),
    max_leaves=40,
)


@st.composite
def _deep(draw: st.DrawFn) -> Any:
    value = draw(_json)
    depth = draw(st.one_of(st.integers(0, 60), st.integers(300, 3000)))
    pattern = draw(st.lists(st.sampled_from(["list", "dict", "wide", "empty"]), min_size=1, max_size=4))
    for level in range(depth):
        kind = pattern[level % len(pattern)]
        value = {
            "list": [value],
            "dict": {"k": value},
            "wide": [{}, value, "x"],
            "empty": {"": value, "e": []},
        }[kind]
    return value


@settings(max_examples=60)
@given(st.one_of(_json, _deep()))
def test_js_stringify_is_the_recursive_one_without_its_depth_limit(value: Any) -> None:
    """Equal to the former recursive form wherever that one answered; never a RecursionError."""
    text = js_stringify(value)
    try:
        expected = _reference_stringify(value)
    except RecursionError:
        assert text.count("[") + text.count("{") >= 300  # only the deep ones were out of its reach
        return
    assert text == expected


def test_a_stored_row_nested_past_the_stack_is_counted() -> None:
    """A row whose BSON content nests 900 levels (the decoder reads ~1 000; the server stores only 180, so
    this row comes from bytes, not a server) reads as a `Message` and counts; the recursive `js_stringify`
    raised RecursionError from ~480 levels."""
    deep: Any = 0
    for _ in range(900):
        deep = {"a": deep}
    invocation = {"state": "result", "toolCallId": "c", "toolName": "t", "args": {}, "result": deep}
    doc = {
        "id": "m1",
        "thread_id": "t",
        "resourceId": "r",
        "role": "assistant",
        "createdAt": datetime(2025, 1, 1, tzinfo=UTC),
        "type": "v2",
        "content": {"format": 2, "parts": [{"type": "tool-invocation", "toolInvocation": invocation}]},
    }
    message = read_message(bson.decode(bson.encode(doc)))
    stringified = '{"a":' * 900 + "0" + "}" * 900
    # role + the stringified result; minus 12 for a stringified value, a message's and a result's 3.8
    assert count_message(message) == estimate_token_count("assistant" + stringified) + (-12 + 3.8 + 3.8)
