"""Differential property (issue 25, item 3): the persist path's one-parse `decode_response` and the models'
JSON route it replaced (`decode_response_reference`) agree on every value: both refuse with the same error
(type, reason, path), or both accept with the same event (equal models, byte-identical encodings).

The values are tests/fuzzing.py's (hostile edges, garbage, random bytes), plus events built to reach each
check the fast route makes itself (a huge number, NaN, a wrong encoding, a frame, a size) and ones a
Python-mode validation words differently from the JSON mode (an object where a string goes, and back).
Pure, no stack; `FUZZ_EXAMPLES` raises the count (docs/fuzzing.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings

from message_history.errors import InvalidInputError
from schemas.codec import decode_response, decode_response_reference, encode
from schemas.events import AgentResponse
from schemas.limits import Limits
from tests.fuzzing import Fuzzed, any_value, response, text_message

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "400"))
LIMITS = Limits(max_event_bytes=16_384, max_messages_per_event=20, max_parts_per_message=20, max_id_length=40)


def _valid(**changes: object) -> dict[str, object]:
    event = response("t", "r", "q", [text_message("user", "hi")])
    event.update(changes)
    return event


def _dumps(event: object) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _with_literal(literal: str) -> bytes:
    """A valid event whose assistant message's metadata holds `literal` as written (not expressible in
    Python: NaN, a number too large for a double)."""
    marker = "__LITERAL__"
    content = {"format": 2, "parts": [{"type": "text", "text": "ok"}], "metadata": {"n": marker}}
    event = _valid(response=[{**text_message("assistant", "ok"), "content": content}])
    return _dumps(event).replace(f'"{marker}"'.encode(), literal.encode())


EDGE_VALUES: list[bytes] = [
    _dumps(_valid()),
    _with_literal("1e309"),
    _with_literal("-1e400"),
    _with_literal("1" * 400 + ".5"),
    _with_literal("1" * 400),  # an integer: exact in Python, accepted by both
    _with_literal("1e-400"),  # underflows to 0.0: accepted by both
    _with_literal("NaN"),
    _with_literal("-Infinity"),
    _with_literal('"1e400 in a string"'),
    _dumps(_valid(input="not a list")),
    _dumps(_valid(input=[{"role": "user", "content": {"parts": "x"}}])),
    _dumps(_valid(input=[{"role": "user", "content": 5}])),
    _dumps(_valid(input=[{"role": "user", "content": ["x"]}])),
    _dumps(_valid(threadId={"an": "object"})),
    _dumps(_valid(createdAt=1735725600)),
    _dumps(_valid(createdAt="2025-01-01")),
    _dumps(_valid(schemaVersion=1.0)),
    _dumps(["a list"]),
    b"\xef\xbb\xbf" + _dumps(_valid()),
    "é".join(["{", "}"]).encode("utf-16-le"),
    b"\x00\x00\x00\x01\x02" + _dumps(_valid()),
    _dumps(_valid(metadata={"pad": "x" * LIMITS.max_event_bytes})),
    b'{"schemaVersion":1,"schemaVersion":2}',
    b'{"a":"\\ud800"}',
    b"[" * 300 + b"]" * 300,
]


def _outcome(
    decode: Callable[[bytes, Limits], AgentResponse], value: bytes
) -> AgentResponse | tuple[str, str]:
    """The event, or the refusal as (error type, message)."""
    try:
        return decode(value, LIMITS)
    except InvalidInputError as exc:
        return type(exc).__name__, str(exc)


def assert_same(value: bytes) -> None:
    """Both routes refuse alike, or both accept the same event."""
    expected = _outcome(decode_response_reference, value)
    got = _outcome(decode_response, value)
    if isinstance(expected, tuple) or isinstance(got, tuple):
        assert got == expected, value[:200]
        return
    assert got == expected, value[:200]
    assert got.model_fields_set == expected.model_fields_set
    assert encode(got) == encode(expected), value[:200]


@pytest.mark.parametrize("value", EDGE_VALUES, ids=range(len(EDGE_VALUES)))
def test_routes_agree_on_edges(value: bytes) -> None:
    assert_same(value)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(any_value("responses", LIMITS))
def test_routes_agree_on_fuzzed_values(record: Fuzzed) -> None:
    if record.value is not None:
        assert_same(record.value)


def test_the_huge_number_check_is_the_fast_routes_own() -> None:
    """The fast route itself refuses a huge number: the reference is not what catches it here."""
    with pytest.raises(InvalidInputError, match="does not fit a double"):
        decode_response(_with_literal("1e309"), LIMITS)
