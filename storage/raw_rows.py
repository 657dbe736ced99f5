"""Raw reply documents decoded one by one (docs/rules.md#stored-rows): a refusal is its row's, alone.

The driver decodes a reply whole, so one document it cannot decode (invalid UTF-8, a date out of
`datetime`'s range, nesting past the decoder's depth) fails every row of the reply, every thread of a
batch's `$in` read. The storage reads replies as `RawBSONDocument`s and decodes each here: a refusal is an
`UnreadableRowError` naming the row, its id and thread read as far as a lenient decoding (invalid UTF-8
replaced, dates clamped) can read them, so the reader skips that row and goes on (`storage.unreadable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from datetime import UTC
from typing import Any, Final, cast

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

from message_history.errors import UnreadableRowError
from schemas.stored_rows import THREADS
from storage.unreadable import skip

__all__ = ["RAW", "decode_row", "keys_of", "keys_row", "lenient_row", "projected"]

RAW: Final[CodecOptions[RawBSONDocument]] = CodecOptions(document_class=RawBSONDocument, tz_aware=False)
"""A collection's reply as raw documents: nothing decoded by the driver, each row by `decode_row`."""

_STRICT: Final[CodecOptions[Mapping[str, Any]]] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
"""As storage/client.py's CODEC: how every collection of ours reads."""

_LENIENT: Final[CodecOptions[Mapping[str, Any]]] = _STRICT.with_options(
    unicode_decode_error_handler="replace", datetime_conversion=DatetimeConversion.DATETIME_CLAMP
)
"""Only to say which row a refused document is, or to read a thread's owner: never a message's content."""

_KEYS: Final[CodecOptions[Mapping[str, Any]]] = _LENIENT.with_options(
    datetime_conversion=DatetimeConversion.DATETIME_MS
)
"""To find a refused row again by its `_id`: a date kept as its exact milliseconds (clamped, a delete by it
would match nothing)."""


def _reason(exc: BaseException) -> str:
    text = str(exc).lower()
    if "recursion" in text:
        return "nesting"
    if "utf" in text or "surrogate" in text:
        return "text"
    if "year" in text or "date" in text or "range" in text:
        return "createdAt"
    return "bson"


def decode_row(raw: bytes | memoryview, collection: str) -> dict[str, Any]:
    """One raw document decoded as our collections read, or the `UnreadableRowError` naming it."""
    try:
        return cast("dict[str, Any]", bson.decode(raw, codec_options=_STRICT))
    except Exception as exc:  # noqa: BLE001 -- whatever the codec refuses is this row's fault
        found: Mapping[str, Any] = {}
        with suppress(Exception):  # not even that: a row without a name
            found = bson.decode(raw, codec_options=_LENIENT)
        ident = found.get("id")
        thread = found.get("id") if collection == THREADS else found.get("thread_id")
        detail = f"the stored document cannot be decoded ({type(exc).__name__}: {str(exc)[:160]})"
        raise UnreadableRowError(collection, ident, thread, _reason(exc), detail) from None


def keys_row(raw: bytes | memoryview) -> dict[str, Any] | None:
    """A document the strict codec refused, read so that its `_id` finds it again (dates as `DatetimeMS`,
    invalid UTF-8 replaced: such an `_id` finds nothing); None when not even that reads it."""
    try:
        return cast("dict[str, Any]", bson.decode(raw, codec_options=_KEYS))
    except Exception:  # noqa: BLE001 -- the same codec errors, the other options
        return None


def lenient_row(raw: bytes | memoryview) -> dict[str, Any] | None:
    """A document the strict codec refused, read with invalid UTF-8 replaced and dates clamped; None when not
    even that reads it. For a row whose fields must be looked at (a thread's owner), never for content."""
    try:
        return cast("dict[str, Any]", bson.decode(raw, codec_options=_LENIENT))
    except Exception:  # noqa: BLE001 -- the same codec errors, the other options
        return None


def keys_of(raw: RawBSONDocument, collection: str) -> dict[str, Any] | None:
    """A raw row found to be deleted or counted (forget, prune: a projection of its `_id` and `id`), decoded
    alone. One the codec refuses is skipped as unreadable (`storage.unreadable.skip`: counted, logged once)
    and read leniently (`keys_row`), so it is still deleted by its `_id`; None when not even that reads it."""
    try:
        return decode_row(raw.raw, collection)
    except UnreadableRowError as exc:
        skip(exc)
        return keys_row(raw.raw)


# The BSON element types by how their value's length is read, to step over one without decoding it: a fixed
# size; an int32 length then that many bytes after a header (string, code, symbol: 4; binary: 4 + subtype;
# DBPointer: a string then an ObjectId); an int32 size of the whole value (document, array, code with scope).
_FIXED_SIZES: Final[dict[int, int]] = {
    **{0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0},
    **{0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0x7F: 0, 0xFF: 0},
}
_LENGTH_PREFIXED: Final[dict[int, int]] = {0x02: 4, 0x0D: 4, 0x0E: 4, 0x05: 5, 0x0C: 16}
_SIZE_PREFIXED: Final = frozenset({0x03, 0x04, 0x0F})


def projected(raw: bytes | memoryview, names: frozenset[bytes]) -> bytes | None:
    """The document of `raw`'s top-level elements named in `names`, their bytes copied, nothing decoded: what
    the server's projection on those fields returns (of a key repeated, the last). None when the bytes are
    not a well-formed document's top level.

    To read a row's `id` and `thread_id` (its home) as the projection `{id: 1, thread_id: 1}` reads them when
    the whole row is one the codec refuses for another field (its content)."""
    data = bytes(raw)
    end = len(data) - 1
    if end < 4 or int.from_bytes(data[:4], "little") != len(data) or data[end] != 0:
        return None
    kept: dict[bytes, bytes] = {}
    at = 4
    while at < end:
        key_end = data.find(b"\x00", at + 1, end)
        after = _value_end(data, data[at], key_end + 1, end) if key_end > 0 else None
        if after is None or after > end:
            return None
        key = data[at + 1 : key_end]
        if key in names:
            kept[key] = data[at:after]
        at = after
    body = b"".join(kept.values())
    return (len(body) + 5).to_bytes(4, "little") + body + b"\x00"


def _value_end(data: bytes, kind: int, value: int, end: int) -> int | None:
    """Where the value of type `kind` starting at `value` ends; None for a type not known here."""
    length = int.from_bytes(data[value : value + 4], "little")
    if kind in _FIXED_SIZES:
        return value + _FIXED_SIZES[kind]
    if kind in _LENGTH_PREFIXED:
        return value + _LENGTH_PREFIXED[kind] + length
    if kind in _SIZE_PREFIXED:
        return value + length
    if kind == 0x0B:  # regex: two C strings
        pattern_end = data.find(b"\x00", value, end)
        flags_end = data.find(b"\x00", pattern_end + 1, end) if pattern_end >= 0 else -1
        return flags_end + 1 if flags_end >= 0 else None
    return None
