"""`schemas.events`: decoding, validation (typed errors with path and reason), limits, normalization."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.errors import EventValidationError, InvalidInputError
from schemas.codec import decode_enriched, decode_persisted, decode_request, decode_response, encode
from schemas.events import (
    MAX_REASON_CHARS,
    AgentRequest,
    AgentResponse,
    EnrichedMessage,
    EnrichedRequest,
    HistoryPersisted,
)
from schemas.ids import Kind, derived_message_id
from schemas.limits import Limits
from schemas.messages import Message, MessageContent, TextPart

T0 = "2025-01-01T11:00:00.000Z"
T0_DT = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)


def user(text: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}, **fields}


def complete(message: dict[str, Any], i: int = 0) -> dict[str, Any]:
    """The message with every field the service would otherwise fill."""
    return {"id": f"m{i}", "createdAt": T0, "threadId": "t1", "resourceId": "r1", **message}


def request(**over: Any) -> dict[str, Any]:
    base = {
        "schemaVersion": 1,
        "requestId": "req-1",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": T0,
        "messages": [complete(user())],
    }
    return base | over


def response(**over: Any) -> dict[str, Any]:
    base = {
        "schemaVersion": 1,
        "requestId": "req-1",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": T0,
        "input": [complete(user())],
        "response": [complete({"role": "assistant", "content": {"format": 2, "parts": []}}, 1)],
    }
    return base | over


def raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def part_message(part: dict[str, Any]) -> dict[str, Any]:
    return complete({"role": "assistant", "content": {"format": 2, "parts": [part]}})


def tool(state: str, **extra: Any) -> dict[str, Any]:
    call = {"state": state, "toolCallId": "c1", "toolName": "calc", "args": {"a": 1}, **extra}
    return {"type": "tool-invocation", "toolInvocation": call}


# --- valid input ----------------------------------------------------------------------------------

VALID_PARTS = [
    pytest.param({"type": "text", "text": "t"}, id="text"),
    pytest.param(
        {"type": "reasoning", "reasoning": "r", "details": [{"type": "redacted", "data": "x"}]},
        id="reasoning",
    ),
    pytest.param(tool("partial-call"), id="tool-partial-call"),
    pytest.param(tool("call"), id="tool-call"),
    pytest.param(tool("result", result={"v": 3}), id="tool-result"),
    pytest.param(
        {"type": "source", "source": {"sourceType": "url", "id": "s", "url": "https://x"}}, id="source"
    ),
    pytest.param(
        {"type": "source-document", "sourceId": "d", "mediaType": "text/plain", "title": "T"}, id="src-doc"
    ),
    pytest.param({"type": "file", "mimeType": "image/png", "data": "aGk="}, id="file"),
    pytest.param({"type": "step-start"}, id="step-start"),
    pytest.param({"type": "error", "error": {"name": "E", "message": "m"}}, id="error"),
    pytest.param({"type": "data-weather", "data": {"c": 21}}, id="data-star"),
    pytest.param({"type": "some-future-kind", "x": [1]}, id="unknown-kind"),
]


@pytest.mark.parametrize("part", VALID_PARTS)
def test_each_part_type_passes_through_request_and_response_unchanged(part: dict[str, Any]) -> None:
    """A request and a response carrying each part kind decode and encode back to the same JSON."""
    req = request(messages=[part_message(part)])
    assert json.loads(encode(decode_request(raw(req)))) == req
    resp = response(response=[part_message(part) | {"id": "m9"}])
    assert json.loads(encode(decode_response(raw(resp)))) == resp


def test_unknown_fields_survive_at_every_event_level() -> None:
    """Unknown keys on the event, in memory, in metadata and in messages come back out unchanged."""
    req = request(
        metadata={"tenant": "acme", "nested": {"a": [1, None]}},
        memory={"lastMessages": False, "readOnly": True, "futureOption": 1},
        traceHint="x",
        messages=[complete(user(), 0) | {"clientField": {"k": "v"}}],
    )
    assert json.loads(encode(decode_request(raw(req)))) == req


@pytest.mark.parametrize(
    ("document", "decode"),
    [
        pytest.param(request(extraTop=1), decode_request, id="AgentRequest"),
        pytest.param(
            response(finishReason="stop", memory={"readOnly": False}, extraTop=[1]),
            decode_response,
            id="resp",
        ),
        pytest.param(
            request(
                messages=[complete(user()) | {"source": "memory"}],
                history={"recalled": 1, "limit": 40},
                eventId="req-1",
                extraTop={"x": 1},
            ),
            decode_enriched,
            id="EnrichedRequest",
        ),
        pytest.param(
            {
                "schemaVersion": 1,
                "requestId": "req-1",
                "threadId": "t1",
                "resourceId": "r1",
                "createdAt": T0,
                "eventId": "req-1",
                "savedMessageIds": ["a", "b"],
                "skipped": None,
                "threadUpdatedAt": "2025-01-01T11:00:02.000Z",
                "extraTop": True,
            },
            decode_persisted,
            id="HistoryPersisted",
        ),
    ],
)
def test_every_event_type_round_trips_losslessly(document: dict[str, Any], decode: Any) -> None:
    """Each of the four events decodes and encodes back to exactly the JSON it came as."""
    assert json.loads(encode(decode(raw(document)))) == document


def test_non_ascii_text_round_trips_as_utf8() -> None:
    """Non-ASCII text is written as UTF-8 and reads back identical."""
    req = request(messages=[complete(user("héllo, 世界 🎉"))])
    encoded = encode(decode_request(raw(req)))
    assert "世界 🎉".encode() in encoded
    assert json.loads(encoded) == req


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        pytest.param({"lastMessages": 0}, 0, id="zero"),
        pytest.param({"lastMessages": 40}, 40, id="forty"),
        pytest.param({"lastMessages": False}, False, id="false-turns-history-off"),
        pytest.param({"lastMessages": None}, None, id="null-means-default"),
        pytest.param({}, None, id="absent-means-default"),
    ],
)
def test_last_messages_accepts_int_false_or_null(memory: dict[str, Any], expected: Any) -> None:
    """`memory.lastMessages` is a non-negative int, `false` (history off) or null (service default)."""
    event = decode_request(raw(request(memory=memory)))
    assert event.memory is not None
    assert event.memory.lastMessages is expected or event.memory.lastMessages == expected
    assert type(event.memory.lastMessages) is type(expected)


# --- bad input ------------------------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param(b"not json", "", "not valid JSON", id="not-json"),
    pytest.param(b"", "", "not valid JSON", id="empty"),
    pytest.param(b'{"requestId": "\xff\xfe"}', "", "not valid JSON", id="not-utf8"),
    pytest.param(b"[1, 2]", "", "object", id="array"),
    pytest.param(b'"a string"', "", "object", id="string"),
    pytest.param(
        raw({k: v for k, v in request().items() if k != "threadId"}),
        "threadId",
        "Field required",
        id="no-thread",
    ),
    pytest.param(raw(request(threadId=None)), "threadId", "valid string", id="null-thread"),
    pytest.param(raw(request(threadId=42)), "threadId", "valid string", id="numeric-thread"),
    pytest.param(raw(request(threadId="   ")), "threadId", "blank", id="blank-thread"),
    pytest.param(raw(request(requestId="")), "requestId", "blank", id="empty-request-id"),
    pytest.param(raw(request(resourceId="\t")), "resourceId", "blank", id="blank-resource"),
    pytest.param(
        raw({k: v for k, v in request().items() if k != "resourceId"}), "resourceId", "required", id="no-res"
    ),
    pytest.param(
        raw({k: v for k, v in request().items() if k != "schemaVersion"}),
        "schemaVersion",
        "required",
        id="nov",
    ),
    pytest.param(raw(request(schemaVersion=2)), "schemaVersion", "unsupported", id="version-2"),
    pytest.param(raw(request(schemaVersion="1")), "schemaVersion", "unsupported", id="version-string"),
    pytest.param(raw(request(schemaVersion=True)), "schemaVersion", "unsupported", id="version-true"),
    pytest.param(raw(request(createdAt="noon")), "createdAt", "datetime", id="bad-created-at"),
    pytest.param(
        raw({k: v for k, v in request().items() if k != "createdAt"}), "createdAt", "required", id="no-date"
    ),
    pytest.param(raw(request(messages={"0": user()})), "messages", "valid array", id="messages-object"),
    pytest.param(raw(request(metadata=[1])), "metadata", "object", id="metadata-list"),
    pytest.param(
        raw(request(memory={"lastMessages": -1})), "memory.lastMessages", "non-negative", id="lm-negative"
    ),
    pytest.param(
        raw(request(memory={"lastMessages": True})), "memory.lastMessages", "non-negative", id="lm-true"
    ),
    pytest.param(
        raw(request(memory={"lastMessages": "5"})), "memory.lastMessages", "non-negative", id="lm-string"
    ),
    pytest.param(
        raw(request(memory={"lastMessages": 2.5})), "memory.lastMessages", "non-negative", id="lm-float"
    ),
    pytest.param(
        raw(request(memory={"readOnly": "yes"})), "memory.readOnly", "boolean", id="read-only-string"
    ),
    pytest.param(
        raw(request(messages=[user(), user() | {"role": "tool"}])), "messages.1.role", "'user'", id="role"
    ),
    pytest.param(
        raw(request(messages=[{"role": "user"}])), "messages.0.content", "required", id="no-content"
    ),
    pytest.param(
        raw(request(messages=[user() | {"id": 7}])), "messages.0.id", "valid string", id="numeric-msg-id"
    ),
    pytest.param(raw(request(messages=[user() | {"id": " "}])), "messages.0.id", "blank", id="blank-msg-id"),
    pytest.param(
        raw(request(messages=[user(), user() | {"threadId": "t2"}])),
        "messages.1.threadId",
        "contradicts",
        id="message-thread-contradicts",
    ),
    pytest.param(
        raw(request(messages=[user() | {"resourceId": "someone-else"}])),
        "messages.0.resourceId",
        "contradicts",
        id="message-resource-contradicts",
    ),
    pytest.param(
        raw(request(messages=[part_message({"type": 5})])),
        "messages.0.content.parts.0",
        "string 'type'",
        id="part-type-not-string",
    ),
    pytest.param(
        raw(request(messages=[part_message({"type": "text", "text": None})])),
        "messages.0.content.parts.0.text",
        "valid string",
        id="text-part-null-text",
    ),
    pytest.param(
        raw(request(messages=[part_message(tool("done"))])),
        "messages.0.content.parts.0.toolInvocation.state",
        "'partial-call'",
        id="unknown-tool-state",
    ),
    pytest.param(
        raw(request(messages=[part_message({"type": "file", "data": "x"})])),
        "messages.0.content.parts.0.mimeType",
        "required",
        id="file-without-mime-type",
    ),
    pytest.param(
        raw(request(messages=[part_message({"type": "data-"})])),
        "messages.0.content.parts.0.type",
        "pattern",
        id="data-part-without-name",
    ),
]


@pytest.mark.parametrize(("data", "path", "reason"), BAD_REQUESTS)
def test_bad_requests_raise_one_typed_error_with_path_and_reason(data: bytes, path: str, reason: str) -> None:
    """Each malformed request raises EventValidationError naming the field path and a short reason."""
    with pytest.raises(EventValidationError) as caught:
        decode_request(data)
    assert isinstance(caught.value, InvalidInputError)  # a dead letter, never retried
    assert not caught.value.retriable
    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value) == (f"{path}: {caught.value.reason}" if path else caught.value.reason)


BAD_RESPONSES = [
    pytest.param({k: v for k, v in response().items() if k != "input"}, "input", "required", id="no-input"),
    pytest.param(
        {k: v for k, v in response().items() if k != "response"}, "response", "required", id="no-response"
    ),
    pytest.param(
        response(input=[complete(user()) | {"source": "cache"}]), "input.0.source", "'memory'", id="source"
    ),
    pytest.param(response(finishReason=1), "finishReason", "valid string", id="finish-reason"),
    pytest.param(
        response(response=[user() | {"threadId": "other"}]), "response.0.threadId", "contradicts", id="thr"
    ),
    pytest.param(response(memory={"readOnly": 1}), "memory.readOnly", "boolean", id="read-only-int"),
]


@pytest.mark.parametrize(("document", "path", "reason"), BAD_RESPONSES)
def test_bad_responses_raise_one_typed_error_with_path_and_reason(
    document: dict[str, Any], path: str, reason: str
) -> None:
    """Each malformed response raises EventValidationError naming the field path and a short reason."""
    with pytest.raises(EventValidationError) as caught:
        decode_response(raw(document))
    assert (caught.value.path, reason in caught.value.reason) == (path, True)


def test_reasons_are_short_and_do_not_echo_the_input() -> None:
    """A huge bad value yields a capped reason that does not contain the value itself."""
    huge = "SECRET" * 5000
    for document in (request(messages=[user() | {"role": huge}]), request(createdAt=huge)):
        with pytest.raises(EventValidationError) as caught:
            decode_request(raw(document))
        assert len(caught.value.reason) <= MAX_REASON_CHARS
        assert "SECRET" not in str(caught.value)
        assert caught.value.__cause__ is None  # the pydantic error (with input excerpts) is not chained


def test_several_errors_are_reported_as_the_first_plus_a_count() -> None:
    """When several fields are wrong, the first is named and the rest are counted."""
    with pytest.raises(EventValidationError) as caught:
        decode_request(raw({"schemaVersion": 1}))
    assert caught.value.path == "requestId"
    assert caught.value.reason == "Field required (and 4 more)"


# --- limits ---------------------------------------------------------------------------------------

SMALL = Limits(max_event_bytes=4096, max_messages_per_event=3, max_parts_per_message=2, max_id_length=10)


def _parts(n: int) -> dict[str, Any]:
    return complete({"role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "x"}] * n}})


LIMIT_CASES = [
    pytest.param(
        decode_request, request(metadata={"pad": "x" * 4096}), "", "bytes; the limit is 4096", id="bytes"
    ),
    pytest.param(decode_request, request(messages=[user()] * 4), "messages", "4 messages", id="messages"),
    pytest.param(decode_response, response(input=[user()] * 4), "input", "4 messages", id="response-input"),
    pytest.param(
        decode_response, response(response=[user()] * 4), "response", "4 messages", id="response-messages"
    ),
    pytest.param(
        decode_request,
        request(messages=[user(), _parts(3)]),
        "messages.1.content.parts",
        "3 parts",
        id="parts",
    ),
    pytest.param(decode_request, request(requestId="r" * 11), "requestId", "11 characters", id="request-id"),
    pytest.param(decode_request, request(threadId="t" * 11), "threadId", "11 characters", id="thread-id"),
    pytest.param(
        decode_request, request(resourceId="u" * 11), "resourceId", "11 characters", id="resource-id"
    ),
    pytest.param(
        decode_request, request(messages=[user() | {"id": "m" * 11}]), "messages.0.id", "11 char", id="msg-id"
    ),
    pytest.param(
        decode_response, response(input=[user() | {"id": "m" * 11}]), "input.0.id", "11 char", id="input-id"
    ),
]


@pytest.mark.parametrize(("decode", "document", "path", "reason"), LIMIT_CASES)
def test_each_limit_is_enforced_with_path_and_reason(
    decode: Any, document: Any, path: str, reason: str
) -> None:
    """Going one over any configured limit raises EventValidationError naming the limit and where."""
    with pytest.raises(EventValidationError) as caught:
        decode(raw(document), SMALL)
    assert caught.value.path == path
    assert reason in caught.value.reason


def test_values_exactly_at_the_limits_are_accepted() -> None:
    """An event with exactly the maximum messages, parts and id length decodes."""
    document = request(
        requestId="r" * 10, threadId="t" * 10, resourceId="u" * 10, messages=[user(), user(), _parts(2)]
    )
    document["messages"][2] |= {"id": "m" * 10, "threadId": "t" * 10, "resourceId": "u" * 10}
    data = raw(document)
    event = decode_request(data, Limits(max_event_bytes=len(data), **{k: getattr(SMALL, k) for k in _OTHER}))
    assert [len(m.content.parts) for m in event.messages] == [1, 1, 2]


_OTHER = ("max_messages_per_event", "max_parts_per_message", "max_id_length")


def test_size_is_checked_before_parsing() -> None:
    """An oversized record is refused for its size even when it is not JSON at all."""
    with pytest.raises(EventValidationError) as caught:
        decode_request(b"\xff" * 5000, SMALL)
    assert "bytes" in caught.value.reason


def test_str_input_is_measured_in_utf8_bytes() -> None:
    """A str event is measured in UTF-8 bytes, not characters."""
    text = json.dumps(request(metadata={"pad": "é" * 2000}), ensure_ascii=False)
    assert len(text) < 4096 < len(text.encode())
    with pytest.raises(EventValidationError, match="bytes"):
        decode_request(text, SMALL)


def test_str_input_that_has_no_utf8_form_is_refused() -> None:
    """A str holding a lone surrogate (no UTF-8 encoding) is an EventValidationError, not a UnicodeError."""
    text = json.dumps(request(metadata={"x": "\ud800"}), ensure_ascii=False)
    with pytest.raises(EventValidationError, match="not valid UTF-8"):
        decode_request(text)


def test_too_deep_nesting_is_refused_as_invalid_json() -> None:
    """JSON nested deeper than the parser's recursion limit is refused cleanly, not with a crash."""
    deep = '{"a":' * 3000 + "1" + "}" * 3000
    data = json.dumps(request())[:-1] + f', "metadata": {deep}}}'
    with pytest.raises(EventValidationError, match="recursion limit"):
        decode_request(data.encode())


def test_default_limits_match_the_settings_defaults() -> None:
    """`Limits()` and `Limits.from_settings(Settings())` agree, so the documented defaults are one set."""
    from message_history.settings import Settings  # noqa: PLC0415

    assert Limits.from_settings(Settings()) == Limits()
    assert Limits() == Limits(1_048_576, 1000, 1000, 256)


# --- normalization: ids, createdAt, thread and resource -------------------------------------------


def _derived(kind: Kind, position: int) -> str:
    """The id the service gives the message at `position` of `kind` of the test events (r1, t1, req-1)."""
    return derived_message_id("r1", "t1", "req-1", kind, position)


def test_request_messages_get_deterministic_ids_timestamps_thread_and_resource() -> None:
    """Missing fields come from the event: an id derived from resource, thread, request and position,
    createdAt + i ms, thread, resource."""
    document = request(
        messages=[user("a"), user("b") | {"id": "keep", "createdAt": "2024-12-31T00:00:00.000Z"}, user()]
    )
    event = decode_request(raw(document))
    assert [m.id for m in event.messages] == [_derived("input", 0), "keep", _derived("input", 2)]
    assert [m.createdAt for m in event.messages] == [
        T0_DT,
        datetime(2024, 12, 31, tzinfo=UTC),
        T0_DT + timedelta(milliseconds=2),
    ]
    assert {(m.threadId, m.resourceId) for m in event.messages} == {("t1", "r1")}
    for message in event.messages:  # filled values are "set", so the wire form carries them
        assert {"id", "createdAt", "threadId", "resourceId"} <= message.model_fields_set
    wire = json.loads(encode(event))["messages"]
    assert [(m["id"], m["createdAt"]) for m in wire] == [
        (_derived("input", 0), "2025-01-01T11:00:00.000Z"),
        ("keep", "2024-12-31T00:00:00.000Z"),
        (_derived("input", 2), "2025-01-01T11:00:00.002Z"),
    ]
    assert all(m["threadId"] == "t1" and m["resourceId"] == "r1" for m in wire)


def test_response_numbers_input_then_response_as_one_turn() -> None:
    """Response input i gets +i ms and the id of (input, i); response j gets +(len(input)+j) ms and the id
    of (response, j)."""
    document = response(input=[user(), user()], response=[user() | {"role": "assistant"}] * 3)
    event = decode_response(raw(document))
    assert [m.id for m in event.input] == [_derived("input", 0), _derived("input", 1)]
    assert [m.id for m in event.response] == [_derived("response", j) for j in range(3)]
    stamps = [m.createdAt for m in [*event.input, *event.response]]
    offsets = [(t - T0_DT) // timedelta(milliseconds=1) for t in stamps if t is not None]
    assert offsets == [0, 1, 2, 3, 4]


def test_replaying_the_same_bytes_gives_the_same_ids_and_timestamps() -> None:
    """Normalization is a function of the event: decoding the same record twice encodes identically."""
    data = raw(response(input=[user()], response=[user() | {"role": "assistant"}]))
    assert encode(decode_response(data)) == encode(decode_response(data))


def test_request_ids_match_the_ids_a_worker_echoes_back() -> None:
    """The request's filled ids are what the response's input carries, so input is saved once, not twice."""
    req = decode_request(raw(request(messages=[user("q")])))
    enriched = EnrichedRequest.from_request(req, [(m, "input") for m in req.messages], recalled=0, limit=40)
    echoed = json.loads(encode(enriched))["messages"]
    resp = decode_response(raw(response(input=echoed, response=[user() | {"role": "assistant"}])))
    assert [m.id for m in resp.input] == [m.id for m in req.messages] == [_derived("input", 0)]


# --- building the service's events ----------------------------------------------------------------


def test_enriched_request_is_the_same_event_with_context_history_and_event_id() -> None:
    """from_request keeps every field, extra and metadata, tags each source, adds history and eventId."""
    req = decode_request(
        raw(request(metadata={"m": 1}, memory={"lastMessages": 5}, gateway="g1", messages=[user("now")]))
    )
    stored = Message.model_validate(
        {
            "id": "old",
            "role": "assistant",
            "createdAt": "2024-01-01T00:00:00.000Z",
            "content": "before",
            "x": 1,
        }
    )
    enriched = EnrichedRequest.from_request(
        req, [(stored, "memory"), (req.messages[0], "input")], recalled=1, limit=5
    )
    out = json.loads(encode(enriched))
    assert {
        k: out[k]
        for k in ("requestId", "threadId", "resourceId", "createdAt", "metadata", "memory", "gateway")
    } == {
        "requestId": "req-1",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": T0,
        "metadata": {"m": 1},
        "memory": {"lastMessages": 5},
        "gateway": "g1",
    }
    assert out["schemaVersion"] == 1
    assert out["eventId"] == "req-1"
    assert out["history"] == {"recalled": 1, "limit": 5, "complete": True, "waitedMs": 0}
    assert [(m["id"], m["source"]) for m in out["messages"]] == [
        ("old", "memory"),
        (_derived("input", 0), "input"),
    ]
    assert out["messages"][0]["x"] == 1  # the stored message's unknown field travels too
    assert (out["messages"][0]["threadId"], out["messages"][0]["resourceId"]) == ("t1", "r1")  # filled
    assert enriched.messages[1].content is req.messages[0].content  # tagged, not re-validated or copied


def test_enriched_request_with_no_limit_writes_null() -> None:
    """`history.limit` is written as null when recall had no limit (lastMessages false)."""
    req = decode_request(raw(request()))
    out = json.loads(encode(EnrichedRequest.from_request(req, [], recalled=0, limit=None)))
    assert out["history"] == {"recalled": 0, "limit": None, "complete": True, "waitedMs": 0}
    assert out["messages"] == []


def test_enriched_message_needs_an_id_and_created_at() -> None:
    """Tagging a message that was never normalized is a programming error, caught at once."""
    bare = Message.model_validate({"role": "user", "content": "x"})
    with pytest.raises(ValueError, match="id and a createdAt"):
        EnrichedMessage.from_message(bare, "input", thread_id="t", resource_id="r")


def test_source_is_stripped_for_storage() -> None:
    """`to_message` gives the stored form: the same keys and values minus the event-only `source`."""
    doc = complete(user()) | {"source": "memory", "clientField": 1}
    resp = decode_response(raw(response(input=[doc])))
    stored = resp.input[0].to_message()
    assert type(stored) is Message
    assert stored.wire() == {k: v for k, v in doc.items() if k != "source"}
    enriched = decode_enriched(
        raw(request(messages=[doc], history={"recalled": 1, "limit": 1}, eventId="req-1"))
    )
    assert enriched.messages[0].to_message().wire() == stored.wire()


@pytest.mark.parametrize(
    ("skipped", "saved"),
    [
        pytest.param(None, ["a", "b"], id="saved"),
        pytest.param("read-only", [], id="read-only"),
        pytest.param("no-thread", [], id="no-thread"),
        pytest.param("failed-turn", [], id="failed-turn"),
        pytest.param("nothing-to-save", [], id="nothing-to-save"),
    ],
)
def test_history_persisted_carries_the_response_identity(skipped: Any, saved: list[str]) -> None:
    """for_response copies the response's identity, createdAt and metadata, and writes every outcome field."""
    resp = decode_response(raw(response(metadata={"k": "v"}, createdAt="2025-01-01T11:00:05.000Z", extra=1)))
    updated = datetime(2025, 1, 1, 11, 0, 6, 123456, tzinfo=UTC)
    out = json.loads(
        encode(
            HistoryPersisted.for_response(
                resp, saved_ids=iter(saved), skipped=skipped, thread_updated_at=updated
            )
        )
    )
    assert out == {
        "schemaVersion": 1,
        "requestId": "req-1",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": "2025-01-01T11:00:05.000Z",
        "metadata": {"k": "v"},
        "eventId": "req-1",
        "savedMessageIds": saved,
        "skipped": skipped,
        "threadUpdatedAt": "2025-01-01T11:00:06.123Z",
    }
    assert decode_persisted(encode(HistoryPersisted.model_validate(out))).savedMessageIds == saved


def test_history_persisted_omits_metadata_the_response_did_not_have() -> None:
    """Without metadata on the response there is none on the outcome (not even null)."""
    resp = decode_response(raw(response()))
    out = json.loads(
        encode(HistoryPersisted.for_response(resp, saved_ids=[], skipped=None, thread_updated_at=None))
    )
    assert "metadata" not in out
    assert out["threadUpdatedAt"] is None


def test_events_built_in_python_always_encode_schema_version() -> None:
    """An event constructed without schemaVersion still writes it, and the wire form decodes again."""
    event = AgentRequest(
        requestId="r",
        threadId="t",
        resourceId="u",
        createdAt=T0_DT,
        messages=[Message(role="user", content=MessageContent(parts=[TextPart(type="text", text="x")]))],
    )
    out = json.loads(encode(event))
    assert out["schemaVersion"] == 1
    assert decode_request(encode(event)).messages[0].id == derived_message_id("u", "t", "r", "input", 0)


def test_encode_is_compact_utf8_json_bytes() -> None:
    """encode returns bytes of compact JSON (no indentation or spaces between tokens)."""
    data = encode(decode_request(raw(request())))
    assert isinstance(data, bytes)
    assert b"\n" not in data
    assert b'", "' not in data
    assert json.loads(data) == request()


def test_agent_response_input_messages_are_typed_with_their_source() -> None:
    """AgentResponse.input exposes `source`, so the persist path can skip memory messages without guessing."""
    resp = decode_response(
        raw(response(input=[complete(user(), 0) | {"source": "memory"}, complete(user(), 1)]))
    )
    assert [m.source for m in resp.input] == ["memory", None]
    assert isinstance(resp, AgentResponse)
