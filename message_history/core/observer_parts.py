"""How Mastra's Observer writes a tool call, a tool result and an attachment (pure; `observation_others`).

As `@mastra/memory` 1.31.0 has them: `formatToolArgumentsForObserver` (a bounded breadth-first outline of the
arguments, then size-limited previews of long strings), `formatToolResultForObserver` (the result as
`JSON.stringify(v, null, 2)` after `sanitizeToolResultValue`, cut at 5 000 tokens by
`truncateStringByTokens`), `formatObserverAttachmentPlaceholder` (`[Image #1: cat.png]`) with
`isImageLikeObserverFilePart` / `resolveObserverAttachmentLabel`, and `extractToolResultAttachments` (a
tool result's media blocks replaced by such placeholders).

JavaScript semantics are reproduced where Python differs: lengths and cuts in UTF-16 units (a surrogate pair
never cut), `String(x)` and `JSON.stringify` forms of numbers (`1`, `1e+21`, `-0`), the order of an
object's keys (integer-like keys first, ascending), `trim`, truthiness.

Values a JSON row cannot hold (a BSON row written by hand) are written as the JSON a row of Mastra's would
hold: a datetime as its ISO form (`2025-03-01T09:05:00.000Z`), bytes as base64, anything else (an ObjectId,
a Decimal128) as `str()`; a key that is not a string as `String(key)`. What Mastra itself cannot render (it
throws: a non-string `text`, a `toolInvocation` that is not an object, a non-string `filename`, nesting
deeper than its stack) raises `UnrenderableError`, and the caller leaves the part out.

Work is bounded (linear in the row, plus C-speed slicing): argument outlines read at most 100 entries at most
5 levels deep (Mastra's limits) and, with a character limit (recall's 500), previews slice no further than
it; a tool result serialized past `MAX_SERIALIZED` UTF-16 units is `UnrenderableError` (the serializer
stops there, so megabytes or thousands of levels, whose indentation grows quadratically, cost at most that
much); the 5 000-token cut counts the whole text once and reads piece totals only up to the budget for its
binary search. Without a character limit (`maxPartLength` 0, which recall never uses) previews of long
strings cost O(n log n).

One approximation: `new URL(…)` (an attachment's label, an image extension in an http(s) URL) is reduced to
what those need (scheme, path, dot segments; hosts are not validated, so a URL Node refuses for its host
gets a label here).
"""

from __future__ import annotations

import base64
import bisect
import heapq
import math
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, Final
from urllib.parse import unquote

from message_history.core import tokens as _tokens
from message_history.core.observation_dates import JS_SPACE_CHARS
from message_history.core.tokens import _by_language, _js_number, _segment_tokens, estimate_token_count

__all__ = [
    "MAX_SERIALIZED",
    "UNDEFINED",
    "AttachmentCounter",
    "UnrenderableError",
    "attachment_placeholder",
    "format_tool_arguments",
    "format_tool_result",
    "js_string",
    "pretty_json",
    "truncate16",
]

MAX_SERIALIZED: Final = 4_000_000
"""A tool result serialized longer than this (UTF-16 units) is not rendered (bounds time and memory)."""

_ARG_MAX_TOKENS: Final = 2000  # DEFAULT_OBSERVER_TOOL_ARGUMENT_MAX_TOKENS
_INLINE_STRING_MAX: Final = 160
_MAX_DEPTH: Final = 5
_MAX_ENTRIES: Final = 20
_MAX_OUTLINE: Final = 100
_MAX_PATH: Final = 160
_RESULT_MAX_TOKENS: Final = 5000
_ENCRYPTED_KEY: Final = "encryptedContent"
_ENCRYPTED_THRESHOLD: Final = 256
_MAX_JOIN_DEPTH: Final = 100  # Array.prototype.join nesting (a list as a tool name) before giving up
_IDENTIFIER: Final = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_IMAGE_EXTENSIONS: Final = frozenset(
    {"png", "jpg", "jpeg", "webp", "gif", "bmp", "tiff", "tif", "heic", "heif", "avif"}
)
_SPECIAL_SCHEMES: Final = frozenset({"http", "https", "ws", "wss", "ftp", "file"})
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*+:")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_DIGITS: Final = frozenset("0123456789")


class UnrenderableError(Exception):
    """A part Mastra's renderer cannot render either (it throws), or past this module's bounds."""


class _Undefined:
    """JavaScript's `undefined` (a missing key), apart from `null` (None)."""

    def __repr__(self) -> str:
        return "undefined"


UNDEFINED: Final = _Undefined()


class AttachmentCounter:
    """`formatMessagesForObserver`'s `{nextImageId, nextFileId}`, shared by one call's messages."""

    __slots__ = ("next_file", "next_image")

    def __init__(self) -> None:
        self.next_image = 1
        self.next_file = 1


# --- JavaScript values -----------------------------------------------------------------------------------

_JSON_TYPES: Final = frozenset({str, int, float, bool, dict, list, tuple, type(None)})


def _plain(value: Any) -> Any:
    """A value a JSON row can hold (see the module docstring for the others)."""
    if type(value) in _JSON_TYPES:
        return value
    if isinstance(value, str | bool | int | float | Mapping | list | tuple | _Undefined):
        return value
    if isinstance(value, datetime):
        at = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        at = at.astimezone(UTC)
        return f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond // 1000:03d}Z"
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    try:
        return str(value)
    except Exception as error:
        raise UnrenderableError(type(value).__name__) from error


def _number(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _number_string(value: int | float) -> str:
    """`String(number)`."""
    number = _number(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return _js_number(number)


def js_string(value: Any, depth: int = 0) -> str:  # noqa: PLR0911 -- one return per JavaScript type
    """`String(value)` (what a template literal writes)."""
    value = _plain(value)
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, _Undefined):
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number_string(value)
    if isinstance(value, Mapping):
        return "[object Object]"
    if depth >= _MAX_JOIN_DEPTH:
        raise UnrenderableError("array nested too deep")
    return ",".join("" if v is None else js_string(v, depth + 1) for v in value)


def js_truthy(value: Any) -> bool:
    if value is None or isinstance(value, _Undefined):
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        number = _number(value)
        return not (number == 0 or math.isnan(number))
    if isinstance(value, str):
        return bool(value)
    return True


def js_trim(text: str) -> str:
    return text.strip(JS_SPACE_CHARS)


def _quote(text: str) -> str:
    """`JSON.stringify(string)`: escapes as JavaScript's (lone surrogates as `\\udxxx`)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif code < 0x20:
            out.append(_CONTROL.get(char, f"\\u{code:04x}"))
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


_CONTROL: Final = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_QUOTE_SAFE: Final = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]*')


def _json_string(text: str) -> str:
    if text.isascii():
        return encode_basestring(text)  # JavaScript's escapes, for ASCII (the C encoder's)
    if _QUOTE_SAFE.fullmatch(text):
        return f'"{text}"'
    return _quote(text)


def _index_key(key: str) -> int | None:
    """An array-index key ("0" … "4294967294"), which JavaScript lists first, in numeric order."""
    if 0 < len(key) <= 10 and key.isascii() and key.isdigit() and (key == "0" or key[0] != "0"):
        number = int(key)
        if number < 4294967295:
            return number
    return None


def _entries(mapping: Mapping[Any, Any], limit: int | None = None) -> tuple[list[tuple[str, Any]], bool]:
    """The object's own keys in JavaScript's order (`Object.entries`, `for…in`): the first `limit` of
    them (all without one) and whether there are more. Keys become strings, a later duplicate's value
    winning at the first one's place, as assignments to a JavaScript object do."""
    if limit is None and type(mapping) is dict:
        # the common case: string keys, none an array index (those start with a digit): already in order
        for key in mapping:
            if type(key) is not str or key[:1] in _DIGITS:
                break
        else:
            return list(mapping.items()), False
    named: dict[str, Any] = {}
    for key, value in mapping.items():
        named[key if isinstance(key, str) else js_string(key)] = value
    indexed = [(n, k) for k in named if (n := _index_key(k)) is not None]
    first = sorted(indexed) if limit is None else heapq.nsmallest(limit + 1, indexed)
    keys = [k for _, k in first]
    if len(keys) != len(named):
        taken = {k for _, k in indexed}
        for key in named:
            if key not in taken:
                keys.append(key)
                if limit is not None and len(keys) > limit:
                    break
    if limit is not None and len(keys) > limit:
        return [(k, named[k]) for k in keys[:limit]], True
    return [(k, named[k]) for k in keys], False


# --- UTF-16 ------------------------------------------------------------------------------------------------


def _len16(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _head16(text: str, end: int) -> str:
    """`safeSlice(text, end)`: the longest prefix of at most `end` UTF-16 units (a pair never cut)."""
    if end <= 0:
        return ""
    head = text[:end]
    if _len16(head) <= end:
        return head
    units = 0
    for index, char in enumerate(head):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > end:
            return head[:index]
    return head


def _tail16(text: str, length: int) -> str:
    """`safeTail(text, length)`: the longest suffix of at most `length` units (a pair never cut)."""
    tail = text[-length:] if length > 0 else ""
    while _len16(tail) > length:
        tail = tail[1:]
    return tail


def truncate16(text: str, max_len: int | None) -> str:
    """`maybeTruncate(text, maxLen)`: cut at `maxLen` UTF-16 units with `... [truncated N characters]`."""
    if not max_len:
        return text
    if len(text) <= max_len and text.isascii():
        return text
    length = _len16(text)
    if length <= max_len:
        return text
    kept = _head16(text, max_len)
    return f"{kept}\n... [truncated {length - _len16(kept)} characters]"


# --- tool arguments ----------------------------------------------------------------------------------------


class _Limits:
    __slots__ = ("max_chars", "max_tokens")

    def __init__(self, max_tokens: float, max_chars: float) -> None:
        self.max_tokens = max_tokens
        self.max_chars = max_chars


def _fits(text: str, limits: _Limits) -> bool:
    return _len16(text) <= limits.max_chars and estimate_token_count(text) <= limits.max_tokens


def _digest(text: str) -> str:
    """`stablePathDigest`: FNV-1a over the UTF-16 units, 8 hex digits."""
    value = 2166136261
    raw = text.encode("utf-16-le", "surrogatepass")
    for index in range(0, len(raw), 2):
        value = ((value ^ (raw[index] | raw[index + 1] << 8)) * 16777619) & 0xFFFFFFFF
    return f"{value:08x}"


def _truncate_path(path: str) -> str:
    length = _len16(path)
    if length <= _MAX_PATH:
        return path
    return f"{_head16(path, 50)}…[{length - 110} chars; {_digest(path)}]…{_tail16(path, 60)}"


def _format_path(parent: str, key: str | int, is_array: bool) -> str:
    if is_array:
        return _truncate_path(f"{parent}[{key}]")
    name = str(key)
    segment = name if _IDENTIFIER.fullmatch(name) else f"[{_json_string(name)}]"
    return _truncate_path(f"{parent}.{segment}" if parent else segment)


def _primitive(value: Any) -> str:
    """`formatPrimitive` (`value` already `_plain`, not a container)."""
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, _Undefined):
        return "<undefined>"
    if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0:
        return "-0"
    return js_string(value)


def _summary(value: Any) -> str:
    if isinstance(value, Mapping):
        return "<object>"
    return f"<array, {len(value)} {'item' if len(value) == 1 else 'items'}>"


def _is_container(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple)


class _Entry:
    __slots__ = ("depth", "order", "text", "tokens")

    def __init__(self, text: str, depth: float, order: int) -> None:
        self.text = text
        self.depth = depth
        self.order = order
        self.tokens = -1


def _join(entries: list[_Entry], marker: str | None = None) -> str:
    lines = [e.text for e in sorted(entries, key=lambda e: e.order)]
    if marker:
        lines.append(marker)
    return "\n".join(lines)


def _select_outline(entries: list[_Entry], limits: _Limits) -> str:
    """`selectOutlineEntries`."""
    whole = _join(entries)
    if _fits(whole, limits):
        return whole
    marker = "... [additional argument fields omitted by size limit]"
    for entry in entries:
        entry.tokens = estimate_token_count(entry.text)
    candidates = sorted(entries, key=lambda e: (e.depth, e.tokens, _len16(e.text), e.order))
    selected: list[_Entry] = []
    for candidate in candidates:
        if _fits(_join([*selected, candidate], marker), limits):
            selected.append(candidate)
    rendered = _join(selected, marker)
    if _fits(rendered, limits):
        return rendered
    if _fits(marker, limits):
        return marker
    return "…" if _fits("…", limits) else ""


def _sanitize_surrogates(text: str) -> str:
    """`sanitizeSurrogates`: a lone surrogate becomes U+FFFD (a Python string holds only lone ones)."""
    return _SURROGATE.sub("\ufffd", text)


def _preview(path: str, value: str, limits: _Limits, prefix: str = "") -> str:
    """`formatPreview`: the longest head of `value` whose block fits (a binary search, as Mastra's)."""
    total = _len16(value)
    # A candidate is longer than its head, so with a finite character limit only heads up to that limit
    # can fit: slicing beyond it is skipped (same answers, bounded work).
    bounded = math.isfinite(limits.max_chars)
    source = value
    if bounded:
        source = _head16(value, int(limits.max_chars) + 2)
    sanitized = _sanitize_surrogates(source)
    low, high, best = 0, total, ""
    while low <= high:
        mid = (low + high) // 2
        fits = False
        if not bounded or mid <= limits.max_chars:
            visible = _head16(sanitized, mid)
            omitted = total - _len16(visible)
            lines = "\n".join(f"  | {line}" for line in visible.split("\n"))
            note = f"\n  | ... [{omitted} characters omitted]" if omitted > 0 else ""
            candidate = f"{path}:\n{lines}{note}"
            fits = _fits(f"{prefix}\n{candidate}" if prefix else candidate, limits)
        if fits:
            best = candidate
            low = mid + 1
        else:
            high = mid - 1
    return best


def _append(base: str, addition: str, limits: _Limits) -> str | None:
    if not addition:
        return None
    candidate = f"{base}\n{addition}" if base else addition
    return candidate if _fits(candidate, limits) else None


def format_tool_arguments(value: Any, max_characters: float = math.inf) -> str:
    """`formatToolArgumentsForObserver(value, {maxCharacters})` (2 000 tokens)."""
    limits = _Limits(_ARG_MAX_TOKENS, max_characters)
    if limits.max_tokens <= 0 or limits.max_chars <= 0:
        return ""
    value = _plain(value)
    if not _is_container(value):
        if not isinstance(value, str) or _len16(value) <= _INLINE_STRING_MAX:
            primitive = _primitive(value)
            return primitive if _fits(primitive, limits) else "…" if _fits("…", limits) else ""
        summary = f"<string, {_len16(value)} characters; preview size-limited>"
        rendered = _append(summary, _preview("preview", value, limits, summary), limits)
        if rendered:
            return rendered
        if _fits(summary, limits):
            return summary
        return "…" if _fits("…", limits) else ""
    return _outline(value, limits)


def _outline(value: Any, limits: _Limits) -> str:  # noqa: PLR0912, PLR0915 -- Mastra's one loop
    outline: list[_Entry] = []
    previews: list[tuple[str, str]] = []
    pending: list[tuple[str, Any, int, frozenset[int]]] = [("", value, 0, frozenset({id(value)}))]
    head = 0
    count = 0
    order = 0
    structural_limit = False
    while head < len(pending) and count < _MAX_OUTLINE:
        path, current, depth, ancestors = pending[head]
        head += 1
        is_array = not isinstance(current, Mapping)
        if is_array:
            items: list[tuple[str | int, Any]] = list(enumerate(current[:_MAX_ENTRIES]))
            more = len(current) > _MAX_ENTRIES
        else:
            named, more = _entries(current, _MAX_ENTRIES)
            items = list(named)
        if not items and not more:
            kind = "array" if is_array else "object"
            outline.append(_Entry(f"{path or 'arguments'}: [empty {kind}]", depth, order))
            order += 1
            count += 1
            continue
        if more:
            label = path or ("items" if is_array else "fields")
            outline.append(_Entry(f"{label}: ... [additional entries omitted]", depth, order))
            order += 1
            count += 1
        for key, raw in items:
            if count >= _MAX_OUTLINE:
                structural_limit = True
                break
            entry_path = _format_path(path, key, is_array)
            count += 1
            entry = _plain(raw)
            if isinstance(entry, str) and _len16(entry) > _INLINE_STRING_MAX:
                text = f"{entry_path}: <string, {_len16(entry)} characters; preview size-limited>"
                outline.append(_Entry(text, depth, order))
                previews.append((entry_path, entry))
            elif not _is_container(entry):
                outline.append(_Entry(f"{entry_path}: {_primitive(entry)}", depth, order))
            elif id(entry) in ancestors:
                outline.append(_Entry(f"{entry_path}: [circular]", depth, order))
            elif depth >= _MAX_DEPTH:
                outline.append(_Entry(f"{entry_path}: {_summary(entry)} [max depth reached]", depth, order))
            else:
                outline.append(_Entry(f"{entry_path}: {_summary(entry)}", depth, order))
                pending.append((entry_path, entry, depth + 1, ancestors | {id(entry)}))
            order += 1
    if head < len(pending) or structural_limit:
        outline.append(_Entry("... [additional nested entries omitted by structure limit]", math.inf, order))
        order += 1
    rendered_outline = _select_outline(outline, limits)
    if not previews:
        return rendered_outline
    with_header = _append(rendered_outline, "Large string previews (size-limited):", limits)
    if not with_header:
        return rendered_outline
    rendered = with_header
    shown = omitted = 0
    for index, (path, text) in enumerate(previews):
        remaining = len(previews) - index
        tokens = estimate_token_count(rendered)
        remaining_tokens = max(0, limits.max_tokens - tokens)
        remaining_chars = max(0, limits.max_chars - _len16(rendered) - 1)
        preview_limits = _Limits(
            tokens + math.floor(remaining_tokens / remaining),
            _len16(rendered) + 1 + math.floor(remaining_chars / remaining)
            if math.isfinite(remaining_chars)
            else math.inf,
        )
        preview = _preview(path, text, preview_limits, rendered)
        with_preview = _append(rendered, preview, limits) if preview else None
        if not with_preview:
            omitted += 1
            continue
        rendered = with_preview
        shown += 1
    if shown == 0:
        return rendered_outline
    if omitted > 0:
        marker = f"... [{omitted} large string {'preview' if omitted == 1 else 'previews'} omitted]"
        rendered = _append(rendered, marker, limits) or rendered
    return rendered


# --- tool results ------------------------------------------------------------------------------------------


def pretty_json(  # noqa: PLR0915 -- one branch per JSON type, in `write`
    value: Any, *, indent: str = "  ", limit: int | None = MAX_SERIALIZED
) -> str | None:
    """`JSON.stringify(sanitizeToolResultValue(value), null, 2)` without recursion, stopping with
    `UnrenderableError` past `limit` units (None: no limit); None where JSON.stringify gives undefined.

    `indent=""` writes the same lines without their indentation (not `JSON.stringify(v, null, "")`, which
    is one line): tokenx counts a run of whitespace as nothing, and indentation only ever lengthens the
    run its newline starts, so the text counts the same (OM's counter uses it: linear, where the indented
    text grows with the depth times the width)."""
    out: list[str] = []
    emit = out.append
    if limit is not None:
        size = 0

        def emit(text: str) -> None:
            nonlocal size
            size += len(text)
            if size > limit:
                raise UnrenderableError("tool result too large")
            out.append(text)

    top = _plain(value)
    if isinstance(top, _Undefined):
        return None
    # The open containers: each one's items still to write (the text before each, its `_plain` value) and
    # its closing text. A scalar is written where it is met; a container met is opened and written first.
    stack: list[tuple[Iterator[tuple[str, Any]], str]] = []

    def write(current: Any) -> None:
        kind = type(current)  # the JSON types first, by type: most values are one
        if kind is str:
            emit(_json_string(current))
        elif kind is int and -_SAFE_INTEGER <= current <= _SAFE_INTEGER:
            emit(str(current))  # what Number::toString writes for an integer a double holds exactly
        elif kind is float and math.isfinite(current):
            emit(_js_number(current))
        elif isinstance(current, str):
            emit(_json_string(current))
        elif isinstance(current, dict | Mapping):
            members = [
                (k, p)
                for k, v in _entries(current)[0]
                if not isinstance(p := v if type(v) in _JSON_TYPES else _plain(v), _Undefined)
            ]
            if not members:
                emit("{}")
                return
            depth = len(stack)
            inner = "\n" + indent * (depth + 1)
            emit("{")
            items = (
                (
                    f"{',' if index else ''}{inner}{_json_string(key)}: ",
                    _sanitized(entry) if key == _ENCRYPTED_KEY else entry,
                )
                for index, (key, entry) in enumerate(members)
            )
            stack.append((items, "\n" + indent * depth + "}"))
        elif isinstance(current, list | tuple):
            if not current:
                emit("[]")
                return
            depth = len(stack)
            inner = "\n" + indent * (depth + 1)
            emit("[")
            items = ((f"{',' if index else ''}{inner}", _array_item(e)) for index, e in enumerate(current))
            stack.append((items, "\n" + indent * depth + "]"))
        elif current is None:
            emit("null")
        elif isinstance(current, bool):
            emit("true" if current else "false")
        else:
            number = _number(current)
            emit("null" if math.isnan(number) or math.isinf(number) else _js_number(number))

    write(top)
    while stack:
        items, closer = stack[-1]
        for prefix, entry in items:
            emit(prefix)
            depth = len(stack)
            write(entry)
            if len(stack) > depth:
                break  # a container opened: its items first
        else:
            emit(closer)
            stack.pop()
    return "".join(out)


def _array_item(entry: Any) -> Any:
    """An array's item as `JSON.stringify` writes it: `undefined` as `null`."""
    plain = _plain(entry)
    return None if isinstance(plain, _Undefined) else plain


def _sanitized(entry: Any) -> Any:
    """`sanitizeToolResultValue` on an `encryptedContent` member: a long string replaced by a note of its
    length."""
    if isinstance(entry, str) and _len16(entry) > _ENCRYPTED_THRESHOLD:
        return f"[stripped encryptedContent: {_len16(entry)} characters]"
    return entry


_SAFE_INTEGER: Final = 2**53


def _stringify_result(value: Any) -> str | None:
    """`stringifyToolResult`."""
    plain = _plain(value)
    if isinstance(plain, str):
        if len(plain) > MAX_SERIALIZED:
            raise UnrenderableError("tool result too large")
        return plain
    return pretty_json(plain)


def _piece_tokens(piece: str) -> int:
    """tokenx's `estimateSegmentTokens` (`tokens._segment_tokens`) with the UTF-16 length in C."""
    if piece.isascii():
        return _segment_tokens(piece)
    if _tokens._WHITESPACE.fullmatch(piece):
        return 0
    if _tokens._CJK.search(piece):
        return len(piece)
    length = _len16(piece)
    if length <= _tokens._SHORT_TOKEN_THRESHOLD:
        return 1
    if _tokens._HAS_PUNCTUATION.search(piece):
        return math.ceil(length / 2)
    return _by_language(piece, length)


class _Prefixes:
    """tokenx counts of the prefixes of one text, from its pieces' running totals, read only as far as
    `limit` tokens: a prefix reaching past that is over any budget up to `limit` (counts only grow)."""

    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.starts: list[int] = []
        self.cumulative: list[int] = [0]
        self.end = 0  # code points covered by the pieces read
        for start, piece in _pieces(text):
            self.starts.append(start)
            self.cumulative.append(self.cumulative[-1] + _piece_tokens(piece))
            self.end = start + len(piece)
            if self.cumulative[-1] > limit:
                break

    def tokens(self, end: int) -> int | None:
        """Tokens of `text[:end]` (code points), None past the pieces read."""
        if end <= 0:
            return 0
        if end > self.end:
            return None
        index = bisect.bisect_right(self.starts, end - 1) - 1
        start = self.starts[index]
        return self.cumulative[index] + _piece_tokens(self.text[start:end])


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """`text.split(TOKEN_SPLIT_PATTERN).filter(Boolean)` with each piece's start, lazily."""
    position = 0
    for match in _tokens._SPLIT.finditer(text):
        if match.start() > position:
            yield position, text[position : match.start()]
        yield match.start(), match.group()
        position = match.end()
    if position < len(text):
        yield position, text[position:]


def _truncate_by_tokens(text: str, max_tokens: int) -> str:
    """`truncateStringByTokens`: the longest head (binary search, as Mastra's) within `max_tokens` with its
    `... [truncated ~N tokens]` note."""
    if not text or max_tokens <= 0:
        return ""
    total = estimate_token_count(text)
    if total <= max_tokens:
        return text
    prefixes = _Prefixes(text, max_tokens)
    # code point index of each UTF-16 offset, needed only when the text has astral characters
    offsets: Callable[[int], int]
    length = _len16(text)
    if length == len(text):
        offsets = lambda end: end  # noqa: E731
    else:
        starts16: list[int] = []
        units = 0
        for char in text:
            starts16.append(units)
            units += 2 if ord(char) > 0xFFFF else 1
        starts16.append(units)

        def offsets(end: int) -> int:
            # safeSlice: the longest prefix of at most `end` units
            return bisect.bisect_right(starts16, end) - 1

    low, high = 0, length
    best = f"\n... [truncated ~{total} tokens]"
    while low <= high:
        mid = (low + high) // 2
        end = offsets(min(mid, length))
        visible_tokens = prefixes.tokens(end)
        if visible_tokens is None:
            high = mid - 1
            continue
        # the note starts with a newline, so its pieces never join the head's
        note = f"\n... [truncated ~{total - visible_tokens} tokens]"
        if visible_tokens + estimate_token_count(note) <= max_tokens:
            best = text[:end] + note
            low = mid + 1
        else:
            high = mid - 1
    return best


def format_tool_result(value: Any) -> str:
    """`formatToolResultForObserver(value, {maxTokens: 5000})`."""
    text = _stringify_result(value)
    if text is None:
        raise UnrenderableError(
            "undefined result"
        )  # Mastra: `text.length` of undefined throws (cannot happen)
    return _truncate_by_tokens(text, _RESULT_MAX_TOKENS)


# --- attachments -------------------------------------------------------------------------------------------


def _extension(value: str) -> str | None:
    """`getObserverPathExtension`: `.png` at the end (before `?` / `#`), lower-cased."""
    path = value.split("#", 1)[0].split("?", 1)[0]
    _, dot, tail = path.rpartition(".")
    if dot and tail and tail.isascii() and tail.isalnum():
        return tail.lower()
    return None


def _image_name(name: Any) -> bool:
    return isinstance(name, str) and _extension(name) in _IMAGE_EXTENSIONS


def _url(text: str) -> tuple[str, str] | None:  # noqa: PLR0912 -- the parser's cases
    """The scheme and `pathname` of `new URL(text)`, or None where it throws (a WHATWG parse, reduced to
    what the basename and extension need; hosts are not validated)."""
    text = text.strip("".join(chr(c) for c in range(0x21))).replace("\t", "").replace("\n", "")
    text = text.replace("\r", "")
    match = _SCHEME.match(text)
    if match is None:
        return None
    scheme = match.group()[:-1].lower()
    rest = text[match.end() :]
    rest = rest.split("#", 1)[0].split("?", 1)[0]
    special = scheme in _SPECIAL_SCHEMES
    if special:
        rest = rest.replace("\\", "/")
        stripped = rest.lstrip("/")
        if scheme != "file" or rest.startswith("//"):
            host, slash, path = stripped.partition("/")
            if not host and scheme != "file":
                return None
            rest = slash + path
        segments = rest.split("/")[1:] if rest.startswith("/") else rest.split("/")
    elif rest.startswith("//"):
        _, slash, path = rest[2:].partition("/")
        segments = path.split("/") if slash else []
    elif rest.startswith("/"):
        segments = rest[1:].split("/")
    else:
        return scheme, rest  # an opaque path
    kept: list[str] = []
    for index, segment in enumerate(segments):
        lowered = segment.lower()
        last = index == len(segments) - 1
        if lowered in {"..", ".%2e", "%2e.", "%2e%2e"}:
            if kept:
                kept.pop()
            if last:
                kept.append("")
        elif lowered in {".", "%2e"}:
            if last:
                kept.append("")
        else:
            kept.append(segment)
    return scheme, "/" + "/".join(kept)


def _decode_uri_component(text: str) -> str | None:
    """`decodeURIComponent`, None where it throws (a `%` without two hex digits, or bad UTF-8)."""
    index = text.find("%")
    while index != -1:
        pair = text[index + 1 : index + 3]
        if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
            return None
        index = text.find("%", index + 3)
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        return None


def _file_is_image(part: Mapping[str, Any]) -> bool:
    """`isImageLikeObserverFilePart`."""
    if part.get("type") != "file":
        return False
    mime = part.get("mimeType")
    if isinstance(mime, str) and mime.lower().startswith("image/"):
        return True
    data = part.get("data")
    if isinstance(data, str):
        if data.startswith("data:image/"):
            return True
        parsed = _url(data)
        if parsed is not None and parsed[0] in {"http", "https"} and _image_name(parsed[1]):
            return True
    return _image_name(part.get("filename"))


def _label(part: Mapping[str, Any]) -> Any:
    """`resolveObserverAttachmentLabel`: the file name, else the URL's last path segment, else the type."""
    filename = part.get("filename", UNDEFINED)
    if filename is not None and not isinstance(filename, _Undefined):
        if not isinstance(filename, str):
            raise UnrenderableError("filename is not a string")  # Mastra: `.trim` is not a function
        if js_trim(filename):
            return js_trim(filename)
    mime = part.get("mimeType", UNDEFINED)
    asset = part.get("image" if part.get("type") == "image" else "data")
    if not isinstance(asset, str) or asset.startswith("data:"):
        return mime
    parsed = _url(asset)
    if parsed is None:
        return mime
    segments = [s for s in parsed[1].split("/") if s]
    if not segments:
        return mime
    decoded = _decode_uri_component(segments[-1])
    return mime if decoded is None else decoded


def attachment_placeholder(part: Mapping[str, Any], counter: AttachmentCounter) -> str:
    """`formatObserverAttachmentPlaceholder`: `[Image #1: cat.png]`, `[File #2]`."""
    label = _label(part)
    if part.get("type") == "image" or _file_is_image(part):
        kind, number = "Image", counter.next_image
        counter.next_image += 1
    else:
        kind, number = "File", counter.next_file
        counter.next_file += 1
    return f"[{kind} #{number}: {js_string(label)}]" if js_truthy(label) else f"[{kind} #{number}]"


def _block_attachment(block: Any) -> dict[str, Any] | None:  # noqa: PLR0911 -- one return per block type
    """`mapToolResultBlockToAttachment`."""
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        return None
    media = block.get("mediaType")
    media = media if isinstance(media, str) else UNDEFINED
    name = block.get("filename")
    name = name if isinstance(name, str) else UNDEFINED
    kind = block["type"]
    data, url = block.get("data"), block.get("url")
    if kind == "image-data" and isinstance(data, str):
        return {"type": "image", "image": f"data:{media};base64,{data}" if media else data, "mimeType": media}
    if kind == "image-url" and isinstance(url, str):
        return {"type": "image", "image": url, "mimeType": media}
    if kind == "media" and isinstance(data, str) and isinstance(media, str) and media:
        uri = f"data:{media};base64,{data}"
        if media.lower().startswith("image/"):
            return {"type": "image", "image": uri, "mimeType": media}
        return {"type": "file", "data": uri, "mimeType": media}
    if kind == "file-data" and isinstance(data, str):
        uri = f"data:{media};base64,{data}" if media else data
        return {"type": "file", "data": uri, "mimeType": media, "filename": name}
    if kind == "file-url" and isinstance(url, str):
        return {"type": "file", "data": url, "mimeType": media, "filename": name}
    return None


def without_attachments(result: Any, counter: AttachmentCounter) -> Any:
    """`extractToolResultAttachments`' `resultWithoutAttachments`: a `{type: "content", value: [...]}`
    result's media blocks replaced by `{type, placeholder}` (numbered by `counter`)."""
    if not isinstance(result, Mapping) or result.get("type") != "content":
        return result
    blocks = result.get("value")
    if not isinstance(blocks, list | tuple):
        return result
    changed = False
    value: list[Any] = []
    for block in blocks:
        attachment = _block_attachment(block)
        if attachment is None:
            value.append(block)
            continue
        changed = True
        value.append({"type": block["type"], "placeholder": attachment_placeholder(attachment, counter)})
    if not changed:
        return result
    named, _ = _entries(result)
    return {k: (value if k == "value" else v) for k, v in named}
