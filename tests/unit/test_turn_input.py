"""`core.persist_plan.turn_input` builds each tagged input message in one construction: the same message
(fields, fields set, extras and their order, the `source` tag) as the two copies it replaces."""

from __future__ import annotations

import json
import random

from message_history.core.persist_plan import saved_input, turn_input
from message_history.core.rules import (
    is_memory_sourced,
    select_for_persistence,
    with_source,
    without_source,
)
from schemas.codec import decode_response
from schemas.events import AgentResponse
from schemas.messages import Message
from tests.memory_cases import random_messages


def _two_copies(response: AgentResponse) -> list[Message]:
    out: list[Message] = []
    for message in response.input:
        plain = message.to_message()
        out.append(with_source(plain, message.source) if message.source is not None else plain)
    return out


def _response(seed: int) -> AgentResponse:
    rng = random.Random(seed)
    messages = random_messages(seed, 6)
    for i, message in enumerate(messages):
        message["threadId"], message["resourceId"] = "t", "r"
        if rng.random() < 0.7:
            message["source"] = rng.choice(["memory", "input"])
        if rng.random() < 0.3:
            message["custom"] = {"i": i}
        if rng.random() < 0.2:
            message.pop("createdAt")
    event = {
        "schemaVersion": 1,
        "requestId": f"q{seed}",
        "threadId": "t",
        "resourceId": "r",
        "createdAt": "2025-03-01T10:00:00.000Z",
        "input": messages[:4],
        "response": messages[4:],
    }
    return decode_response(json.dumps(event).encode())


def test_one_construction_gives_the_two_copies_message() -> None:
    tagged = 0
    for seed in range(300):
        response = _response(seed)
        ours, theirs = turn_input(response), _two_copies(response)
        assert ours == theirs
        for a, b in zip(ours, theirs, strict=True):
            assert type(a) is type(b) is Message
            assert a.model_fields_set == b.model_fields_set
            assert list((a.model_extra or {}).items()) == list((b.model_extra or {}).items())
            assert a.wire() == b.wire()
            assert is_memory_sourced(a) == is_memory_sourced(b)
            assert without_source(a).wire() == without_source(b).wire()
            tagged += "source" in a.model_fields_set
    assert tagged > 500


def _decision_fields(messages: list[Message]) -> list[tuple[object, ...]]:
    return [
        (type(m), m.wire(), m.model_fields_set, list((m.model_extra or {}).items()), m.__dict__)
        for m in messages
    ]


def test_the_saved_input_decides_as_the_tagged_input() -> None:
    """`saved_input` leaves out what `select_for_persistence` drops and skips the tag it removes: the same
    decision (skip reason, messages with their fields set and extras in order) as from `turn_input`."""
    skipped = saved = 0
    for seed in range(400):
        response = _response(seed)
        for finish in (None, "stop", "error"):
            for response_messages in (response.response, []):
                decisions = [
                    select_for_persistence(
                        chosen,
                        response_messages,
                        finish_reason=finish,
                        read_only=False,
                        has_thread=True,
                    )
                    for chosen in (saved_input(response), turn_input(response))
                ]
                ours, theirs = decisions
                assert ours.skipped == theirs.skipped
                assert _decision_fields(ours.messages) == _decision_fields(theirs.messages)
                skipped += ours.skipped is not None
                saved += bool(ours.messages)
    assert skipped  # both kinds of decision were met
    assert saved
