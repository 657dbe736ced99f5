"""`storage.row_codec.plain_page_of`: a plain recall's page decided natively on its rows' bytes
(`message_history_native.plain_runs`) is the reference's, `plain_page(rows_from_raw(docs)[:read], limit,
incoming)` and the length of those rows, wherever it answers; and it answers wherever the codec is sure of
every row and the reference decides the page.

The whole handler's form (the published bytes against the processor's):
tests/unit/test_recall_plain_equivalence.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from message_history.core.recall_plan import PlainPage, plain_page
from schemas.messages import Message
from storage import row_codec
from storage.save_plan import message_write
from tests.unit import test_recall_plain_equivalence as equivalence

T0 = datetime(2025, 1, 1, tzinfo=UTC)
NATIVE = row_codec.select_plain_runs() is not row_codec.no_fusing
needs_native = pytest.mark.skipif(
    not NATIVE and not os.environ.get("CI"), reason="message_history_native not built"
)


def _message(ident: str | None, role: str, text: str, at: int | None) -> Message:
    """The message of the equivalence test's tables (`at`: ms after T0), validated."""
    return Message.model_validate(equivalence._message(ident, role, text, at))


def _doc(ident: str, role: str, text: str, ms: int) -> bytes:
    """The row a save writes for the message (`storage.save_plan.message_write`), as its BSON."""
    at = T0 + timedelta(milliseconds=ms)
    write = message_write(_message(ident, role, text, ms), "t", "u", at)
    return bson.encode({**write.fields, "createdAt": write.created})


def _reference(
    docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]
) -> tuple[PlainPage | None, int] | None:
    """What `RecallHandler._plain` decides without the native call: None when a row is not plain (the
    messages route then reads the page)."""
    rows = row_codec.rows_from_raw(docs)
    if None in rows:
        return None
    page = rows[:read]
    return plain_page(page, limit, incoming), len(page)


def _fused(
    docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]
) -> tuple[PlainPage, int] | None:
    return row_codec.plain_page_of(docs, read, limit, incoming)


def _sure(docs: Sequence[bytes]) -> bool:
    """Is the native codec sure of every row (its own `rows_from_raw` answers each)?"""
    native = row_codec._native()
    assert native is not None
    return None not in native.rows_from_raw(docs)


def assert_same(docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]) -> bool:
    """The native answer is the reference's where it answers, and it answers where it can; whether it did."""
    expected = _reference(docs, read, limit, incoming)
    got = _fused(docs, read, limit, incoming)
    if got is not None:
        assert expected is not None
        assert got == expected
        return True
    exact = all(m.createdAt is None or m.createdAt.microsecond % 1000 == 0 for m in incoming)
    assert expected is None or expected[0] is None or not _sure(docs) or not exact, (expected, docs)
    return False


def _rows(*specs: tuple[str, str, int]) -> list[bytes]:
    """Newest first, as the recall reads them."""
    return [_doc(ident, role, f"text {ident}", ms) for ident, role, ms in specs]


PAGE = _rows(
    ("e", "assistant", 50), ("d", "user", 40), ("c", "assistant", 30), ("b", "user", 20), ("a", "user", 10)
)


@needs_native
@pytest.mark.parametrize(
    ("read", "limit", "incoming"),
    [
        (5, 5, [_message("n", "user", "hi", 60)]),  # after every row
        (5, 3, [_message("n", "user", "hi", 60)]),  # the page: the newest 3
        (3, 3, [_message("n", "user", "hi", 60)]),  # read fewer than the page holds
        (9, 9, [_message("n", "user", "hi", 60)]),  # read more than the page holds
        (5, 5, [_message("n", "user", "hi", 25)]),  # between rows
        (5, 5, [_message("n", "user", "hi", 5)]),  # before every row
        (5, 5, [_message("c", "user", "hi", 5)]),  # an id the page holds: the reference's answer (none)
        (5, 5, [_message("b0", "user", "hi", 20), _message("z", "user", "x", 20)]),  # ties on time
        (5, 5, [_message("a0", "user", "hi", 10), _message(None, "user", "x", None)]),  # undated, no id
        (5, 5, [_message("n", "user", "hi", 30), _message("m", "user", "x", 25)]),  # out of order
        (5, 0, [_message("n", "user", "hi", 60)]),  # limit 0
        (0, 0, [_message("n", "user", "hi", 60)]),
        (5, 5, []),
    ],
)
def test_a_page_is_decided_as_the_reference_decides_it(
    read: int, limit: int, incoming: list[Message]
) -> None:
    answered = assert_same(PAGE, read, limit, incoming)
    assert answered == (not any(m.id == "c" for m in incoming))


@needs_native
@pytest.mark.parametrize(
    "page",
    [
        _rows(("b", "system", 20), ("a", "user", 10)),  # a system row
        _rows(("a", "user", 20), ("a", "assistant", 10)),  # an id twice
        _rows(("a", "user", 10), ("b", "user", 10)),  # at equal times, the ids not decreasing
        _rows(("a", "user", 10), ("b", "user", 20)),  # oldest first
    ],
)
def test_a_page_that_does_not_qualify_is_not_decided(page: list[bytes]) -> None:
    assert _fused(page, 5, 5, [_message("n", "user", "hi", 60)]) is None
    expected = _reference(page, 5, 5, [_message("n", "user", "hi", 60)])
    assert expected is not None
    assert expected[0] is None  # the reference refuses it too


@needs_native
def test_a_row_it_is_not_sure_of_anywhere_in_the_page_leaves_it_to_the_reference() -> None:
    odd = bson.encode({"id": "z", "thread_id": "t", "role": "user", "content": "{}", "extra": 1})
    incoming = [_message("n", "user", "hi", 60)]
    assert _fused([*PAGE, odd], 2, 2, incoming) is None  # beyond what is read: the page still goes there
    assert _fused([*PAGE[:2], b"not bson", *PAGE[2:]], 5, 5, incoming) is None
    not_bytes: list[Any] = [*PAGE[:2], bytearray(PAGE[2]), *PAGE[3:]]
    assert _fused(not_bytes, 5, 5, incoming) is None


@needs_native
@pytest.mark.parametrize(
    "when",
    [
        datetime(2025, 1, 1, 0, 0, 0, 20_500, tzinfo=UTC),  # finer than a millisecond
        datetime(2025, 1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=1))),  # not UTC's own tzinfo
        datetime(2025, 1, 1),  # naive
    ],
)
def test_an_input_time_it_does_not_compare_exactly_is_left_to_the_reference(when: datetime) -> None:
    message = _message("n", "user", "hi", None).model_copy(update={"createdAt": when})
    assert _fused(PAGE, 5, 5, [message]) is None


@needs_native
@pytest.mark.parametrize(
    ("incoming", "ids"),
    [
        ([(1, "\ud800")], []),  # a lone surrogate: no UTF-8 form
        ([], ["\ud800"]),
        ([(1, 2)], []),
        ([(1.5, "a")], []),
        ([(1, "a", 3)], []),
        ([[1, "a"]], []),
        ([(2**70, "a")], []),
        ([], [None]),
    ],
)
def test_an_input_key_it_cannot_read_is_left_to_the_reference(incoming: list[Any], ids: list[Any]) -> None:
    native = row_codec._native()
    assert native is not None
    assert native.plain_runs(PAGE, 5, 5, incoming, ids) is None
    assert native.plain_runs(PAGE, 5, 5, [(60, "n")], []) is not None  # the same page, readable keys


IDS = st.sampled_from(["a", "b", "c", "é", "😀", "a\u0301", "B", "ab"])
ROWS = st.lists(
    st.tuples(IDS, st.sampled_from(["user", "assistant", "system"]), st.integers(0, 8)), max_size=12
)
INCOMING = st.lists(
    st.tuples(st.one_of(st.none(), IDS, st.just("new")), st.one_of(st.none(), st.integers(0, 10))),
    max_size=4,
)


@needs_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=ROWS,
    read=st.integers(0, 14),
    limit=st.integers(0, 14),
    incoming=INCOMING,
    newest_first=st.booleans(),
)
def test_the_native_page_is_the_reference_on_any_page(
    rows: list[tuple[str, str, int]],
    read: int,
    limit: int,
    incoming: list[tuple[str | None, int | None]],
    newest_first: bool,
) -> None:
    ordered = sorted(rows, key=lambda r: (r[2], r[0]), reverse=True) if newest_first else rows
    docs = [_doc(ident, role, f"t{n}", ms) for n, (ident, role, ms) in enumerate(ordered)]
    messages = [_message(ident, "user", "x", at) for ident, at in incoming]
    assert_same(docs, read, min(limit, read), messages)


@needs_native
@settings(max_examples=200, deadline=None)
@given(docs=st.lists(st.binary(max_size=64), max_size=6), read=st.integers(0, 8))
def test_the_native_page_never_fails_on_any_bytes(docs: list[bytes], read: int) -> None:
    # the native call itself: `plain_page_of` answers a failure with None (counted), which would hide it
    native = row_codec._native()
    assert native is not None
    answer = native.plain_runs(docs, read, read, [(1, "n")], ["n"])
    assert answer is None or answer[0] == min(read, len(docs))


def test_the_python_route_never_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_codec, "_selected_plain", row_codec.select_plain_runs("python"))
    assert row_codec.select_plain_runs("python") is row_codec.no_fusing
    assert _fused(PAGE, 5, 5, [_message("n", "user", "hi", 60)]) is None


@needs_native
def test_a_failing_native_call_is_counted_and_the_reference_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        FINGERPRINT = row_codec.codec_fingerprint()
        rows_from_raw = staticmethod(row_codec.rows_from_raw_py)

        @staticmethod
        def plain_runs(*args: Any) -> Any:
            raise RuntimeError("broken")

    monkeypatch.setattr(row_codec, "_native", lambda: Broken)
    monkeypatch.setattr(row_codec, "_selected_plain", row_codec.select_plain_runs("auto"))
    before = row_codec.native_failures
    assert _fused(PAGE, 5, 5, [_message("n", "user", "hi", 60)]) is None
    assert row_codec.native_failures == before + 1


def test_a_stale_native_module_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stale:
        FINGERPRINT = "0" * 64

        @staticmethod
        def plain_runs(*args: Any) -> Any:
            raise AssertionError("a module built from other models must not decide")

    monkeypatch.setattr(row_codec, "_native", lambda: Stale)
    assert row_codec.select_plain_runs("auto") is row_codec.no_fusing
