"""A stored `mastra_messages` row read as Mastra 1.71 reads it, or refused with why (rules.md#stored-rows).

Mastra reads a row with `@mastra/mongodb`'s `parseRow` (1.19: `content` through `JSON.parse`, the raw string
kept when that fails; `type` kept unless `'v2'`), then `new MessageList().add(rows, "memory")`
(`@mastra/core` 1.71, `inputToMastraDBMessage`): a row whose content is an object with `format: 2` is a
`MastraDBMessage` as it is; any other row is a v1 `MastraMessageV1`, converted by
`mastraMessageV1ToMastraDBMessage` -> `AIV4Adapter.fromCoreMessage({content, role}, ctx, "memory")`:

* `role` `"tool"` becomes `"assistant"` (`getRole`); `type` (a v1 `'text' | 'tool-call' | 'tool-result'`) is
  dropped;
* string content: one text part, and `content.content` the string;
* array content (AI SDK v4 parts): `text` (a `step-start` first when an assistant's text follows a tool
  invocation), `tool-call` (a tool invocation in state `call`), `tool-result` (state `result`, `result ?? ""`,
  the args of the same message's `tool-call`, else `{}`, and the invocation again in `toolInvocations`),
  `reasoning`, `redacted-reasoning`, `image` and `file` (a file part); other part types are dropped;
  `providerOptions` become `providerMetadata`; empty text parts are dropped unless every part is one.

Mastra's `findToolCallArgs` also looks for a tool-result's args in the messages already in the list; its
recall adds a page newest first, so those are newer rows, which never hold the call a result answers: `{}`.

Refused (`UnreadableRowError`, with a reason class for the metric): what no Mastra would read, or what this
service cannot send on: `id` missing or not a string, `role` missing or unknown, `content` missing, `null`, a
number, a boolean, an object without `format: 2`, `parts` not a list or a part that is not valid, an array
part that is null, `createdAt` missing, `null`, not a date (`"yesterday"`) or out of range, `type`
not a string, strings with lone surrogates (`"\\ud800"`: no UTF-8 can carry them), nesting past the parsers'
recursion limits. Where Mastra 1.71 throws on such a row, it reads no row of the page; where it reads one
anyway (a v2 row with an unknown or no `role`, `parts` not a list as no parts, a missing `id` as a fresh
one, an unreadable `createdAt` as now or an invalid date), the service skips it instead, and says so
(`history.skipped`): docs/rules.md#stored-rows lists them. Like Mastra, it keeps only the parts of a
format-2 row that are objects, and ignores an `_mh_extra` (the service's own column) that is not a JSON
object.

Pure: a decoded document in, a `Message` out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, get_args

from pydantic import ValidationError
from pydantic_core import from_json

from message_history.errors import UnreadableRowError
from schemas.limits import id_problem
from schemas.messages import Message, Role

__all__ = [
    "EXTRA_FIELD",
    "MESSAGES",
    "REASONS",
    "THREADS",
    "read_message",
    "row_header",
    "stored_datetime",
    "v1_message",
]

THREADS: Final = "mastra_threads"
MESSAGES: Final = "mastra_messages"
EXTRA_FIELD: Final = "_mh_extra"

REASONS: Final = frozenset(
    {"bson", "id", "role", "content", "createdAt", "type", "text", "nesting", "schema"}
)
"""The reason classes of an unreadable row (the metric's `reason` label): a closed set."""

_ROLES: Final = frozenset(get_args(Role))
_V1_ROLES: Final = {"user": "user", "assistant": "assistant", "tool": "assistant", "system": "system"}
_MESSAGE_FIELDS: Final = frozenset(Message.model_fields)

_ABSENT: Final = object()
"""A key absent from the stored JSON: JavaScript's `undefined`, which `JSON.stringify` leaves out."""


def _refuse(doc: Mapping[str, Any], reason: str, detail: str) -> UnreadableRowError:
    return UnreadableRowError(MESSAGES, doc.get("id"), doc.get("thread_id"), reason, detail)


def stored_datetime(value: Any) -> datetime | None:
    """A stored date: a BSON Date (aware, or naive UTC) or, in legacy rows, an ISO-8601 string; else None."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _parse_content(text: str, doc: Mapping[str, Any]) -> Any:
    """`JSON.parse(text)`, or the text itself when it is not JSON (as `parseRow`)."""
    try:
        return from_json(text)
    except ValueError as exc:
        if "recursion" in str(exc):
            raise _refuse(doc, "nesting", "content nests deeper than the JSON parser allows") from None
    try:
        # JSON that pydantic-core refuses but JavaScript reads: lone surrogate escapes, which no UTF-8
        # output can carry (NaN / Infinity are not JSON to JavaScript either: plain text, below)
        json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise _refuse(doc, "nesting", "content nests deeper than the JSON parser allows") from None
    except ValueError:
        return text  # plain text: a legacy row (Mastra keeps the raw string)
    raise _refuse(doc, "text", "content holds a lone surrogate escape (not encodable as UTF-8)")


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _provider(part: dict[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    """`part` with the v1 part's `providerOptions` as `providerMetadata`, when it has any."""
    options = item.get("providerOptions")
    if options is not None:  # JavaScript's truthiness for an object value
        part["providerMetadata"] = options
    return part


def _data_uri_type(data: str) -> str | None:
    if not data.startswith("data:"):
        return None
    comma = data.find(",")
    if comma < 0:
        return None
    header = data[5:comma]
    return header.split(";", 1)[0] or None


def _v1_tool_call(item: Mapping[str, Any], items: list[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    invocation = _defined(
        state="call",
        toolCallId=item.get("toolCallId", _ABSENT),
        toolName=item.get("toolName", _ABSENT),
        args=item.get("args", _ABSENT),
    )
    return _provider({"type": "tool-invocation", "toolInvocation": invocation}, item)


def _v1_tool_result(item: Mapping[str, Any], items: list[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    args: Any = {}  # `findToolCallArgs` finds nothing: see the module's docstring
    call = next(
        (
            p
            for p in items
            if isinstance(p, dict)
            and p.get("type") == "tool-call"
            and p.get("toolCallId") == item.get("toolCallId")
        ),
        None,
    )
    if call is not None:
        args = call.get("args", _ABSENT)
        if args is _ABSENT:  # `Object.keys(undefined)` throws: Mastra reads no row of the page
            raise _refuse(doc, "content", "a v1 tool-call part has no args")
    result = item.get("result")
    invocation = _defined(
        state="result",
        toolCallId=item.get("toolCallId", _ABSENT),
        toolName=item.get("toolName", _ABSENT),
        result="" if result is None else result,
        args=args,
    )
    return _provider({"type": "tool-invocation", "toolInvocation": invocation}, item)


def _v1_reasoning(item: Mapping[str, Any], items: list[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    text = item.get("text", _ABSENT)
    detail = _defined(type="text", text=text, signature=item.get("signature", _ABSENT))
    return _provider(_defined(type="reasoning", reasoning=text, details=[detail]), item)


def _v1_redacted(item: Mapping[str, Any], items: list[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    detail = _defined(type="redacted", data=item.get("data", _ABSENT))
    return _provider({"type": "reasoning", "reasoning": "", "details": [detail]}, item)


def _v1_image(item: Mapping[str, Any], items: list[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    return _file_part("image", item, doc)


def _v1_file(item: Mapping[str, Any], items: list[Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    return _file_part("file", item, doc)


_V1_PARTS: Final[
    Mapping[str, Callable[[Mapping[str, Any], list[Any], Mapping[str, Any]], dict[str, Any]]]
] = {
    "tool-call": _v1_tool_call,
    "tool-result": _v1_tool_result,
    "reasoning": _v1_reasoning,
    "redacted-reasoning": _v1_redacted,
    "image": _v1_image,
    "file": _v1_file,
}
"""`AIV4Adapter.fromCoreMessage`'s cases besides `text`; any other part type has no case and is dropped."""


def _v1_parts(role: str, items: list[Any], doc: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """`AIV4Adapter.fromCoreMessage`'s loop over a v1 content array: (parts, toolInvocations)."""
    parts: list[dict[str, Any]] = []
    for item in items:
        if item is None:  # `null.type` throws: Mastra reads no row of the page
            raise _refuse(doc, "content", "a v1 content part is null")
        if not isinstance(item, dict):
            continue  # a number, string, array or boolean has no `type` Mastra knows: dropped
        kind = item.get("type")
        if kind == "text":
            if role == "assistant" and parts and parts[-1].get("type") == "tool-invocation":
                parts.append({"type": "step-start"})
            parts.append(_provider(_defined(type="text", text=item.get("text", _ABSENT)), item))
        elif isinstance(kind, str) and kind in _V1_PARTS:
            parts.append(_V1_PARTS[kind](item, items, doc))
    invocations = [
        p["toolInvocation"]
        for p in parts
        if p.get("type") == "tool-invocation" and p["toolInvocation"].get("state") == "result"
    ]
    if any(not _empty_text(p) for p in parts):
        parts = [p for p in parts if not _empty_text(p)]
    return parts, invocations


def _empty_text(part: Mapping[str, Any]) -> bool:
    return part.get("type") == "text" and part.get("text") == ""


def _file_part(kind: str, item: Mapping[str, Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    data = item.get("image") if kind == "image" else item.get("data")
    if not isinstance(data, str):
        raise _refuse(doc, "content", f"a v1 {kind} part's data is not a string")
    mime = item.get("mimeType")
    if kind == "file":
        mime = _data_uri_type(data) or mime or "image/png"
    part = _provider(_defined(type="file", data=data, mimeType=_ABSENT if mime is None else mime), item)
    if kind == "file" and item.get("filename"):
        part["filename"] = item["filename"]
    return part


def _defined(**fields: Any) -> dict[str, Any]:
    """The fields that are not `undefined` (absent from the stored part)."""
    return {key: value for key, value in fields.items() if value is not _ABSENT}


def v1_message(role: Any, content: Any, doc: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """`mastraMessageV1ToMastraDBMessage`'s role and content of a v1 row (content: parsed, not format 2)."""
    if not isinstance(role, str) or role not in _V1_ROLES:
        raise _refuse(doc, "role", f"role {role!r} is not one Mastra reads")
    mapped = _V1_ROLES[role]
    if isinstance(content, str):
        return mapped, {"format": 2, "parts": [{"type": "text", "text": content}], "content": content}
    if isinstance(content, list):
        parts, invocations = _v1_parts(role, content, doc)
        out: dict[str, Any] = {"format": 2, "parts": parts}
        if invocations:
            out["toolInvocations"] = invocations
        return mapped, out
    kind = "null" if content is None else type(content).__name__
    raise _refuse(doc, "content", f"content is {kind}, neither format 2, text nor a v1 array")


def read_message(doc: Mapping[str, Any]) -> Message:
    """A `mastra_messages` document as the `Message` Mastra 1.71 recalls from it, or `UnreadableRowError`."""
    try:
        return _read(doc)
    except RecursionError:
        raise _refuse(doc, "nesting", "the row nests deeper than the parsers allow") from None


def _read(doc: Mapping[str, Any]) -> Message:
    ident, kind, created = row_header(doc)
    role = doc.get("role")
    raw = doc.get("content")
    content: Any = _parse_content(raw, doc) if isinstance(raw, str) else raw
    if isinstance(content, Mapping) and content.get("format") == 2:
        if not isinstance(role, str) or role not in _ROLES:
            raise _refuse(doc, "role", f"role {role!r} is not one Mastra reads")
        parts = content.get("parts")
        if not isinstance(parts, list):
            raise _refuse(doc, "content", "content.parts is not a list")
        if not all(isinstance(part, dict) for part in parts):
            # `hydrateMastraDBMessageFields` keeps the parts that are objects
            content = {**content, "parts": [part for part in parts if isinstance(part, dict)]}
    else:
        role, content = v1_message(role, content, doc)
        kind = None  # a v1 row's `type` is not carried over by the conversion
    data: dict[str, Any] = {
        "id": ident,
        "content": content,
        "role": role,
        "createdAt": created,
        "threadId": doc.get("thread_id"),
        "resourceId": doc.get("resourceId"),
    }
    if kind is not None:
        data["type"] = kind
    data.update(_extras(doc))
    return _validated(data, doc)


def row_header(doc: Mapping[str, Any]) -> tuple[str, str | None, datetime]:
    """The row's id, its `type` (None for Mastra's own `'v2'`) and its `createdAt`, or the refusal (alone: a
    read projected on `id`, `thread_id`, `createdAt` checks them as a whole row's read does)."""
    ident = doc.get("id")
    if not isinstance(ident, str):
        shown = "no id" if ident is None else f"id is a {type(ident).__name__}, not a string"
        raise _refuse(doc, "id", shown)
    problem = id_problem(ident)  # recalled, it goes into an event a worker decodes with the default limits
    if problem is not None:
        raise _refuse(doc, "id", f"id {problem}")
    kind = doc.get("type")
    if kind is not None and not isinstance(kind, str):
        raise _refuse(doc, "type", f"type is a {type(kind).__name__}, not a string")
    raw = doc.get("createdAt")
    created = stored_datetime(raw)
    if created is None:
        shown = "missing" if raw is None else f"{type(raw).__name__} {str(raw)[:40]!r}"
        raise _refuse(doc, "createdAt", f"createdAt is not a date ({shown})")
    return ident, (None if kind == "v2" or not kind else kind), created


def _extras(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The unknown top-level keys the service kept in `_mh_extra` (JSON text of an object)."""
    extra = doc.get(EXTRA_FIELD)
    if not isinstance(extra, str):
        return {}
    try:
        kept = json.loads(extra)
    except (ValueError, RecursionError):
        kept = None
    if not isinstance(kept, dict):
        return {}  # Mastra never reads this column: a broken one is no reason to leave the row out
    return {key: value for key, value in kept.items() if key not in _MESSAGE_FIELDS}


def _validated(data: dict[str, Any], doc: Mapping[str, Any]) -> Message:
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        field = str(first["loc"][0]) if first["loc"] else ""
        reason = field if field in REASONS else "schema"
        if first["type"] == "recursion_loop":
            reason = "nesting"
        raise _refuse(doc, reason, f"{where or 'the row'}: {first['msg']}") from None
    except ValueError as exc:  # a validator's own error
        raise _refuse(doc, "schema", str(exc)[:200]) from None
