"""The pure rules of `message_history.core.rules`, table by table, without any storage."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from message_history.core import rules
from message_history.core.rules import (
    PersistDecision,
    SkipReason,
    assign_thread,
    build_context,
    filter_for_persistence,
    is_memory_sourced,
    normalize_limit,
    remove_working_memory_tags,
    select_for_persistence,
    sort_key,
    with_source,
    without_source,
)
from message_history.errors import InvalidInputError
from schemas.messages import Message
from tests.rule_cases import RESOURCE, THREAD, msg, summarize, tool

# --- limits ------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 40), (False, None), (0, 0), (1, 1), (100, 100)],
    ids=["unset-is-40", "false-is-no-limit", "zero-is-nothing", "one", "hundred"],
)
def test_normalize_limit(value: int | bool | None, expected: int | None) -> None:
    """lastMessages maps to a page size as Mastra's storage normalises perPage."""
    assert normalize_limit(value) == expected


@pytest.mark.parametrize("value", [-1, True, "3", 2.5], ids=["negative", "true", "string", "float"])
def test_normalize_limit_rejects(value: Any) -> None:
    """Anything but a non-negative int, False or None is a ValueError (InvalidInputError)."""
    with pytest.raises(InvalidInputError):
        normalize_limit(value)
    assert issubclass(InvalidInputError, ValueError)


# --- order ------


def test_sort_key_breaks_ties_by_id_and_puts_undated_last() -> None:
    """Equal createdAt orders by id; a message without createdAt sorts after dated ones."""
    undated = Message.model_validate({"id": "0", "role": "user", "content": "x"})
    ordered = sorted([msg("b", t=5), undated, msg("a", t=5), msg("z", t=1)], key=sort_key)
    assert [m.id for m in ordered] == ["z", "a", "b", "0"]


# --- context ------

ContextCase = tuple[list[Message], list[Message], list[tuple[str, str]]]

CONTEXT_CASES: dict[str, ContextCase] = {
    "page-reversed-then-input": (
        [msg("a1", "assistant", t=2), msg("u1", t=1)],
        [msg("u2", t=3)],
        [("u1", "memory"), ("a1", "memory"), ("u2", "input")],
    ),
    "ties-ordered-by-id-across-sources": (
        [msg("d", t=5), msg("b", t=5)],
        [msg("c", t=5), msg("a", t=5)],
        [("a", "input"), ("b", "memory"), ("c", "input"), ("d", "memory")],
    ),
    "system-rows-dropped": (
        [msg("a1", "assistant", t=3), msg("s1", "system", t=2), msg("u1", t=1)],
        [],
        [("u1", "memory"), ("a1", "memory")],
    ),
    "incoming-system-kept-as-input": (
        [msg("u1", t=1)],
        [msg("s", "system", t=0)],
        [("s", "input"), ("u1", "memory")],
    ),
    "duplicate-id-incoming-wins": (
        [msg("u1", t=1, text="stored")],
        [msg("u1", t=9, text="incoming")],
        [("u1", "input")],
    ),
    "duplicate-recalled-keeps-the-newest-copy": (
        [msg("x", t=4, text="newer"), msg("x", t=2, text="older")],
        [],
        [("x", "memory")],
    ),
    "duplicate-incoming-keeps-the-last-copy": (
        [],
        [msg("u", t=1, text="first"), msg("u", t=1, text="last")],
        [("u", "input")],
    ),
    "incoming-older-than-history-interleaves": (
        [msg("a1", "assistant", t=20), msg("u1", t=10)],
        [msg("early", t=15)],
        [("u1", "memory"), ("early", "input"), ("a1", "memory")],
    ),
    "nothing-at-all": ([], [], []),
}


@pytest.mark.parametrize("case", list(CONTEXT_CASES.values()), ids=list(CONTEXT_CASES))
def test_build_context(case: ContextCase) -> None:
    """build_context drops system rows and duplicate ids, and orders by (createdAt, id)."""
    recalled, incoming, expected = case
    assert [(m.id, source) for m, source in build_context(recalled, incoming)] == expected


def test_build_context_keeps_the_winning_copy_and_does_not_copy() -> None:
    """The incoming copy of a duplicate is the very object passed in; inputs are left as they were."""
    stored, first, last = (
        msg("u", t=1, text="stored"),
        msg("u", t=2, text="first"),
        msg("u", t=3, text="last"),
    )
    recalled, incoming = [stored], [first, last]
    before = ([m.wire() for m in recalled], [m.wire() for m in incoming])
    ((winner, source),) = build_context(recalled, incoming)
    assert winner is last
    assert source == "input"
    assert ([m.wire() for m in recalled], [m.wire() for m in incoming]) == before


def test_recalled_row_without_id_is_kept() -> None:
    """A stored message with no id cannot collide and stays in the context (as Mastra 1.0.4)."""
    anonymous = Message.model_validate(
        {"role": "user", "createdAt": "2025-01-01T11:00:00.001Z", "content": "x"}
    )
    context = build_context([anonymous], [msg("u1", t=5)])
    assert [(m.id, s) for m, s in context] == [(None, "memory"), ("u1", "input")]


class CountingKey:
    """A sort key that counts its comparisons."""

    comparisons = 0

    def __init__(self, key: tuple[datetime, str]) -> None:
        self.key = key

    def __lt__(self, other: CountingKey) -> bool:
        CountingKey.comparisons += 1
        return self.key < other.key


@pytest.fixture
def counting_sort_key(monkeypatch: pytest.MonkeyPatch) -> type[CountingKey]:
    """Replace rules.sort_key by a comparison-counting wrapper."""
    real = rules.sort_key
    CountingKey.comparisons = 0
    monkeypatch.setattr(rules, "sort_key", lambda m: CountingKey(real(m)))
    return CountingKey


def test_build_context_is_linear_on_a_2000_message_thread(counting_sort_key: type[CountingKey]) -> None:
    """Merging a 2,000-row page with a 2,000-message turn takes O(n) comparisons, not O(n log n) or O(n²)."""
    n = 2000
    recalled = [msg(f"h{i:05d}", t=i) for i in reversed(range(n))]  # newest first, as storage pages
    incoming = [msg(f"i{i:05d}", t=n + i) for i in range(n)] + [msg("h00010", t=10, text="edited")]
    context = build_context(recalled, incoming)
    assert len(context) == 2 * n
    assert [m.id for m, _ in context][:3] == ["h00000", "h00001", "h00002"]
    assert dict((m.id, s) for m, s in context)["h00010"] == "input"
    # Timsort merges the two ordered runs; a full comparison sort would need about n·log2(n) ≈ 44,000.
    assert counting_sort_key.comparisons < 3 * (2 * n)


# --- working memory ------

WM = "<working_memory>data</working_memory>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        (f"a{WM}b", "ab"),
        (f"{WM}{WM}", ""),
        (f"a{WM}b{WM}c", "abc"),
        ("a<working_memory>open", "a<working_memory>open"),
        (f"a{WM}b<working_memory>open", "ab<working_memory>open"),
        ("a</working_memory>b", "a</working_memory>b"),
        ("<working_memory>x<working_memory>y</working_memory>z", "z"),
        ("", ""),
    ],
    ids=[
        "no-tags",
        "one-block",
        "only-blocks",
        "two-blocks",
        "unclosed",
        "block-then-unclosed",
        "stray-closing-tag",
        "shortest-match",
        "empty",
    ],
)
def test_remove_working_memory_tags(text: str, expected: str) -> None:
    """Complete blocks are removed (shortest match), an unclosed tag keeps the rest of the text."""
    assert remove_working_memory_tags(text) == expected


def test_remove_working_memory_tags_is_linear_on_many_unclosed_tags() -> None:
    """A text of 20,000 opening tags without a closing one is returned unchanged (no regex backtracking)."""
    text = "<working_memory>" * 20_000
    assert remove_working_memory_tags(text) == text


# --- the persistence filter ------


@pytest.mark.parametrize(
    ("message", "expected_parts", "expected_content"),
    [
        (msg("u", t=1, text="hi"), ["text:hi"], "hi"),
        (msg("s", "system", t=1), None, None),
        (msg("a", "assistant", t=1, parts=[tool("x", "partial-call")]), None, None),
        (msg("a", "assistant", t=1, parts=[]), None, None),
        (
            msg("a", "assistant", t=1, parts=[tool("x", "call"), tool("y", "partial-call", "c2")]),
            ["tool:call:x"],
            None,
        ),
        (msg("a", "assistant", t=1, parts=[tool("x", "output-error")]), ["tool:output-error:x"], None),
        (
            msg("a", "assistant", t=1, parts=[tool("updateWorkingMemory", "result"), {"type": "step-start"}]),
            ["step-start"],
            None,
        ),
        (msg("a", "assistant", t=1, text=f"  Hi {WM}\n"), ["text:Hi"], "Hi"),
        (msg("a", "assistant", t=1, text=" keep "), ["text: keep "], " keep "),
        (msg("a", "assistant", t=1, text=f"x{WM}\ufeff"), ["text:x"], "x"),
        (
            msg(
                "a", "assistant", t=1, parts=[{"type": "text", "text": "body"}], content_text=f"{WM} legacy "
            ),
            ["text:body"],
            "legacy",
        ),
    ],
    ids=[
        "plain-kept",
        "system-dropped",
        "only-partial-call-dropped",
        "no-parts-dropped",
        "call-kept-partial-removed",
        "other-states-kept",
        "update-working-memory-removed",
        "closed-block-stripped-and-trimmed",
        "untouched-text-not-trimmed",
        "trim-uses-javascript-whitespace",
        "legacy-content-string-cleaned-separately",
    ],
)
def test_filter_for_persistence(
    message: Message, expected_parts: list[str] | None, expected_content: str | None
) -> None:
    """Each message is kept, cleaned or dropped as Mastra 1.71.0's persistence filter does."""
    out = filter_for_persistence([message])
    if expected_parts is None:
        assert out == []
        return
    (cleaned,) = out
    assert summarize(cleaned) == expected_parts
    assert cleaned.content.content == expected_content


def test_filter_never_mutates_and_reuses_unchanged_messages() -> None:
    """Changed messages are copies (the originals stay as they were); unchanged ones are the same objects."""
    changed = msg(
        "a", "assistant", t=1, parts=[tool("x", "partial-call"), {"type": "text", "text": f"ok{WM}"}]
    )
    unchanged = msg("u", t=0, text="hello")
    before = changed.wire()
    out = filter_for_persistence([unchanged, changed])
    assert out[0] is unchanged
    assert out[1] is not changed
    assert changed.wire() == before
    assert summarize(out[1]) == ["text:ok"]


def test_filter_handles_a_2000_message_turn() -> None:
    """2,000 messages, each with a partial call and a working-memory block, are all cleaned in one pass."""
    messages = [
        msg(
            f"a{i}", "assistant", t=i, parts=[tool("x", "partial-call"), {"type": "text", "text": f"{i}{WM}"}]
        )
        for i in range(2000)
    ]
    out = filter_for_persistence(messages)
    assert [summarize(m) for m in out] == [[f"text:{i}"] for i in range(2000)]


# --- selecting what a turn saves ------

SelectCase = tuple[dict[str, Any], list[str], SkipReason | None]

SELECT_CASES: dict[str, SelectCase] = {
    "input-then-response": (
        {"input": [msg("u", t=1)], "response": [msg("a", "assistant", t=2)]},
        ["u", "a"],
        None,
    ),
    "order-is-input-then-response-not-time": (
        {"input": [msg("u", t=9)], "response": [msg("a", "assistant", t=2)]},
        ["u", "a"],
        None,
    ),
    "no-thread-beats-everything": (
        {"input": [], "response": [], "read_only": True, "has_thread": False},
        [],
        "no-thread",
    ),
    "read-only-beats-failed-turn": (
        {"input": [msg("u", t=1)], "response": [], "read_only": True, "finish_reason": "error"},
        [],
        "read-only",
    ),
    "read-only": ({"input": [msg("u", t=1)], "response": [], "read_only": True}, [], "read-only"),
    "failed-turn": ({"input": [msg("u", t=1)], "response": [], "finish_reason": "error"}, [], "failed-turn"),
    "failed-turn-with-response": (
        {"input": [msg("u", t=1)], "response": [msg("a", "assistant", t=2)], "finish_reason": "error"},
        ["u", "a"],
        None,
    ),
    "empty-turn": ({"input": [], "response": [], "finish_reason": "error"}, [], "nothing-to-save"),
    "memory-sourced-input-skipped": (
        {"input": [msg("m", t=1, source="memory"), msg("u", t=2, source="input")], "response": []},
        ["u"],
        None,
    ),
    "only-memory-sourced-input": (
        {"input": [msg("m", t=1, source="memory")], "response": [], "finish_reason": "error"},
        [],
        "nothing-to-save",
    ),
    "filtered-to-nothing": (
        {"input": [msg("s", "system", t=1)], "response": [msg("a", "assistant", t=2, parts=[])]},
        [],
        "nothing-to-save",
    ),
    "same-id-in-input-and-response-saved-once-last-copy": (
        {"input": [msg("x", t=1, text="first"), msg("u", t=2)], "response": [msg("x", "assistant", t=3)]},
        ["u", "x"],
        None,
    ),
}


@pytest.mark.parametrize("case", list(SELECT_CASES.values()), ids=list(SELECT_CASES))
def test_select_for_persistence(case: SelectCase) -> None:
    """The choke point skips or selects as docs/rules.md#r1 #r4 #r6 #r7 #r8 and read-only prescribe."""
    args, expected_ids, expected_skip = case
    options = {"finish_reason": None, "read_only": False, "has_thread": True, **args}
    decision = select_for_persistence(
        options.pop("input"),
        options.pop("response"),
        finish_reason=options["finish_reason"],
        read_only=options["read_only"],
        has_thread=options["has_thread"],
    )
    assert isinstance(decision, PersistDecision)
    assert decision.skipped == expected_skip
    assert [m.id for m in decision.messages] == expected_ids


def test_selected_messages_lose_the_source_tag() -> None:
    """`source` is a transport tag: the saved copy has none, the caller's message still has it."""
    tagged = msg("u", t=1, source="input")
    (saved,) = select_for_persistence(
        [tagged], [], finish_reason=None, read_only=False, has_thread=True
    ).messages
    assert "source" not in saved.wire()
    assert tagged.wire()["source"] == "input"


def test_source_helpers() -> None:
    """with_source tags a copy, without_source removes the tag, is_memory_sourced reads it."""
    plain = msg("u", t=1)
    tagged = with_source(plain, "memory")
    assert is_memory_sourced(tagged)
    assert not is_memory_sourced(plain)
    assert "source" not in plain.wire()
    assert tagged.wire()["source"] == "memory"
    assert without_source(tagged).wire() == plain.wire()
    assert without_source(plain) is plain


# --- stamping thread and resource ------


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (msg("u", t=1), None),
        (msg("u", t=1, thread=None, resource=None), None),
        (msg("u", t=1, thread="other"), "threadId"),
        (msg("u", t=1, resource="other"), "resourceId"),
        (Message.model_validate({"role": "user", "content": "no id"}), "no id"),
    ],
    ids=["matching", "bare-gets-stamped", "other-thread", "other-resource", "no-id"],
)
def test_assign_thread(message: Message, error: str | None) -> None:
    """Messages take the turn's thread and resource; another thread/resource or a missing id is refused."""
    if error is not None:
        with pytest.raises(InvalidInputError, match=error):
            assign_thread([message], thread_id=THREAD, resource_id=RESOURCE)
        return
    (stamped,) = assign_thread([message], thread_id=THREAD, resource_id=RESOURCE)
    assert (stamped.threadId, stamped.resourceId) == (THREAD, RESOURCE)
    assert (stamped is message) == (message.threadId is not None)


class TaggedMessage(Message):
    """A message model declaring `source` as a field (as an event schema may)."""

    source: str | None = None


def test_source_helpers_handle_a_declared_source_field() -> None:
    """A subclass with a declared `source` is recognised as memory-sourced and saved as a plain Message."""
    data = msg("u", t=1).wire()
    recalled = TaggedMessage.model_validate({**data, "source": "memory"})
    typed_input = TaggedMessage.model_validate({**data, "source": "input"})
    assert is_memory_sourced(recalled)
    assert not is_memory_sourced(typed_input)
    decision = select_for_persistence(
        [recalled, typed_input], [], finish_reason=None, read_only=False, has_thread=True
    )
    (saved,) = decision.messages
    assert type(saved) is Message
    assert saved.wire() == data
