"""A client-side tool conversation through Kafka: the echo filter on recall, the tool-state merge on persist.

Turn 1 leaves a pending client tool call. Turn 2 comes useChat-style: the whole history again, the call's
result on the echoed assistant message, and a new question; only the result and the question are new input.
Turn 3 sends only a client result for the call the second answer left pending, and the model's reply is
folded into that stored assistant message (Mastra 1.71's continuation, no new row).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    running_service,
    stored_messages,
    values,
)
from tests.integration.stream_helpers import Record, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

THREAD, RESOURCE = "client-tools", "user-c"


def _at(turn: int, ms: int) -> str:
    return f"2025-03-01T10:{turn:02d}:00.{ms:03d}Z"


def _msg(id: str, role: str, turn: int, ms: int, *parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": id,
        "role": role,
        "createdAt": _at(turn, ms),
        "content": {"format": 2, "parts": list(parts)},
    }


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool(call: str, state: str, **extra: Any) -> dict[str, Any]:
    invocation = {"state": state, "toolCallId": call, "toolName": "askUser", "args": {"q": call}, **extra}
    return {"type": "tool-invocation", "toolInvocation": invocation}


def _event(turn: int, **fields: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, "requestId": f"req-{turn}", "threadId": THREAD, "resourceId": RESOURCE,
            "createdAt": _at(turn, 900), **fields}  # fmt: skip


def _has(request_id: str) -> Callable[[list[Record]], bool]:
    return lambda records: any(v["requestId"] == request_id for v in values(records))


def _parts(message: dict[str, Any]) -> list[str]:
    out = []
    for part in message["content"]["parts"]:
        if part["type"] == "tool-invocation":
            out.append(f"{part['toolInvocation']['toolCallId']}:{part['toolInvocation']['state']}")
        else:
            out.append(part.get("text", part["type"]))
    return out


async def test_client_tool_turns_filter_the_echo_and_fold_the_continuation(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Recall drops the echoed history; persist advances the stored call and folds the continuation."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    bootstrap = settings.kafka_bootstrap_servers
    u1 = _msg("u1", "user", 1, 0, _text("Summarise my file."))
    a1 = _msg("a1", "assistant", 1, 100, _text("Which file?"), _tool("c1", "call"))
    a1_answered = _msg("a1", "assistant", 1, 100, _text("Which file?"), _tool("c1", "result", result="x.txt"))
    u2 = _msg("u2", "user", 2, 0, _text("Thanks."))
    a2 = _msg("a2", "assistant", 2, 100, _text("Reading x.txt. Shall I also mail it?"), _tool("c2", "call"))
    a2_answered = _msg("a2", "assistant", 2, 100, _tool("c2", "result", result="yes"))
    a3 = _msg("a3", "assistant", 3, 100, _text("Mailed."))
    enriched: dict[int, dict[str, Any]] = {}

    async def turn(number: int, request: list[dict[str, Any]], response: list[dict[str, Any]]) -> None:
        await produce(bootstrap, settings.requests_topic, [encoded(_event(number, messages=request))])
        records = await read_topic(bootstrap, settings.enriched_topic, until=_has(f"req-{number}"))
        event = next(v for v in values(records) if v["requestId"] == f"req-{number}")
        enriched[number] = event
        answer = _event(number, input=event["messages"], response=response, finishReason="stop")
        await produce(bootstrap, settings.responses_topic, [encoded(answer)])
        await read_topic(bootstrap, settings.persisted_topic, until=_has(f"req-{number}"))

    try:
        async with running_service(settings):
            await turn(1, [u1], [a1])
            await turn(2, [u1, a1_answered, u2], [a2])  # useChat: everything again, with the client's result
            await turn(3, [a2_answered], [a3])  # only the client's result for the pending call
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)

    second = enriched[2]["messages"]
    # the stored a1 is not recalled beside the input copy of its id (docs/rules.md#r5); u1 left the input
    assert [(m["id"], m["source"]) for m in second] == [("u1", "memory"), ("a1", "input"), ("u2", "input")]
    echoed = next(m for m in second if m["id"] == "a1" and m["source"] == "input")
    assert _parts(echoed) == ["c1:result"]  # only the outcome of the call the stored copy had pending
    third = enriched[3]["messages"]
    assert [(m["id"], m["source"]) for m in third if m["source"] == "input"] == [("a2", "input")]

    by_id = {r["id"]: r for r in rows}
    assert sorted(by_id) == ["a1", "a2", "u1", "u2"]  # a3 was folded into a2: no row of its own
    contents = {i: json.loads(r["content"]) for i, r in by_id.items()}
    assert _parts({"content": contents["a1"]}) == ["Which file?", "c1:result"]
    assert _parts({"content": contents["a2"]}) == [
        "Reading x.txt. Shall I also mail it?",
        "c2:result",
        "step-start",
        "Mailed.",
    ]
