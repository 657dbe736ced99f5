"""`schemas.events._without_source` builds the plain `Message` directly: the same message (fields and their
order, fields set, extras and their order, no private state) as `Message.model_construct` of its values,
which it replaces (issue 33), for turn messages and enriched messages alike."""

from __future__ import annotations

import json
import random
from typing import Any

from schemas.codec import decode_response
from schemas.events import EnrichedMessage, TurnMessage
from schemas.messages import Message
from tests.memory_cases import random_messages


def _constructed(message: Message) -> Message:
    """The reference: what `_without_source` did before (`Message.model_construct`)."""
    values = {k: v for k, v in message.__dict__.items() if k != "source"}
    values.update(message.model_extra or {})
    values.pop("source", None)
    return Message.model_construct(_fields_set=message.model_fields_set - {"source"}, **values)


def _same(ours: Message, reference: Message) -> None:
    assert type(ours) is type(reference) is Message
    assert list(ours.__dict__.items()) == list(reference.__dict__.items())
    assert ours.model_fields_set == reference.model_fields_set
    assert list((ours.model_extra or {}).items()) == list((reference.model_extra or {}).items())
    assert ours.__pydantic_private__ == reference.__pydantic_private__
    assert ours.wire() == reference.wire()
    assert ours == reference


def _input(seed: int) -> list[TurnMessage]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = random_messages(seed, 5)
    for i, message in enumerate(messages):
        message["threadId"], message["resourceId"] = "t", "r"
        if rng.random() < 0.6:
            message["source"] = rng.choice(["memory", "input"])
        if rng.random() < 0.4:
            message["custom"] = {"i": i}
        if rng.random() < 0.3:
            message["zeta"] = [i]  # extras keep their order
        if rng.random() < 0.2:
            message.pop("createdAt")
    event = {
        "schemaVersion": 1,
        "requestId": f"q{seed}",
        "threadId": "t",
        "resourceId": "r",
        "createdAt": "2025-03-01T10:00:00.000Z",
        "input": messages,
        "response": [],
    }
    return decode_response(json.dumps(event).encode()).input


def test_a_turn_message_without_source_is_what_model_construct_made() -> None:
    for seed in range(300):
        for message in _input(seed):
            _same(message.to_message(), _constructed(message))


def test_an_enriched_message_without_source_is_what_model_construct_made() -> None:
    for seed in range(100):
        for message in _input(seed):
            plain = message.to_message()
            enriched = EnrichedMessage.from_message(plain, "memory", thread_id="t", resource_id="r")
            _same(enriched.to_message(), _constructed(enriched))
