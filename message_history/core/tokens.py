"""Mastra 1.71's default token counter, reproduced number for number (pure, no I/O).

Two layers, both as `@mastra/core` 1.71.0 has them:

* `estimate_token_count(text)`: tokenx 1.3.0's `estimateTokenCount` (inlined in Mastra's bundle), a
  heuristic on pieces of the text split at whitespace and punctuation runs;
* `count_message(message)`: `TokenLimiterProcessor.countInputMessageTokens`, the per-message count Memory's
  token-limited history and its memory-only limiter use: the role, the texts, tool names, arguments and
  results as one string, plus floating-point overheads (3.8 per message and per tool result, minus 12 per
  JSON-stringified value) and flat media estimates. `count_system_text` counts a system instruction.

Exactness is the point: a Mastra app and this service reading one thread must draw the same boundary, so
the JavaScript semantics are reproduced where Python differs: UTF-16 lengths, JavaScript's `\\s`, ASCII `\\d`,
case-insensitive matching without the `u` flag, `JSON.stringify` number and string forms, and the order in
which the floats are added. One known difference: a part stringified whole (`reasoning`, `source`, data and
unknown parts) lists its keys in our model's order (declared fields, then the others as received), which is
the order Mastra writes them in for every part kind Mastra itself produces.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any, Final

from schemas.messages import FilePart, Message, TextPart, ToolInvocationPart

__all__ = [
    "STRINGIFIED_DISCOUNT",
    "TOKENS_PER_CONVERSATION",
    "TOKENS_PER_MESSAGE",
    "CountCache",
    "count_message",
    "count_system_text",
    "estimate_token_count",
    "js_stringify",
    "js_truthy",
    "utf16_length",
]

TOKENS_PER_MESSAGE: Final = 3.8
"""Overhead of one message (and of each tool result in it)."""

TOKENS_PER_CONVERSATION: Final = 24
"""The fixed base the memory-only limiter starts its total from."""

STRINGIFIED_DISCOUNT: Final = 12
_TOKENS_PER_IMAGE: Final = 765
_TOKENS_PER_MEDIA_FALLBACK: Final = 258
_BYTES_PER_TOKEN: Final = 4
_SHORT_TOKEN_THRESHOLD: Final = 3
_DEFAULT_CHARS_PER_TOKEN: Final = 6

# JavaScript's \s (WhiteSpace + LineTerminator); Python's \s also matches U+001C..U+001F and U+0085 and
# misses U+FEFF.
_JS_SPACE: Final = "\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_PUNCTUATION: Final = r".,!?;(){}\[\]<>:/\\|@#$%^&*+=`~_\-"
# Every pattern below is linear in the text (tests/unit/test_regex_bounds.py): each is one character class
# repeated, alternatives of disjoint classes, or (`_NUMERIC`) runs separated by a character the run before
# cannot take; `_ASCII_LONG_WORD`'s `{7,}` retries at most 6 characters from each start.
_SPLIT: Final = re.compile(f"([{_JS_SPACE}]+|[{_PUNCTUATION}]+)")
_WHITESPACE: Final = re.compile(f"[{_JS_SPACE}]+")
_CJK: Final = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\u3000-\u303f\uff00-\uffef\u30a0-\u30ff\u2e80-\u2eff\u31c0-\u31ef"
    "\u3200-\u32ff\u3300-\u33ff\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]"
)
_NUMERIC: Final = re.compile(r"[0-9]+(?:[.,][0-9]+)*")
_HAS_PUNCTUATION: Final = re.compile(f"[{_PUNCTUATION}]")
# Used with `match`; the lookbehind keeps it linear when scanning too (a run of scheme characters without a
# `:` would otherwise be rescanned from each of its letters).
_URL_SCHEME: Final = re.compile(r"(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*+:", re.IGNORECASE)


def _canonicalize(char: str) -> str:
    """ECMAScript's Canonicalize for a case-insensitive, non-Unicode regular expression."""
    upper = char.upper()
    if len(upper) != 1 or (ord(char) >= 128 and ord(upper) < 128):
        return char
    return upper


# tokenx's language rules (`/[...]/i`): the first whose class matches a piece sets its characters per token.
_LANGUAGE_RULES: Final = (
    ("äöüßẞ", 3.0),
    ("éèêëàâîïôûùüÿçœæáíóúñ", 3.0),
    ("ąćęłńóśźżěščřžýůúďťň", 3.5),
)
_PUNCTUATION_CHARS: Final = frozenset(".,!?;(){}[]<>:/\\|@#$%^&*+=`~_-")
_languages: tuple[tuple[frozenset[str], float], ...] | None = None


def _language_sets() -> tuple[tuple[frozenset[str], float], ...]:
    """Every BMP character each rule matches case-insensitively (built once, on first non-ASCII text).

    Only non-ASCII characters can match: Canonicalize never maps one onto ASCII, and the rules list none.
    Astral characters are two surrogates to JavaScript, and a surrogate matches none of the classes.
    """
    global _languages  # noqa: PLW0603 -- a lazily built constant
    if _languages is None:
        wanted = [({_canonicalize(c) for c in chars}, per_token) for chars, per_token in _LANGUAGE_RULES]
        members: list[set[str]] = [set() for _ in wanted]
        for code in range(0x80, 0x10000):
            char = chr(code)
            canonical = _canonicalize(char)
            for index, (canon_set, _) in enumerate(wanted):
                if canonical in canon_set:
                    members[index].add(char)
        _languages = tuple((frozenset(m), w[1]) for m, w in zip(members, wanted, strict=True))
    return _languages


def utf16_length(text: str) -> int:
    """JavaScript's `string.length`: UTF-16 code units (astral characters count twice)."""
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def _by_language(piece: str, length: int) -> int:
    chars = set(piece)
    for members, chars_per_token in _language_sets():
        if not chars.isdisjoint(members):
            return math.ceil(length / chars_per_token)
    return math.ceil(length / _DEFAULT_CHARS_PER_TOKEN)


def _word_tokens(word: str) -> int:
    """A piece between separators (no whitespace, no punctuation): tokenx's remaining rules, in order."""
    if word.isascii():
        if word.isdigit() or len(word) <= _SHORT_TOKEN_THRESHOLD:
            return 1  # a number is one token; so is a short piece
        return math.ceil(len(word) / _DEFAULT_CHARS_PER_TOKEN)
    if _CJK.search(word):
        return len(word)  # Array.from(text).length: code points
    length = utf16_length(word)
    if length <= _SHORT_TOKEN_THRESHOLD:
        return 1
    return _by_language(word, length)


def _segment_tokens(segment: str) -> int:
    """tokenx's `estimateSegmentTokens` for any piece (the reference; `estimate_token_count` is faster)."""
    if _WHITESPACE.fullmatch(segment):
        return 0
    if _CJK.search(segment):
        return len(segment)
    if _NUMERIC.fullmatch(segment):
        return 1
    length = utf16_length(segment)
    if length <= _SHORT_TOKEN_THRESHOLD:
        return 1
    if _HAS_PUNCTUATION.search(segment):
        return math.ceil(length / 2)
    return _by_language(segment, length)


def estimate_token_count(text: str) -> int:
    """tokenx 1.3.0 `estimateTokenCount(text)` with its default options.

    `re.split` with one group alternates words and separators, and a separator is a run of whitespace (0
    tokens) or of ASCII punctuation (1 token up to 3 characters, else half its length, rounded up); so only
    words go through the remaining rules. Equal to summing `_segment_tokens` over the pieces (tested).
    """
    if not text:
        return 0
    if text.isascii():
        return _ascii_token_count(text)
    total = 0
    for index, piece in enumerate(_SPLIT.split(text)):
        if not piece:
            continue
        if index % 2 == 0:
            total += _word_tokens(piece)
        elif piece[0] in _PUNCTUATION_CHARS:
            total += 1 if len(piece) <= _SHORT_TOKEN_THRESHOLD else math.ceil(len(piece) / 2)
    return total


_ASCII_WORD: Final = re.compile(f"[^{_JS_SPACE}{_PUNCTUATION}]+")
_ASCII_LONG_WORD: Final = re.compile(f"[^{_JS_SPACE}{_PUNCTUATION}]{{7,}}")
_PUNCTUATION_RUN: Final = re.compile(f"[{_PUNCTUATION}]+")


def _ascii_token_count(text: str) -> int:
    """The same count for ASCII text, with the per-piece work done by the regex engine.

    Every word and every punctuation run is at least one token; only words of 7+ characters (not all
    digits: ceil(n / 6)) and punctuation runs of 4+ (ceil(n / 2)) add more.
    """
    total = len(_ASCII_WORD.findall(text))
    for word in _ASCII_LONG_WORD.findall(text):
        if not word.isdigit():
            total += math.ceil(len(word) / _DEFAULT_CHARS_PER_TOKEN) - 1
    for run in _PUNCTUATION_RUN.findall(text):
        total += 1 if len(run) <= _SHORT_TOKEN_THRESHOLD else math.ceil(len(run) / 2)
    return total


def estimate_token_count_reference(text: str) -> int:
    """The same count, piece by piece through `_segment_tokens` (tokenx's own structure), for the tests."""
    if not text:
        return 0
    return sum(_segment_tokens(piece) for piece in _SPLIT.split(text) if piece)


# --- JSON.stringify --------------------------------------------------------------------------------------


def _js_number(value: float) -> str:
    """ECMAScript `Number::toString` (what `JSON.stringify` writes for a number)."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr is the shortest round-tripping form, the same digits JavaScript picks.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = exponent + k  # value = 0.digits × 10^n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


def js_stringify(value: Any) -> str:
    """`JSON.stringify(value)` for JSON data (dicts keep their key order); `TypeError` for anything else.

    Without recursion, so no depth limit of its own: the server stores 180 levels and the event decoder
    reads 200, but the BSON decoder reads ~1 000 (past Python's stack here), and the count must not rest on
    them. Open containers wait on a stack as iterators; linear in the value.
    """
    leaf = _leaf(value)
    if leaf is not None:
        return leaf
    out: list[str] = []
    stack: list[tuple[Iterator[Any], bool]] = []  # an open container's rest, and whether it is a dict
    _open(value, out, stack)
    while stack:
        rest, is_dict = stack[-1]
        # the leaves are written in this loop; a container is opened and the loop goes on inside it
        if is_dict:
            for key, item in rest:
                out.append(f"{_JOIN[out[-1] != '{']}{_string(str(key))}:")
                leaf = _leaf(item)
                if leaf is None:
                    _open(item, out, stack)
                    break
                out.append(leaf)
            else:
                out.append("}")
                stack.pop()
        else:
            for item in rest:
                if out[-1] != "[":
                    out.append(",")
                leaf = _leaf(item)
                if leaf is None:
                    _open(item, out, stack)
                    break
                out.append(leaf)
            else:
                out.append("]")
                stack.pop()
    return "".join(out)


_JOIN: Final = ("", ",")  # before a member: nothing right after its object's "{", else a comma


_string: Final[Callable[[str], str]] = encode_basestring
"""`JSON.stringify(string)`: what `json.dumps(text, ensure_ascii=False)` calls, without building an encoder
for each string."""


def _leaf(value: Any) -> str | None:  # noqa: PLR0911 -- one return per JSON type
    """A scalar's JSON text; None for a container; `TypeError` for what is not JSON data."""
    if isinstance(value, str):
        return _string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _js_number(value)
    if isinstance(value, dict | list | tuple):
        return None
    raise TypeError(f"not JSON data: {type(value).__name__}")


def _open(value: Any, out: list[str], stack: list[tuple[Iterator[Any], bool]]) -> None:
    """Write a container's opening bracket ("{" and "[" are never a leaf's text) and push its items."""
    if isinstance(value, dict):
        out.append("{")
        stack.append((iter(value.items()), True))
    else:
        out.append("[")
        stack.append((iter(value), False))


# --- per message ----------------------------------------------------------------------------------------


def _media_tokens(data: Any, media_type: Any) -> int:
    """Mastra's `estimateMediaTokens`: flat per image, else decoded bytes / 4, else a fallback."""
    if isinstance(media_type, str) and media_type.startswith("image/"):
        return _TOKENS_PER_IMAGE
    byte_length: int | None = None
    if isinstance(data, str):
        is_data_uri = data.startswith("data:")
        content = data
        if is_data_uri and "," in data:
            content = data[data.index(",") + 1 :]
        if is_data_uri or not _URL_SCHEME.match(data):
            byte_length = utf16_length(content) * 3 // 4
    if byte_length is None:
        return _TOKENS_PER_MEDIA_FALLBACK
    return max(1, byte_length // _BYTES_PER_TOKEN)


def _is_media_payload(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("data"), str)
        and (isinstance(value.get("mediaType"), str) or isinstance(value.get("mimeType"), str))
    )


def _nullish(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def js_truthy(value: Any) -> bool:
    """JavaScript truthiness of JSON data: objects and arrays are true even when empty."""
    if isinstance(value, dict | list):
        return True
    if isinstance(value, float) and math.isnan(value):
        return False
    return bool(value)


class _Tally:
    """The pieces `countInputMessageTokens` accumulates, added up in its order."""

    __slots__ = ("media", "overhead", "results", "text")

    def __init__(self, role: str) -> None:
        self.text = [role]
        self.overhead = 0.0
        self.media = 0
        self.results = 0

    def add_value(self, value: Any) -> None:
        if isinstance(value, str):
            self.text.append(value)
        else:
            self.text.append(js_stringify(value))
            self.overhead -= STRINGIFIED_DISCOUNT

    def add_media(self, payload: dict[str, Any]) -> None:
        rest = {k: v for k, v in payload.items() if k != "data"}
        self.media += _media_tokens(
            payload["data"], _nullish(payload.get("mediaType"), payload.get("mimeType"))
        )
        self.text.append(js_stringify(rest))

    def total(self) -> float:
        overhead = self.overhead + TOKENS_PER_MESSAGE
        if self.results > 0:
            overhead += self.results * TOKENS_PER_MESSAGE
        return estimate_token_count("".join(self.text)) + overhead + self.media


def _add_tool(tally: _Tally, part: ToolInvocationPart) -> None:
    invocation = part.toolInvocation
    if invocation.state in ("call", "partial-call"):
        if invocation.toolName:
            tally.text.append(invocation.toolName)
        if js_truthy(invocation.args):
            tally.add_value(invocation.args)
    elif invocation.state == "result":
        tally.results += 1
        if "result" not in invocation.model_fields_set:
            return  # undefined in JavaScript: nothing appended
        result = invocation.result
        if _is_media_payload(result):
            tally.add_media(result)
            tally.overhead -= STRINGIFIED_DISCOUNT
        elif isinstance(result, list) and result and all(_is_media_payload(r) for r in result):
            for entry in result:
                tally.add_media(entry)
            tally.overhead -= STRINGIFIED_DISCOUNT
        else:
            tally.add_value(result)


def count_message(message: Message) -> float:
    """Mastra 1.71's `countInputMessageTokens(message)`: the default per-message token count."""
    tally = _Tally(message.role)
    for part in message.content.parts:
        if isinstance(part, TextPart):
            tally.text.append(part.text)
        elif isinstance(part, ToolInvocationPart):
            _add_tool(tally, part)
        elif isinstance(part, FilePart):
            tally.media += _media_tokens(part.data, part.mimeType)
        else:
            tally.text.append(js_stringify(part.model_dump(mode="json", exclude_unset=True)))
    return tally.total()


def count_system_text(text: str) -> float:
    """Mastra's `countCoreSystemMessageTokens`: `"system" + text`, plus one message overhead."""
    return estimate_token_count("system" + text) + TOKENS_PER_MESSAGE


class CountCache:
    """`count_message` with each message counted once: keyed by the object, which the cache keeps alive.

    A recall counts a message while paging, again in the limiter and for the event's total; one cache per
    batch (the recall path's prefetch shares it with the processor) makes that one count.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, tuple[Message, float]] = {}

    def __call__(self, message: Message) -> float:
        hit = self._counts.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        value = count_message(message)
        self._counts[id(message)] = (message, value)
        return value
