"""`storage.raw_owner.RawOwner.read` reads a raw row's `thread_id` and `resourceId` from its bytes: it must
answer exactly what the decoded document says (`wanted.get(doc.get("thread_id", ""))`, then
`doc.get("resourceId") == resource`) for every layout: ours, Mastra's (`resourceId` after `content`, `role`,
`type`), the keys nested in a sub-document or an array, repeated, of another type, missing, or not UTF-8.
Pure (documents built with `bson`, keys in the order given), table-style plus a Hypothesis property.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.son import SON
from hypothesis import given
from hypothesis import strategies as st

from storage.protocol import RecallQuery
from storage.raw_owner import RawOwner
from storage.raw_rows import RAW as RAW_CODEC

WANTED = {
    "t1": RecallQuery(thread_id="t1", resource_id="r1", limit=10),
    "t2": RecallQuery(thread_id="t2", resource_id=None, limit=10),
    "ré": RecallQuery(thread_id="ré", resource_id="rü", limit=10),
}


def _raw(*items: tuple[str, Any]) -> RawBSONDocument:
    """The document with `items` in order, a key repeated if given twice (a dict or SON would merge them)."""
    body = b"".join(bson.encode({key: value})[4:-1] for key, value in items)
    return RawBSONDocument((len(body) + 5).to_bytes(4, "little") + body + b"\x00", RAW_CODEC)


def _expected(doc: RawBSONDocument) -> RecallQuery | None:
    plain = bson.decode(doc.raw)
    query = WANTED.get(plain.get("thread_id", ""))
    if query is None or query.resource_id is None or plain.get("resourceId") == query.resource_id:
        return query
    return None


AT = datetime(2025, 1, 1, tzinfo=UTC)
CASES: list[RawBSONDocument] = [
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r1"), ("role", "user"), ("content", {"a": 1})),
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r2")),
    _raw(
        ("id", "m1"),
        ("thread_id", "t1"),
        ("content", "{}"),
        ("role", "user"),
        ("type", "v2"),
        ("resourceId", "r1"),
    ),
    _raw(("id", "m1"), ("thread_id", "t1"), ("createdAt", AT), ("n", 1), ("x", None), ("resourceId", "r1")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("extra", {"resourceId": "r1"})),  # only nested: not owned
    _raw(("id", "m1"), ("thread_id", "t1"), ("extra", ["r1", {"resourceId": "r1"}]), ("resourceId", "r2")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r1"), ("extra", {"resourceId": "r2"})),
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r1"), ("resourceId", "r2")),  # the last one wins
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r2"), ("resourceId", "r1")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", 5)),
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r1\x00")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("resourceId", "r1x")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("thread_id", "t2"), ("resourceId", "r1")),
    _raw(("id", "m1"), ("thread_id", "t2")),
    _raw(("id", "m1"), ("thread_id", "t3"), ("resourceId", "r1")),
    _raw(("thread_id", "t1"), ("id", "m1"), ("resourceId", "r1")),
    _raw(("id", "m1"), ("resourceId", "r1"), ("thread_id", "t1")),
    _raw(("id", 5), ("thread_id", "t1"), ("resourceId", "r1")),
    _raw(("id", "m1"), ("thread_id", 1), ("resourceId", "r1")),
    _raw(("id", "thread_id"), ("thread_id", "t1"), ("resourceId", "resourceId")),
    _raw(("id", "m1"), ("thread_id", "ré"), ("resourceId", "rü")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("d", 1.5), ("b", True), ("l", 2**40), ("resourceId", "r1")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("o", bson.ObjectId()), ("resourceId", "r1")),
    _raw(("id", "m1"), ("thread_id", "t1"), ("bin", b"resourceId\x00"), ("resourceId", "r1")),  # unknown type
    RawBSONDocument(  # a thread id that is not UTF-8
        bson.encode(SON([("id", "m1"), ("thread_id", "t\x7f"), ("resourceId", "r1")])).replace(
            b"t\x7f", b"t\xff"
        ),
        RAW_CODEC,
    ),
]


def _outcome(read: Callable[[], RecallQuery | None]) -> RecallQuery | None | type[Exception]:
    """The answer, or the error's type (not UTF-8, a list where the thread id goes: both routes raise)."""
    try:
        return read()
    except (bson.errors.InvalidBSON, TypeError) as exc:
        return type(exc)


def assert_same(doc: RawBSONDocument) -> None:
    raw = bytes(doc.raw)  # the recall reads raw batches: each row's bytes
    assert _outcome(lambda: RawOwner().read(raw, WANTED)) == _outcome(lambda: _expected(doc)), bson.decode(
        doc.raw, RAW_CODEC
    )


@pytest.mark.parametrize("doc", CASES, ids=range(len(CASES)))
def test_read_is_the_decoded_rule(doc: RawBSONDocument) -> None:
    assert_same(doc)


_KEYS = st.sampled_from(["id", "thread_id", "resourceId", "role", "content", "x"])
_SCALARS = st.one_of(
    st.sampled_from(["t1", "t2", "ré", "r1", "r2", "rü", "m1", ""]),
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.lists(st.tuples(_KEYS, inner), max_size=3).map(lambda kv: SON(kv))
    ),
    max_leaves=6,
)


@given(
    st.lists(st.tuples(_KEYS, _VALUES), max_size=6),
    st.sampled_from(["t1", "t2", "ré", "t3"]),
    st.sampled_from(["r1", "r2", "rü", None]),
)
def test_read_is_the_decoded_rule_for_any_layout(
    rest: list[tuple[str, Any]], thread: str, resource: Any
) -> None:
    head: list[tuple[str, Any]] = [("id", "m1"), ("thread_id", thread)]
    if resource is not None:
        head.append(("resourceId", resource))
    for doc in (_raw(*head, *rest), _raw(*head[:2], *rest, *head[2:]), _raw(*rest, *head)):
        assert_same(doc)
