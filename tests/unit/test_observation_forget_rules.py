"""Forgetting one thread of a resource-scoped log (`core/observation_forget.py`), table by table, plus
properties: removing a thread from a log built as the observed path builds it equals the log built without
that thread; any text (hand-written, malformed, huge) is scanned in linear time and never raises."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from message_history.core.observation_forget import (
    mentions_thread,
    plan_thread_forget,
    remove_thread_sections,
    thread_open_tag,
)
from message_history.core.observation_resource import ThreadObservations, merge_thread_observations
from message_history.core.om_tokens import count_observations

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
B1 = "\n\n--- message boundary (2025-01-01T12:01:00.000Z) ---\n\n"
B2 = "\n\n--- message boundary (2025-01-01T12:02:00.000Z) ---\n\n"


def _s(thread: str, body: str) -> str:
    return f'<thread id="{thread}">\n{body}\n</thread>'


@pytest.mark.parametrize(
    ("log", "thread", "expected", "removed"),
    [
        pytest.param("", "t", "", 0, id="empty"),
        pytest.param(_s("a", "x"), "t", _s("a", "x"), 0, id="absent"),
        pytest.param(_s("t", "x"), "t", "", 1, id="alone"),
        pytest.param(_s("t", "x") + B1 + _s("a", "y"), "t", _s("a", "y"), 1, id="first: the boundary after"),
        pytest.param(_s("a", "y") + B1 + _s("t", "x"), "t", _s("a", "y"), 1, id="last: the boundary before"),
        pytest.param(
            _s("a", "y") + B1 + _s("t", "x") + B2 + _s("b", "z"),
            "t",
            _s("a", "y") + B2 + _s("b", "z"),
            1,
            id="middle",
        ),
        pytest.param(
            _s("t", "1") + B1 + _s("a", "y") + B2 + _s("t", "2"), "t", _s("a", "y"), 2, id="two sections"
        ),
        pytest.param(_s('q"<', "x") + B1 + _s("a", "y"), 'q"<', _s("a", "y"), 1, id="quote and <"),
        pytest.param(_s("T", "x"), "t", _s("T", "x"), 0, id="ids are exact"),
        pytest.param("note by hand\n" + _s("t", "x"), "t", "note by hand", 1, id="hand text kept"),
    ],
)
def test_sections_removed(log: str, thread: str, expected: str, removed: int) -> None:
    result = remove_thread_sections(log, thread)
    assert (result.text, result.removed, result.malformed) == (expected, removed, False)


@pytest.mark.parametrize(
    "log",
    [
        pytest.param('<thread id="t">\nnever closed', id="no end"),
        pytest.param('<thread id="t">\nx\n<thread id="a">\ny\n</thread>', id="next opens first"),
        pytest.param(_s("a", "y") + '<thread id="t">', id="tag at the end"),
    ],
)
def test_a_malformed_section_is_said_and_nothing_removed(log: str) -> None:
    result = remove_thread_sections(log, "t")
    assert result.malformed
    assert result.text == log
    assert result.removed == 0


def _row(log: object, **fields: Any) -> dict[str, Any]:
    return {"activeObservations": log, "generationCount": 0, "observedMessageIds": [], **fields}


LOG = _s("a", "y") + B1 + _s("t", "x")


@pytest.mark.parametrize(
    ("row", "kwargs", "why"),
    [
        pytest.param(_row(42), {}, "activeObservations is not text", id="log not text"),
        pytest.param(_row('<thread id="t">\nx'), {}, "a section of the thread has no end", id="malformed"),
        pytest.param(_row(LOG), {"older_mention": True}, "a reflection's input", id="older generation"),
        pytest.param(_row("* merged"), {"cursor": T0}, "no section of it", id="observed, no section"),
        pytest.param(_row("* merged"), {"cursor_unknown": True}, "no section of it", id="cursor unreadable"),
        pytest.param(
            _row(LOG, generationCount=1, lastReflectionAt=T0 + timedelta(minutes=5)),
            {"cursor": T0},
            "before the log was reflected",
            id="observed before the reflection",
        ),
    ],
)
def test_not_separable(row: dict[str, Any], kwargs: dict[str, Any], why: str) -> None:
    plan = plan_thread_forget(row, "t", **kwargs)
    assert not plan.separable
    assert why in plan.why


def test_separable_plan_counts_again_and_drops_what_held_the_thread() -> None:
    row = _row(
        LOG,
        observedMessageIds=["a-1", "t-1", "t-2"],
        lastObservedAt=T0 + timedelta(minutes=2),
        pendingMessageTokens=50,
        bufferedReflection="* condensed",
        bufferedReflectionTokens=3,
    )
    plan = plan_thread_forget(
        row,
        "t",
        cursor=T0 + timedelta(minutes=2),
        missing_ids=frozenset({"t-1", "t-2"}),
        others_newest=T0 + timedelta(minutes=1),
    )
    assert plan.separable
    assert plan.removed_sections == 1
    assert plan.fields == {
        "activeObservations": _s("a", "y"),
        "observationTokenCount": count_observations(_s("a", "y")),
        "observedMessageIds": ["a-1"],
        "bufferedReflection": None,
        "bufferedReflectionTokens": None,
        "pendingMessageTokens": 0,
        "lastObservedAt": T0 + timedelta(minutes=1),
    }


def test_observed_after_the_reflection_is_separable() -> None:
    row = _row(LOG, generationCount=2, lastReflectionAt=T0)
    plan = plan_thread_forget(row, "t", cursor=T0 + timedelta(minutes=1))
    assert plan.separable
    assert plan.fields["activeObservations"] == _s("a", "y")


def test_a_thread_never_observed_changes_nothing() -> None:
    plan = plan_thread_forget(_row(_s("a", "y")), "t", cursor=None)
    assert plan.separable
    assert plan.fields == {}


def test_buffered_chunks() -> None:
    other = _s("a", "y")
    chunks = [
        {"id": 1, "observations": _s("t", "x"), "messageIds": ["t-1"]},
        {"id": 2, "observations": _s("t", "x") + B1 + other, "messageIds": ["t-1", "a-1"]},
        {"id": 3, "observations": "* no sections", "messageIds": ["t-1"]},
        {"id": 4, "observations": other, "messageIds": ["a-1"]},
        "not a chunk",
        {"id": 6, "observations": '<thread id="t">', "messageIds": []},
    ]
    row = _row(other, bufferedObservationChunks=chunks, activeObservationsPendingUpdate=_s("t", "x"))
    plan = plan_thread_forget(row, "t", cursor=None, missing_ids=frozenset({"t-1"}))
    assert plan.separable
    kept = plan.fields["bufferedObservationChunks"]
    assert [c["id"] for c in kept] == [2, 4]
    assert kept[0] == {
        "id": 2,
        "observations": other,
        "messageIds": ["a-1"],
        "tokenCount": count_observations(other),
    }
    assert plan.fields["activeObservationsPendingUpdate"] is None
    assert plan.removed_sections == 3


def test_mentions() -> None:
    assert mentions_thread(_s("t", "x"), "t")
    assert not mentions_thread(_s("a", "x"), "t")
    assert not mentions_thread(None, "t")
    assert thread_open_tag('a"b') == '<thread id="a"b">'


# --- properties ---

_IDS = st.sampled_from(["t", "a", "b", 'q"<', "<x>", "t2"])
_WORDS = st.text(alphabet="abc xyz*-:\n\"'<>", min_size=1, max_size=30).filter(
    lambda s: "<thread" not in s and "</thread" not in s and "--- message boundary" not in s
)
_BODY = st.one_of(_WORDS, _WORDS.map(lambda w: f"Date: Jan 1, 2025\n* {w}"))
_CYCLES = st.lists(st.lists(st.tuples(_IDS, _BODY), min_size=1, max_size=3), min_size=1, max_size=6)


def _build(cycles: list[list[tuple[str, str]]], skip: str | None = None) -> str:
    log = ""
    for n, cycle in enumerate(cycles):
        parts = [
            ThreadObservations(thread, body, T0 + timedelta(minutes=n))
            for thread, body in cycle
            if thread != skip
        ]
        log = merge_thread_observations(log, parts)
    return log


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(cycles=_CYCLES, thread=_IDS)
def test_removing_a_thread_is_building_without_it(cycles: list[list[tuple[str, str]]], thread: str) -> None:
    """Removal by the section scanner equals the log the observed path would have built without the thread
    (ids here never start with another's id followed by `">`, which would make its tag a prefix)."""
    result = remove_thread_sections(_build(cycles), thread)
    assert not result.malformed
    assert result.text == _build(cycles, skip=thread)
    assert thread_open_tag(thread) not in result.text


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.lists(
        st.sampled_from(
            [
                '<thread id="t">',
                "</thread>",
                "<thread",
                "x",
                "\n",
                " ",
                '"',
                "--- message boundary (",
                ") ---",
            ]
        )
    ).map("".join),
    thread=st.sampled_from(["t", "", '"', "<thread"]),
)
def test_any_text_is_scanned_never_raising(text: str, thread: str) -> None:
    result = remove_thread_sections(text, thread)
    assert len(result.text) <= len(text)
    if result.malformed or not result.removed:
        assert result.text == text
    plan = plan_thread_forget(
        {"activeObservations": text, "bufferedObservationChunks": [text, {}]}, thread, cursor=T0
    )
    assert plan.separable in (True, False)


@pytest.mark.parametrize(
    "log",
    [
        pytest.param(_s("t", "x") * 200_000, id="many sections"),
        pytest.param('<thread id="t">' * 200_000, id="many unclosed"),
        pytest.param((" " * 1_000_000 + _s("t", "x")) * 4, id="long spaces"),
        pytest.param(
            ("\n" + "--- message boundary (" * 50_000 + ") ---" + _s("t", "x")) * 4, id="boundary-ish"
        ),
        pytest.param('<thread id="' * 300_000, id="prefixes"),
    ],
)
def test_huge_logs_are_scanned_in_linear_time(log: str) -> None:
    started = time.perf_counter()
    remove_thread_sections(log, "t")
    assert time.perf_counter() - started < 2.0


_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.datetimes(timezones=st.just(UTC)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = st.sampled_from(
    [
        "activeObservations",
        "activeObservationsPendingUpdate",
        "bufferedObservationChunks",
        "observedMessageIds",
        "generationCount",
        "lastReflectionAt",
        "lastObservedAt",
        "pendingMessageTokens",
        "bufferedReflection",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(row=st.dictionaries(_FIELDS, _ANY), cursor=st.none() | st.datetimes(timezones=st.just(UTC)))
def test_a_hand_written_row_of_any_shape_is_planned_never_raising(
    row: dict[str, Any], cursor: datetime | None
) -> None:
    """Any field of any type: a plan (separable or not, with a reason), never an exception."""
    plan = plan_thread_forget(row, "t", cursor=cursor, missing_ids=frozenset({"t-1"}))
    assert plan.separable or plan.why
