"""Mastra's `MastraDBMessage` (content format 2), field for field, with unknown fields kept.

Every model here allows extra keys and the wire form is dumped with `exclude_unset=True`, so a message a
Mastra app wrote comes back out with the same keys and values, including keys this module never names.
Known part types are validated; an unknown part `type` is kept as it came (Mastra adds part kinds between
releases, and a memory service must not be the component that rejects them).
"""

# ruff: noqa: N815 -- field names are the wire names, camelCase as Mastra writes them
from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    Tag,
    field_validator,
)
from pydantic_core import PydanticCustomError

EARLIEST: Final = datetime(1, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
"""The instants a timestamp may be: what a Python `datetime` holds in UTC, at millisecond precision (a BSON
date, int64 milliseconds, and a JavaScript `Date` hold more, so Python's range is the narrower one)."""

TIMESTAMP_RANGE_ERROR: Final = (
    "is outside the range of storable times (0001-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z, in UTC)"
)


def utc_now_ms() -> datetime:
    """Now, in UTC, cut to milliseconds: the precision Mastra's stores keep (a JS `Date`)."""
    return _to_utc_ms(datetime.now(UTC))


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is UTC:
        return value
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def format_timestamp(value: datetime) -> str:
    """ISO-8601 in UTC with exactly three fraction digits, as JavaScript's `Date.toISOString()` writes it."""
    # isoformat ends in "+00:00" for UTC; it is C code, several times faster than strftime on the encode path.
    return _as_utc(value).isoformat(timespec="milliseconds")[:-6] + "Z"


def _to_utc_ms(value: datetime) -> datetime:
    # MongoDB and JavaScript keep milliseconds; truncating here keeps ordering identical on both sides.
    try:
        value = _as_utc(value)
    except OverflowError:  # an offset that moves the instant past year 1 or 9999 in UTC
        raise PydanticCustomError("timestamp_range", TIMESTAMP_RANGE_ERROR) from None
    sub_ms = value.microsecond % 1000
    return value.replace(microsecond=value.microsecond - sub_ms) if sub_ms else value


Timestamp = Annotated[
    datetime,
    AfterValidator(_to_utc_ms),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
]
"""A UTC instant with millisecond precision, serialized as `2025-01-01T11:00:00.000Z`.

A timestamp without an offset is taken as UTC; finer precision than milliseconds is truncated (MongoDB and
JavaScript `Date` keep milliseconds, so both sides then order messages the same way)."""


class Open(BaseModel):
    """Base of every wire model: camelCase names as on the wire, unknown keys preserved."""

    model_config = ConfigDict(
        extra="allow",
        populate_by_name=True,
        validate_default=False,
        field_title_generator=lambda name, _info: name,  # schema titles are the wire names
    )


# --- parts -----------------------------------------------------------------------------------------------


class TextPart(Open):
    type: Literal["text"]
    text: str


class ReasoningPart(Open):
    type: Literal["reasoning"]
    reasoning: str = ""
    details: list[dict[str, Any]] = Field(default_factory=list)


ToolState = Literal[
    "partial-call",
    "call",
    "result",
    # Mastra 1.71 states, kept so newer workers' messages validate:
    "approval-requested",
    "approval-responded",
    "output-error",
    "output-denied",
]


class ToolInvocation(Open):
    state: ToolState
    toolCallId: str
    toolName: str
    args: Any = None
    result: Any = None  # only meaningful in state 'result'; absent (not null) otherwise


class ToolInvocationPart(Open):
    type: Literal["tool-invocation"]
    toolInvocation: ToolInvocation


class SourceInfo(Open):
    sourceType: str
    id: str
    url: str | None = None


class SourcePart(Open):
    type: Literal["source"]
    source: SourceInfo


class SourceDocumentPart(Open):
    """Mastra 1.71: a document the answer cites."""

    type: Literal["source-document"]
    sourceId: str
    mediaType: str
    title: str


class FilePart(Open):
    type: Literal["file"]
    mimeType: str
    data: str


class StepStartPart(Open):
    type: Literal["step-start"]


class ErrorInfo(Open):
    name: str | None = None
    message: str


class ErrorPart(Open):
    type: Literal["error"]
    error: ErrorInfo


class DataPart(Open):
    """AI SDK v5 custom data part: `type` is `data-<name>`, `data` is anything."""

    type: Annotated[str, Field(pattern=r"^data-.+")]
    data: Any = None


_KNOWN_PARTS = frozenset(
    {"text", "reasoning", "tool-invocation", "source", "source-document", "file", "step-start", "error"}
)


class UnknownPart(Open):
    """A part kind this version does not know; carried through untouched."""

    # The schema excludes the known kinds so the published `oneOf` stays exclusive.
    type: Annotated[
        str,
        Field(json_schema_extra={"not": {"anyOf": [{"enum": sorted(_KNOWN_PARTS)}, {"pattern": "^data-"}]}}),
    ]


PART_TYPES: tuple[type[Open], ...] = (
    TextPart,
    ReasoningPart,
    ToolInvocationPart,
    SourcePart,
    SourceDocumentPart,
    FilePart,
    StepStartPart,
    ErrorPart,
    DataPart,
    UnknownPart,
)


_TAG_OF_MODEL: dict[type[Open], str] = {
    TextPart: "text",
    ReasoningPart: "reasoning",
    ToolInvocationPart: "tool-invocation",
    SourcePart: "source",
    SourceDocumentPart: "source-document",
    FilePart: "file",
    StepStartPart: "step-start",
    ErrorPart: "error",
    DataPart: "data",
    UnknownPart: "unknown",
}


def _part_tag(value: Any) -> str:
    # Called for every part on decode (a dict) and on encode (a model): the model case is a dict lookup.
    tag = _TAG_OF_MODEL.get(type(value))
    if tag is not None:
        return tag
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return "missing"  # no tag matches, so pydantic reports a clear error for the part
    if kind in _KNOWN_PARTS:
        return kind
    return "data" if kind.startswith("data-") else "unknown"


PART_TAGS = frozenset({*_KNOWN_PARTS, "data", "unknown"})
"""The tags pydantic inserts into an error location after a part's index (stripped from error paths)."""

Part = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ReasoningPart, Tag("reasoning")]
    | Annotated[ToolInvocationPart, Tag("tool-invocation")]
    | Annotated[SourcePart, Tag("source")]
    | Annotated[SourceDocumentPart, Tag("source-document")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[StepStartPart, Tag("step-start")]
    | Annotated[ErrorPart, Tag("error")]
    | Annotated[DataPart, Tag("data")]
    | Annotated[UnknownPart, Tag("unknown")],
    Discriminator(
        _part_tag,
        custom_error_type="invalid_part",
        custom_error_message="a part must be an object with a string 'type'",
    ),
]


# --- content and message ---------------------------------------------------------------------------------


class MessageContent(Open):
    """`MastraMessageContentV2`: `parts` is the source of truth; the rest are legacy mirrors."""

    format: Literal[2] = 2
    parts: list[Part]
    content: str | None = None
    toolInvocations: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    annotations: list[Any] | None = None
    experimental_attachments: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None
    providerMetadata: dict[str, Any] | None = None

    def model_post_init(self, context: Any, /) -> None:
        # `format` is always written, also when the content was built in Python or arrived without it.
        self.model_fields_set.add("format")


Role = Literal["user", "assistant", "system", "signal"]
"""`signal`: Mastra 1.71's agent signals; transient ones are never saved (`message_history.core.signals`)."""


class Message(Open):
    """A `MastraDBMessage`. `id` and `createdAt` may be absent on input; the event fills them in."""

    id: str | None = None
    role: Role
    createdAt: Timestamp | None = None
    threadId: str | None = None
    resourceId: str | None = None
    type: str | None = None
    content: MessageContent

    @field_validator("content", mode="before")
    @classmethod
    def _plain_text_content(cls, value: Any) -> Any:
        # Legacy (format 1) rows hold plain text; Mastra wraps them the same way.
        if isinstance(value, str):
            return {"format": 2, "content": value, "parts": [{"type": "text", "text": value}]}
        return value

    def wire(self) -> dict[str, Any]:
        """The message as JSON-ready data, exactly the keys it was given (plus any filled in)."""
        return self.model_dump(mode="json", exclude_unset=True)
