"""`storage.row_codec.group_rows`, the native grouping of a `$in` recall reply into its threads' pages: where
it answers, it is exactly `storage.mongo_recall.group_rows_py` (the reference: the loop the recall ran per
row), the documents the very objects of the reply; where it is not sure of a row's owner it answers None and
the reference groups the batch. Pure: documents built with `bson`, table-style plus Hypothesis properties.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest
from bson.regex import Regex
from hypothesis import given
from hypothesis import strategies as st

from storage import row_codec
from storage.mongo_recall import _grouped, group_rows_py
from storage.protocol import RecallQuery
from tests.unit.test_raw_owner import _KEYS, _VALUES, CASES, _raw

_NATIVE_GROUP = getattr(row_codec._native(), "group_rows", None)
needs_native = pytest.mark.skipif(
    _NATIVE_GROUP is None and not os.environ.get("CI"), reason="message_history_native not built"
)

WANTED = [
    RecallQuery(thread_id="t1", resource_id="r1", limit=2),
    RecallQuery(thread_id="t2", resource_id=None, limit=None),
    RecallQuery(thread_id="ré", resource_id="rü", limit=1),
]


def _native(docs: Sequence[bytes], queries: Sequence[RecallQuery]) -> dict[str, list[bytes]] | None:
    assert _NATIVE_GROUP is not None, "message_history_native.group_rows is missing (stack install --all)"
    pages = _NATIVE_GROUP(docs, [(q.thread_id, q.resource_id, q.limit) for q in queries])
    return None if pages is None else dict(zip([q.thread_id for q in queries], pages, strict=True))


def _row(n: int, thread: str, resource: Any = None, *rest: tuple[str, Any]) -> bytes:
    head: list[tuple[str, Any]] = [("id", f"m{n}"), ("thread_id", thread)]
    if resource is not None:
        head.append(("resourceId", resource))
    return bytes(_raw(*head, ("role", "user"), *rest).raw)


def assert_same(docs: Sequence[bytes], queries: Sequence[RecallQuery]) -> bool:
    """The native grouping is the reference where it answers (the same objects, in order); whether it did."""
    by_thread = {q.thread_id: q for q in queries}
    expected = group_rows_py(docs, by_thread)
    got = _native(docs, queries)
    if got is None:
        return False
    assert got == expected
    for thread, page in got.items():  # the reply's own objects: no copy of a row
        assert all(a is b for a, b in zip(page, expected[thread], strict=True))
    return True


ROWS = [
    _row(1, "t1", "r1"),
    _row(2, "t2", "r9"),
    _row(3, "t1", "r2"),  # another resource's row: not t1's page
    _row(4, "t1"),  # no resource: equals no resource id
    _row(5, "t3", "r1"),  # a thread nobody asked for
    _row(6, "t1", "r1"),
    _row(7, "t1", "r1"),  # past t1's limit of 2
    _row(8, "ré", "rü"),
    _row(9, "ré", "rü"),  # past ré's limit of 1
    _row(10, "t2"),
    _row(11, "t1", 5),  # a resource that is not a string
]


@needs_native
def test_a_batch_is_cut_per_thread_by_owner_and_limit() -> None:
    assert assert_same(ROWS, WANTED)
    got = _native(ROWS, WANTED)
    assert got == {"t1": [ROWS[0], ROWS[5]], "t2": [ROWS[1], ROWS[9]], "ré": [ROWS[7]]}


@needs_native
@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(bytes(_raw(("id", "m"), ("thread_id", "t1"), ("re", Regex("x"))).raw), id="regex"),
        pytest.param(bytes(_raw(("id", "m"), ("thread_id", 7)).raw), id="thread-not-string"),
        pytest.param(b"\x05\x00\x00\x00", id="truncated"),
        pytest.param(ROWS[0][:-1], id="unterminated"),
    ],
)
def test_one_row_it_is_not_sure_of_leaves_the_batch_to_the_reference(odd: bytes) -> None:
    docs = [*ROWS[:3], odd, *ROWS[3:]]
    assert _native(docs, WANTED) is None
    by_thread = {q.thread_id: q for q in WANTED}
    assert _grouped(docs, by_thread) == group_rows_py(docs, by_thread)


@needs_native
@pytest.mark.parametrize(
    "wanted",
    [
        pytest.param([("t1", None, 1), ("t1", None, 2)], id="a-thread-twice"),
        pytest.param([("t1", None, -1)], id="negative-limit"),
        pytest.param([("t1", None, 2**64)], id="limit-past-u64"),
        pytest.param([("t1", None, 1.5)], id="float-limit"),
        pytest.param([("t1", 5, 1)], id="resource-not-a-string"),
        pytest.param([(b"t1", None, 1)], id="thread-as-bytes"),
        pytest.param([("t\udc80", None, 1)], id="lone-surrogate"),
        pytest.param([("t1", None)], id="short-tuple"),
        pytest.param([["t1", None, 1]], id="a-list"),
    ],
)
def test_a_query_it_cannot_read_leaves_the_batch_to_the_reference(wanted: list[Any]) -> None:
    assert _NATIVE_GROUP is not None
    assert _NATIVE_GROUP(ROWS, wanted) is None


@needs_native
def test_a_document_that_is_not_bytes_leaves_the_batch_to_the_reference() -> None:
    assert _NATIVE_GROUP is not None
    assert _NATIVE_GROUP([ROWS[0], bytearray(ROWS[1])], [("t1", None, None)]) is None
    assert _NATIVE_GROUP([ROWS[0], memoryview(ROWS[1])], [("t1", None, None)]) is None


@needs_native
def test_the_layouts_the_service_and_mastra_write_are_grouped_natively() -> None:
    """Not vacuous: the owner table's ordinary rows are all grouped natively, and alike."""
    docs = [bytes(doc.raw) for doc in CASES[:4]] * 3
    queries = [RecallQuery("t1", "r1", 5), RecallQuery("t2", None, None)]
    assert assert_same(docs, queries)


@needs_native
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["t1", "t2", "ré", "t3", ""]),
            st.sampled_from(["r1", "r2", "rü", None, 5]),
            st.lists(st.tuples(_KEYS, _VALUES), max_size=3),
            st.booleans(),
        ),
        max_size=30,
    ),
    st.lists(
        st.tuples(
            st.sampled_from(["t1", "t2", "ré", "t3", ""]),
            st.sampled_from(["r1", "r2", "rü", None]),
            st.none() | st.integers(0, 6),
        ),
        max_size=5,
        unique_by=lambda w: w[0],
    ),
)
def test_the_native_grouping_is_the_reference_on_any_batch(
    rows: list[tuple[str, Any, list[tuple[str, Any]], bool]], wanted: list[tuple[str, str | None, int | None]]
) -> None:
    """Rows of any thread and resource (absent, not a string), with any other fields before or after the
    owner's; a few wanted threads with or without a resource and a limit."""
    docs = []
    for n, (thread, resource, rest, first) in enumerate(rows):
        head: list[tuple[str, Any]] = [("id", f"m{n}"), ("thread_id", thread)]
        if resource is not None:
            head.append(("resourceId", resource))
        docs.append(bytes((_raw(*head, *rest) if first else _raw(*rest, *head)).raw))
    queries = [RecallQuery(t, r, limit) for t, r, limit in wanted]
    assert_same(docs, queries)
    by_thread = {q.thread_id: q for q in queries}
    assert _grouped(docs, by_thread) == group_rows_py(docs, by_thread)


@needs_native
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_the_native_grouping_never_fails_on_any_bytes(data: list[bytes]) -> None:
    framed = [(len(d) + 5).to_bytes(4, "little") + d + b"\x00" for d in data]
    for docs in (data, framed):
        assert_same(docs, WANTED)


def test_the_python_route_never_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """`MESSAGE_HISTORY_ROW_CODEC=python`: the reference groups every batch."""
    assert row_codec.select_group("python") is row_codec.no_grouping
    monkeypatch.setattr(row_codec, "_selected_group", row_codec.select_group("python"))
    by_thread = {q.thread_id: q for q in WANTED}
    assert row_codec.group_rows(ROWS, [(q.thread_id, q.resource_id, q.limit) for q in WANTED]) is None
    assert _grouped(ROWS, by_thread) == group_rows_py(ROWS, by_thread)


def test_a_failing_native_walk_is_counted_and_the_reference_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        @staticmethod
        def group_rows(docs: Any, wanted: Any) -> Any:
            raise RuntimeError("boom")

    monkeypatch.setattr(row_codec, "_native", lambda: Broken())
    monkeypatch.setattr(row_codec, "_selected_group", row_codec.select_group("auto"))
    before = row_codec.native_failures
    by_thread = {q.thread_id: q for q in WANTED}
    assert _grouped(ROWS, by_thread) == group_rows_py(ROWS, by_thread)
    assert row_codec.native_failures == before + 1


def test_the_reference_cuts_by_owner_and_limit() -> None:
    """The reference itself, by hand: a grouping that ignored the resource or the limit would differ."""
    pages = group_rows_py(ROWS, {q.thread_id: q for q in WANTED})
    assert pages == {"t1": [ROWS[0], ROWS[5]], "t2": [ROWS[1], ROWS[9]], "ré": [ROWS[7]]}
