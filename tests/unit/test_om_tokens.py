"""Mastra Observational Memory's token counter (`message_history.core.om_tokens`).

The expected numbers are Mastra's own: `@mastra/memory` 1.31.0's `TokenCounter` run under Node on
`tests/om_cases.py` (recorded in tests/data/om/mastra_om.json; tests/interop/test_mastra_om_interop.py checks
the recording against live Mastra, and random messages of every part kind).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from message_history.core.observer_parts import pretty_json
from message_history.core.om_tokens import (
    attachment_free,
    count_observations,
    count_om_message,
    count_om_messages,
    count_string,
)
from message_history.core.tokens import js_stringify, utf16_length
from tests.om_cases import MESSAGES, OBSERVATIONS, RECORDING


def _recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDING.read_text(encoding="utf-8"))["tokens"]
    return data


@pytest.mark.parametrize(("index", "message"), list(enumerate(MESSAGES)), ids=lambda v: str(v)[:40])
def test_each_message_counts_as_mastra_counts_it(index: int, message: dict[str, Any]) -> None:
    """Every part kind, tool state and edge (empty text, null result, cached estimates) as Mastra says."""
    assert count_om_message(message) == _recorded()["perMessage"][index]


def test_a_list_is_24_plus_its_messages_and_an_empty_list_is_zero() -> None:
    """`countMessages`: the conversation overhead once, not per message; nothing for no messages."""
    assert count_om_messages(MESSAGES) == _recorded()["total"]
    assert count_om_messages(MESSAGES) == 24 + sum(count_om_message(m) for m in MESSAGES)
    assert count_om_messages([]) == 0


def test_observations_count_as_mastra_counts_them() -> None:
    """`countObservations`: tokenx on the log's text."""
    assert [count_observations(o) for o in OBSERVATIONS] == _recorded()["observations"]


def test_the_om_counter_differs_from_the_token_limiters() -> None:
    """Each piece is estimated alone: 'hello world' is role 1 + text 2 + 3.8 → round(6.8) = 7."""
    assert (
        count_om_message(
            {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "hello world"}]}}
        )
        == 7
    )


def test_halves_round_up_as_math_round_does() -> None:
    """A client estimate of 1.7: 1 + 1.7 + 3.8 = 6.5, which Mastra's `Math.round` makes 7 (Node says 7;
    Python's `round` would say 6)."""
    part = {
        "type": "file",
        "data": "https://e.com/a.png",
        "mimeType": "image/png",
        "providerMetadata": {
            "mastra": {"tokenEstimate": {"v": 0, "source": "client", "key": "client", "tokens": 1.7}}
        },
    }
    assert count_om_message({"role": "user", "content": {"format": 2, "parts": [part]}}) == 7


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({}, "{}"),
        ([], "[]"),
        (
            {"a": [1, {"b": None}], "c": "x"},
            '{\n  "a": [\n    1,\n    {\n      "b": null\n    }\n  ],\n  "c": "x"\n}',
        ),
        (1e21, "1e+21"),
        ("é\n", '"é\\n"'),
        # where the recursive serializer the counter had differed, JavaScript's forms: index-like keys
        # first, a lone surrogate escaped, an integer past 2**53 as the double it is
        ({"b": 1, "10": 2, "2": 3}, '{\n  "2": 3,\n  "10": 2,\n  "b": 1\n}'),
        ("\ud800", '"\\ud800"'),
        (2**60, "1152921504606847000"),
        (
            {"encryptedContent": "x" * 257},
            '{\n  "encryptedContent": "[stripped encryptedContent: 257 characters]"\n}',
        ),
    ],
)
def test_pretty_stringify_is_json_stringify_with_two_spaces(value: Any, expected: str) -> None:
    """`JSON.stringify(sanitizeToolResultValue(v), null, 2)`, the form tool results are counted in."""
    assert pretty_json(value) == expected


def test_attachment_free_tells_exact_counts_from_estimates() -> None:
    """Text and tool parts are exact; an image or a file part makes the count an estimate."""
    assert attachment_free(MESSAGES[0])
    assert attachment_free({"role": "user", "content": "plain"})
    assert not attachment_free({"role": "user", "content": {"parts": [{"type": "image", "image": "x"}]}})
    media = {"type": "content", "value": [{"type": "media", "data": "AAAA", "mediaType": "image/png"}]}

    def tool(result: Any) -> dict[str, Any]:
        invocation = {"state": "result", "toolName": "t", "result": result}
        return {
            "role": "assistant",
            "content": {"parts": [{"type": "tool-invocation", "toolInvocation": invocation}]},
        }

    assert not attachment_free(tool(media))
    assert attachment_free(tool({"type": "content", "value": []}))


def test_rows_of_any_shape_are_counted_without_raising() -> None:
    """Stored rows are input: odd parts and contents count as Mastra's fallbacks would, never crash."""
    odd: list[dict[str, Any]] = [
        {"role": None, "content": None},
        {"role": "user", "content": {"parts": [None, 3, "s", {"type": "tool-invocation"}]}},
        {
            "role": "user",
            "content": {"parts": [{"type": "tool-invocation", "toolInvocation": {"state": "weird"}}]},
        },
        {"role": "user", "content": {"parts": [{"type": "text", "text": 5}]}},
    ]
    for message in odd:
        assert isinstance(count_om_message(message), int)


def test_a_client_estimate_past_every_float_is_no_estimate() -> None:
    """`tokens` as a JSON integer too big for a float (pydantic-core parses it whole): JavaScript reads it as
    Infinity, not finite, so the part gets Mastra's own estimate; `math.isfinite` raised OverflowError."""
    stamp = {"source": "client", "v": 1, "key": "k"}

    def image(tokens: Any) -> dict[str, Any]:
        metadata = {"mastra": {"tokenEstimate": {**stamp, "tokens": tokens}}}
        part = {"type": "image", "image": "x", "providerMetadata": metadata}
        return {"role": "user", "content": {"format": 2, "parts": [part]}}

    assert count_om_message(image(10**400)) == count_om_message(image(float("inf")))


# --- deep and wide values (a tool result is input; the counter relies on no depth limit of the server's) ----


def _reference_pretty(value: Any, level: int = 0) -> str:
    """The counter's former serializer, recursive (`sanitizeToolResultValue` folded in): the oracle for
    the values it could write."""
    inner = "  " * (level + 1)
    if isinstance(value, dict) and value:
        items = []
        for key, entry in value.items():
            shown = entry
            if key == "encryptedContent" and isinstance(entry, str) and utf16_length(entry) > 256:
                shown = f"[stripped encryptedContent: {utf16_length(entry)} characters]"
            items.append(f"{inner}{js_stringify(str(key))}: {_reference_pretty(shown, level + 1)}")
        return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"
    if isinstance(value, list) and value:
        items = [f"{inner}{_reference_pretty(v, level + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * level + "]"
    return js_stringify(value)


# JSON data as a stored row holds it; the equality leaves out what the old serializer wrote unlike
# JavaScript (the table above): index-like keys, lone surrogates, integers past 2**53
_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
_key = st.one_of(_text.filter(lambda k: not k.isdigit()), st.just("encryptedContent"))
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(),
    _text,
    st.sampled_from(["", " ", "\n  x", "é" * 300, "a b\t\u3000c", "x" * 257]),
)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(_key, inner, max_size=6)),
    max_leaves=40,
)


@st.composite
def _nested(draw: st.DrawFn) -> Any:
    """A value wrapped in lists and objects up to 3 000 levels deep (past Python's stack), in a pattern."""
    value = draw(_json)
    depth = draw(st.one_of(st.integers(0, 60), st.integers(300, 3000)))
    pattern = draw(st.lists(st.sampled_from(["list", "dict", "wide"]), min_size=1, max_size=4))
    for level in range(depth):
        kind = pattern[level % len(pattern)]
        value = [value] if kind == "list" else {"k": value} if kind == "dict" else [0, value, "x y"]
    return value


def _tool_message(result: Any) -> dict[str, Any]:
    invocation = {"state": "result", "toolCallId": "c", "toolName": "t", "args": {}, "result": result}
    return {
        "role": "assistant",
        "content": {"format": 2, "parts": [{"type": "tool-invocation", "toolInvocation": invocation}]},
    }


@settings(max_examples=150)
@given(_json)
def test_the_shared_serializer_writes_what_the_recursive_one_did(value: Any) -> None:
    """`pretty_json` equals the former recursive serializer on every value it could write."""
    assert pretty_json(value, limit=None) == _reference_pretty(value)


@settings(max_examples=150)
@given(_json)
def test_indentation_never_changes_the_count(value: Any) -> None:
    """The counter counts the text without its indentation: the same tokenx count, whatever the value."""
    assert count_string(pretty_json(value, indent="", limit=None)) == count_string(
        pretty_json(value, limit=None)
    )


@settings(max_examples=25)
@given(_nested())
def test_deep_results_count_without_raising(value: Any) -> None:
    """Any depth counts, never raises, and where the recursive serializer could write the value (within
    Python's stack) the count is the one it gave."""
    tokens = count_om_message(_tool_message(value))
    try:
        expected = _reference_pretty(value)
    except RecursionError:
        return
    if not isinstance(value, str):  # a string result is counted as it is: nothing serialized
        # the reference's text given as a string result: the same count, without the -12 of a stringified one
        assert tokens == count_om_message(_tool_message(expected)) - 12


@pytest.mark.timeout(60)  # a hang guard, not a timing assertion
@pytest.mark.parametrize(
    "shape", ["deep-lists", "deep-objects", "wide-object", "wide-list", "deep-then-wide"]
)
def test_huge_results_count_in_linear_work(shape: str) -> None:
    """100 000 levels, 200 000 keys, and 2 000 levels holding 100 000 entries (whose indentation alone
    would be 400 M characters): each counts, none raises."""
    value: Any = 1
    if shape.startswith("deep"):
        for _ in range(100_000 if shape != "deep-then-wide" else 2000):
            value = [value] if shape == "deep-lists" else {"a": value}
        if shape == "deep-then-wide":
            value = {"a": [value, list(range(100_000))]}
    elif shape == "wide-object":
        value = {f"k{i}": i for i in range(200_000)}
    else:
        value = ["word"] * 200_000
    assert count_om_message(_tool_message(value)) > 0
