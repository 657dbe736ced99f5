"""Differential property (recall's decode): `decode_request` with the native NaN / Infinity / huge-number
prescan (`message_history_native.maybe_non_finite`, what the service uses when it is installed) and with the
Python reference (`maybe_non_finite_py`) agree on every value: both refuse with the same error (type, reason,
path), or both accept with the same event (equal models, byte-identical encodings).

The values are tests/fuzzing.py's (hostile edges, garbage, random bytes), plus events built to reach each
check of the raw bytes (a huge number, NaN, the letters and long digit runs inside strings, a wrong encoding,
a frame, a size), the memory options and schema errors. Pure, no stack; `FUZZ_EXAMPLES` raises the count.
tests/unit/test_non_finite_prescan.py holds the two prescans equal on bytes alone.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings

from message_history.errors import InvalidInputError
from schemas.codec import decode_request, maybe_non_finite_py
from schemas.limits import Limits
from tests.fuzzing import Fuzzed, any_value, request, text_message
from tests.prescan import Prescan, assert_same_decode, native_prescan, using

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "400"))
LIMITS = Limits(max_event_bytes=16_384, max_messages_per_event=20, max_parts_per_message=20, max_id_length=40)


def _valid(**changes: object) -> dict[str, object]:
    event = request("t", "r", "q")
    event.update(changes)
    return event


def _dumps(event: object) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _with_literal(literal: str) -> bytes:
    """A valid event whose message's metadata holds `literal` as written (NaN, a number too large for a
    double: not expressible in Python)."""
    marker = "__LITERAL__"
    content = {"format": 2, "parts": [{"type": "text", "text": "hi"}], "metadata": {"n": marker}}
    event = _valid(messages=[{**text_message("user", "hi"), "content": content}])
    return _dumps(event).replace(f'"{marker}"'.encode(), literal.encode())


EDGE_VALUES: list[bytes] = [
    _dumps(_valid()),
    _with_literal("1e309"),
    _with_literal("-1e400"),
    _with_literal("1" * 400 + ".5"),
    _with_literal("1" * 400),
    _with_literal("1e-400"),
    _with_literal("NaN"),
    _with_literal("-Infinity"),
    _with_literal('"1e400 in a string"'),
    _with_literal('"NaN, Infinity and 1E-123 in a string"'),
    _with_literal('"' + "9" * 300 + '"'),
    _with_literal("1" * 299),
    _with_literal("1" * 300),
    _with_literal("1.5E-123"),
    _with_literal("1e+99"),
    _dumps(_valid(messages="not a list")),
    _dumps(_valid(messages=[])),
    _dumps(_valid(messages=[{"role": "user", "content": {"parts": "x"}}])),
    _dumps(_valid(messages=[{"role": "user", "content": 5}])),
    _dumps(_valid(messages=[{"role": "user", "content": ["x"]}])),
    _dumps(_valid(messages=[{"role": "user", "content": "plain text"}])),
    _dumps(_valid(messages=[text_message("assistant", "a"), text_message("system", "s")])),
    _dumps(_valid(threadId={"an": "object"})),
    _dumps(_valid(createdAt=1735725600)),
    _dumps(_valid(createdAt="2025-01-01")),
    _dumps(_valid(schemaVersion=1.0)),
    _dumps(_valid(schemaVersion="1")),
    _dumps(_valid(memory=None)),
    _dumps(_valid(memory={})),
    _dumps(_valid(memory="x")),
    _dumps(_valid(memory={"lastMessages": 5, "readOnly": True, "retainFullInput": False})),
    _dumps(_valid(memory={"lastMessages": False})),
    _dumps(_valid(memory={"lastMessages": 5.0})),
    _dumps(_valid(memory={"lastMessages": "5"})),
    _dumps(_valid(memory={"lastMessages": -1})),
    _dumps(_valid(memory={"readOnly": 1})),
    _dumps(_valid(memory={"readOnly": "true"})),
    _dumps(_valid(memory={"maxTokens": 1.5, "atMaxRemoveTokens": 2})),
    _dumps(_valid(memory={"maxTokens": "10"})),
    _dumps(["a list"]),
    b"\xef\xbb\xbf" + _dumps(_valid()),
    "é".join(["{", "}"]).encode("utf-16-le"),
    b"\x00\x00\x00\x01\x02" + _dumps(_valid()),
    _dumps(_valid(metadata={"pad": "x" * LIMITS.max_event_bytes})),
    b'{"schemaVersion":1,"schemaVersion":2}',
    b'{"a":"\\ud800"}',
    b"[" * 300 + b"]" * 300,
]


@pytest.fixture(scope="module")
def native() -> Prescan:
    return native_prescan()


def assert_same(native: Prescan, value: bytes) -> None:
    """Both prescans refuse alike, or both accept the same event."""
    assert_same_decode(lambda raw: decode_request(raw, LIMITS), native, value)


@pytest.mark.parametrize("value", EDGE_VALUES, ids=range(len(EDGE_VALUES)))
def test_prescans_agree_on_edges(native: Prescan, value: bytes) -> None:
    assert_same(native, value)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(any_value("requests", LIMITS))
def test_prescans_agree_on_fuzzed_values(native: Prescan, record: Fuzzed) -> None:
    if record.value is not None:
        assert_same(native, record.value)


@pytest.mark.parametrize("literal", ["1e309", "-1e400", "1" * 400 + ".5"])
def test_each_prescan_refuses_a_huge_number(native: Prescan, literal: str) -> None:
    for prescan in (native, maybe_non_finite_py):
        with using(prescan), pytest.raises(InvalidInputError, match="does not fit a double"):
            decode_request(_with_literal(literal), LIMITS)


NON_FINITE = "NaN, Infinity and -Infinity are not JSON"


@pytest.mark.parametrize("literal", ["NaN", "-Infinity", "Infinity"])
def test_each_prescan_refuses_nan_and_infinity(native: Prescan, literal: str) -> None:
    for prescan in (native, maybe_non_finite_py):
        with using(prescan), pytest.raises(InvalidInputError, match=NON_FINITE):
            decode_request(_with_literal(literal), LIMITS)
