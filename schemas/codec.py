"""The one way in and out of the four events (`schemas.events`): `decode_*` and `encode`.

Decoding is size check (and the other checks of the raw bytes, `check_raw`), then pydantic-core's JSON parser
straight into the models (no `json.loads` and dict walking), then the checks a schema cannot express (limits
that are configurable, ids that must agree with the event), then normalization: every message leaves
`decode_request` / `decode_response` with an `id`, a `createdAt`, a `threadId` and a `resourceId`
(`docs/events.md#11-ids-and-timestamps`). Everything wrong becomes one `EventValidationError(reason, path)`.

Encoding dumps exactly the keys that were set (`exclude_unset`), so unknown fields and absent optional fields
come back out as they came in; values the service adds are constructed explicitly, so they count as set.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, from_json, to_json

from message_history.errors import EventValidationError
from schemas.events import (
    AT_MAX_REMOVE_TOKENS_ERROR,
    MAX_REASON_CHARS,
    SCHEMA_VERSION,
    AgentRequest,
    AgentResponse,
    EnrichedRequest,
    EventBase,
    HistoryPersisted,
    MemoryOptions,
    Skipped,
)
from schemas.ids import Kind, derived_message_id
from schemas.limits import Limits, id_problem
from schemas.messages import LATEST, PART_TAGS, TIMESTAMP_RANGE_ERROR, Message, format_timestamp

E = TypeVar("E", bound=EventBase)


def encode(event: BaseModel) -> bytes:
    """The event as UTF-8 JSON: exactly the keys that are set; an event always carries `schemaVersion`."""
    if isinstance(event, EventBase):
        event.model_fields_set.add("schemaVersion")
    return event.__pydantic_serializer__.to_json(event, exclude_unset=True)


def persisted_value(
    response: AgentResponse,
    *,
    saved_ids: Sequence[str],
    skipped: Skipped | None,
    thread_updated_at: datetime | None,
) -> bytes:
    """`encode(HistoryPersisted.for_response(...))`, byte for byte, without building the model (issue 25:
    half of the event's encode cost was the model). The keys in the model's field order, each one the model
    would write; `metadata` (any JSON) through pydantic's own serializer, as the model's `Any` field is.
    tests/unit/test_persisted_value.py holds the two equal."""
    event: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "requestId": response.requestId,
        "threadId": response.threadId,
        "resourceId": response.resourceId,
        "createdAt": format_timestamp(response.createdAt),
    }
    if "metadata" in response.model_fields_set:
        event["metadata"] = response.metadata
    event["eventId"] = response.requestId
    event["savedMessageIds"] = saved_ids
    event["skipped"] = skipped
    event["threadUpdatedAt"] = None if thread_updated_at is None else format_timestamp(thread_updated_at)
    return to_json(event)


def decode_request(raw: bytes | str, limits: Limits = Limits()) -> AgentRequest:  # noqa: B008 -- frozen
    """Decode, check and normalize an `agent.requests` record value (the recall path's decode).

    `check_raw` (its NaN / Infinity / huge-number prescan native when installed: `select_prescan`), the
    models' JSON parser, then the event's checks.
    """
    return _checked_request(_decode(raw, AgentRequest, limits), limits)


def _checked_request(event: AgentRequest, limits: Limits) -> AgentRequest:
    """The checks and normalization after the models."""
    _check_memory(event.memory)
    _check_messages(event, event.messages, "messages", limits)
    _check_derived_times(event, event.messages, "messages", 0)
    _normalize(event, event.messages, "input", 0)
    return event


def decode_response(raw: bytes | str, limits: Limits = Limits()) -> AgentResponse:  # noqa: B008 -- frozen
    """Decode, check and normalize an `agent.responses` record value (the persist path's decode), as
    `decode_request`: `check_raw`, the models' JSON parser, the event's checks."""
    return _checked_response(_decode(raw, AgentResponse, limits), limits)


def _checked_response(event: AgentResponse, limits: Limits) -> AgentResponse:
    """The checks and normalization after the models: `input` and `response` are numbered as one turn:
    input `i` is `+i` ms, response `j` is `+len(input)+j` ms."""
    _check_messages(event, event.input, "input", limits)
    _check_messages(event, event.response, "response", limits)
    _check_derived_times(event, event.input, "input", 0)
    _check_derived_times(event, event.response, "response", len(event.input))
    _normalize(event, event.input, "input", 0)
    _normalize(event, event.response, "response", len(event.input))
    return event


def decode_enriched(raw: bytes | str, limits: Limits = Limits()) -> EnrichedRequest:  # noqa: B008 -- frozen
    """Decode and check an `agent.requests.enriched` record value (what an agent worker reads)."""
    event = _decode(raw, EnrichedRequest, limits)
    check_id(event.eventId, "eventId", limits)
    _check_messages(event, event.messages, "messages", limits)
    return event


def decode_persisted(raw: bytes | str, limits: Limits = Limits()) -> HistoryPersisted:  # noqa: B008 -- frozen
    """Decode and check an `agent.history.persisted` record value."""
    event = _decode(raw, HistoryPersisted, limits)
    check_id(event.eventId, "eventId", limits)
    return event


def _decode(raw: bytes | str, model: type[E], limits: Limits) -> E:
    if isinstance(raw, str):
        try:
            raw = raw.encode()
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form, so it could never be a record value
            raise EventValidationError("not valid UTF-8") from None
    check_raw(raw, limits, "event")
    try:
        event = model.model_validate_json(raw)
    except ValidationError as exc:
        # `from None`: the pydantic error embeds input excerpts, which must not reach logs or headers.
        raise validation_error(exc) from None
    return _checked_event(event, limits)


def _checked_event(event: E, limits: Limits) -> E:
    """The checks every event gets after the models: `schemaVersion` present, the three ids usable."""
    if "schemaVersion" not in event.model_fields_set:
        raise EventValidationError("Field required", "schemaVersion")
    for name in ("requestId", "threadId", "resourceId"):
        check_id(getattr(event, name), name, limits)
    return event


def check_raw(raw: bytes, limits: Limits, what: str) -> None:
    """Refuse a record value over the size limit, not UTF-8, in a Schema Registry frame, or holding NaN or
    Infinity, before parsing it into the models."""
    if len(raw) > limits.max_event_bytes:
        raise EventValidationError(f"{what} is {len(raw)} bytes; the limit is {limits.max_event_bytes}")
    encoded = other_encoding(raw)
    if encoded is not None:
        raise EventValidationError(encoded)
    framed = schema_registry_framing(raw)
    if framed is not None:
        raise EventValidationError(framed)
    _refuse_non_finite(raw)


# Byte order marks, longest first (UTF-32 LE's starts with UTF-16 LE's).
_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with a byte order mark)"),
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with a byte order mark)"),
    (b"\xfe\xff", "UTF-16 (big-endian, with a byte order mark)"),
    (b"\xff\xfe", "UTF-16 (little-endian, with a byte order mark)"),
)
# Without a mark, JSON text starts with an ASCII character, so the zero bytes of its first code unit say the
# encoding (RFC 4627, section 3): the pattern of the first four bytes (0 = zero, x = not zero), the codec.
_UNMARKED: tuple[tuple[str, str, str], ...] = (
    ("000x", "utf-32-be", "UTF-32 (big-endian)"),
    ("x000", "utf-32-le", "UTF-32 (little-endian)"),
    ("0x0x", "utf-16-be", "UTF-16 (big-endian)"),
    ("x0x0", "utf-16-le", "UTF-16 (little-endian)"),
)


_MAY_START_OTHER = frozenset({b"", b"\x00", b"\xef", b"\xfe", b"\xff"})


def other_encoding(raw: bytes) -> str | None:
    """Why a value that is JSON text in another encoding than UTF-8 (or UTF-8 behind a byte order mark) is
    refused, else None. Checked before the Schema Registry frame, which also starts with a zero byte."""
    if raw[:1] not in _MAY_START_OTHER and raw[1:2] != b"\x00":
        return None  # the common case: UTF-8 JSON starts with an ASCII byte, then a non-zero one
    if raw.startswith(b"\xef\xbb\xbf"):
        return (
            "not valid JSON: the value starts with a UTF-8 byte order mark (BOM); produce UTF-8 without one"
        )
    marked = next((name for mark, name in _BOMS if raw.startswith(mark)), None)
    if marked is not None:
        return f"not UTF-8: the value is {marked} text; produce UTF-8 JSON"
    unmarked = _unmarked_encoding(raw)
    return f"not UTF-8: the value looks like {unmarked} JSON text; produce UTF-8 JSON" if unmarked else None


def _unmarked_encoding(raw: bytes) -> str | None:
    if len(raw) < 4 or 0 not in raw[:4]:
        return None
    pattern = "".join("0" if byte == 0 else "x" for byte in raw[:4])
    for expected, codec, name in _UNMARKED:
        if pattern == expected:
            try:
                text = raw.decode(codec)
            except UnicodeDecodeError:
                return None  # not text in that encoding either (a Schema Registry frame, say)
            return name if text.lstrip()[:1] in ("{", "[") else None
    return None


_NON_FINITE = "NaN, Infinity and -Infinity are not JSON"
# A number literal that may not fit a double: a 3-digit exponent, or 300 digits in a row. The parser would
# read it as infinity, written back as null. Rare in real events: a match only triggers the careful parse.
# Linear: the first branch starts only at an `e`; the second only at the start of a run of digits (without
# the lookbehind, every digit of runs just under 300 long started a 299-digit scan: 1 s per MiB).
_MAYBE_HUGE = re.compile(rb"[eE][+-]?\d{3,}|(?<!\d)\d{300,}")


def maybe_non_finite_reference(raw: bytes) -> bool:
    """May `raw` hold NaN, Infinity or a number too large for a double: the prescan's definition (the native
    module's `maybe_non_finite` and `maybe_non_finite_py` answer exactly this; the regex costs ~35 us per KB,
    so it only defines them: tests/unit/test_non_finite_prescan.py)."""
    return b"NaN" in raw or b"Infinity" in raw or _MAYBE_HUGE.search(raw) is not None


# Digits to "0", "E" to "e", the signs kept, every other byte to a space: `_MAYBE_HUGE` matches `raw` exactly
# when its translation holds "e000", "e+000", "e-000" or 300 zeros in a row (a run of 300 digits or more holds
# 300 in a row; the lookbehind only says where a run starts).
_NUMBER_SHAPE: Final = bytes(
    ord("0") if chr(b).isdigit() and b < 128 else b if b in b"e+-" else ord("e") if b == ord("E") else 32
    for b in range(256)
)
_RUN_OF_300: Final = b"0" * 300


def maybe_non_finite_py(raw: bytes) -> bool:
    """`maybe_non_finite_reference` without the regex: the prescan where the native module is not installed
    (a translation and substring searches, ~10 us a bench response against the regex's ~95 and the native
    function's ~0.6)."""
    if b"NaN" in raw or b"Infinity" in raw:
        return True
    shape = raw.translate(_NUMBER_SHAPE)
    return b"e000" in shape or b"e+000" in shape or b"e-000" in shape or _RUN_OF_300 in shape


NATIVE_MODULE: Final = "message_history_native"


def select_prescan() -> Callable[[bytes], bool]:
    """The prescan `_refuse_non_finite` asks: the native module's `maybe_non_finite` when it is installed and
    has it (native/src/prescan.rs, tests/unit/test_non_finite_prescan.py hold it equal to the reference), else
    `maybe_non_finite_py`. It mirrors no model, so any build that has the function will do."""
    try:
        module = importlib.import_module(NATIVE_MODULE)
    except ImportError:
        return maybe_non_finite_py
    native: Callable[[bytes], bool] | None = getattr(module, "maybe_non_finite", None)
    return maybe_non_finite_py if native is None else native


_maybe_non_finite: Callable[[bytes], bool] = select_prescan()
"""Chosen once, at import: the one place that decides which prescan runs."""


def _refuse_non_finite(raw: bytes) -> None:
    """Refuse the `NaN`, `Infinity` and `-Infinity` literals anywhere in a value, and numbers too large for a
    double (the models' parser reads them all as floats, and they would be written back as null).

    One prescan in the common case (`_maybe_non_finite`); only a value that contains the letters or a
    huge-looking number anywhere (in a string, say) is looked at again and parsed once more, with those
    refused.
    """
    try:
        maybe = _maybe_non_finite(raw)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 -- a Rust panic (PyO3's `PanicException` is a BaseException that
        # every `except Exception` would let through, ending the loop): the reference decides this value
        maybe = maybe_non_finite_py(raw)
    if not maybe:
        return
    if b"NaN" in raw or b"Infinity" in raw:
        try:
            from_json(raw, allow_inf_nan=False)
        except ValueError as exc:
            try:
                from_json(raw)
            except ValueError:
                return  # not JSON for another reason too: the models' parse says where
            raise EventValidationError(f"not valid JSON: {exc} ({_NON_FINITE})") from None
    if _MAYBE_HUGE.search(raw) is not None:
        try:
            json.loads(raw, parse_float=_finite_float)
        except _NotFiniteError as exc:
            raise EventValidationError(
                f"not valid JSON: the number {exc.literal[:40]} does not fit a double ({_NON_FINITE})"
            ) from None
        except ValueError:
            return  # not JSON for another reason: the models' parse says where


class _NotFiniteError(Exception):  # control flow inside `_refuse_non_finite` only, never raised out of it
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotFiniteError(literal)
    return value


_DAY_MS = 86_400_000
_DAY_BEFORE_LATEST = LATEST - timedelta(milliseconds=_DAY_MS)


def _check_derived_times(event: EventBase, messages: Sequence[Message], path: str, offset: int) -> None:
    """A message without `createdAt` gets the event's `createdAt` + its position in ms (`_normalize`): refuse
    the event when that instant is past the latest storable one, instead of overflowing."""
    if offset + len(messages) < _DAY_MS and event.createdAt <= _DAY_BEFORE_LATEST:
        return  # the common case, without building a timedelta per list (issue 33)
    if event.createdAt <= LATEST - timedelta(milliseconds=offset + len(messages)):
        return  # no derived time of this list can pass the end
    for i, message in enumerate(messages):
        if message.createdAt is None and event.createdAt > LATEST - timedelta(milliseconds=offset + i):
            raise EventValidationError(
                f"derived from the event's createdAt + {offset + i} ms, {TIMESTAMP_RANGE_ERROR}",
                f"{path}.{i}.createdAt",
            )


def schema_registry_framing(raw: bytes) -> str | None:
    """Why a value framed by a Schema Registry serializer (magic byte 0, schema id) is refused, else None.

    Confluent's Avro, Protobuf and JSON Schema serializers put these five bytes before the payload. JSON never
    starts with a zero byte, so the check cannot refuse a JSON event.
    """
    if len(raw) < 5 or raw[0] != 0:
        return None
    schema_id = int.from_bytes(raw[1:5], "big")
    return (
        f"Schema Registry framing (magic byte 0, schema id {schema_id}): this service reads plain JSON "
        "values; produce with a plain JSON (string) serializer, not a Schema Registry serializer"
    )


def _check_memory(memory: MemoryOptions | None) -> None:
    # The checks tying two fields together (Mastra's normalizeMessageHistoryConfig); the service defaults
    # are checked where they are applied (consumers.recall).
    if memory is None or memory.atMaxRemoveTokens is None:
        return
    if memory.maxTokens is not None and memory.atMaxRemoveTokens > memory.maxTokens:
        raise EventValidationError(AT_MAX_REMOVE_TOKENS_ERROR, "memory.atMaxRemoveTokens")


def check_id(value: str, path: str, limits: Limits) -> None:
    problem = id_problem(value, limits.max_id_length)
    if problem is not None:
        raise EventValidationError(problem, path)


def _check_messages(event: EventBase, messages: Sequence[Message], path: str, limits: Limits) -> None:
    if len(messages) > limits.max_messages_per_event:
        raise EventValidationError(
            f"{len(messages)} messages; the limit is {limits.max_messages_per_event}", path
        )
    for i, message in enumerate(messages):
        where = f"{path}.{i}"
        if message.id is not None:
            check_id(message.id, f"{where}.id", limits)
        if message.threadId is not None and message.threadId != event.threadId:
            raise EventValidationError("contradicts the event's threadId", f"{where}.threadId")
        if message.resourceId is not None and message.resourceId != event.resourceId:
            raise EventValidationError("contradicts the event's resourceId", f"{where}.resourceId")
        parts = len(message.content.parts)
        if parts > limits.max_parts_per_message:
            raise EventValidationError(
                f"{parts} parts; the limit is {limits.max_parts_per_message}", f"{where}.content.parts"
            )


def _normalize(event: EventBase, messages: Sequence[Message], kind: Kind, offset: int) -> None:
    """Fill `id`, `createdAt`, `threadId`, `resourceId` where absent, deterministically from the event.

    The filled fields are marked as set, so they are in the wire form. The messages are the ones this decode
    just parsed, owned by nothing else, so they are filled in place: what `model_copy(update=...)` would set
    on a copy (the same `__dict__` and fields set; tests/unit/test_normalize_in_place.py), without a copy per
    message (issue 33: two of a bench response's 23 us). The lists stay the event's own (its required fields:
    nothing to assign back, nothing newly set on the event).
    """
    for i, message in enumerate(messages):
        filled: list[str] = []
        values = message.__dict__
        if message.id is None:
            # scoped to tenant and thread, deterministic (schemas.ids)
            values["id"] = derived_message_id(event.resourceId, event.threadId, event.requestId, kind, i)
            filled.append("id")
        if message.createdAt is None:
            values["createdAt"] = event.createdAt + timedelta(milliseconds=offset + i)
            filled.append("createdAt")
        if message.threadId is None:
            values["threadId"] = event.threadId
            filled.append("threadId")
        if message.resourceId is None:
            values["resourceId"] = event.resourceId
            filled.append("resourceId")
        if filled:
            message.__pydantic_fields_set__.update(filled)


def validation_error(exc: ValidationError) -> EventValidationError:
    """The one `EventValidationError` for a pydantic error (its first error, "not valid JSON: ..." for JSON
    that does not parse), the same on every path."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    reason = _reason(first)
    if len(errors) > 1:
        reason = f"{reason} (and {len(errors) - 1} more)"
    return EventValidationError(reason, error_path(first["loc"]))


def _reason(error: ErrorDetails) -> str:
    if error["type"] == "json_invalid":
        text = f"not valid JSON: {error['msg'].removeprefix('Invalid JSON: ')}"
    else:
        text = error["msg"].removeprefix("Value error, ")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def error_path(loc: Sequence[int | str]) -> str:
    """Dotted path from a pydantic location, minus the part-kind tags pydantic inserts (`parts.0.text`)."""
    out: list[str] = []
    for i, item in enumerate(loc):
        if i >= 2 and loc[i - 2] == "parts" and isinstance(loc[i - 1], int) and item in PART_TAGS:
            continue
        out.append(str(item))
    return ".".join(out)


def keyed_by_thread(key: bytes | None, event: E) -> E:
    """`event`, when its record's Kafka key is its `threadId`; else `EventValidationError` (a dead letter).

    One writer per thread: the key picks the partition, and only records of one partition are processed in
    order by one consumer. A record keyed otherwise (or not at all) could be processed beside another record
    of its thread, on another partition or instance, so it is refused. The reason never echoes the key.
    """
    if key is None:
        raise EventValidationError("the record has no key; records must be keyed by their threadId", "key")
    if key != event.threadId.encode():
        raise EventValidationError("the record's key is not its threadId; records must be keyed by it", "key")
    return event
