"""A token-budgeted conversation with tool calls, end to end through Kafka and the MongoDB-wire server.

The service's enriched events (context, `history.tokens`, `trimmed`, `boundary`) must equal what the library
computes for the same conversation over the in-memory storage, turn after turn, and the boundary stored in
`thread.metadata.memoryTokenLimiter` must advance as the history outgrows the budget.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.core.budget import BOUNDARY_KEY, resolve_budget
from message_history.processor import MessageHistory
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    running_service,
    stored_threads,
    values,
)
from tests.integration.stream_helpers import Record, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

THREAD, RESOURCE = "budgeted", "user-b"
TURNS = 8
MEMORY = {"maxTokens": 260, "atMaxRemoveTokens": 100}
T0 = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)


def _at(turn: int, ms: int) -> str:
    return (
        (T0 + timedelta(minutes=turn, milliseconds=ms))
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _message(id: str, role: str, ms_turn: int, ms: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id, "role": role, "createdAt": _at(ms_turn, ms), "content": {"format": 2, "parts": parts}}


def _turn(turn: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The user message and the response of a turn: a tool call with its result, then a long answer."""
    user = _message(
        f"u{turn}", "user", turn, 0, [{"type": "text", "text": f"Question {turn}: what is {turn}+{turn}?"}]
    )
    call = {
        "state": "result",
        "toolCallId": f"c{turn}",
        "toolName": "add",
        "args": {"a": turn, "b": turn},
        "result": {"sum": 2 * turn},
    }
    response = [
        _message(
            f"a{turn}-tool", "assistant", turn, 100, [{"type": "tool-invocation", "toolInvocation": call}]
        ),
        _message(
            f"a{turn}-text",
            "assistant",
            turn,
            200,
            [{"type": "text", "text": f"The answer is {2 * turn}. " + "Here is a longer explanation. " * 8}],
        ),
    ]
    return user, response


def _request(turn: int, user: dict[str, Any]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": f"req-{turn}",
        "threadId": THREAD,
        "resourceId": RESOURCE,
        "createdAt": _at(turn, 0),
        "messages": [user],
        "memory": MEMORY,
    }


def _response(turn: int, context: list[dict[str, Any]], response: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": f"req-{turn}",
        "threadId": THREAD,
        "resourceId": RESOURCE,
        "createdAt": _at(turn, 300),
        "input": context,
        "response": response,
        "finishReason": "stop",
    }


def _has(request_id: str) -> Callable[[list[Record]], bool]:
    return lambda records: any(v["requestId"] == request_id for v in values(records))


async def _expected() -> list[dict[str, Any]]:
    """The library's recall for each turn, over the in-memory storage."""
    storage = InMemoryHistoryStorage()
    history = MessageHistory(storage=storage)
    budget = resolve_budget(MEMORY["maxTokens"], MEMORY["atMaxRemoveTokens"])
    out = []
    for turn in range(1, TURNS + 1):
        user, response = _turn(turn)
        user_message = Message.model_validate(user | {"threadId": THREAD, "resourceId": RESOURCE})
        outcome = await history.recall(
            thread_id=THREAD,
            resource_id=RESOURCE,
            incoming=[user_message],
            last_messages=False,
            budget=budget,
        )
        out.append(
            {
                "memory": [m.id for m, s in outcome.context if s == "memory"],
                "tokens": outcome.tokens,
                "trimmed": outcome.trimmed,
                "boundary": outcome.boundary.to_metadata() if outcome.boundary is not None else None,
            }
        )
        saved = [Message.model_validate(m) for m in [user, *response]]
        await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=saved)
    return out


async def test_budgeted_conversation_with_tool_calls_advances_the_boundary(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Every turn's recall equals the library's; the stored boundary advances more than once."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    bootstrap = settings.kafka_bootstrap_servers
    expected = await _expected()
    seen: list[dict[str, Any]] = []
    try:
        async with running_service(settings):
            for turn in range(1, TURNS + 1):
                user, response = _turn(turn)
                await produce(bootstrap, settings.requests_topic, [encoded(_request(turn, user))])
                enriched = await read_topic(bootstrap, settings.enriched_topic, until=_has(f"req-{turn}"))
                event = next(v for v in values(enriched) if v["requestId"] == f"req-{turn}")
                seen.append(event)
                await produce(
                    bootstrap,
                    settings.responses_topic,
                    [encoded(_response(turn, event["messages"], response))],
                )
                await read_topic(bootstrap, settings.persisted_topic, until=_has(f"req-{turn}"))
        threads = await stored_threads(settings)
    finally:
        await drop_database(settings)
    for turn, (event, want) in enumerate(zip(seen, expected, strict=True), start=1):
        memory = [m["id"] for m in event["messages"] if m["source"] == "memory"]
        history = event["history"]
        got = {
            "memory": memory,
            "tokens": history["tokens"],
            "trimmed": history["trimmed"],
            "boundary": history["boundary"],
        }
        assert got == want, f"turn {turn}"
        assert [m["id"] for m in event["messages"] if m["source"] == "input"] == [f"u{turn}"]
    boundaries = [e["history"]["boundary"]["createdAt"] for e in seen if e["history"]["boundary"]]
    assert len(set(boundaries)) >= 2, boundaries  # it moved forward at least twice
    assert boundaries == sorted(boundaries)
    [thread] = threads
    assert thread["metadata"][BOUNDARY_KEY] == seen[-1]["history"]["boundary"]
