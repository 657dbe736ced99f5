"""`storage.raw_rows.projected` copies a raw document's named top-level elements without decoding anything:
decoded, it must equal the decoded document's fields of those names (what the server's projection returns),
for every element type around them, keys nested (never taken), repeated (the last wins) or missing; and it
refuses (None) bytes that are not a document's top level. Pure (documents built with `bson`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from bson.son import SON
from hypothesis import given
from hypothesis import strategies as st

from storage.raw_rows import projected

NAMES = frozenset({b"id", b"thread_id"})

EVERY_TYPE: dict[str, Any] = {
    "double": 1.5,
    "string": "é" * 3,
    "document": {"id": "nested", "thread_id": "nested"},
    "array": [{"thread_id": "in-array"}, 2],
    "binary": b"\x00thread_id\x00",
    "objectid": bson.ObjectId(),
    "bool": True,
    "date": datetime(2025, 1, 1, tzinfo=UTC),
    "null": None,
    "regex": bson.regex.Regex("th(read)?_id", "i"),
    "code": bson.code.Code("x"),
    "code with scope": bson.code.Code("x", {"id": 1}),
    "int32": 5,
    "timestamp": bson.timestamp.Timestamp(1, 2),
    "int64": bson.int64.Int64(3),
    "decimal": bson.decimal128.Decimal128("1.5"),
    "minkey": bson.min_key.MinKey(),
    "maxkey": bson.max_key.MaxKey(),
}


def _fields(doc: SON[str, Any]) -> dict[str, Any]:
    decoded = bson.decode(bson.encode(doc))
    return {k: decoded[k] for k in ("id", "thread_id") if k in decoded}


@pytest.mark.parametrize("kind", list(EVERY_TYPE))
def test_every_element_type_is_stepped_over(kind: str) -> None:
    doc = SON([(kind, EVERY_TYPE[kind]), ("id", "m1"), ("other", EVERY_TYPE[kind]), ("thread_id", "t1")])
    out = projected(bson.encode(doc), NAMES)
    assert out is not None
    assert bson.decode(out) == {"id": "m1", "thread_id": "t1"}


def test_a_repeated_key_keeps_the_last_value_as_decoding_does() -> None:
    raw = bson.encode(SON([("thread_id", "first"), ("id", 7), ("thread_id", "last")]))
    out = projected(raw, NAMES)
    assert out is not None
    assert (
        bson.decode(out)
        == {"thread_id": "last", "id": 7}
        == {k: bson.decode(raw)[k] for k in ("id", "thread_id")}
    )


def test_missing_fields_give_an_empty_document() -> None:
    out = projected(bson.encode({"a": 1}), NAMES)
    assert out is not None
    assert bson.decode(out) == {}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x05\x00\x00",
        bson.encode({"id": "m1"})[:-1] + b"\x01",  # no terminating zero
        bson.encode({"id": "m1"})[:-2] + b"\x00",  # the size says otherwise
        b"\x0c\x00\x00\x00\x02id\x00\xff\x00\x00\x00",  # a string running past the end
        b"\x0b\x00\x00\x00\x20id\x00\x00\x00\x00",  # an unknown element type
    ],
)
def test_bytes_that_are_not_a_document_are_refused(raw: bytes) -> None:
    assert projected(raw, NAMES) is None


_VALUES = st.sampled_from(list(EVERY_TYPE.values())) | st.text(max_size=5) | st.integers(-(2**31), 2**31 - 1)


@given(st.lists(st.tuples(st.sampled_from(["id", "thread_id", "a", "content", "idx"]), _VALUES), max_size=8))
def test_projected_fields_decode_as_the_document_does(elements: list[tuple[str, Any]]) -> None:
    doc: SON[str, Any] = SON()
    raw_parts = b"".join(bson.encode(SON([(k, v)]))[4:-1] for k, v in elements)  # keys repeated as given
    raw = (len(raw_parts) + 5).to_bytes(4, "little") + raw_parts + b"\x00"
    for key, value in elements:
        doc[key] = value
    out = projected(raw, NAMES)
    assert out is not None
    assert bson.decode(out) == _fields(doc)
