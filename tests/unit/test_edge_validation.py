"""Validation at the edge (issue 23, items 2 and 7): every time, derived time and number an event carries is
within what Python datetimes, BSON and JavaScript hold, or the record is refused with an
`EventValidationError` saying so (never an `OverflowError`); NaN/Infinity are not JSON; a value in another
encoding than UTF-8 is named as such. The same on all three input topics (requests, responses, commands).

Each refused value of the issue stands next to its neighbours inside the range, which must still pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from message_history.errors import EventValidationError, MessageIdTakenError, ThreadOwnershipError
from schemas.codec import decode_request, decode_response
from schemas.commands import decode_command
from schemas.events import MAX_SAFE_INTEGER
from schemas.messages import EARLIEST, LATEST

LATEST_TEXT = "9999-12-31T23:59:59.999Z"
RANGE = "outside the range of storable times"


def user(text: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}, **fields}


def assistant(text: str = "ok") -> dict[str, Any]:
    return {"role": "assistant", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def request(count: int = 1, **over: Any) -> dict[str, Any]:
    """A request whose messages have no createdAt (the service derives them: createdAt + i ms)."""
    base = {
        "schemaVersion": 1,
        "requestId": "req-1",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": "2025-01-01T11:00:00.000Z",
        "messages": [user(f"m{i}") for i in range(count)],
    }
    return base | over


def response(inputs: int = 1, responses: int = 1, **over: Any) -> dict[str, Any]:
    base = {
        "schemaVersion": 1,
        "requestId": "req-1",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": "2025-01-01T11:00:00.000Z",
        "input": [user(f"in{i}") for i in range(inputs)],
        "response": [assistant(f"out{i}") for i in range(responses)],
    }
    return base | over


def command(**over: Any) -> dict[str, Any]:
    base = {
        "schemaVersion": 1,
        "command": "ForgetThread",
        "requestId": "c-1",
        "threadId": "t1",
        "createdAt": "2025-01-01T11:00:00.000Z",
    }
    return base | over


def raw(event: dict[str, Any], *replace: tuple[str, str]) -> bytes:
    text = json.dumps(event)
    for old, new in replace:
        assert old in text
        text = text.replace(old, new)
    return text.encode()


Decode = Callable[[bytes], object]
REQUEST: Decode = decode_request
RESPONSE: Decode = decode_response
COMMAND: Decode = decode_command


# --- times --------------------------------------------------------------------------------------------------

REFUSED_TIMES = [
    # the three: a derived time past the end, offsets moving the instant past either end
    pytest.param(
        REQUEST, request(2, createdAt=LATEST_TEXT), "messages.1.createdAt", id="request-derived-late"
    ),
    pytest.param(
        RESPONSE, response(1, 1, createdAt=LATEST_TEXT), "response.0.createdAt", id="response-derived"
    ),
    pytest.param(RESPONSE, response(2, 0, createdAt=LATEST_TEXT), "input.1.createdAt", id="response-input"),
    pytest.param(
        REQUEST, request(createdAt="0001-01-01T00:00:00+01:00"), "createdAt", id="request-offset-low"
    ),
    pytest.param(
        REQUEST, request(createdAt="9999-12-31T23:59:59.999-01:00"), "createdAt", id="req-offset-high"
    ),
    pytest.param(
        RESPONSE, response(createdAt="0001-01-01T00:00:00+01:00"), "createdAt", id="response-offset"
    ),
    pytest.param(
        COMMAND, command(createdAt="0001-01-01T00:00:00+01:00"), "createdAt", id="command-offset-low"
    ),
    pytest.param(COMMAND, command(createdAt="9999-12-31T23:59:59.999-00:01"), "createdAt", id="command-high"),
    # a message's own createdAt
    pytest.param(
        REQUEST,
        request(messages=[user(createdAt="0001-01-01T00:00:00.000+00:01")]),
        "messages.0.createdAt",
        id="message-offset",
    ),
    pytest.param(
        RESPONSE,
        response(response=[assistant() | {"createdAt": "9999-12-31T23:59:59.999-23:59"}]),
        "response.0.createdAt",
        id="response-message-offset",
    ),
]


@pytest.mark.parametrize(("decode", "event", "path"), REFUSED_TIMES)
def test_times_past_the_storable_range_are_refused_with_a_clear_reason(
    decode: Decode, event: dict[str, Any], path: str
) -> None:
    """An `EventValidationError` naming the field and the range, not an `OverflowError` (which stopped the
    loop before)."""
    with pytest.raises(EventValidationError) as refused:
        decode(json.dumps(event).encode())
    assert refused.value.path.endswith(path)
    assert RANGE in refused.value.reason


ACCEPTED_TIMES = [
    # the neighbours inside the range
    pytest.param(REQUEST, request(1, createdAt=LATEST_TEXT), id="request-latest-one-message"),
    pytest.param(REQUEST, request(2, createdAt="9999-12-31T23:59:59.998Z"), id="request-derived-to-latest"),
    pytest.param(
        RESPONSE, response(1, 1, createdAt="9999-12-31T23:59:59.998Z"), id="response-derived-latest"
    ),
    pytest.param(REQUEST, request(createdAt="0001-01-01T00:00:00.000Z"), id="request-earliest"),
    pytest.param(REQUEST, request(createdAt="0001-01-01T01:00:00+01:00"), id="request-earliest-with-offset"),
    pytest.param(
        REQUEST, request(createdAt="9999-12-31T22:59:59.999-01:00"), id="request-latest-with-offset"
    ),
    pytest.param(REQUEST, request(createdAt="9999-12-31T23:59:59.999+01:00"), id="request-positive-offset"),
    pytest.param(REQUEST, request(createdAt="0001-01-01T00:00:00-01:00"), id="request-negative-offset-low"),
    pytest.param(COMMAND, command(createdAt=LATEST_TEXT), id="command-latest"),
    pytest.param(COMMAND, command(createdAt="0001-01-01T00:00:00Z"), id="command-earliest"),
]


@pytest.mark.parametrize(("decode", "event"), ACCEPTED_TIMES)
def test_times_at_the_ends_of_the_range_pass(decode: Decode, event: dict[str, Any]) -> None:
    decode(json.dumps(event).encode())


def test_derived_times_at_the_end_are_exactly_the_latest_storable_instant() -> None:
    decoded = decode_response(json.dumps(response(1, 1, createdAt="9999-12-31T23:59:59.998Z")).encode())
    assert [m.createdAt for m in decoded.input + decoded.response] == [
        LATEST.replace(microsecond=998_000),
        LATEST,
    ]
    earliest = decode_request(json.dumps(request(createdAt="0001-01-01T01:00:00+01:00")).encode())
    assert earliest.createdAt == EARLIEST == earliest.messages[0].createdAt


# --- integers -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "path"),
    [
        pytest.param({"lastMessages": 2**70}, "memory.lastMessages", id="last-messages-2**70"),
        pytest.param({"lastMessages": 2**63}, "memory.lastMessages", id="last-messages-past-int64"),
        pytest.param({"lastMessages": MAX_SAFE_INTEGER + 1}, "memory.lastMessages", id="last-messages-2**53"),
        pytest.param({"maxTokens": 2**70}, "memory.maxTokens", id="max-tokens-2**70"),
        pytest.param({"maxTokens": 1e300}, "memory.maxTokens", id="max-tokens-huge-float"),
        pytest.param({"maxTokens": 2**70, "atMaxRemoveTokens": 1}, "memory.maxTokens", id="pair"),
        pytest.param({"atMaxRemoveTokens": MAX_SAFE_INTEGER + 1}, "memory.atMaxRemoveTokens", id="remove"),
    ],
)
def test_counts_and_token_numbers_beyond_the_safe_integer_are_refused(
    memory: dict[str, Any], path: str
) -> None:
    """`lastMessages` 2**70 passed as an "integer >= 0" and stopped the recall loop in MongoDB's driver."""
    with pytest.raises(EventValidationError) as refused:
        decode_request(json.dumps(request(memory=memory)).encode())
    assert refused.value.path == path
    assert str(MAX_SAFE_INTEGER) in refused.value.reason


@pytest.mark.parametrize(
    "memory",
    [
        pytest.param({"lastMessages": MAX_SAFE_INTEGER}, id="last-messages-max-safe"),
        pytest.param({"lastMessages": 0}, id="last-messages-zero"),
        pytest.param({"maxTokens": MAX_SAFE_INTEGER, "atMaxRemoveTokens": MAX_SAFE_INTEGER}, id="tokens-max"),
        pytest.param({"maxTokens": float(MAX_SAFE_INTEGER)}, id="max-tokens-float"),
    ],
)
def test_counts_and_token_numbers_up_to_the_safe_integer_pass(memory: dict[str, Any]) -> None:
    decoded = decode_request(json.dumps(request(memory=memory)).encode())
    assert decoded.memory is not None


def test_large_integers_in_free_form_fields_pass_unchanged() -> None:
    """Free-form values are stored as JSON text, never as BSON numbers: a JavaScript client's 1e19 stays."""
    decoded = decode_request(json.dumps(request(metadata={"n": 10**19, "m": 2**70})).encode())
    assert decoded.metadata == {"n": 10**19, "m": 2**70}


# --- NaN and Infinity ---------------------------------------------------------------------------------------

NON_FINITE = [
    pytest.param(REQUEST, request(metadata={"x": 1}), ('"x": 1', '"x": NaN'), id="request-metadata-nan"),
    pytest.param(REQUEST, request(metadata={"x": 1}), ('"x": 1', '"x": Infinity'), id="request-infinity"),
    pytest.param(REQUEST, request(metadata={"x": 1}), ('"x": 1', '"x": -Infinity'), id="request-minus-inf"),
    pytest.param(REQUEST, request(memory={"maxTokens": 1}), ('"maxTokens": 1', '"maxTokens": NaN'), id="max"),
    pytest.param(
        REQUEST,
        request(messages=[user(extra=[1, 2])]),
        ("[1, 2]", "[1, NaN]"),
        id="message-extra",
    ),
    pytest.param(RESPONSE, response(), ('"schemaVersion": 1', '"schemaVersion": 1, "x": NaN'), id="response"),
    pytest.param(
        RESPONSE,
        response(response=[assistant() | {"content": {"format": 2, "parts": [], "metadata": {"score": 1}}}]),
        ('"score": 1', '"score": Infinity'),
        id="response-content",
    ),
    pytest.param(COMMAND, command(metadata={"x": 1}), ('"x": 1', '"x": NaN'), id="command-metadata"),
]


@pytest.mark.parametrize(("decode", "event", "literal"), NON_FINITE)
def test_nan_and_infinity_are_not_json_anywhere(
    decode: Decode, event: dict[str, Any], literal: tuple[str, str]
) -> None:
    """They were accepted and written as null into the enriched event, MongoDB and the persisted event."""
    with pytest.raises(EventValidationError, match=r"^not valid JSON: .*NaN, Infinity and -Infinity"):
        decode(raw(event, literal))


@pytest.mark.parametrize(
    ("decode", "event"),
    [
        pytest.param(REQUEST, request(metadata={"s": "NaN", "t": "Infinity"}), id="request-strings"),
        pytest.param(REQUEST, request(messages=[user("NaN and -Infinity")]), id="request-text"),
        pytest.param(COMMAND, command(metadata={"s": "NaN"}), id="command-string"),
    ],
)
def test_the_words_nan_and_infinity_in_strings_pass(decode: Decode, event: dict[str, Any]) -> None:
    decode(json.dumps(event).encode())


# --- encodings and one wording ------------------------------------------------------------------------------

ENCODINGS = [
    pytest.param("utf-16", "UTF-16 (little-endian, with a byte order mark)", id="utf-16-bom"),
    pytest.param("utf-16-le", "UTF-16 (little-endian)", id="utf-16-le"),
    pytest.param("utf-16-be", "UTF-16 (big-endian)", id="utf-16-be"),
    pytest.param("utf-32", "UTF-32 (little-endian, with a byte order mark)", id="utf-32-bom"),
    pytest.param("utf-32-le", "UTF-32 (little-endian)", id="utf-32-le"),
    pytest.param("utf-32-be", "UTF-32 (big-endian)", id="utf-32-be"),
]


@pytest.mark.parametrize("decode", [REQUEST, RESPONSE, COMMAND], ids=["request", "response", "command"])
@pytest.mark.parametrize(("codec", "name"), ENCODINGS)
def test_other_encodings_are_named_not_taken_for_schema_registry_framing(
    decode: Decode, codec: str, name: str
) -> None:
    """A UTF-16 payload was reported as "Schema Registry framing (magic byte 0, schema id 2063606272)"."""
    event = {REQUEST: request(), RESPONSE: response(), COMMAND: command()}[decode]
    with pytest.raises(EventValidationError) as refused:
        decode(json.dumps(event).encode(codec))
    assert refused.value.reason.startswith("not UTF-8: ")
    assert name in refused.value.reason
    assert "Schema Registry" not in refused.value.reason


@pytest.mark.parametrize("decode", [REQUEST, RESPONSE, COMMAND], ids=["request", "response", "command"])
def test_a_utf8_byte_order_mark_is_named(decode: Decode) -> None:
    event = {REQUEST: request(), RESPONSE: response(), COMMAND: command()}[decode]
    with pytest.raises(EventValidationError, match=r"^not valid JSON: .*UTF-8 byte order mark"):
        decode(b"\xef\xbb\xbf" + json.dumps(event).encode())


@pytest.mark.parametrize(
    "framed",
    [
        pytest.param(b"\x00\x00\x00\x00\x07" + b'{"a":1}', id="json-schema-serializer"),
        pytest.param(b"\x00\x00\x00\x01\x02\x02\x06abc", id="avro"),
    ],
)
def test_a_schema_registry_frame_is_still_named_as_one(framed: bytes) -> None:
    for decode in (REQUEST, RESPONSE, COMMAND):
        with pytest.raises(EventValidationError, match=r"^Schema Registry framing"):
            decode(framed)


@pytest.mark.parametrize("decode", [REQUEST, RESPONSE, COMMAND], ids=["request", "response", "command"])
@pytest.mark.parametrize("value", [b"{not json", b'{"a": 1', b"[]x"])
def test_one_wording_for_json_that_does_not_parse(decode: Decode, value: bytes) -> None:
    """The commands path said "Invalid JSON: ..." where the events say "not valid JSON: ..."."""
    with pytest.raises(EventValidationError, match=r"^not valid JSON: "):
        decode(value)


def test_an_ownership_refusal_does_not_name_the_owner() -> None:
    """The message becomes the dead letter's `error.message`: another tenant's id must not leak there."""
    error = ThreadOwnershipError("t1", "mallory", "alice-tenant-42")
    assert str(error) == "thread 't1' is owned by another resource"
    assert "alice-tenant-42" not in str(error)
    assert "mallory" not in str(error)
    collision = MessageIdTakenError("mallorys-thread", "mallory", "m-1")
    assert "'m-1'" in str(collision)
    assert "alice" not in str(collision)
