"""`RowsCursor`: a `find` whose reply batches come back as each row's BSON bytes, with no object per row.

PyMongo's `find_raw_batches` keeps the driver's cursor (its `getMore`s, timeouts, sessions, retries) but, for
an OP_MSG reply, still inflates the batch array into one `RawBSONDocument` per row before joining them into a
stream again (`_OpMsg.raw_response`, `_convert_raw_document_lists_to_streams`): for a recall batch of 20,000
rows that was about a tenth of the recall path's CPU. `RowsCursor` overrides the one step that unpacks a
reply: it cuts the batch array's elements out of the reply's bytes (`cut_batch`, one linear walk), lets the
driver's own unpacking read the rest of the reply (with the array emptied: the cursor id, namespace, cluster
time and errors as PyMongo reads them), and puts the rows back as the batch. Each item the cursor yields is
one row's bytes, and the cursor counts rows as a plain `find` does (its `limit` bookkeeping included).

Any reply this walk does not make certain (not an OP_MSG, an error, an unexpected layout or type) takes
PyMongo's own path, whose stream is then cut into rows (`split_stream`): the same rows, only slower.
`_unpack_response` is a private hook of PyMongo's cursor: `tests/integration/test_raw_batches.py` compares
this cursor with a plain `find` on the real server (first batches, `getMore`s, limits, errors), so a PyMongo
upgrade that moves it fails there, not in production.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from bson.errors import InvalidBSON
from pymongo.asynchronous.cursor import AsyncRawBatchCursor
from pymongo.message import _OpMsg

__all__ = ["Bytes", "RowsCursor", "array_documents_py", "cut_batch", "split_stream"]

_BATCH_KEYS: Final = (b"firstBatch", b"nextBatch")
# Sizes of the fixed-size BSON element types (double, ObjectId, bool, datetime, null, int32, timestamp,
# int64, decimal128), to step over an element of the reply's `cursor` document without decoding it.
_FIXED_SIZES: Final = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}
_EMPTY_ARRAY: Final = b"\x05\x00\x00\x00\x00"


Bytes = bytes | memoryview
"""A reply's bytes: the driver hands a `memoryview` of its receive buffer, read in place (a recall reply is
tens of MB, and a copy of it cost a few percent of the recall path's CPU)."""


def _int32(data: Bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little", signed=True)


def _find_zero(data: Bytes, start: int, limit: int) -> int:
    """`data.find(b"\\x00", start, limit)`, also for a `memoryview` (which has no `find`): read 64 bytes at a
    time, so a key's terminator costs a short copy, not the reply's. Linear in what it reads."""
    if isinstance(data, bytes):
        return data.find(b"\x00", start, limit)
    at = start
    while at < limit:
        stop = min(limit, at + 64)
        found = bytes(data[at:stop]).find(b"\x00")
        if found >= 0:
            return at + found
        at = stop
    return -1


def _element_end(data: Bytes, at: int, limit: int) -> tuple[int, int] | None:
    """The end of the key and of the element starting at `at` (its type byte), or None when the bytes do not
    make it certain (an unknown type, a size that runs past `limit`)."""
    key_end = _find_zero(data, at + 1, limit)
    if key_end < 0:
        return None
    kind = data[at]
    if kind in (0x02, 0x0D, 0x0E):  # string, code, symbol: int32 length + bytes
        end = key_end + 5 + _int32(data, key_end + 1)
    elif kind in (0x03, 0x04):  # document, array: int32 size, itself included
        end = key_end + 1 + _int32(data, key_end + 1)
    elif kind == 0x05:  # binary: int32 length + subtype + bytes
        end = key_end + 6 + _int32(data, key_end + 1)
    elif kind in _FIXED_SIZES:
        end = key_end + 1 + _FIXED_SIZES[kind]
    else:
        return None
    if end <= key_end or end > limit:
        return None
    return key_end, end


def cut_batch(payload: Bytes) -> tuple[bytes, list[bytes]] | None:
    """The reply `payload` with its `cursor.firstBatch` / `cursor.nextBatch` array emptied, and that array's
    documents as bytes, in order; None when the bytes do not make that certain (the caller takes PyMongo's
    path). One walk over the reply's top level, the cursor document's and the array's elements: linear."""
    if isinstance(payload, memoryview) and (payload.format != "B" or not payload.c_contiguous):
        payload = bytes(payload)  # a view of other items: read as the bytes they are
    end = len(payload)
    if end < 5 or _int32(payload, 0) != end or payload[-1] != 0:
        return None
    at = 4
    while at < end - 1:  # the top level, to the `cursor` document
        step = _element_end(payload, at, end - 1)
        if step is None:
            return None
        key_end, element_end = step
        if payload[at] == 0x03 and payload[at + 1 : key_end] == b"cursor":
            return _cut_cursor(payload, key_end + 1, element_end)
        at = element_end
    return None


def _cut_cursor(payload: Bytes, start: int, end: int) -> tuple[bytes, list[bytes]] | None:
    """`cut_batch` inside the cursor document at `payload[start:end]`."""
    if payload[end - 1] != 0:
        return None
    at = start + 4
    found: tuple[int, int, int] | None = None  # the batch element's start, key end, end
    while at < end - 1:
        step = _element_end(payload, at, end - 1)
        if step is None:
            return None
        key_end, element_end = step
        if payload[at + 1 : key_end] in _BATCH_KEYS:
            if payload[at] != 0x04 or found is not None:
                return None  # not an array, or twice: PyMongo's path says what it is
            found = (at, key_end, element_end)
        at = element_end
    if found is None:
        return None
    at, key_end, array_end = found
    rows = _split_rows(payload, key_end + 1, array_end)
    if rows is None:
        return None
    # the rest of the reply (small: the cursor's id and namespace, `ok`, the cluster time) as bytes
    emptied = bytes(payload[start + 4 : key_end + 1]) + _EMPTY_ARRAY + bytes(payload[array_end:end])
    cursor = (len(emptied) + 4).to_bytes(4, "little") + emptied
    body = bytes(payload[4:start]) + cursor + bytes(payload[end:])
    return (len(body) + 4).to_bytes(4, "little") + body, rows


def _split_rows(payload: Bytes, start: int, end: int) -> list[bytes] | None:
    """`storage.row_codec.array_documents` (the native walk where installed, else `array_documents_py`),
    imported here at first use: row_codec imports this module for its reference."""
    from storage.row_codec import array_documents  # noqa: PLC0415 -- see the docstring

    return array_documents(payload, start, end)


def array_documents_py(payload: Bytes, start: int, end: int) -> list[bytes] | None:
    """The documents of the BSON array at `payload[start:end]`; None when an element is not a document.
    The reference of the native `array_documents` (native/src/split.rs): the same answer on any bytes."""
    if not isinstance(payload, bytes):
        payload = bytes(payload)  # the reference's walk searches with `bytes.find`
    if payload[end - 1] != 0 or _int32(payload, start) != end - start:
        return None
    rows: list[bytes] = []
    at = start + 4
    while at < end - 1:
        if payload[at] != 0x03:
            return None
        key_end = payload.find(b"\x00", at + 1, end - 1)
        if key_end < 0:
            return None
        size = _int32(payload, key_end + 1)
        if size < 5 or key_end + 1 + size > end - 1:
            return None
        rows.append(payload[key_end + 1 : key_end + 1 + size])
        at = key_end + 1 + size
    return rows


def split_stream(stream: bytes, into: list[bytes]) -> None:
    """The documents of a raw batch stream (BSON documents one after the other), appended to `into`. A size
    that does not fit is the reply's fault, not a row's: `InvalidBSON` (a storage error)."""
    at, end = 0, len(stream)
    while at < end:
        size = _int32(stream, at)
        if size < 5 or at + size > end:
            raise InvalidBSON(f"a raw batch's document at byte {at} claims {size} bytes of {end - at} left")
        into.append(stream[at : at + size])
        at += size


class RowsCursor(AsyncRawBatchCursor[Any]):
    """`find_raw_batches` whose items are rows: each one document's bytes (see the module docstring)."""

    def _unpack_response(  # type: ignore[override]
        self,
        response: Any,
        cursor_id: int | None,
        codec_options: Any,
        user_fields: Mapping[str, Any] | None = None,
        legacy_response: bool = False,
    ) -> Sequence[Any]:
        if not legacy_response and isinstance(response, _OpMsg):
            cut = cut_batch(response.payload_document)  # in place: no copy of the reply
            if cut is not None:
                emptied, rows = cut
                read = _OpMsg(response.flags, emptied).raw_response(cursor_id, user_fields=user_fields)
                batch = read[0].get("cursor") if read else None
                if isinstance(batch, dict):  # the driver's own reading of the rest of the reply
                    for key in ("firstBatch", "nextBatch"):
                        if key in batch:
                            batch[key] = rows
                    return read
        docs = super()._unpack_response(response, cursor_id, codec_options, user_fields, legacy_response)
        batch = docs[0].get("cursor") if docs else None
        if isinstance(batch, dict):
            for key in ("firstBatch", "nextBatch"):
                if key in batch:
                    split: list[bytes] = []
                    for stream in batch[key]:
                        split_stream(bytes(stream), split)
                    batch[key] = split
        return docs
