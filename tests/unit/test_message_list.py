"""`MessageList`: sources, (createdAt, id) order, duplicates by id, hydration, and cost on big threads."""

from __future__ import annotations

from datetime import datetime

import pytest

from message_history.core import message_list as message_list_module
from message_history.core.message_list import MessageList, MessageSource
from message_history.core.rules import sort_key
from message_history.errors import InvalidInputError
from schemas.messages import Message
from tests.rule_cases import RESOURCE, THREAD, at, msg, summarize


class FixedClock:
    """A settable "now" for createdAt hydration."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def new_list(clock: FixedClock | None = None) -> MessageList:
    if clock is None:
        return MessageList(thread_id=THREAD, resource_id=RESOURCE)
    return MessageList(thread_id=THREAD, resource_id=RESOURCE, now=clock)


def test_views_by_source_in_time_order() -> None:
    """Each view holds its source's messages, all views ordered by (createdAt, id) whatever the add order."""
    ml = new_list()
    ml.add(msg("u2", t=30), "input")
    ml.add([msg("a1", "assistant", t=20), msg("u1", t=10)], "memory")
    ml.add(msg("r", "assistant", t=40), "response")
    ml.add(msg("c", t=5), "context")
    assert [m.id for m in ml.get_all()] == ["c", "u1", "a1", "u2", "r"]
    assert [m.id for m in ml.get_remembered()] == ["u1", "a1"]
    assert [m.id for m in ml.get_input()] == ["u2"]
    assert [m.id for m in ml.get_response()] == ["r"]
    assert [m.id for m in ml.get_context()] == ["c"]
    assert len(ml) == 5


def test_ties_ordered_by_id() -> None:
    """Messages with equal createdAt are ordered by id, not by insertion."""
    ml = new_list().add([msg("c", t=1), msg("a", t=1), msg("b", t=1)], "input")
    assert [m.id for m in ml.get_all()] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("first", "second", "expected_text", "expected_sources"),
    [
        ("memory", "input", "second", {"input"}),
        ("input", "memory", "first", {"input"}),
        ("input", "response", "second", {"input", "response"}),
        ("memory", "memory", "second", {"memory"}),
        ("context", "input", "second", {"context", "input"}),
    ],
    ids=[
        "input-replaces-memory-and-drops-the-tag",
        "memory-copy-of-input-skipped",
        "response-replaces-input-and-joins",
        "newer-memory-copy-replaces-memory-only",
        "input-replaces-context-and-joins",
    ],
)
def test_duplicate_ids(
    first: MessageSource, second: MessageSource, expected_text: str, expected_sources: set[str]
) -> None:
    """A second add of an id keeps one message; who wins depends on the sources (incoming beats memory)."""
    ml = new_list()
    ml.add(msg("x", t=1, text="first"), first)
    ml.add(msg("x", t=1, text="second"), second)
    assert len(ml) == 1
    found = ml.get("x")
    assert found is not None
    assert summarize(found) == [f"text:{expected_text}"]
    assert ml.get_sources("x") == frozenset(expected_sources)


def test_equal_memory_copy_changes_nothing() -> None:
    """Adding an equal copy of a remembered message leaves the very same object in place."""
    ml = new_list()
    original = msg("x", t=1)
    ml.add(original, "memory")
    ml.add(msg("x", t=1), "memory")
    assert ml.get("x") is original


def test_system_messages_kept_apart() -> None:
    """System messages go to the system list, never into the views; recalled ones are ignored."""
    ml = new_list()
    ml.add(msg("s-in", "system", t=1), "input")
    ml.add(msg("s-mem", "system", t=2), "memory")
    ml.add(msg("u", t=3), "input")
    assert [m.id for m in ml.get_system()] == ["s-in"]
    assert [m.id for m in ml.get_all()] == ["u"]
    assert [m.id for m in ml.get_input()] == ["u"]
    assert "s-in" in ml
    assert "s-mem" not in ml
    assert ml.get_sources("s-in") == frozenset({"input"})


def test_hydration_fills_id_thread_resource_and_time() -> None:
    """A bare input message gets a UUID, the list's thread and resource, and 'now'."""
    clock = FixedClock(at(1000))
    ml = new_list(clock).add({"role": "user", "content": "hello"}, "input")
    (message,) = ml.get_input()
    assert message.id is not None
    assert len(message.id) == 36
    assert (message.threadId, message.resourceId, message.createdAt) == (THREAD, RESOURCE, at(1000))


def test_missing_created_at_stays_after_the_latest_message() -> None:
    """When 'now' is not later than the newest message, a new message gets latest + 1 ms (Mastra's rule)."""
    clock = FixedClock(at(5))
    ml = new_list(clock)
    ml.add(msg("future", t=100), "memory")
    ml.add(
        [{"id": "n1", "role": "user", "content": "a"}, {"id": "n2", "role": "user", "content": "b"}], "input"
    )
    got = {m.id: m.createdAt for m in ml.get_all()}
    assert got["n1"] == at(101)
    assert got["n2"] == at(102)
    assert [m.id for m in ml.get_all()] == ["future", "n1", "n2"]


def test_given_fields_are_kept_and_inputs_not_mutated() -> None:
    """A message with id, time, thread and resource is stored as given (same object, nothing copied)."""
    given = msg("u", t=7)
    before = given.wire()
    ml = new_list().add(given, "input")
    assert ml.get("u") is given
    assert given.wire() == before


def test_bare_message_is_copied_not_mutated() -> None:
    """Hydration works on a copy: the caller's message keeps its missing fields."""
    bare = Message.model_validate({"role": "user", "content": "x"})
    new_list().add(bare, "input")
    assert (bare.id, bare.threadId, bare.createdAt) == (None, None, None)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (msg("u", t=1, thread="other"), "wrong threadId"),
        (msg("u", t=1, resource="other"), "wrong resourceId"),
    ],
    ids=["other-thread", "other-resource"],
)
def test_input_from_another_thread_or_resource_is_refused(message: Message, match: str) -> None:
    """A non-memory message naming another thread or resource raises InvalidInputError, as Mastra throws."""
    ml = new_list()
    with pytest.raises(InvalidInputError, match=match):
        ml.add(message, "input")
    assert len(ml) == 0


def test_memory_from_another_thread_is_accepted() -> None:
    """Recalled messages keep their own fields; only non-memory adds are checked (as Mastra)."""
    ml = new_list().add(msg("m", t=1, thread="other"), "memory")
    assert [m.threadId for m in ml.get_remembered()] == ["other"]


def test_list_without_thread_keeps_messages_bare() -> None:
    """A list with no thread neither stamps nor checks threadId."""
    ml = MessageList().add([msg("u", t=1, thread="t9"), {"id": "v", "role": "user", "content": "x"}], "input")
    assert sorted((m.id or "", m.threadId or "-") for m in ml.get_all()) == [("u", "t9"), ("v", "-")]


def test_unknown_source_is_refused() -> None:
    """Sources are input, memory, response and context only."""
    with pytest.raises(ValueError, match="unknown message source"):
        new_list().add(msg("u", t=1), "user")  # type: ignore[arg-type]


def test_get_sources_of_unknown_id_is_empty() -> None:
    """Asking for an id that is not there gives no sources and no message."""
    ml = new_list()
    assert ml.get_sources("nope") == frozenset()
    assert ml.get("nope") is None


def test_2000_message_thread_sorts_once_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding 2,000+ messages one by one computes each sort key once at the next read, not once per add."""
    calls = 0

    def counting_key(message: Message) -> tuple[datetime, str]:
        nonlocal calls
        calls += 1
        return sort_key(message)

    monkeypatch.setattr(message_list_module, "sort_key", counting_key)
    ml = new_list()
    n = 2000
    for i in reversed(range(n)):  # newest first, as a page arrives, then the turn's input
        ml.add(msg(f"m{i:05d}", t=i), "memory")
    for i in range(50):
        ml.add(msg(f"u{i:03d}", t=n + i), "input")
        ml.add(msg(f"m{i:05d}", t=i), "memory")  # duplicate memory copies: skipped by dict lookup
    assert calls == 0
    everything = ml.get_all()
    assert len(everything) == n + 50
    assert [m.id for m in everything[:2]] == ["m00000", "m00001"]
    assert [m.id for m in everything[-2:]] == ["u048", "u049"]
    assert calls == n + 50
    ml.get_input()
    ml.get_remembered()
    assert calls == n + 50  # reads in between reuse the sorted order
    ml.add(msg("late", t=10 * n), "input")
    assert ml.get_all()[-1].id == "late"
    assert calls == 2 * (n + 50) + 1
