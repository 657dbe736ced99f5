"""The worker SDK's pure part: the response built from a turn and a reply, the bounded memory of eventIds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.codec import decode_response, encode
from schemas.events import EnrichedRequest
from schemas.ids import derived_message_id
from worker import Reply, SeenEvents, Turn, build_response, failed_response

NOW = datetime(2025, 3, 1, 10, 5, tzinfo=UTC)


def _message(mid: str, role: str, source: str, at: str) -> dict[str, Any]:
    return {
        "id": mid,
        "role": role,
        "createdAt": at,
        "threadId": "t",
        "resourceId": "u",
        "content": {"format": 2, "parts": [{"type": "text", "text": mid}]},
        "source": source,
    }


def _turn(**extra: Any) -> Turn:
    event = {
        "schemaVersion": 1,
        "requestId": "r2",
        "eventId": "r2",
        "threadId": "t",
        "resourceId": "u",
        "createdAt": "2025-03-01T10:02:00.000Z",
        "messages": [
            _message("r1:input:0", "user", "memory", "2025-03-01T10:01:00.000Z"),
            _message("r1:response:0", "assistant", "memory", "2025-03-01T10:01:00.001Z"),
            _message("r2:input:0", "user", "input", "2025-03-01T10:02:00.000Z"),
        ],
        "history": {"recalled": 2, "limit": 40},
        **extra,
    }
    return Turn(EnrichedRequest.model_validate(event))


def test_turn_splits_memory_and_input() -> None:
    """`memory` is the recalled history, `input` the turn's own messages, `messages` both in order."""
    turn = _turn()
    assert [m.id for m in turn.memory] == ["r1:input:0", "r1:response:0"]
    assert [m.id for m in turn.input] == ["r2:input:0"]
    assert [m.id for m in turn.messages] == ["r1:input:0", "r1:response:0", "r2:input:0"]
    assert (turn.request_id, turn.event_id, turn.thread_id, turn.resource_id) == ("r2", "r2", "t", "u")


def test_turn_reads_each_of_its_request_fields() -> None:
    """Each delegating attribute reads its own field of the enriched request (not a neighbour's)."""
    turn = _turn(eventId="e2", metadata={"k": 1})
    assert (turn.request_id, turn.event_id, turn.thread_id, turn.resource_id) == ("r2", "e2", "t", "u")
    assert turn.metadata == {"k": 1}
    assert (turn.history.recalled, turn.history.limit) == (2, 40)


def test_response_echoes_ids_input_with_sources_and_the_reply() -> None:
    """The response has the turn's ids, its whole context tagged by source, and the reply's message."""
    response = build_response(_turn(metadata={"k": 1}), "hello", now=NOW)
    assert (response.requestId, response.threadId, response.resourceId) == ("r2", "t", "u")
    assert [(m.id, m.source) for m in response.input] == [
        ("r1:input:0", "memory"),
        ("r1:response:0", "memory"),
        ("r2:input:0", "input"),
    ]
    assert [m.wire() for m in response.response] == [
        {"role": "assistant", "content": {"format": 2, "parts": [{"type": "text", "text": "hello"}]}}
    ]
    assert response.finishReason == "stop"
    assert response.metadata == {"k": 1}
    # what the persist path reads back: the SDK leaves response ids to the service, which derives them
    # from the resource, thread, request and position (the same for an answer produced twice)
    decoded = decode_response(encode(response))
    assert decoded.response[0].id == derived_message_id(
        response.resourceId, response.threadId, "r2", "response", 0
    )


@pytest.mark.parametrize(
    ("memory", "reply_read_only", "expected"),
    [
        (None, None, None),
        ({"readOnly": True}, None, {"readOnly": True}),
        ({"readOnly": False}, None, {"readOnly": False}),
        ({"readOnly": True}, False, {"readOnly": False}),
        (None, True, {"readOnly": True}),
    ],
)
def test_read_only_is_the_requests_unless_the_reply_says(
    memory: dict[str, Any] | None, reply_read_only: bool | None, expected: dict[str, Any] | None
) -> None:
    """A read-only request stays read-only in its response (else the service would save the turn)."""
    turn = _turn(**({"memory": memory} if memory is not None else {}))
    response = build_response(turn, Reply((), read_only=reply_read_only), now=NOW)
    got = response.memory.model_dump(exclude_none=True) if response.memory is not None else None
    assert got == expected


def test_failed_response_has_no_response_and_finish_reason_error() -> None:
    """What the persist path skips as `failed-turn`."""
    response = failed_response(_turn(), now=NOW)
    assert (response.finishReason, response.response, len(response.input)) == ("error", [], 3)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (datetime(2025, 3, 1, 10, 5, tzinfo=UTC), "2025-03-01T10:05:00.000Z"),  # after the context: now
        (datetime(2025, 3, 1, 9, 0, tzinfo=UTC), "2025-03-01T10:02:00.001Z"),  # a clock behind: newest + 1ms
    ],
)
def test_response_created_at_is_never_before_the_context(now: datetime, expected: str) -> None:
    """The answer sorts after its question whatever the worker's clock says."""
    assert encode(build_response(_turn(), "x", now=now)).decode().count(f'"createdAt":"{expected}"') == 1


def test_seen_events_are_per_partition_and_bounded_least_recent_first() -> None:
    """An id is seen on its own partition only; past the bound the least recently seen one is forgotten."""
    seen = SeenEvents(per_partition=2)
    seen.add(0, "a")
    seen.add(0, "b")
    assert (0, "a") in seen  # touches "a": now "b" is the least recent
    assert (1, "a") not in seen
    seen.add(0, "c")
    assert [(0, e) in seen for e in ("a", "b", "c")] == [True, False, True]
    assert seen.size(0) == 2


def test_seen_events_needs_room_for_one() -> None:
    """A zero bound would drop nothing; it is refused."""
    with pytest.raises(ValueError, match="at least 1"):
        SeenEvents(per_partition=0)


def test_the_docs_example_uses_what_the_sdk_exports() -> None:
    """docs/worker.md's Python examples parse and import only names the `worker` package provides."""
    import ast  # noqa: PLC0415
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    import worker  # noqa: PLC0415

    text = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 2  # the short one beside the TypeScript example, and the SDK's section
    for block in blocks:
        tree = ast.parse(block)
        imported = [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "worker"
            for alias in node.names
        ]
        assert imported
        assert all(hasattr(worker, name) for name in imported)
        assert "from_settings" in block
