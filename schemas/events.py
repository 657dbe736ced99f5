"""The four events of docs/events.md (sections 3-7): their shapes and their checks; `schemas.codec` is the one
way in and out (`decode_*` / `encode`).
"""

# ruff: noqa: N815 -- field names are the wire names, camelCase as Mastra writes them
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, PlainValidator, StrictBool, WithJsonSchema
from pydantic_core import PydanticCustomError

from schemas.messages import Message, Open, Timestamp

SCHEMA_VERSION: Final = 1

Source = Literal["memory", "input"]
Skipped = Literal["read-only", "no-thread", "failed-turn", "nothing-to-save", "forgotten"]

MAX_REASON_CHARS: Final = 200
"""A reason becomes a header: pydantic's messages do not echo the input, and we cap them anyway."""


# --- field types -------------------------------------------------------------------------------------------


def _schema_version(value: Any) -> Literal[1]:
    # `Literal[1]` alone would accept `true` and `1.0`; a version number must be exactly the integer 1.
    if type(value) is int and value == SCHEMA_VERSION:
        return 1
    raise PydanticCustomError("schema_version", "unsupported schemaVersion: this service reads 1")


SchemaVersion = Annotated[
    Literal[1],
    PlainValidator(_schema_version),
    WithJsonSchema({"type": "integer", "const": SCHEMA_VERSION, "title": "schemaVersion"}),
]


LAST_MESSAGES_ERROR: Final = "lastMessages must be a finite non-negative integer"
MAX_TOKENS_ERROR: Final = "messageHistory.maxTokens must be a finite non-negative number"
AT_MAX_REMOVE_TOKENS_ERROR: Final = (
    "messageHistory.atMaxRemoveTokens must be a finite non-negative number no greater than maxTokens"
)
"""Mastra 1.71's messages (`normalizeMessageHistoryConfig`): a dead letter says what Mastra says."""

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""The cap on every count and token number of an event (`lastMessages`, `maxTokens`, `atMaxRemoveTokens`):
JavaScript's `Number.MAX_SAFE_INTEGER`, the largest integer a Mastra client writes exactly (and the usual way
to say "all"), well inside MongoDB's int64, which these numbers reach (a query's limit, a thread's metadata).
"""
ABOVE_SAFE_INTEGER_ERROR: Final = f"must be at most {MAX_SAFE_INTEGER} (Number.MAX_SAFE_INTEGER)"


def _last_messages(value: Any) -> int | Literal[False] | None:
    # One clear error instead of pydantic's per-union-member pair, and `true` refused (bool is an int).
    if value is None or value is False:
        return value
    if type(value) is int and value >= 0:
        if value > MAX_SAFE_INTEGER:
            raise PydanticCustomError("last_messages", f"lastMessages {ABOVE_SAFE_INTEGER_ERROR}")
        return value
    raise PydanticCustomError("last_messages", LAST_MESSAGES_ERROR)


def _token_number(message: str, name: str) -> Any:
    def check(value: Any) -> float | int | None:
        if value is None:
            return None
        if type(value) in (int, float) and math.isfinite(value) and value >= 0:
            if value > MAX_SAFE_INTEGER:
                raise PydanticCustomError("token_number", f"{name} {ABOVE_SAFE_INTEGER_ERROR}")
            return value  # type: ignore[no-any-return]
        raise PydanticCustomError("token_number", message)

    return check


def _token_schema(title: str, description: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_SAFE_INTEGER}, {"type": "null"}],
            "title": title,
            "description": description,
        }
    )


MaxTokens = Annotated[
    float | int | None,
    PlainValidator(_token_number(MAX_TOKENS_ERROR, "messageHistory.maxTokens")),
    _token_schema(
        "maxTokens", "token budget of the recalled history; 0 = no history; null/absent = the service default"
    ),
]
AtMaxRemoveTokens = Annotated[
    float | int | None,
    PlainValidator(_token_number(AT_MAX_REMOVE_TOKENS_ERROR, "messageHistory.atMaxRemoveTokens")),
    _token_schema(
        "atMaxRemoveTokens", "how far below maxTokens a trim goes (≤ maxTokens); default maxTokens × 0.25"
    ),
]


LastMessages = Annotated[
    int | Literal[False] | None,
    PlainValidator(_last_messages),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_SAFE_INTEGER},
                {"const": False},
                {"type": "null"},
            ],
            "title": "lastMessages",
            "description": "messages to recall: 0 or false = none, null/absent = the service default",
        }
    ),
]


# --- messages inside events --------------------------------------------------------------------------------


def _without_source(message: Message) -> Message:
    """`Message.model_construct(_fields_set=..., **values)` of the message's values without `source`, built
    directly (issue 33: its generic loop over the fields was most of the persist path's `turn_input`): the
    fields in `Message`'s order, everything else (a subclass's own fields, then the extras) as extras, which
    is what `model_construct` makes of them. Only while `Message` has no post-init and no private
    attributes, which it would run; tests/unit/test_without_source.py holds the two equal."""
    values = message.__dict__
    fields_set = message.model_fields_set - {"source"}
    if not _PLAIN_MESSAGE or not values.keys() >= _FIELD_NAMES:
        every = {k: v for k, v in values.items() if k != "source"}
        every.update(message.model_extra or {})
        every.pop("source", None)
        return Message.model_construct(_fields_set=fields_set, **every)
    extra = {k: v for k, v in values.items() if k not in _FIELD_NAMES and k != "source"}
    extra.update(message.model_extra or ())
    extra.pop("source", None)
    plain = Message.__new__(Message)
    object.__setattr__(plain, "__dict__", {k: values[k] for k in _MESSAGE_FIELDS})
    object.__setattr__(plain, "__pydantic_fields_set__", fields_set)
    object.__setattr__(plain, "__pydantic_extra__", extra)
    object.__setattr__(plain, "__pydantic_private__", None)
    return plain


_MESSAGE_FIELDS = tuple(Message.__pydantic_fields__)  # in declared order: the order of `__dict__`
_FIELD_NAMES = frozenset(_MESSAGE_FIELDS)
_PLAIN_MESSAGE = (
    Message.__pydantic_post_init__ is None
    and not Message.__private_attributes__
    and Message.model_config.get("extra") == "allow"
    and all(f.alias is None and f.validation_alias is None for f in Message.__pydantic_fields__.values())
)


class TurnMessage(Message):
    """A message in `AgentResponse.input`: it may carry the `source` the worker got in the EnrichedRequest."""

    source: Annotated[Source | None, Field(description="as received in the EnrichedRequest")] = None

    def to_message(self) -> Message:
        """The stored form: the same message without the event-only `source` field (no re-validation)."""
        return _without_source(self)


class EnrichedMessage(Message):
    """A message of an `EnrichedRequest`: always complete, and tagged with where it came from."""

    id: str
    createdAt: Timestamp
    threadId: str
    resourceId: str
    source: Annotated[Source, Field(description="'memory': recalled history; 'input': this turn's")]

    @classmethod
    def from_message(
        cls, message: Message, source: Source, *, thread_id: str, resource_id: str
    ) -> EnrichedMessage:
        """Tag an already-validated message without validating it again; fills a missing thread/resource."""
        if message.id is None or message.createdAt is None:
            raise ValueError("an enriched message needs an id and a createdAt (decode_request fills them)")
        values = dict(message.__dict__)
        values.update(message.model_extra or {})
        fields_set = set(message.model_fields_set) | {"source"}
        if message.threadId is None:
            values["threadId"] = thread_id
            fields_set.add("threadId")
        if message.resourceId is None:
            values["resourceId"] = resource_id
            fields_set.add("resourceId")
        values["source"] = source
        return cls.model_construct(_fields_set=fields_set, **values)

    def to_message(self) -> Message:
        """The stored form: the same message without `source` (no re-validation)."""
        return _without_source(self)


# --- events ------------------------------------------------------------------------------------------------


class MemoryOptions(Open):
    """Per-turn overrides of the service defaults (Mastra's memory options, flattened)."""

    lastMessages: LastMessages = None
    readOnly: StrictBool | None = None
    maxTokens: MaxTokens = None
    atMaxRemoveTokens: AtMaxRemoveTokens = None
    retainFullInput: Annotated[
        StrictBool | None,
        Field(
            description="true: the input as sent (no client-echo filter); null/absent = the service default"
        ),
    ] = None


class MemoryBoundary(Open):
    """`thread.metadata.memoryTokenLimiter`: where the memory-only limiter last trimmed (Mastra 1.71)."""

    createdAt: Annotated[str, Field(description="the newest trimmed instant, ISO-8601 as Mastra writes it")]
    messageIds: Annotated[list[str], Field(description="the trimmed ids at that instant")]
    maxTokens: float | int
    atMaxRemoveTokens: float | int


def _require_schema_version(schema: dict[str, Any]) -> None:
    # Python callers may omit it (it defaults to 1 and is always encoded); on the wire it is required.
    schema["required"] = ["schemaVersion", *schema.get("required", [])]


class EventBase(Open):
    """Fields every event carries (docs/events.md#3-fields-every-event-carries)."""

    model_config = ConfigDict(json_schema_extra=_require_schema_version)

    schemaVersion: SchemaVersion = SCHEMA_VERSION
    requestId: Annotated[str, Field(description="the turn's id; the same on all four events of a turn")]
    threadId: Annotated[str, Field(description="the conversation; also the Kafka record key")]
    resourceId: Annotated[str, Field(description="the thread's owner (user, tenant, ...)")]
    createdAt: Annotated[Timestamp, Field(description="when the event was produced, ISO-8601 UTC, ms")]
    metadata: Annotated[dict[str, Any] | None, Field(description="free-form, passed through unchanged")] = (
        None
    )


class AgentRequest(EventBase):
    """`agent.requests`: a new turn and its input messages."""

    messages: Annotated[list[Message], Field(description="the turn's input: user (and system) messages")]
    memory: Annotated[MemoryOptions | None, Field(description="per-turn overrides")] = None


class HistoryInfo(Open):
    """What recall did."""

    recalled: Annotated[int, Field(description="messages taken from memory (source 'memory')")]
    limit: Annotated[int | None, Field(description="the lastMessages limit applied; null = no limit")]
    complete: Annotated[
        bool,
        Field(
            description=(
                "false when a wait for an earlier turn (barrier or busy thread) timed out: the recall may "
                "lack that turn"
            )
        ),
    ] = True
    waitedMs: Annotated[
        int, Field(ge=0, description="milliseconds the request waited for earlier turns before recall")
    ] = 0
    tokens: Annotated[
        float | int | None,
        Field(description="the recalled messages' token count (Mastra's default counter); null = no budget"),
    ] = None
    trimmed: Annotated[
        list[str] | None, Field(description="ids the memory-only token limiter removed from the context")
    ] = None
    boundary: Annotated[
        MemoryBoundary | None,
        Field(description="the thread's token boundary after this recall (memoryTokenLimiter); null = none"),
    ] = None
    truncated: Annotated[
        bool,
        Field(
            description=(
                "true when the service's cap on rows read for one request (MAX_ROWS_PER_REQUEST) left out "
                "older stored rows the request asked for: the newest were recalled; absent = false"
            )
        ),
    ] = False
    skipped: Annotated[
        int,
        Field(
            ge=0,
            description=(
                "stored rows of the thread that no Mastra would read, left out of this recall (counted in "
                "message_history_unreadable_rows_total); absent = 0"
            ),
        ),
    ] = 0
    observed: Annotated[
        int | None,
        Field(
            ge=0,
            description=(
                "Observational Memory: the messages the observation log covers (left out of `messages`, the "
                "log is there instead); absent without OM"
            ),
        ),
    ] = None
    observationTokens: Annotated[
        int | None,
        Field(
            ge=0, description="Observational Memory: the log's tokens (Mastra OM's count); absent without OM"
        ),
    ] = None


class EnrichedRequest(EventBase):
    """`agent.requests.enriched`: the request with `messages` replaced by the context the model should see."""

    messages: Annotated[
        list[EnrichedMessage],
        Field(description="recalled history then the input, ordered by (createdAt, id), each with source"),
    ]
    memory: MemoryOptions | None = None
    history: HistoryInfo
    eventId: Annotated[str, Field(description="equal to requestId: drop duplicates delivered twice")]

    @classmethod
    def from_request(
        cls,
        request: AgentRequest,
        context: Sequence[tuple[Message, Source]],
        *,
        recalled: int,
        limit: int | None,
        complete: bool = True,
        waited_ms: int = 0,
        tokens: float | None = None,
        trimmed: Sequence[str] = (),
        boundary: dict[str, Any] | None = None,
        truncated: bool = False,
        skipped: int = 0,
    ) -> EnrichedRequest:
        """The same event (fields, extras, metadata), with the context as `messages`, `history` and `eventId`.

        Messages are tagged, not re-validated: they were validated when decoded or loaded. `tokens`,
        `trimmed` and `boundary` describe a token-budgeted recall; without a budget (`tokens` None) they are
        left out of the event, so an unbudgeted event looks as it always did; so is `skipped` when 0.
        """
        messages = [
            EnrichedMessage.from_message(
                m, source, thread_id=request.threadId, resource_id=request.resourceId
            )
            for m, source in context
        ]
        values = dict(request.__dict__)
        values.update(request.model_extra or {})
        values.update(
            schemaVersion=SCHEMA_VERSION,
            messages=messages,
            history=_history_info(
                recalled, limit, tokens, trimmed, boundary, complete, waited_ms, truncated, skipped
            ),
            eventId=request.requestId,
        )
        fields_set = set(request.model_fields_set) | {"schemaVersion", "messages", "history", "eventId"}
        return cls.model_construct(_fields_set=fields_set, **values)


def _history_info(
    recalled: int,
    limit: int | None,
    tokens: float | None,
    trimmed: Sequence[str],
    boundary: dict[str, Any] | None,
    complete: bool,
    waited_ms: int,
    truncated: bool = False,
    skipped: int = 0,
) -> HistoryInfo:
    # `truncated` and `skipped` are written only when set, so an event without them looks as it always did
    extra: dict[str, Any] = {"truncated": True} if truncated else {}
    if skipped:
        extra["skipped"] = skipped
    if tokens is None:
        return HistoryInfo(recalled=recalled, limit=limit, complete=complete, waitedMs=waited_ms, **extra)
    return HistoryInfo(
        recalled=recalled,
        limit=limit,
        complete=complete,
        waitedMs=waited_ms,
        tokens=tokens,
        trimmed=list(trimmed),
        boundary=MemoryBoundary.model_validate(boundary) if boundary is not None else None,
        **extra,
    )


class AgentResponse(EventBase):
    """`agent.responses`: a finished turn, its input as the worker saw it and the messages it produced."""

    input: Annotated[
        list[TurnMessage],
        Field(description="the turn's input as the worker saw it; source 'memory' ones are never re-saved"),
    ]
    response: Annotated[list[Message], Field(description="the messages the turn produced")]
    finishReason: Annotated[str | None, Field(description="'stop', 'error', ...")] = None
    memory: Annotated[MemoryOptions | None, Field(description="readOnly: do not save this turn")] = None


class HistoryPersisted(EventBase):
    """`agent.history.persisted`: what the persist path did for one response."""

    eventId: Annotated[str, Field(description="equal to requestId")]
    savedMessageIds: Annotated[list[str], Field(description="ids upserted, in order")]
    skipped: Annotated[Skipped | None, Field(description="why nothing was saved; null when saved")] = None
    threadUpdatedAt: Annotated[
        Timestamp | None, Field(description="the thread's updatedAt after the save")
    ] = None

    @classmethod
    def for_response(
        cls,
        response: AgentResponse,
        *,
        saved_ids: Iterable[str],
        skipped: Skipped | None,
        thread_updated_at: datetime | None,
    ) -> HistoryPersisted:
        """The outcome event for `response`: its identity fields and createdAt, metadata passed through."""
        optional: dict[str, Any] = {}
        if "metadata" in response.model_fields_set:
            optional["metadata"] = response.metadata
        return cls(
            schemaVersion=SCHEMA_VERSION,
            requestId=response.requestId,
            threadId=response.threadId,
            resourceId=response.resourceId,
            createdAt=response.createdAt,
            eventId=response.requestId,
            savedMessageIds=list(saved_ids),
            skipped=skipped,
            threadUpdatedAt=thread_updated_at,
            **optional,
        )


EVENT_TYPES: Final[tuple[type[EventBase], ...]] = (
    AgentRequest,
    EnrichedRequest,
    AgentResponse,
    HistoryPersisted,
)
