"""`core.observation_hints`: the `metadata.mastra.om` hints an observation leaves, as `@mastra/memory` 1.31's
`getLastObservedMessageCursor` and observation strategies' `persist` write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from message_history.core.observation_hints import StoredStamp, last_observed_cursors, om_hints, title_update
from message_history.core.observation_text import js_trim


def _not_extracted() -> dict[str, object]:
    return {"currentTask": None, "suggestedResponse": None, "threadTitle": None}


def _m(ident: str, at: str, thread: str = "t1") -> StoredStamp:
    return StoredStamp(ident, thread, datetime.fromisoformat(at))


@pytest.mark.parametrize(
    ("order", "messages", "expected"),
    [
        ([], [], {}),
        (["a"], [_m("a", "2025-03-01T10:00:00.000Z")], {"t1": ("2025-03-01T10:00:00.000Z", "a")}),
        # the newest by createdAt, whatever the order it was stored or named in
        (
            ["a", "b", "c"],
            [
                _m("c", "2025-03-01T09:00:00Z"),
                _m("b", "2025-03-01T11:00:00Z"),
                _m("a", "2025-03-01T10:00:00Z"),
            ],
            {"t1": ("2025-03-01T11:00:00.000Z", "b")},
        ),
        # a tie: the first in the observed order stays (Mastra replaces on `>` only)
        (
            ["b", "a"],
            [_m("a", "2025-03-01T10:00:00Z"), _m("b", "2025-03-01T10:00:00Z")],
            {"t1": ("2025-03-01T10:00:00.000Z", "b")},
        ),
        # a message not among the observed ids is no cursor (one without an id or a date has no stamp)
        (["a"], [_m("z", "2025-03-01T12:00:00Z")], {}),
        # each thread its own (resource scope)
        (
            ["a", "b"],
            [_m("a", "2025-03-01T10:00:00Z", "x"), _m("b", "2025-03-01T09:00:00Z", "y")],
            {"x": ("2025-03-01T10:00:00.000Z", "a"), "y": ("2025-03-01T09:00:00.000Z", "b")},
        ),
        # another offset: ISO in UTC with milliseconds, as `toISOString()`
        (["a"], [_m("a", "2025-03-01T12:00:00.5+02:00")], {"t1": ("2025-03-01T10:00:00.500Z", "a")}),
    ],
)
def test_last_observed_cursor(
    order: list[str], messages: list[StoredStamp], expected: dict[str, tuple[str, str]]
) -> None:
    got = last_observed_cursors(order, messages)
    assert got == {t: {"createdAt": at, "id": i} for t, (at, i) in expected.items()}


NONE: dict[str, object] = {
    "currentTask": None,
    "suggestedResponse": None,
    "threadTitle": None,
    "extracted": {},
}
"""An answer without hints on a thread without `extracted`: Mastra's spread of `undefined`s, stored null."""


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, NONE),
        (
            {"current_task": "book", "suggested_response": "ask"},
            {**NONE, "currentTask": "book", "suggestedResponse": "ask"},
        ),
        ({"current_task": "", "suggested_response": ""}, NONE),  # empty: none (Mastra's parser's `||`)
        ({"thread_title": "  Trip to Lyon\n"}, {**NONE, "threadTitle": "Trip to Lyon"}),
        ({"thread_title": "\ufeff Lyon\u3000"}, {**NONE, "threadTitle": "Lyon"}),  # JavaScript's trim()
        ({"thread_title": "   "}, NONE),  # an empty title is none (Mastra's parser: `trim()` then `||`)
        (
            {"cursor": {"createdAt": "2025-03-01T10:00:00.000Z", "id": "a"}},
            {**NONE, "lastObservedMessageCursor": {"createdAt": "2025-03-01T10:00:00.000Z", "id": "a"}},
        ),
        # extracted: the thread's object merged key by key, a null or "" value none
        ({"extracted": {"a": 1, "b": None, "c": ""}}, {**NONE, "extracted": {"a": 1}}),
        (
            {"extracted": {"a": {"x": 1}, "d": [0]}, "extracted_was": {"a": 2, "z": 3}},
            {**_not_extracted(), "extracted.a": {"x": 1}, "extracted.d": [0]},
        ),
        ({"extracted": None, "extracted_was": {"z": 3}}, _not_extracted()),
        ({"extracted": {"a": 1}, "extracted_was": ["z"]}, {**NONE, "extracted": {"a": 1}}),
    ],
)
def test_om_hints(fields: dict[str, Any], expected: dict[str, object]) -> None:
    base: dict[str, Any] = {
        "current_task": None,
        "suggested_response": None,
        "thread_title": None,
        "cursor": None,
    }
    assert om_hints(**{**base, **fields}) == expected


@pytest.mark.parametrize(
    ("title_was", "metadata", "candidate", "expected"),
    [
        ("Old", {}, "Trip to Lyon", "Trip to Lyon"),
        ("Old", {}, "  Trip to Lyon\n", "Trip to Lyon"),  # trimmed
        (None, None, "Lyon", "Lyon"),  # no title yet
        ("", {}, "Lyon", "Lyon"),
        ("Old", {"titlePinned": True}, "Trip to Lyon", None),  # pinned by the user: kept
        ("Old", {"titlePinned": False}, "Trip to Lyon", "Trip to Lyon"),
        ("Old", {"titlePinned": "true"}, "Trip to Lyon", "Trip to Lyon"),  # `=== true` only
        ("Old", {"titlePinned": 1}, "Trip to Lyon", "Trip to Lyon"),
        ("Old", "not an object", "Trip to Lyon", "Trip to Lyon"),
        (" Lyon ", {}, "Lyon", None),  # the same title, trimmed
        ("Old", {}, "Ly", None),  # under 3 characters
        ("Old", {}, "  Ly  ", None),  # under 3 once trimmed
        ("Old", {}, "😀a", "😀a"),  # 3 UTF-16 units: JavaScript's `length`
        ("Old", {}, "é", None),
        ("Old", {}, None, None),
        (7, {}, "Lyon", "Lyon"),  # a title that is not text differs
    ],
)
def test_title_update(
    title_was: object, metadata: object, candidate: str | None, expected: str | None
) -> None:
    assert title_update(title_was, metadata, candidate) == expected


@given(st.text(max_size=8), st.text(max_size=8), st.sampled_from([None, True, False, "true"]))
def test_a_pinned_title_is_never_replaced(title_was: str, candidate: str, pinned: object) -> None:
    """The title changes only when unpinned, to a new, long enough, trimmed title; written again: as is."""
    metadata = {} if pinned is None else {"titlePinned": pinned}
    got = title_update(title_was, metadata, candidate)
    if got is not None:
        assert pinned is not True
        assert got == js_trim(got)
        assert len(got.encode("utf-16-le", "surrogatepass")) >= 6
        assert got != js_trim(title_was)
        assert title_update(got, metadata, candidate) is None  # idempotent: the second write changes nothing


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 5), st.sampled_from("xy")), max_size=30))
def test_the_cursor_is_the_newest_observed_message_of_its_thread(rows: list[tuple[str, int, str]]) -> None:
    t0 = datetime(2025, 3, 1, tzinfo=UTC)
    messages = [StoredStamp(i, t, t0 + timedelta(minutes=m)) for i, m, t in rows]
    order = [i for i, _, _ in rows]
    got = last_observed_cursors(order, messages)
    assert set(got) == {t for _, _, t in rows}
    for thread, cursor in got.items():
        mine = [m for m in messages if m.thread_id == thread]
        newest = max(m.created_at for m in mine)
        assert cursor["createdAt"] == newest.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert cursor["id"] in {m.id for m in mine if m.created_at == newest}


_VALUES = st.one_of(
    st.none(), st.just(""), st.text(max_size=3), st.integers(-3, 3), st.lists(st.integers(), max_size=2)
)
_EXTRACTED = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _VALUES, max_size=4)


@given(st.one_of(st.none(), _EXTRACTED), st.one_of(st.none(), _EXTRACTED))
def test_the_extracted_write_leaves_mastras_merge(
    was: dict[str, Any] | None, new: dict[str, Any] | None
) -> None:
    """The keys `om_hints` sets, applied as MongoDB applies a dotted `$set`, leave `extracted` as Mastra's
    `{...previous.extracted ?? {}, ...normalizeExtractedValues(new)}` does."""
    om: dict[str, Any] = {} if was is None else {"extracted": dict(was)}
    hints = om_hints(current_task=None, suggested_response=None, thread_title=None, cursor=None,
                     extracted=new, extracted_was=om.get("extracted"))  # fmt: skip
    for key, value in hints.items():
        *parents, leaf = key.split(".")
        target = om
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    present = {k: v for k, v in (new or {}).items() if v is not None and v != ""}
    assert om["extracted"] == {**(was or {}), **present}
