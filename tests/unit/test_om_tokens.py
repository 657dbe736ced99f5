"""Mastra Observational Memory's token counter (`message_history.core.om_tokens`).

The expected numbers are Mastra's own: `@mastra/memory` 1.31.0's `TokenCounter` run under Node on
`tests/om_cases.py` (recorded in tests/data/om/mastra_om.json; tests/interop/test_mastra_om_interop.py checks
the recording against live Mastra, and random messages of every part kind).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from message_history.core.om_tokens import (
    attachment_free,
    count_observations,
    count_om_message,
    count_om_messages,
    js_stringify_pretty,
)
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
    ],
)
def test_pretty_stringify_is_json_stringify_with_two_spaces(value: Any, expected: str) -> None:
    """`JSON.stringify(v, null, 2)`, the form tool results are counted in."""
    assert js_stringify_pretty(value) == expected


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
