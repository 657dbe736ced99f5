"""Mastra OM's pure rules (`core/observation.py`, `core/observation_text.py`), table by table.

The texts and `optimize_for_context` are also checked against Mastra's own exports in
tests/interop/test_mastra_om_interop.py; here the recorded answers stand in for Node.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.core.observation import (
    DEFAULT_MESSAGE_TOKENS,
    DEFAULT_OBSERVATION_TOKENS,
    ObservationSettings,
    ObservedState,
    Threshold,
    decide_observation,
    dynamic_threshold,
    resolve_settings,
    should_reflect,
    unobserved_messages,
)
from message_history.core.observation_dates import _gap, _relative, expand_inline_dates
from message_history.core.observation_text import (
    OBSERVATION_CONTEXT_INSTRUCTIONS,
    OBSERVATION_CONTEXT_PROMPT,
    OBSERVATION_CONTINUATION_HINT,
    append_observations,
    context_system_messages,
    continuation_message,
    message_boundary,
    optimize_for_context,
    split_context_chunks,
)
from message_history.core.om_tokens import count_om_messages
from tests.om_cases import CONTEXT_CASES, OBSERVATIONS, RECORDING

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _context() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDING.read_text(encoding="utf-8"))["context"]
    return data


def _msg(
    i: int, text: str = "hello there", *, role: str = "user", at: Any = None, parts: Any = None
) -> dict[str, Any]:
    created = (T0 + timedelta(minutes=i)).isoformat().replace("+00:00", "Z") if at is None else at
    body = parts if parts is not None else [{"type": "text", "text": text}]
    return {"id": f"m{i}", "role": role, "createdAt": created, "content": {"format": 2, "parts": body}}


# --- settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (None, None),
        (False, None),
        ("yes", None),
        ({"enabled": False}, None),
        (True, ObservationSettings()),
        ({}, ObservationSettings()),
        ({"scope": "resource"}, ObservationSettings(scope="resource")),
        ({"scope": "weird"}, ObservationSettings()),
        ({"observation": {"messageTokens": 500}}, ObservationSettings(message_tokens=Threshold(500, 500))),
        ({"observation": {"messageTokens": -1}}, ObservationSettings()),
        ({"observation": {"messageTokens": True}}, ObservationSettings()),
        ({"reflection": {"observationTokens": 900}}, ObservationSettings(observation_tokens=900)),
        ({"shareTokenBudget": True}, ObservationSettings(message_tokens=Threshold(30_000, 70_000))),
        (
            {
                "shareTokenBudget": True,
                "observation": {"messageTokens": 10},
                "reflection": {"observationTokens": 5},
            },
            ObservationSettings(message_tokens=Threshold(10, 15), observation_tokens=5),
        ),
    ],
)
def test_settings_read_as_mastra_names_them(option: Any, expected: ObservationSettings | None) -> None:
    """`memory.observationalMemory`: Mastra's names and defaults; odd values fall back, never raise."""
    assert resolve_settings(option) == expected


def test_mastra_defaults() -> None:
    """30 000 message tokens to observe, 40 000 log tokens to reflect (OBSERVATIONAL_MEMORY_DEFAULTS)."""
    assert (
        _context()["messageTokens"],
        _context()["observationTokens"],
    ) == (DEFAULT_MESSAGE_TOKENS, DEFAULT_OBSERVATION_TOKENS)


@pytest.mark.parametrize(
    ("threshold", "log", "expected"),
    [
        (Threshold(30_000, 30_000), 50_000, 30_000),
        (Threshold(30_000, 70_000), 0, 70_000),
        (Threshold(30_000, 70_000), 10_000, 60_000),
        (Threshold(30_000, 70_000), 40_000, 30_000),
        (Threshold(30_000, 70_000), 90_000, 30_000),
    ],
)
def test_dynamic_threshold(threshold: Threshold, log: int, expected: int) -> None:
    """`calculateDynamicThreshold`: a shared budget shrinks as the log grows, down to its minimum."""
    assert dynamic_threshold(threshold, log) == expected


# --- which messages ---------------------------------------------------------------------------------------


def test_unobserved_by_timestamp_and_ids() -> None:
    """Newer than `lastObservedAt` and not already observed by id; system rows never."""
    messages = [_msg(0), _msg(1), _msg(2), _msg(3, role="system"), _msg(4), _msg(5, at=None)]
    messages[5].pop("createdAt")
    state = ObservedState(last_observed_at=T0 + timedelta(minutes=1), observed_message_ids=frozenset({"m4"}))
    assert [m["id"] for m in unobserved_messages(messages, state)] == ["m2", "m5"]
    assert [m["id"] for m in unobserved_messages(messages, ObservedState())] == ["m0", "m1", "m2", "m4", "m5"]


def test_equal_timestamp_is_observed() -> None:
    """Mastra's cursor is exclusive: a message at exactly `lastObservedAt` was covered."""
    state = ObservedState(last_observed_at=T0)
    assert unobserved_messages([_msg(0)], state) == []


def test_naive_and_string_dates_compare_as_utc() -> None:
    """A naive stored date is UTC; an unparsable `createdAt` counts as having none (included)."""
    naive = datetime(2025, 1, 1, 12, 30)
    state = ObservedState(last_observed_at=T0)
    assert [m["id"] for m in unobserved_messages([_msg(7, at=naive), _msg(8, at="not a date")], state)] == [
        "m7",
        "m8",
    ]


def test_marked_messages_keep_only_parts_after_the_last_completed_observation() -> None:
    """Mastra's `data-om-observation-*` markers: parts after the last end marker, markers dropped."""
    parts = [
        {"type": "text", "text": "old"},
        {"type": "data-om-observation-start", "data": {}},
        {"type": "data-om-observation-end", "data": {}},
        {"type": "text", "text": "new"},
        {"type": "data-om-observation-failed", "data": {}},
    ]
    done = [_msg(0, parts=parts), _msg(1, parts=parts[:3])]
    out = unobserved_messages(done, ObservedState(last_observed_at=T0 + timedelta(days=1)))
    assert [(m["id"], m["content"]["parts"]) for m in out] == [("m0", [{"type": "text", "text": "new"}])]
    running = [_msg(2, parts=[*parts[:3], {"type": "data-om-observation-start", "data": {}}])]
    assert unobserved_messages(running, ObservedState(last_observed_at=T0 + timedelta(days=1))) == running


def test_working_memory_state_signals_are_never_observed() -> None:
    """A `signal` row holding the working-memory state is not conversation."""
    signal = _msg(0, role="signal")
    signal["content"]["metadata"] = {
        "signal": {"type": "state", "metadata": {"state": {"id": "working-memory"}}}
    }
    other = _msg(1, role="signal")
    assert [m["id"] for m in unobserved_messages([signal, other], ObservedState())] == ["m1"]


# --- when ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pending_before", "due"), [(0, False), (10_000, True)])
def test_observe_once_pending_plus_unobserved_reach_the_threshold(pending_before: int, due: bool) -> None:
    """`pendingMessageTokens + countMessages(unobserved) >= threshold`."""
    messages = [_msg(i, "word " * 50) for i in range(5)]
    tokens = count_om_messages(messages)
    settings = ObservationSettings(message_tokens=Threshold(tokens + 1, tokens + 1))
    decision = decide_observation(messages, ObservedState(pending_message_tokens=pending_before), settings)
    assert decision.observe is due
    assert decision.pending_tokens == tokens + pending_before
    assert decision.threshold == tokens + 1
    assert [m["id"] for m in decision.messages] == ([m["id"] for m in messages] if due else [])


def test_exactly_at_the_threshold_observes() -> None:
    """The comparison is `>=`."""
    messages = [_msg(0)]
    tokens = count_om_messages(messages)
    settings = ObservationSettings(message_tokens=Threshold(tokens, tokens))
    assert decide_observation(messages, ObservedState(), settings).observe


def test_nothing_unobserved_never_observes() -> None:
    """Pending tokens alone (an app's count) do not make an observation of nothing."""
    settings = ObservationSettings(message_tokens=Threshold(1, 1))
    assert not decide_observation([], ObservedState(pending_message_tokens=10), settings).observe


@pytest.mark.parametrize(("log", "due"), [(39_999, False), (40_000, True), (50_000, True)])
def test_reflect_at_the_observation_tokens(log: int, due: bool) -> None:
    """Reflection once the log reaches `reflection.observationTokens` (40 000 by default)."""
    assert should_reflect(log, ObservationSettings()) is due


# --- texts ------------------------------------------------------------------------------------------------


def test_texts_are_mastras() -> None:
    """The prompt, instructions and continuation hint: Mastra's exported constants, to the character."""
    context = _context()
    assert context["prompt"] == OBSERVATION_CONTEXT_PROMPT
    assert context["instructions"] == OBSERVATION_CONTEXT_INSTRUCTIONS
    assert context["continuationHint"] == OBSERVATION_CONTINUATION_HINT


def test_optimize_for_context_is_mastras() -> None:
    """Emoji marks, anchors, `[tags]`, arrows and extra blanks out, as `optimizeObservationsForContext` does
    (the recorded texts include JavaScript's edges: U+2028 and U+FEFF are \\s, a tag ends at the first `]`).
    """
    assert [optimize_for_context(o) for o in OBSERVATIONS] == _context()["optimized"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a) \n-> -> b", "a) b"),  # the second arrow's spaces were taken by the first: JS still matches it
        ("x-->y", "x- y"),
        ("p \u2028->\ufeffq", "p q"),
    ],
)
def test_arrows_as_javascript_replaces_them(text: str, expected: str) -> None:
    """`/\\s*->\\s*/g` → " ", then double spaces → one (found by the generated interop test: a lookbehind
    form missed an arrow right after a replaced one)."""
    assert optimize_for_context(text) == expected


def test_log_split_at_boundaries_and_appended_with_one() -> None:
    """Cycles are joined with `--- message boundary (ISO) ---` and the context splits the log there."""
    log = append_observations("", "first", None)
    log = append_observations(log, "second", T0)
    log = append_observations(log, "third", None)
    assert log == "first\n\n--- message boundary (2025-01-01T12:00:00.000Z) ---\n\nsecond\n\nthird"
    assert split_context_chunks(log) == ["first", "second\n\nthird"]
    assert message_boundary(datetime(2025, 1, 1, 12, 0, 0, 123_999, tzinfo=UTC)).strip() == (
        "--- message boundary (2025-01-01T12:00:00.123Z) ---"
    )


def test_context_messages() -> None:
    """Preamble + instructions, `<observations>`, the chunks, then the task and suggested response."""
    assert context_system_messages("") == []
    messages = context_system_messages(
        "🟡 a\n\n--- message boundary (2025-01-01T00:00:00Z) ---\n\nb", "t", "s"
    )
    assert messages == [
        f"{OBSERVATION_CONTEXT_PROMPT}\n\n{OBSERVATION_CONTEXT_INSTRUCTIONS}",
        "<observations>",
        "a",
        "b",
        "<current-task>\nt\n</current-task>",
        "<suggested-response>\ns\n</suggested-response>",
    ]
    reminder = continuation_message("t1", "r1")
    assert reminder["id"] == "om-continuation"
    assert (
        reminder["content"]["parts"][0]["text"]
        == f"<system-reminder>{OBSERVATION_CONTINUATION_HINT}</system-reminder>"
    )


@pytest.mark.parametrize("index", range(len(CONTEXT_CASES)))
def test_context_is_what_mastra_builds(index: int) -> None:
    """`buildContextSystemMessages` of a record holding the log, at the request's time, as Mastra built it:
    `Date:` headers with their distance (today, 3 days ago, in 2 weeks, …) and gap markers, V8's reading of
    odd dates (a month by its first three letters, Feb 30 rolling over, year 0049 as 2049, Foo 1 ignored), the
    JavaScript line ends, the chunks split at boundaries."""
    case = CONTEXT_CASES[index]
    now = datetime.fromisoformat(case["now"].replace("Z", "+00:00"))
    built = json.loads(RECORDING.read_text(encoding="utf-8"))["built"][index]
    assert (context_system_messages(case["observations"], now=now) or None) == built


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text", ["[" * 200_000, "[" * 200_000 + "]", "[ 1" * 100_000 + "]", " " * 200_000 + "x"]
)
def test_tag_stripping_is_linear(text: str) -> None:
    """Hang guard (not a timing assertion): the hand-written scans (tags, inline dates, their date patterns,
    the planned-action test) and the header pass stay linear on hostile logs."""
    context_system_messages(text, now=T0)


@pytest.mark.timeout(30)
def test_many_estimated_before_one_close_stay_linear() -> None:
    """Hang guard (not a timing assertion): 8 MB of `(estimated x` before a single `)`. Each opening met the
    same far `)` and copied the text up to it before looking at its last four characters (quadratic: minutes
    here); now the digits are checked in place and nothing is copied for a non-date."""
    text = "(estimated x" * 700_000 + ")"
    assert expand_inline_dates(text, T0) == text


@pytest.mark.parametrize(
    ("days", "relative", "gap"),
    [
        (-400, "in 1 year", None),
        (-100, "in 3 months", None),
        (-20, "in 2 weeks", None),
        (-1, "tomorrow", None),
        (0, "today", None),
        (1, "yesterday", None),
        (2, "2 days ago", "[2 days later]"),
        (10, "1 week ago", "[1 week later]"),
        (45, "1 month ago", "[1 month later]"),
        (400, "1 year ago", "[13 months later]"),
        (800, "2 years ago", "[26 months later]"),
    ],
)
def test_relative_wording_is_mastras(days: int, relative: str, gap: str | None) -> None:
    """`formatRelativeTime` both ways, and `formatGapBetweenDates` (never in years), from one wording."""
    date = T0 - timedelta(days=days)
    assert _relative(date, T0) == relative
    assert _gap(date, T0) == gap


def test_hostile_values_are_read_as_mastra_would_not_raised() -> None:
    """An id of another type (a list: unhashable) is in no set of observed ids; a count past every float is
    not a finite count (the default stands). Both raised before (TypeError, OverflowError)."""
    odd = {"id": ["m1"], "role": "user", "content": {"format": 2, "parts": []}}
    state = ObservedState(observed_message_ids=frozenset({"m1"}))
    assert unobserved_messages([odd], state) == [odd]
    settings = resolve_settings({"observation": {"messageTokens": 10**400}})
    assert settings is not None
    assert settings.message_tokens == Threshold(DEFAULT_MESSAGE_TOKENS, DEFAULT_MESSAGE_TOKENS)
