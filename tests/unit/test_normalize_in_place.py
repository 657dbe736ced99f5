"""`schemas.codec._normalize` fills a decoded message's missing `id`, `createdAt`, `threadId` and `resourceId`
in place: each message ends up as `model_copy(update=...)` of it would (the same fields in the same order,
the same fields set, the same extras, the same wire form), which it replaced (issue 33), for the requests'
messages, the responses' input (turn messages) and their response messages."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from typing import Any

import pytest

from schemas import codec
from schemas.codec import decode_request, decode_response
from schemas.events import AgentRequest, AgentResponse, EventBase
from schemas.ids import Kind, derived_message_id
from schemas.messages import Message
from tests.memory_cases import random_messages

_FILLED = ("id", "createdAt", "threadId", "resourceId")


def _by_copy(event: EventBase, messages: list[Message], kind: Kind, offset: int) -> list[Message]:
    """The reference: `_normalize` as it was, a `model_copy(update=...)` per message that lacks a field."""
    out: list[Message] = []
    for i, message in enumerate(messages):
        update: dict[str, Any] = {}
        if message.id is None:
            update["id"] = derived_message_id(event.resourceId, event.threadId, event.requestId, kind, i)
        if message.createdAt is None:
            update["createdAt"] = event.createdAt + timedelta(milliseconds=offset + i)
        if message.threadId is None:
            update["threadId"] = event.threadId
        if message.resourceId is None:
            update["resourceId"] = event.resourceId
        out.append(message.model_copy(update=update) if update else message)
    return out


def _same(ours: Message, reference: Message) -> None:
    assert type(ours) is type(reference)
    assert list(ours.__dict__.items()) == list(reference.__dict__.items())
    assert ours.model_fields_set == reference.model_fields_set
    assert list((ours.model_extra or {}).items()) == list((reference.model_extra or {}).items())
    assert ours.wire() == reference.wire()


def _messages(seed: int) -> list[dict[str, Any]]:
    """Random messages, each missing a random subset of the four filled fields (sometimes none, sometimes
    all), some with extras."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = random_messages(seed, rng.randint(1, 6))
    for message in messages:
        message["threadId"], message["resourceId"] = "t1", "r1"
        for field in _FILLED:
            if rng.random() < 0.5:
                message.pop(field, None)
        if rng.random() < 0.3:
            message["providerMetadata"] = {"seed": seed}
    return messages


def _event(seed: int, **lists: list[dict[str, Any]]) -> bytes:
    event = {
        "schemaVersion": 1,
        "requestId": f"q{seed}",
        "threadId": "t1",
        "resourceId": "r1",
        "createdAt": "2025-03-01T10:00:00.000Z",
        **lists,
    }
    return json.dumps(event).encode()


def _request(seed: int) -> bytes:
    return _event(seed, messages=_messages(seed))


def _response(seed: int) -> bytes:
    return _event(seed, input=_messages(seed), response=_messages(seed + 100_000))


@pytest.mark.parametrize("seed", range(300))
def test_a_request_is_normalized_as_by_copies(seed: int) -> None:
    raw = _request(seed)
    parsed = AgentRequest.model_validate_json(raw)
    reference = _by_copy(parsed, list(parsed.messages), "input", 0)
    ours = decode_request(raw).messages
    assert len(ours) == len(reference)
    for mine, theirs in zip(ours, reference, strict=True):
        _same(mine, theirs)


@pytest.mark.parametrize("seed", range(300))
def test_a_response_is_normalized_as_by_copies(seed: int) -> None:
    raw = _response(seed)
    parsed = AgentResponse.model_validate_json(raw)
    reference_input = _by_copy(parsed, list(parsed.input), "input", 0)
    reference_response = _by_copy(parsed, list(parsed.response), "response", len(parsed.input))
    decoded = decode_response(raw)
    mine: Message
    for mine, theirs in zip(decoded.input, reference_input, strict=True):
        _same(mine, theirs)
    for mine, theirs in zip(decoded.response, reference_response, strict=True):
        _same(mine, theirs)


def test_the_cases_fill_every_field_and_leave_some_messages_whole() -> None:
    """The seeds above reach each filled field, and messages that need nothing (the comparison is not
    vacuous)."""
    filled = {field: 0 for field in _FILLED}
    whole = 0
    for seed in range(300):
        for message in json.loads(_response(seed))["input"]:
            missing = [field for field in _FILLED if field not in message]
            whole += not missing
            for field in missing:
                filled[field] += 1
    assert whole > 0
    assert all(count > 50 for count in filled.values()), filled


def test_a_fill_not_marked_as_set_leaves_the_wire_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fields set matter: the decode's fill is in the wire form (what the enriched request and the stored
    rows are built from); filling `__dict__` alone would leave it out, which the comparison above catches."""

    def unmarked(event: EventBase, messages: list[Message], kind: Kind, offset: int) -> None:
        for i, message in enumerate(messages):
            if message.id is None:
                message.__dict__["id"] = derived_message_id(
                    event.resourceId, event.threadId, event.requestId, kind, i
                )

    raw = _event(0, messages=[{"role": "user", "content": "hi"}])
    filled = decode_request(raw).messages[0]
    assert filled.wire()["id"] == derived_message_id("r1", "t1", "q0", "input", 0)
    monkeypatch.setattr(codec, "_normalize", unmarked)
    message = decode_request(raw).messages[0]
    assert message.id == filled.id
    assert "id" not in message.wire()
