"""Observational Memory's events (`schemas/observational.py`): what they accept, refuse and keep."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from schemas.export import json_schemas
from schemas.observational import ObserveRequest, ObserveResult, ReflectRequest, ReflectResult

BASE: dict[str, Any] = {
    "requestId": "om-1",
    "createdAt": "2025-01-01T12:00:00.000Z",
    "scope": "thread",
    "threadId": "t1",
    "resourceId": "r1",
    "recordId": "rec-1",
    "generation": 0,
    "cycle": 3,
}
MESSAGE = {
    "id": "m1",
    "role": "user",
    "createdAt": "2025-01-01T11:00:00.000Z",
    "content": {"format": 2, "parts": []},
}
EXAMPLES: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (
        ObserveRequest,
        {**BASE, "type": "ObserveRequest", "messages": [MESSAGE], "activeObservations": "",
         "observationTokenCount": 0, "pendingTokens": 30_001, "messageTokens": 30_000},
    ),
    (
        ObserveResult,
        {**BASE, "type": "ObserveResult", "observations": "* 🔴 (11:00) User likes tea",
         "observedMessageIds": ["m1"], "lastObservedAt": "2025-01-01T11:00:00.000Z"},
    ),
    (
        ReflectRequest,
        {**BASE, "type": "ReflectRequest", "activeObservations": "long", "observationTokenCount": 40_000,
         "observationTokens": 40_000},
    ),
    (ReflectResult, {**BASE, "type": "ReflectResult", "reflection": "short"}),
]  # fmt: skip


@pytest.mark.parametrize(("model", "example"), EXAMPLES, ids=lambda v: getattr(v, "__name__", ""))
def test_examples_round_trip_and_keep_unknown_fields(model: type[BaseModel], example: dict[str, Any]) -> None:
    """A valid event reads, writes back the same JSON, and keeps fields it does not know."""
    event = model.model_validate({**example, "extra": {"x": 1}})
    out = json.loads(event.model_dump_json(exclude_unset=True))
    assert out == {**example, "extra": {"x": 1}}


@pytest.mark.parametrize(
    "change",
    [
        {"generation": -1},
        {"cycle": True},
        {"cycle": 1.5},
        {"generation": 2**53},
        {"scope": "global"},
        {"schemaVersion": 2},
        {"recordId": None},
        {"type": "ReflectResult"},
        {"threadId": None},
        {"threadId": ""},
        {"scope": "resource"},
    ],
)
def test_refusals(change: dict[str, Any]) -> None:
    """Counts are exact non-negative integers; the scope, version and type are the contract's."""
    model, example = EXAMPLES[1]
    with pytest.raises(ValidationError):
        model.model_validate({**example, **change})


def test_resource_scope_has_no_thread() -> None:
    """With resource scope the record key is the resource; `threadId` is null."""
    thread = {"threadId": "t-1", "observations": "- likes tea", "lastObservedAt": "2025-01-01T11:00:00.000Z"}
    event = ObserveResult.model_validate(
        {**EXAMPLES[1][1], "scope": "resource", "threadId": None, "threads": [thread]}
    )
    assert event.threadId is None
    assert event.threads is not None
    assert [t.threadId for t in event.threads] == ["t-1"]
    # Without `threads` a resource-scoped answer cannot say whose observations these are: refused.
    with pytest.raises(ValidationError, match="threads is required"):
        ObserveResult.model_validate({**EXAMPLES[1][1], "scope": "resource", "threadId": None})


def test_json_schemas_are_published() -> None:
    """One JSON Schema per OM event, requiring the claim's fields."""
    files = json_schemas()
    for model, _ in EXAMPLES:
        schema = json.loads(files[f"{model.__name__}.schema.json"])
        assert {"recordId", "generation", "cycle", "type", "requestId"} <= set(schema["required"])
        assert schema["additionalProperties"] is True
