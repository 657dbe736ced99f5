"""Resource scope's pure rules (`core/observation_resource.py`), table by table: per-thread cursors, which
messages are unobserved, when and which threads are observed, and how the log is shaped per thread.

`merge_thread_observations` is also checked against Mastra's own `wrapObservations` (resource scope) in
tests/interop/test_mastra_om_interop.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.core.observation import ObservationSettings, ObservedState, Threshold
from message_history.core.observation_resource import (
    ThreadObservations,
    decide_resource_observation,
    max_created_at,
    merge_thread_observations,
    replace_or_append_thread_section,
    strip_thread_tags,
    thread_cursor,
    unobserved_by_thread,
    wrap_with_thread_tag,
)
from message_history.core.om_tokens import count_om_messages

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _msg(i: int, thread: str, text: str = "hello there", *, role: str = "user") -> dict[str, Any]:
    return {
        "id": f"m{i}",
        "threadId": thread,
        "role": role,
        "createdAt": _iso(T0 + timedelta(minutes=i)),
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
    }


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"mastra": {"om": {"lastObservedAt": "2025-01-01T12:05:00.000Z"}}}, T0 + timedelta(minutes=5)),
        ({"mastra": {"om": {"currentTask": "x"}}}, None),
        ({"mastra": {"om": "2025-01-01T12:05:00.000Z"}}, None),  # not a plain object: no OM metadata
        ({"mastra": ["om"]}, None),
        ({"mastra": {"om": {"lastObservedAt": "not a date"}}}, None),
        ({"mastra": {"om": {"lastObservedAt": 5}}}, None),
        (None, None),
        ("text", None),
    ],
)
def test_a_threads_cursor_is_its_om_metadata_last_observed_at(metadata: Any, expected: Any) -> None:
    assert thread_cursor(metadata) == expected


def test_each_thread_is_unobserved_from_its_own_cursor() -> None:
    """Observing thread a (cursor at m2) does not move b's boundary: b's older messages stay unobserved."""
    messages = [_msg(1, "a"), _msg(2, "b"), _msg(3, "a"), _msg(4, "b"), _msg(5, "c", role="system")]
    cursors = {"a": T0 + timedelta(minutes=1), "b": None}
    got = unobserved_by_thread(messages, cursors, frozenset())
    assert {t: [m["id"] for m in ms] for t, ms in got.items()} == {"a": ["m3"], "b": ["m2", "m4"]}
    # a message id already in the row's observedMessageIds is observed whatever the cursor
    got = unobserved_by_thread(messages, {}, frozenset({"m2"}))
    assert {t: [m["id"] for m in ms] for t, ms in got.items()} == {"a": ["m1", "m3"], "b": ["m4"]}


def test_a_message_at_the_cursor_is_observed() -> None:
    """Mastra reads from `lastObservedAt + 1 ms`: the message at the cursor itself is not read again."""
    got = unobserved_by_thread([_msg(2, "a"), _msg(3, "a")], {"a": T0 + timedelta(minutes=2)}, frozenset())
    assert [m["id"] for m in got["a"]] == ["m3"]


def _settings(tokens: int) -> ObservationSettings:
    return ObservationSettings("resource", Threshold(tokens, tokens), 40_000)


def test_the_threshold_is_over_all_threads_and_threads_go_oldest_first() -> None:
    by_thread = {
        "new": [_msg(10, "new", "word " * 50)],
        "old": [_msg(1, "old", "hi"), _msg(2, "old", "there")],
    }
    total = count_om_messages([*by_thread["new"], *by_thread["old"]])
    due = decide_resource_observation(by_thread, ObservedState(), _settings(total))
    assert due.observe
    assert due.pending_tokens == total
    assert [t for t, _ in due.threads] == ["old", "new"]  # sortThreadsByOldestMessage
    assert [m["id"] for m in due.messages] == ["m1", "m2", "m10"]
    below = decide_resource_observation(by_thread, ObservedState(), _settings(total + 1))
    assert not below.observe
    assert below.threads == []
    # the row's pendingMessageTokens counts towards it
    state = ObservedState(pending_message_tokens=1)
    pending = decide_resource_observation(by_thread, state, _settings(total + 1))
    assert pending.observe


def test_threads_are_taken_largest_first_until_the_threshold() -> None:
    """Mastra's `threadsBySize`: once the larger threads reach the threshold, the smaller wait."""
    big = [_msg(5, "big", "word " * 400)]
    small = [_msg(1, "small", "hi")]
    threshold = count_om_messages(big)
    by_thread = {"small": small, "big": big}
    decision = decide_resource_observation(by_thread, ObservedState(), _settings(threshold))
    assert [t for t, _ in decision.threads] == ["big"]


def test_nothing_unobserved_is_never_due() -> None:
    decision = decide_resource_observation({}, ObservedState(pending_message_tokens=10**6), _settings(1))
    assert not decision.observe


def test_max_created_at() -> None:
    assert max_created_at([_msg(3, "a"), _msg(1, "b")]) == T0 + timedelta(minutes=3)
    assert max_created_at([{"id": "x"}]) is None


def test_the_observers_thread_tags_are_replaced_by_the_services() -> None:
    assert strip_thread_tags('  <thread id="evil">x</THREAD >\n') == "x"
    assert wrap_with_thread_tag("t1", '<thread id="t9">Date: Jan 1, 2025\n* a</thread>') == (
        '<thread id="t1">\nDate: Jan 1, 2025\n* a\n</thread>'
    )


AT = T0 + timedelta(hours=1)
BOUNDARY = "\n\n--- message boundary (2025-01-01T13:00:00.000Z) ---\n\n"


@pytest.mark.parametrize(
    ("existing", "section", "expected"),
    [
        ("", '<thread id="a">\nx\n</thread>', '<thread id="a">\nx\n</thread>'),
        # same thread, same date: merged into its section
        (
            '<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>',
            '<thread id="a">\nDate: Jan 1, 2025\n* two\n</thread>',
            '<thread id="a">\nDate: Jan 1, 2025\n* one\n* two\n</thread>',
        ),
        # same thread, another date: appended after a boundary
        (
            '<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>',
            '<thread id="a">\nDate: Jan 2, 2025\n* two\n</thread>',
            f'<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>{BOUNDARY}'
            '<thread id="a">\nDate: Jan 2, 2025\n* two\n</thread>',
        ),
        # another thread: appended
        (
            '<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>',
            '<thread id="b">\nDate: Jan 1, 2025\n* two\n</thread>',
            f'<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>{BOUNDARY}'
            '<thread id="b">\nDate: Jan 1, 2025\n* two\n</thread>',
        ),
        # no Date line: appended
        ('<thread id="a">\n* one\n</thread>', '<thread id="a">\n* two\n</thread>',
         f'<thread id="a">\n* one\n</thread>{BOUNDARY}<thread id="a">\n* two\n</thread>'),
        # nothing after the date line: appended as it is
        (
            '<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>',
            '<thread id="a">\nDate: Jan 1, 2025\n</thread>',
            f'<thread id="a">\nDate: Jan 1, 2025\n* one\n</thread>{BOUNDARY}'
            '<thread id="a">\nDate: Jan 1, 2025\n</thread>',
        ),
    ],
)  # fmt: skip
def test_replace_or_append_thread_section(existing: str, section: str, expected: str) -> None:
    assert replace_or_append_thread_section(existing, section, AT) == expected


def test_a_cycle_of_two_threads_merges_each_in_turn() -> None:
    log = merge_thread_observations(
        "",
        [
            ThreadObservations("a", "Date: Jan 1, 2025\n* a1", AT),
            ThreadObservations("b", "Date: Jan 1, 2025\n* b1", AT),
        ],
    )
    log = merge_thread_observations(log, [ThreadObservations("a", "Date: Jan 1, 2025\n* a2", AT)])
    assert log == (
        f'<thread id="a">\nDate: Jan 1, 2025\n* a1\n* a2\n</thread>{BOUNDARY}'
        '<thread id="b">\nDate: Jan 1, 2025\n* b1\n</thread>'
    )
