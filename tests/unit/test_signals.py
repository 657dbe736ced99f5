"""Transient signals (`message_history.core.signals`): which messages count, and the places that drop them.

Mastra 1.71 (packages/core/src/agent/signals.ts `isTransientSignalMessage`) drops them before saving
(`filterMessagesForPersistence`) and from token-limited recall's pages (`loadMessageHistory`), nowhere else.
"""

from __future__ import annotations

from typing import Any

import pytest

from message_history.core.budget import resolve_budget
from message_history.core.rules import build_context, filter_for_persistence, select_for_persistence
from message_history.core.signals import is_transient_signal
from schemas.messages import Message
from tests.rule_cases import TRANSIENT_SIGNAL, load_all, msg


def signal(id: str, t: int, metadata: Any, role: str = "signal") -> Message:
    """A message of `role` (a `signal` by default) whose `content.metadata` is `metadata`."""
    return msg(id, role, t=t, content_extra={"metadata": metadata})


TRANSIENT = TRANSIENT_SIGNAL
KEPT = {"signal": {"type": "notification", "tagName": "notification"}}


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        (signal("s", 1, TRANSIENT), True),
        (signal("s", 1, {"signal": {"transient": True}, "other": 1}), True),
        (signal("s", 1, KEPT), False),
        (signal("s", 1, {"signal": {"transient": False}}), False),
        (signal("s", 1, {"signal": {"transient": "true"}}), False),
        (signal("s", 1, {"signal": {"transient": 1}}), False),
        (signal("s", 1, {"signal": [{"transient": True}]}), False),
        (signal("s", 1, {"signal": None}), False),
        (signal("s", 1, {"transient": True}), False),
        (signal("s", 1, None), False),
        (msg("s", "signal", t=1), False),
        (signal("u", 1, TRANSIENT, role="user"), False),
        (signal("a", 1, TRANSIENT, role="assistant"), False),
        (signal("y", 1, TRANSIENT, role="system"), False),
    ],
    ids=[
        "transient-signal",
        "other-metadata-keys-alongside",
        "signal-without-the-flag",
        "transient-false",
        "transient-the-string-true",
        "transient-one",
        "signal-metadata-an-array",
        "signal-metadata-null",
        "flag-outside-signal",
        "metadata-null",
        "no-metadata",
        "user-with-the-flag",
        "assistant-with-the-flag",
        "system-with-the-flag",
    ],
)
def test_is_transient_signal(message: Message, transient: bool) -> None:
    """Only `role: "signal"` with `content.metadata.signal.transient === true` counts, as in Mastra 1.71."""
    assert is_transient_signal(message) is transient


def test_the_persistence_filter_drops_transient_signals_only() -> None:
    """Transient signals go, a kept signal and a flagged user message stay, the same objects as given."""
    kept_signal, flagged_user = signal("k", 2, KEPT), signal("u", 3, TRANSIENT, role="user")
    out = filter_for_persistence([signal("s", 1, TRANSIENT), kept_signal, flagged_user])
    assert out == [kept_signal, flagged_user]
    assert out[0] is kept_signal


@pytest.mark.parametrize(
    ("input", "response", "finish_reason", "saved", "skipped"),
    [
        (
            [msg("u", t=1), signal("si", 2, TRANSIENT), signal("sk", 3, KEPT)],
            [signal("sr", 4, TRANSIENT), msg("a", "assistant", t=5)],
            "stop",
            ["u", "sk", "a"],
            None,
        ),
        ([], [signal("sr", 4, TRANSIENT)], "stop", [], "nothing-to-save"),
        ([signal("si", 1, TRANSIENT)], [], None, [], "nothing-to-save"),
        # the failed-turn check sees the response before the filter, as Mastra 1.71's processOutputResult
        ([msg("u", t=1)], [signal("sr", 4, TRANSIENT)], "error", ["u"], None),
        ([msg("u", t=1), signal("si", 2, TRANSIENT)], [], "error", [], "failed-turn"),
    ],
    ids=[
        "dropped-from-input-and-response",
        "a-response-of-only-a-transient-signal",
        "an-input-of-only-a-transient-signal",
        "failed-turn-whose-response-is-only-a-transient-signal-saves-the-input",
        "failed-turn-without-response",
    ],
)
def test_what_a_turn_with_transient_signals_saves(
    input: list[Message],
    response: list[Message],
    finish_reason: str | None,
    saved: list[str],
    skipped: str | None,
) -> None:
    """The choke point saves the turn without its transient signals, or says why nothing is saved."""
    decision = select_for_persistence(
        input, response, finish_reason=finish_reason, read_only=False, has_thread=True
    )
    assert [m.id for m in decision.messages] == saved
    assert decision.skipped == skipped


def _thread_with_transient_signals(n: int) -> list[Message]:
    """`n` rows 1 ms apart, newest first; every third one a transient signal."""
    rows = [
        signal(f"m{i:03d}", i, TRANSIENT) if i % 3 == 0 else msg(f"m{i:03d}", "user", t=i) for i in range(n)
    ]
    return rows[::-1]


def test_token_limited_recall_skips_stored_transient_signals() -> None:
    """`loadMessageHistory`'s pages leave them out; the cursor still moves past them (several pages)."""
    rows = _thread_with_transient_signals(100)
    budget = resolve_budget(1_000_000, 0)
    loaded, pages = load_all(rows, boundary=None, max_messages=None, budget=budget)
    assert pages == 3
    assert [m.id for m in loaded] == [f"m{i:03d}" for i in range(100) if i % 3 != 0]


def test_token_limited_recall_counts_the_cap_without_them() -> None:
    """A count cap of 4 under a budget takes the 4 newest other rows: the skipped signals take no room."""
    rows = _thread_with_transient_signals(10)
    loaded, _ = load_all(rows, boundary=None, max_messages=4, budget=resolve_budget(1_000_000, 0))
    assert [m.id for m in loaded] == ["m004", "m005", "m007", "m008"]


def test_count_capped_recall_and_the_turn_keep_them() -> None:
    """Without a budget a stored one is recalled as it is (Mastra does not look), and the turn's own
    transient signals stay in the context the model sees, under a budget too."""
    stored = signal("old", 1, TRANSIENT)
    incoming = [msg("u", t=2), signal("now", 3, TRANSIENT)]
    context = build_context([stored], incoming)
    assert [(m.id, source) for m, source in context] == [("old", "memory"), ("u", "input"), ("now", "input")]
    loaded, _ = load_all([stored], boundary=None, max_messages=None, budget=resolve_budget(1_000_000, 0))
    budgeted = build_context(loaded[::-1], incoming)
    assert [(m.id, source) for m, source in budgeted] == [("u", "input"), ("now", "input")]
