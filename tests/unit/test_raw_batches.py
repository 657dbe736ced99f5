"""`storage.raw_batches.cut_batch`: the rows and the rest of a `find` reply, read from its bytes, are what
PyMongo's own unpacking of the same reply gives (`_OpMsg.raw_response` + the stream of the batch), or None.
Every test runs with each route of the batch array's walk: the Python reference and the native one
(`message_history_native.array_documents`, built by `stack install --all`), which must answer alike on any
bytes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import bson
import pytest
from bson import SON, _convert_raw_document_lists_to_streams
from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from hypothesis import given
from hypothesis import strategies as st
from pymongo.message import _OpMsg

from storage import row_codec
from storage.raw_batches import array_documents_py, cut_batch, split_stream

_NATIVE_SPLIT = getattr(row_codec._native(), "array_documents", None)
_MISSING = "message_history_native.array_documents is missing (stack install --all)"
needs_native = pytest.mark.skipif(
    _NATIVE_SPLIT is None and not os.environ.get("CI"), reason="message_history_native not built"
)


@pytest.fixture(
    autouse=True, params=["python", pytest.param("native", marks=needs_native)], ids=["python", "native"]
)
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> row_codec.RowCodec:
    """The walk `cut_batch` uses: the reference, or the native one (required under CI)."""
    mode: row_codec.RowCodec = request.param
    if mode == "native":
        assert _NATIVE_SPLIT is not None, _MISSING
    monkeypatch.setattr(row_codec, "_selected_split", row_codec.select_split(mode))
    return mode


FIELDS = {"cursor": {"firstBatch": 1, "nextBatch": 1}}  # what a find's cursor asks PyMongo to leave raw
ROWS: list[SON[str, Any]] = [
    SON([("id", "m1"), ("thread_id", "t1")]),
    SON([("id", "m2"), ("n", 2), ("d", {"k": [1, 2]})]),
]


def _reply(
    *top: tuple[str, Any], key: str = "firstBatch", rows: list[Any] = ROWS, first: bool = True
) -> bytes:
    """A find reply: `cursor` (its batch first or last) among `top`'s other fields."""
    batch: list[tuple[str, Any]] = [(key, rows)]
    rest: list[tuple[str, Any]] = [("id", Int64(0)), ("ns", "db.coll")]
    cursor = SON(batch + rest if first else rest + batch)
    return bson.encode(SON([("cursor", cursor), *top]))


def _oversized_batch() -> bytes:
    payload = bytearray(_reply(("ok", 1.0)))
    at = payload.index(b"firstBatch\x00") + len("firstBatch\x00")
    payload[at : at + 4] = (len(payload) + 10).to_bytes(4, "little")
    return bytes(payload)


def _pymongo(payload: bytes, key: str) -> tuple[Mapping[str, Any], list[bytes]]:
    """PyMongo's reading of the reply, as its raw-batch cursor does it: the rest of the reply, and the
    batch's stream of documents cut into rows."""
    doc = _OpMsg(0, payload).raw_response(None, user_fields=FIELDS)[0]
    _convert_raw_document_lists_to_streams(doc)
    rows: list[bytes] = []
    for stream in doc["cursor"].pop(key):
        split_stream(bytes(stream), rows)
    return doc, rows


def _cut(payload: bytes, key: str) -> tuple[Mapping[str, Any], list[bytes]] | None:
    cut = cut_batch(payload)
    if cut is None:
        return None
    emptied, rows = cut
    doc = _OpMsg(0, emptied).raw_response(None, user_fields=FIELDS)[0]
    assert doc["cursor"].pop(key) == b"\x05\x00\x00\x00\x00"  # the emptied array, left raw
    return doc, rows


def _plain(doc: Mapping[str, Any]) -> Any:
    return bson.decode(bson.encode(doc))


@pytest.mark.parametrize(
    "payload",
    [
        _reply(("ok", 1.0)),
        _reply(("ok", 1.0), first=False),
        _reply(("ok", 1.0), key="nextBatch"),
        _reply(("ok", 1.0), rows=[]),
        _reply(("ok", 1.0), ("$clusterTime", {"clusterTime": bson.Timestamp(5, 1)}), ("operationTime", 7)),
        _reply(("ok", 1.0), rows=[{"s": "x" * 10_000}] * 50),
    ],
    ids=["first", "batch-last", "next", "empty", "cluster-time", "large"],
)
def test_the_rows_and_the_rest_are_pymongos(payload: bytes) -> None:
    key = "nextBatch" if b"nextBatch" in payload else "firstBatch"
    cut = _cut(payload, key)
    assert cut is not None
    expected_doc, expected_rows = _pymongo(payload, key)
    assert cut[1] == expected_rows
    assert _plain(cut[0]) == _plain(expected_doc)


@pytest.mark.parametrize(
    "payload",
    [
        bson.encode({"ok": 0.0, "errmsg": "no", "code": 2}),  # an error: no cursor
        bson.encode({"cursor": {"firstBatch": [1, 2], "id": 0}, "ok": 1.0}),  # not documents
        bson.encode({"cursor": {"firstBatch": "x", "id": 0}, "ok": 1.0}),  # not an array
        bson.encode({"cursor": {"id": 0, "x": bson.Regex("a")}, "ok": 1.0}),  # an unknown type, no batch
        bson.encode({"cursor": {"firstBatch": [], "nextBatch": [], "id": 0}, "ok": 1.0}),  # two batches
        b"\x05\x00\x00\x00\x00",
        b"",
        _reply(("ok", 1.0))[:-1],  # cut short
        _oversized_batch(),  # an array whose size runs past its document
    ],
)
def test_what_the_bytes_do_not_make_certain_is_left_to_pymongo(payload: bytes) -> None:
    assert cut_batch(payload) is None


# BSON strings are UTF-8 (no lone surrogates); a key is a C string (no NUL)
_TEXT = st.characters(exclude_categories=["Cs"])
_NAME = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
_SCALARS = st.one_of(
    st.text(_TEXT, max_size=8),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.binary(max_size=8),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_NAME, inner, max_size=3)),
    max_leaves=8,
)
_ROWS = st.lists(st.dictionaries(_NAME, _VALUES, max_size=4), max_size=5)
_TOP = st.lists(st.tuples(_NAME.filter(lambda k: k != "cursor"), _VALUES), max_size=4)


@given(_ROWS, _TOP, st.sampled_from(["firstBatch", "nextBatch"]), st.booleans())
def test_any_find_reply_reads_as_pymongo_reads_it(
    rows: list[dict[str, Any]], top: list[tuple[str, Any]], key: str, first: bool
) -> None:
    payload = _reply(*top, key=key, rows=rows, first=first)
    cut = _cut(payload, key)
    assert cut is not None  # every layout a BSON encoder writes is certain
    expected_doc, expected_rows = _pymongo(payload, key)
    assert cut[1] == expected_rows
    assert _plain(cut[0]) == _plain(expected_doc)


@given(st.binary(max_size=200))
def test_any_bytes_are_cut_or_refused_never_raise(payload: bytes) -> None:
    cut = cut_batch(payload)
    if cut is not None:
        assert all(len(row) >= 5 for row in cut[1])


def test_a_stream_is_split_into_its_documents_or_refused() -> None:
    docs = [bson.encode({"a": i}) for i in range(3)]
    into: list[bytes] = []
    split_stream(b"".join(docs), into)
    assert into == docs
    with pytest.raises(InvalidBSON):
        split_stream(b"".join(docs)[:-1], [])


def _array(rows: list[Any]) -> bytes:
    """A BSON array's bytes (as a document whose keys are the indexes)."""
    return bson.encode(SON([(str(i), row) for i, row in enumerate(rows)]))


def _elements(array: bytes) -> list[bytes]:
    """The array's rows as they stand in it (`bson.encode(row)` would move a row's `_id` first; nested
    documents keep their order)."""
    raw = bson.decode(array, codec_options=CodecOptions(document_class=RawBSONDocument))
    return [bytes(row.raw) for row in raw.values()]


def _native_split(payload: bytes | memoryview, start: int, end: int) -> list[bytes] | None:
    assert _NATIVE_SPLIT is not None, _MISSING
    out: list[bytes] | None = _NATIVE_SPLIT(payload, start, end)
    return out


@needs_native
@given(_ROWS, st.binary(max_size=8), st.binary(max_size=8), st.data())
def test_the_native_walk_is_the_reference_on_any_array(
    rows: list[dict[str, Any]], before: bytes, after: bytes, data: st.DataObject
) -> None:
    """Encoded arrays (every row answered), then the same bytes with one byte changed (whatever the
    reference answers, a list or None, the native walk answers the same)."""
    array = _array(rows)
    payload = before + array + after
    start, end = len(before), len(before) + len(array)
    assert _native_split(payload, start, end) == array_documents_py(payload, start, end) == _elements(array)
    at = data.draw(st.integers(0, len(payload) - 1))
    changed = bytearray(payload)
    changed[at] = data.draw(st.integers(0, 255))
    assert _native_split(bytes(changed), start, end) == array_documents_py(bytes(changed), start, end)


@needs_native
@given(st.binary(min_size=1, max_size=120), st.data())
def test_the_native_walk_is_the_reference_on_any_bytes(payload: bytes, data: st.DataObject) -> None:
    end = data.draw(st.integers(1, len(payload)))
    start = data.draw(st.integers(0, end))
    assert _native_split(payload, start, end) == array_documents_py(payload, start, end)


def test_bounds_outside_the_payload_are_the_references_to_answer(route: row_codec.RowCodec) -> None:
    """The native walk refuses bounds outside the payload (a ValueError, counted as a codec failure) and
    the reference answers instead: the wrapper never answers differently from it."""
    array = _array(ROWS)
    split = row_codec.select_split(route)
    assert split(array, 0, len(array)) == [bson.encode(row) for row in ROWS]
    before = row_codec.native_failures
    with pytest.raises(IndexError):  # the reference's own answer to an end past the bytes
        split(array, 0, len(array) + 1)
    assert row_codec.native_failures == before + (1 if route == "native" else 0)


def _view(payload: bytes, pad: int = 5) -> memoryview:
    """`payload` as the driver hands a reply: a view into a larger receive buffer (a header before it)."""
    return memoryview(bytearray(b"h" * pad + payload))[pad:]


@given(_ROWS, _TOP, st.sampled_from(["firstBatch", "nextBatch"]), st.booleans(), st.integers(0, 20))
def test_a_reply_read_in_place_is_cut_as_its_bytes(
    rows: list[dict[str, Any]], top: list[tuple[str, Any]], key: str, first: bool, pad: int
) -> None:
    """The driver's `memoryview` of its receive buffer, read without a copy, cuts as the same bytes do."""
    payload = _reply(*top, key=key, rows=rows, first=first)
    assert cut_batch(_view(payload, pad)) == cut_batch(payload)


@pytest.mark.parametrize(
    ("payload", "certain"),
    [
        (_reply(("ok", 1.0), rows=[{"s": "x" * 10_000}] * 50), True),
        # keys the walk must step over, longer than one 64-byte read of a view: before the cursor, and in
        # the cursor document before and after its batch
        (
            bson.encode(
                SON([("k" * 200, 1), ("cursor", SON([("firstBatch", ROWS), ("id", Int64(0))])), ("ok", 1)])
            ),
            True,
        ),
        (
            bson.encode(
                SON([("cursor", SON([("n" * 130, "x"), ("firstBatch", ROWS), ("m" * 64, 2)])), ("ok", 1)])
            ),
            True,
        ),
        (_reply(("ok", 1.0))[:-1], False),
        (b"", False),
        (_oversized_batch(), False),
    ],
    ids=["large", "long-key-first", "long-keys-in-cursor", "cut-short", "empty", "oversized"],
)
def test_a_view_answers_as_its_bytes_including_none(payload: bytes, certain: bool) -> None:
    cut = cut_batch(payload)
    assert (cut is not None) == certain
    assert cut_batch(_view(payload)) == cut


def test_a_view_of_other_items_is_read_as_its_bytes() -> None:
    """A view whose items are not unsigned bytes (or not contiguous) is read as the bytes it holds."""
    payload = _reply(("ok", 1.0), rows=ROWS)
    signed = memoryview(bytearray(payload)).cast("b")
    assert cut_batch(signed) == cut_batch(payload)
    strided = memoryview(bytearray(b"".join(bytes([b, 0]) for b in payload)))[::2]
    assert cut_batch(strided) == cut_batch(payload)


@given(st.binary(max_size=200))
def test_any_view_is_cut_or_refused_as_its_bytes(payload: bytes) -> None:
    assert cut_batch(_view(payload)) == cut_batch(payload)


@needs_native
@given(_ROWS, st.binary(max_size=8), st.binary(max_size=8))
def test_the_native_walk_reads_a_view_in_place(
    rows: list[dict[str, Any]], before: bytes, after: bytes
) -> None:
    array = _array(rows)
    payload = before + array + after
    start, end = len(before), len(before) + len(array)
    view = _view(payload)
    assert _native_split(view, start, end) == array_documents_py(view, start, end) == _elements(array)
