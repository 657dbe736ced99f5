"""Observational Memory's events (issue 35): the work the service asks of observer workers, and their answers.

`ObserveRequest` / `ReflectRequest` go to `agent.memory.observe`, `ObserveResult` / `ReflectResult` come back
on `agent.memory.observed` (a `type` field names each), keyed by `threadId` (thread scope) or `resourceId`
(resource scope). A request names the claim it was made under (`recordId`, `generation`, `cycle`); the result
echoes them and is applied only if that claim is still current (`storage/observational.py`), so a late or
repeated answer changes nothing. Design: docs/observational-memory.md. The persist path sends the requests
(`consumers.observe_emit`), the observed path applies the results (`consumers.observe_results`).
"""

# ruff: noqa: N815 -- field names are the wire names, camelCase as Mastra writes them
from __future__ import annotations

import json
import math
from typing import Annotated, Any, Final, Literal, Self

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from message_history.errors import EventValidationError
from schemas.codec import check_id, check_raw, validation_error
from schemas.events import MAX_SAFE_INTEGER, SchemaVersion
from schemas.limits import Limits
from schemas.messages import Message, Open, Timestamp

__all__ = [
    "EXTRACTED_MAX_BYTES",
    "EXTRACTED_MAX_DEPTH",
    "THREAD_TITLE_MAX_CHARS",
    "ObserveRequest",
    "ObserveResult",
    "ReflectRequest",
    "ReflectResult",
    "ThreadObservations",
    "decode_result",
    "decode_work",
]

Scope = Literal["thread", "resource"]
Count = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER, strict=True)]

THREAD_TITLE_MAX_CHARS: Final = 1000
"""A `threadTitle` longer is refused (the answer dead-lettered): Mastra asks its Observer for 2-5 words, and
the title lands in a thread's metadata other apps read; the record's size limit alone lets a megabyte by."""
ThreadTitle = Annotated[
    str | None,
    Field(
        max_length=THREAD_TITLE_MAX_CHARS,
        description="the Observer's <thread-title>, if any (Mastra's `observation.threadTitle`); kept in the "
        "thread's metadata.mastra.om.threadTitle, and made the thread's title as Mastra does (3 characters "
        "or more, not the current title, metadata.titlePinned not true)",
    ),
]

EXTRACTED_MAX_BYTES: Final = 16_384
"""An `extracted` larger (as compact JSON, UTF-8) is refused (the answer dead-lettered): it is merged into the
thread's metadata, which every recall of the thread reads; Mastra's extractors write a few short values."""
EXTRACTED_MAX_DEPTH: Final = 8
"""Objects and arrays nested deeper in an `extracted` (itself the first level) are refused."""
_UNSAFE_KEYS: Final = frozenset({"__proto__", "constructor", "prototype"})  # Mastra's unsafe path segments


def _check_extracted(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """JSON a Mastra app reads back as it was written: keys MongoDB stores as one field (not empty, no `.`,
    no leading `$`, no NUL) and not a JavaScript prototype's; finite numbers, integers exact in JavaScript;
    bounded in depth and size."""
    if value is None:
        return None
    _check_json(value, 1)
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if size > EXTRACTED_MAX_BYTES:
        raise ValueError(f"is {size} bytes as JSON; the limit is {EXTRACTED_MAX_BYTES}")
    return value


def _check_json(value: object, depth: int) -> None:
    if isinstance(value, dict | list) and depth > EXTRACTED_MAX_DEPTH:
        raise ValueError(f"nests deeper than {EXTRACTED_MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_key(key)
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)
    elif isinstance(value, bool) or value is None or isinstance(value, str):
        return
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ValueError(f"has the integer {value}, past Number.MAX_SAFE_INTEGER")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("has a number that is not finite")
    else:
        raise ValueError(f"has a {type(value).__name__}, which is not JSON")


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key or "." in key or key.startswith("$") or "\x00" in key:
        raise ValueError(f"has the key {key!r}: keys must be non-empty, without '.', '$' first or NUL")
    if key in _UNSAFE_KEYS:
        raise ValueError(f"has the key {key!r}, which Mastra refuses in a metadata path")


Extracted = Annotated[
    dict[str, Any] | None,
    AfterValidator(_check_extracted),
    Field(
        description="custom extractors' values (Mastra's `observation.extract`), by key under the "
        "thread's metadata.mastra.om.extracted (an extractor's slug, Mastra's default `metadataKeyPath` "
        "`extracted.<slug>`): merged there, the answer's keys replacing the thread's, a null or empty-string "
        f"value ignored; at most {EXTRACTED_MAX_BYTES} bytes as JSON and {EXTRACTED_MAX_DEPTH} levels deep",
    ),
]


def _require_schema_version(schema: dict[str, Any]) -> None:
    # as the events': Python callers may omit it (it defaults to 1); on the wire it is required
    schema["required"] = ["schemaVersion", *schema.get("required", [])]


def _failed(worker: str) -> Any:
    # a result's `error`: the same meaning in both results, so the same words
    return Field(description=f"set when the {worker} failed: the claim is released")


class WorkBase(Open):
    """What every OM event carries: who it is for and the claim it belongs to."""

    model_config = ConfigDict(json_schema_extra=_require_schema_version)

    schemaVersion: SchemaVersion = 1
    requestId: Annotated[str, Field(description="the request's id; a result echoes it")]
    createdAt: Annotated[Timestamp, Field(description="when the event was produced, ISO-8601 UTC")]
    scope: Annotated[Scope, Field(description="'thread' (the default) or 'resource' (Mastra's OM scope)")]
    threadId: Annotated[
        str | None, Field(description="the thread (null with resource scope); the record key")
    ]
    resourceId: Annotated[str, Field(description="the resource; the record key with resource scope")]
    recordId: Annotated[str, Field(description="the mastra_observational_memory row (its `id`)")]
    generation: Annotated[Count, Field(description="the row's generationCount")]
    cycle: Annotated[Count, Field(description="the claim's cycle: a result applies only to its own claim")]

    @model_validator(mode="after")
    def _thread_iff_thread_scope(self) -> Self:
        """The record key (`thread:<threadId>` or `resource:<resourceId>`) follows the scope: a thread-scoped
        event names its thread, a resource-scoped one none (as Mastra's `getOMKey` is called)."""
        if (self.scope == "thread") != bool(self.threadId):
            raise ValueError(
                f"threadId must be {'set' if self.scope == 'thread' else 'null'} with {self.scope} scope"
            )
        return self


class ObserveRequest(WorkBase):
    """`agent.memory.observe`: observe these messages, given the log so far."""

    type: Literal["ObserveRequest"]
    messages: Annotated[list[Message], Field(description="the unobserved messages, oldest first")]
    activeObservations: Annotated[str, Field(description="the current observation log ('' when none)")]
    observationTokenCount: Annotated[Count, Field(description="the log's tokens, as Mastra OM counts them")]
    pendingTokens: Annotated[Count, Field(description="the unobserved messages' tokens (Mastra OM's count)")]
    messageTokens: Annotated[Count, Field(description="the observation threshold in force")]


class ThreadObservations(Open):
    """One thread's part of a resource-scoped `ObserveResult` (Mastra's multi-thread Observer output)."""

    threadId: Annotated[str, Field(description="the thread these observations are of")]
    observations: Annotated[
        str, Field(description="its observations; the service wraps them in <thread id=...>")
    ]
    lastObservedAt: Annotated[
        Timestamp, Field(description="the newest observed message's createdAt in this thread: its cursor")
    ]
    currentTask: Annotated[str | None, Field(description="the thread's <current-task>, if any")] = None
    suggestedResponse: Annotated[str | None, Field(description="the thread's <suggested-response>")] = None
    threadTitle: ThreadTitle = None
    extracted: Extracted = None


class ObserveResult(WorkBase):
    """`agent.memory.observed`: the new observations for the request's messages (or why there are none)."""

    type: Literal["ObserveResult"]
    observations: Annotated[
        str, Field(description="this cycle's observations, as Mastra's Observer writes them")
    ]
    observedMessageIds: Annotated[list[str], Field(description="the ids of the messages observed")]
    lastObservedAt: Annotated[Timestamp, Field(description="the newest observed message's createdAt")]
    currentTask: Annotated[str | None, Field(description="the Observer's <current-task>, if any")] = None
    suggestedResponse: Annotated[str | None, Field(description="the Observer's <suggested-response>")] = None
    threadTitle: ThreadTitle = None
    extracted: Extracted = None
    threads: Annotated[
        list[ThreadObservations] | None,
        Field(
            description="resource scope: the observations per thread (required unless `error`); "
            "`observations` is then unused"
        ),
    ] = None
    error: Annotated[str | None, _failed("observer")] = None

    @model_validator(mode="after")
    def _threads_with_resource_scope(self) -> Self:
        """A resource-scoped answer says which thread each observation is of (the log is kept per thread,
        each thread's cursor moved to its own newest observed message); a thread-scoped one has none."""
        if self.scope == "resource" and self.error is None and not self.threads:
            raise ValueError("threads is required with resource scope (unless error)")
        if self.scope == "thread" and self.threads is not None:
            raise ValueError("threads is only for resource scope")
        return self


class ReflectRequest(WorkBase):
    """`agent.memory.observe`: condense this observation log."""

    type: Literal["ReflectRequest"]
    activeObservations: Annotated[str, Field(description="the whole observation log to condense")]
    observationTokenCount: Annotated[Count, Field(description="its tokens, as Mastra OM counts them")]
    observationTokens: Annotated[Count, Field(description="the reflection threshold in force")]


class ReflectResult(WorkBase):
    """`agent.memory.observed`: the condensed log, which starts the next generation."""

    type: Literal["ReflectResult"]
    reflection: Annotated[str, Field(description="the condensed log, as Mastra's Reflector writes it")]
    error: Annotated[str | None, _failed("reflector")] = None


_RESULT: Final = TypeAdapter(Annotated[ObserveResult | ReflectResult, Field(discriminator="type")])


def decode_result(raw: bytes, limits: Limits = Limits()) -> ObserveResult | ReflectResult:  # noqa: B008
    """Decode and check an `agent.memory.observed` record value; anything wrong is one `EventValidationError`
    (the record's dead letter)."""
    check_raw(raw, limits, "observer result")
    try:
        result = _RESULT.validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if "schemaVersion" not in result.model_fields_set:  # required on the wire, as for the events
        raise EventValidationError("Field required", "schemaVersion")
    for path, value in (("requestId", result.requestId), ("resourceId", result.resourceId),
                        ("threadId", result.threadId), ("recordId", result.recordId)):  # fmt: skip
        if value is not None:
            check_id(value, path, limits)
    if isinstance(result, ObserveResult):
        for i, ident in enumerate(result.observedMessageIds):
            check_id(ident, f"observedMessageIds.{i}", limits)
        for i, thread in enumerate(result.threads or []):
            check_id(thread.threadId, f"threads.{i}.threadId", limits)
    return result


_WORK: Final = TypeAdapter(Annotated[ObserveRequest | ReflectRequest, Field(discriminator="type")])


def decode_work(raw: bytes | str) -> ObserveRequest | ReflectRequest:
    """An `agent.memory.observe` record value (what an observer worker reads); `EventValidationError` when it
    is not one."""
    try:
        return _WORK.validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None
