"""`core.observation_hints`: the `metadata.mastra.om` hints an observation leaves, as `@mastra/memory` 1.31's
`getLastObservedMessageCursor` and observation strategies' `persist` write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from message_history.core.observation_hints import StoredStamp, last_observed_cursors, om_hints


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


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {}),
        (
            {"current_task": "book", "suggested_response": "ask"},
            {"currentTask": "book", "suggestedResponse": "ask"},
        ),
        ({"thread_title": "  Trip to Lyon\n"}, {"threadTitle": "Trip to Lyon"}),
        ({"thread_title": "   "}, {}),  # an empty title is none (Mastra's parser: `trim()` then `||`)
        (
            {"cursor": {"createdAt": "2025-03-01T10:00:00.000Z", "id": "a"}},
            {"lastObservedMessageCursor": {"createdAt": "2025-03-01T10:00:00.000Z", "id": "a"}},
        ),
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
