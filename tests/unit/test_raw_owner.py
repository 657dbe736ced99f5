"""`storage.raw_owner.RawOwner.read` reads a raw row's `thread_id` and `resourceId` from its bytes: it must
answer exactly what the decoded document says (`wanted.get(doc.get("thread_id", ""))`, then
`doc.get("resourceId") == resource`) for every layout: ours, Mastra's (`resourceId` after `content`, `role`,
`type`), the keys nested in a sub-document or an array, repeated, of another type, missing, or not UTF-8.
Pure (documents built with `bson`, keys in the order given), table-style plus a Hypothesis property.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.son import SON
from hypothesis import given
from hypothesis import strategies as st

from storage.mongo_recall import _query_of
from storage.protocol import RecallQuery
from storage.raw_owner import RawOwner
from storage.raw_rows import RAW as RAW_CODEC
from storage.row_codec import _native

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


# The native walk (`message_history_native.owners_from_raw`, used by the recall's `$in` read before
# `RawOwner`): where it is sure, the query it leads to is the decoded document's; where it is not, `RawOwner`
# reads the row (above). Built by `stack install --all`, so CI always has it.
_NATIVE_OWNERS = getattr(_native(), "owners_from_raw", None)
needs_native = pytest.mark.skipif(
    _NATIVE_OWNERS is None and not os.environ.get("CI"), reason="message_history_native not built"
)


def assert_native_same(doc: RawBSONDocument) -> bool:
    """The native walk agrees with the decoded rule where it answers; whether it answered."""
    assert _NATIVE_OWNERS is not None, (
        "message_history_native.owners_from_raw is missing (stack install --all)"
    )
    raw = bytes(doc.raw)
    [sure] = _NATIVE_OWNERS([raw])
    if sure is None:
        return False
    assert _query_of(raw, sure, RawOwner(), WANTED) == _outcome(lambda: _expected(doc)), bson.decode(
        doc.raw, RAW_CODEC
    )
    return True


@needs_native
@pytest.mark.parametrize("doc", CASES, ids=range(len(CASES)))
def test_the_native_walk_is_the_decoded_rule(doc: RawBSONDocument) -> None:
    assert_native_same(doc)


@needs_native
def test_the_native_walk_is_sure_of_the_rows_it_is_for() -> None:
    """Not vacuous: the layouts the service and Mastra write are answered natively, not left to Python."""
    answered = [assert_native_same(doc) for doc in CASES[:4]]
    assert all(answered)
    assert _NATIVE_OWNERS is not None
    assert _NATIVE_OWNERS([b"", b"\x05\x00\x00\x00", bytes(CASES[0].raw)[:-1]]) == [None, None, None]


@pytest.mark.parametrize(
    "check",
    [
        pytest.param(assert_same, id="python"),
        pytest.param(assert_native_same, id="native", marks=needs_native),
    ],
)
@given(
    st.lists(st.tuples(_KEYS, _VALUES), max_size=6),
    st.sampled_from(["t1", "t2", "ré", "t3"]),
    st.sampled_from(["r1", "r2", "rü", None]),
)
def test_each_route_is_the_decoded_rule_for_any_layout(
    check: Callable[[RawBSONDocument], object], rest: list[tuple[str, Any]], thread: str, resource: Any
) -> None:
    """`RawOwner` and the native walk, on the row's fields in any order among any others."""
    head: list[tuple[str, Any]] = [("id", "m1"), ("thread_id", thread)]
    if resource is not None:
        head.append(("resourceId", resource))
    for doc in (_raw(*head, *rest), _raw(*head[:2], *rest, *head[2:]), _raw(*rest, *head)):
        check(doc)


@needs_native
@given(st.binary(max_size=64))
def test_the_native_walk_never_fails_on_any_bytes(data: bytes) -> None:
    assert _NATIVE_OWNERS is not None
    framed = (len(data) + 5).to_bytes(4, "little") + data + b"\x00"
    for raw in (data, framed):
        [sure] = _NATIVE_OWNERS([raw])
        if sure is not None:  # sure only where a decoder reads the same thread
            assert bson.decode(raw).get("thread_id", "") == sure[0]
