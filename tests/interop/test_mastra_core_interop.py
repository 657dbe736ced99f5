"""Interop with code nobody here wrote: Mastra's own `MessageList` (`@mastra/core`, run under Node) and ajv.

Mastra builds conversations and serializes them as `MastraDBMessage` JSON; they must pass through our models
and events unchanged. Then the messages of one of our `EnrichedRequest`s go into a fresh Mastra `MessageList`,
which must hold them with the same ids, in the same order, split into memory and input as `source` says.
Each check runs against every pinned `@mastra/core` (tests/interop/mastra-core: 0.24.9, the newest that
declares Node 20; tests/interop/mastra-core/v1: 1.71.0, the release docs/rules.md follows).

The Node packages are installed by `deploy/local/stack install --all` (`npm ci`). Without them the tests are
skipped with the reason, except under CI, where they fail.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from schemas.codec import decode_request, decode_response, encode
from schemas.events import AgentRequest, AgentResponse, EnrichedRequest, HistoryPersisted
from schemas.ids import derived_message_id
from schemas.messages import Message
from tests.infra import skip_or_fail

pytestmark = pytest.mark.interop

HERE = Path(__file__).parent / "mastra-core"
GENERATED = Path(__file__).parents[2] / "schemas" / "generated"
NODE_TIMEOUT_S = 120
THREAD = "interop-thread"  # what mastra.mjs builds with
RESOURCE = "interop-user"


def _pinned(folder: Path) -> str:
    return str(json.loads((folder / "package.json").read_text())["dependencies"]["@mastra/core"])


PACKAGES = [pytest.param(folder, id=f"mastra-core-{_pinned(folder)}") for folder in (HERE, HERE / "v1")]


def _node(folder: Path) -> str:
    """The node binary, once the packages of `folder` are installed; skip (fail under CI) otherwise."""
    node = shutil.which("node")
    reason = None
    if node is None:
        reason = "node is not on PATH"
    elif not (folder / "node_modules" / "@mastra" / "core").is_dir():
        where = folder.relative_to(HERE.parents[2])
        reason = f"{where}/node_modules is missing (run `deploy/local/stack install`)"
    if reason is not None:
        skip_or_fail(reason)
    assert node is not None
    return node


def _run(folder: Path, script: str, *args: str, stdin: bytes = b"") -> Any:
    result = subprocess.run(
        [_node(folder), script, *args],
        cwd=HERE,
        input=stdin,
        capture_output=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    return json.loads(result.stdout)


def _mastra_messages(folder: Path) -> list[dict[str, Any]]:
    built = _run(folder, "mastra.mjs", "build", str(folder))
    assert built["version"] == _pinned(folder)
    messages: list[dict[str, Any]] = built["messages"]
    return messages


def _part_kinds(messages: list[dict[str, Any]]) -> set[str]:
    kinds = set()
    for message in messages:
        for part in message["content"]["parts"]:
            kind = part["type"]
            if kind == "tool-invocation":
                kind += ":" + part["toolInvocation"]["state"]
            kinds.add(kind)
    return kinds


@pytest.mark.parametrize("folder", PACKAGES)
def test_mastra_messages_round_trip_through_message(folder: Path) -> None:
    """Every message Mastra's MessageList serializes comes out of `Message` with the same keys and values."""
    messages = _mastra_messages(folder)
    # The conversation covers what the issue asks for, so a change in Mastra cannot hollow the test out.
    assert {"text", "reasoning", "tool-invocation:result", "tool-invocation:call", "file", "source"} <= (
        _part_kinds(messages)
    )
    for original in messages:
        assert Message.model_validate_json(json.dumps(original)).wire() == original


@pytest.mark.parametrize("folder", PACKAGES)
def test_mastra_messages_round_trip_through_response_event(folder: Path) -> None:
    """Mastra's messages in an AgentResponse survive decode and encode: nothing filled, nothing lost."""
    messages = _mastra_messages(folder)
    raw = {
        "schemaVersion": 1,
        "requestId": "interop-turn",
        "threadId": THREAD,
        "resourceId": RESOURCE,
        "createdAt": messages[-1]["createdAt"],
        "input": messages[:1],
        "response": messages[1:],
        "finishReason": "stop",
    }
    out = json.loads(encode(decode_response(json.dumps(raw).encode())))
    assert out == raw


@pytest.mark.parametrize("folder", PACKAGES)
def test_mastra_accepts_an_enriched_request(folder: Path) -> None:
    """Mastra's MessageList holds an EnrichedRequest's messages with our ids, order and memory/input split."""
    history = [Message.model_validate_json(json.dumps(m)) for m in _mastra_messages(folder)]
    last = max(m.createdAt for m in history if m.createdAt is not None)
    request = decode_request(
        json.dumps(
            {
                "schemaVersion": 1,
                "requestId": "interop-turn-2",
                "threadId": THREAD,
                "resourceId": RESOURCE,
                "createdAt": (last + timedelta(seconds=1)).isoformat(),
                "messages": [{"role": "user", "content": "The second page, please."}],
            }
        ).encode()
    )
    enriched = EnrichedRequest.from_request(
        request,
        [(m, "memory") for m in history] + [(m, "input") for m in request.messages],
        recalled=len(history),
        limit=40,
    )
    held = _run(folder, "mastra.mjs", "accept", str(folder), stdin=encode(enriched))
    ours = [m.id for m in enriched.messages]
    filled = derived_message_id(RESOURCE, THREAD, "interop-turn-2", "input", 0)
    assert ours[-1] == filled  # the filled-in deterministic id is what Mastra sees
    assert held["all"] == ours
    assert held["remembered"] == [m.id for m in enriched.messages if m.source == "memory"]
    assert held["input"] == [filled]


def _validate(schema: str, documents: list[Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = _run(
        HERE, "validate.mjs", str(GENERATED / schema), stdin=json.dumps(documents).encode()
    )
    return results


def test_published_schemas_accept_mastra_messages_and_our_events() -> None:
    """ajv validates Mastra's messages against Message.schema.json and our encoded events against theirs."""
    messages = _mastra_messages(HERE)
    assert all(r["valid"] for r in _validate("Message.schema.json", messages)), _validate(
        "Message.schema.json", messages
    )
    history = [Message.model_validate_json(json.dumps(m)) for m in messages]
    request_raw = {
        "schemaVersion": 1,
        "requestId": "turn-3",
        "threadId": THREAD,
        "resourceId": RESOURCE,
        "createdAt": "2030-01-01T00:00:00.000Z",
        "metadata": {"tenant": "t"},
        "messages": [{"role": "user", "content": "Hi"}],
    }
    request = decode_request(json.dumps(request_raw).encode())
    enriched = EnrichedRequest.from_request(
        request, [(m, "memory") for m in history] + [(request.messages[0], "input")], recalled=4, limit=None
    )
    response_raw = {k: v for k, v in request_raw.items() if k != "messages"}
    response_raw |= {"input": [], "response": messages[1:2]}
    response = decode_response(json.dumps(response_raw).encode())
    persisted = HistoryPersisted.for_response(
        response, saved_ids=["a"], skipped=None, thread_updated_at=response.createdAt
    )
    cases: list[tuple[type[Any], Any]] = [
        (AgentRequest, request),
        (EnrichedRequest, enriched),
        (AgentResponse, response),
        (HistoryPersisted, persisted),
    ]
    for model, event in cases:
        document = json.loads(encode(event))
        broken = {k: v for k, v in document.items() if k != "threadId"}
        results = _validate(f"{model.__name__}.schema.json", [document, broken])
        assert results[0] == {"valid": True}, (model.__name__, results[0])
        assert results[1]["valid"] is False, model.__name__  # the schema does reject: threadId is required
