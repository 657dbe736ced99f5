"""Token-limited recall's pure rules (`message_history.core.budget`), table by table, with a flat counter.

A flat counter (every message counts 10) keeps the tables readable; the real counter is checked against
Mastra's in tests/interop/test_mastra_memory_interop.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from message_history.core.budget import (
    BOUNDARY_KEY,
    Boundary,
    HistoryLoader,
    TokenBudget,
    advance_boundary,
    boundary_for,
    group_linked,
    is_after,
    page_of,
    partition,
    read_boundary,
    resolve_budget,
    trim_memory,
)
from message_history.core.memory_options import MemoryDefaults, turn_memory
from message_history.errors import EventValidationError, InvalidInputError
from message_history.processor import MessageHistory
from schemas.codec import decode_request
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from tests.rule_cases import RESOURCE, THREAD, at, load_all, msg, tool


def flat(_: Message) -> float:
    return 10


def _tool_msg(id: str, t: int, *calls: str) -> Message:
    return msg(id, "assistant", t=t, parts=[tool("f", "result", c) for c in calls])


def _ids(messages: list[Message]) -> list[str | None]:
    return [m.id for m in messages]


# --- groups ------


@pytest.mark.parametrize(
    ("messages", "groups"),
    [
        pytest.param([msg("a", t=1), msg("b", t=2)], [["a"], ["b"]], id="no-tools-one-each"),
        pytest.param(
            [_tool_msg("a", 1, "c1"), msg("b", t=2), _tool_msg("c", 3, "c1")],
            [["a", "c"], ["b"]],
            id="far-apart",
        ),
        pytest.param(
            [_tool_msg("a", 1, "c1"), _tool_msg("b", 2, "c2"), _tool_msg("c", 3, "c1", "c2")],
            [["a", "b", "c"]],
            id="transitive",
        ),
        pytest.param(
            [msg("a", t=1, content_extra={"toolInvocations": [{"toolCallId": "x"}]}), _tool_msg("b", 2, "x")],
            [["a", "b"]],
            id="legacy-toolInvocations-link",
        ),
    ],
)
def test_group_linked(messages: list[Message], groups: list[list[str]]) -> None:
    """Messages sharing a toolCallId (directly or through another) are one group, in the given order."""
    assert [_ids(g) for g in group_linked(messages)] == groups


# --- partition ------


@pytest.mark.parametrize(
    ("cap", "budget", "kept", "overflow", "reason"),
    [
        pytest.param(None, None, ["a", "b", "c", "d"], [], None, id="no-limits"),
        pytest.param(2, None, ["c", "d"], ["a", "b"], "messages", id="count-cap"),
        pytest.param(None, TokenBudget(40, 15), ["c", "d"], ["a", "b"], "tokens", id="token-target-25"),
        pytest.param(None, TokenBudget(40, 10), ["b", "c", "d"], ["a"], "tokens", id="token-target-30"),
        pytest.param(3, TokenBudget(100, 0), ["b", "c", "d"], ["a"], "messages", id="cap-binds-first"),
    ],
)
def test_partition(
    cap: int | None, budget: TokenBudget | None, kept: list[str], overflow: list[str], reason: str | None
) -> None:
    """Newest first while the count cap and maxTokens − atMaxRemoveTokens hold; both lists oldest first."""
    newest_first = [msg(i, t=t) for i, t in (("d", 4), ("c", 3), ("b", 2), ("a", 1))]
    result = partition(newest_first, max_messages=cap, budget=budget, count=flat)
    assert (_ids(result.kept), _ids(result.overflow), result.reason) == (kept, overflow, reason)


def test_partition_keeps_or_drops_a_tool_group_whole() -> None:
    """A group that does not fit overflows whole, and so does everything older, even what would fit."""
    newest_first = [
        msg("e", t=5),
        _tool_msg("d", 4, "c1"),
        msg("c", t=3),
        _tool_msg("b", 2, "c1"),
        msg("a", t=1),
    ]
    result = partition(newest_first, max_messages=3, budget=None, count=flat)
    # groups newest first: [e], [d, b], [c], [a]: e and d+b fit (3), then c does not, nor a after it
    assert _ids(result.kept) == ["b", "d", "e"]
    assert _ids(result.overflow) == ["a", "c"]


# --- the boundary ------

BUDGET = TokenBudget(100, 25)


def _boundary(ms: int, *ids: str, budget: TokenBudget = BUDGET) -> Boundary:
    created = at(ms)
    return Boundary(
        created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        ids,
        budget.max_tokens,
        budget.at_max_remove_tokens,
        created,
    )


@pytest.mark.parametrize(
    ("message", "after"),
    [
        pytest.param(msg("x", t=11), True, id="later"),
        pytest.param(msg("x", t=9), False, id="earlier"),
        pytest.param(msg("x", t=10), True, id="same-instant-not-trimmed"),
        pytest.param(msg("a", t=10), False, id="same-instant-trimmed"),
    ],
)
def test_is_after(message: Message, after: bool) -> None:
    """After the boundary: later, or at its instant and not one of its ids."""
    assert is_after(message, _boundary(10, "a")) is after


@pytest.mark.parametrize(
    ("previous", "removed", "expected"),
    [
        pytest.param(None, [], None, id="nothing-removed-no-boundary"),
        pytest.param(
            None, [msg("a", t=5), msg("b", t=7), msg("c", t=7)], ("b", "c"), id="newest-instant-ids"
        ),
        pytest.param(_boundary(7, "a"), [msg("b", t=7)], ("a", "b"), id="same-instant-union"),
        pytest.param(_boundary(7, "a"), [msg("b", t=9)], ("b",), id="newer-replaces"),
        pytest.param(_boundary(9, "a"), [msg("b", t=7)], "previous", id="older-never-moves-back"),
    ],
)
def test_advance_boundary(previous: Boundary | None, removed: list[Message], expected: Any) -> None:
    """The boundary moves to the newest removed instant; ties at that instant are listed; never backwards."""
    result = advance_boundary(previous, removed, BUDGET)
    if expected == "previous":
        assert result is previous
    elif expected is None:
        assert result is None
    else:
        assert result is not None
        assert result.message_ids == expected
        assert result.instant == max(m.createdAt for m in removed if m.createdAt is not None)
        assert result.to_metadata()["maxTokens"] == 100


@pytest.mark.parametrize(
    "value",
    [
        None,
        "x",
        {"createdAt": "not a date", "messageIds": [], "maxTokens": 1, "atMaxRemoveTokens": 0},
        {"createdAt": "2025-01-01T00:00:00.000Z", "messageIds": [1], "maxTokens": 1, "atMaxRemoveTokens": 0},
        {"createdAt": "2025-01-01T00:00:00.000Z", "messageIds": [], "maxTokens": "1", "atMaxRemoveTokens": 0},
        {"createdAt": "2025-01-01T00:00:00.000Z", "messageIds": []},
    ],
)
def test_read_boundary_ignores_malformed(value: Any) -> None:
    """A stored value that is not Mastra's shape is no boundary at all."""
    assert read_boundary({"memoryTokenLimiter": value}) is None


def test_boundary_round_trips_and_another_budget_is_ignored() -> None:
    """Stored as Mastra writes it; used only under the very budget that drew it."""
    boundary = _boundary(10, "a", "b")
    stored = read_boundary({"memoryTokenLimiter": json.loads(json.dumps(boundary.to_metadata())), "other": 1})
    assert stored == boundary
    assert boundary_for(BUDGET, stored) is stored
    assert boundary_for(TokenBudget(100, 30), stored) is None
    assert boundary_for(None, stored) is None


# --- the memory-only limiter ------


def test_trim_removes_memory_groups_oldest_first_down_to_the_target() -> None:
    """Above maxTokens, whole memory groups go oldest first until the total is ≤ the target."""
    context = [
        (msg("a", t=1), "memory"),
        (_tool_msg("b", 2, "c1"), "memory"),
        (_tool_msg("c", 3, "c1"), "memory"),
        (msg("d", t=4), "memory"),
        (msg("in", t=5), "input"),
    ]
    # total = 24 + 5 × 10 = 74 > 70; target 40: remove [a] (64), [b, c] (44), [d] (34)
    removed, total = trim_memory(context, TokenBudget(70, 30), count=flat)  # type: ignore[arg-type]
    assert (_ids(removed), total) == (["a", "b", "c", "d"], 34)
    removed, total = trim_memory(context, TokenBudget(70, 20), count=flat)  # type: ignore[arg-type]
    assert (_ids(removed), total) == (["a", "b", "c"], 44)
    removed, total = trim_memory(context, TokenBudget(80, 20), count=flat)  # type: ignore[arg-type]
    assert (_ids(removed), total) == ([], 74)  # under maxTokens: nothing


def test_trim_never_removes_a_group_with_an_input_member_and_counts_system() -> None:
    """A tool group linking memory and input stays; system texts count towards the total."""
    context = [
        (_tool_msg("a", 1, "c1"), "memory"),
        (msg("b", t=2), "memory"),
        (_tool_msg("in", 3, "c1"), "input"),
    ]
    removed, total = trim_memory(context, TokenBudget(60, 10), system=["Be brief."], count=flat)  # type: ignore[arg-type]
    assert _ids(removed) == ["b"]
    assert total > 44  # 24 + 20 + the system text


# --- paging ------


def test_loader_pages_until_the_cutoff_and_respects_the_boundary() -> None:
    """Pages of 40 stop once past the cutoff; with a boundary, nothing at or before it is loaded."""
    rows = [msg(f"m{i:03d}", t=i) for i in range(200)][::-1]
    result, pages = load_all(rows, boundary=None, max_messages=None, budget=TokenBudget(500, 100), count=flat)
    # target 400 = 40 messages kept; the overflow (tokens) is handed on: the rest of the pages loaded
    assert _ids(result)[-40:] == [f"m{i:03d}" for i in range(160, 200)]
    assert pages == 2  # the first page holds 40; the second crosses the cutoff
    result, pages = load_all(
        rows, boundary=_boundary(189, "m189"), max_messages=None, budget=TokenBudget(500, 100), count=flat
    )
    assert _ids(result) == [f"m{i:03d}" for i in range(190, 200)]
    assert pages == 1


def test_loader_hands_on_overflow_only_when_tokens_bind() -> None:
    """A count-cap miss hands back only the kept messages; a token miss, the loaded overflow too."""
    rows = [msg(f"m{i}", t=i) for i in range(10)][::-1]
    by_count, _ = load_all(rows, boundary=None, max_messages=3, budget=TokenBudget(1000, 0), count=flat)
    assert _ids(by_count) == ["m7", "m8", "m9"]
    by_tokens, _ = load_all(rows, boundary=None, max_messages=None, budget=TokenBudget(30, 0), count=flat)
    assert _ids(by_tokens) == [f"m{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("rows", "system", "max_rows", "pages", "truncated"),
    [
        pytest.param(200, 0, None, 2, False, id="no-cap"),
        pytest.param(200, 0, 40, 1, True, id="cap-of-one-page"),
        pytest.param(200, 0, 100, 2, False, id="cap-above-what-the-budget-needs"),
        pytest.param(30, 0, 40, 1, False, id="short-thread-never-truncated"),
        pytest.param(2000, 2000, None, 52, False, id="system-rows-paged-to-the-end"),
        pytest.param(2000, 2000, 200, 5, True, id="system-rows-stop-at-the-cap"),
    ],
)
def test_loader_stops_paging_at_the_row_cap(
    rows: int, system: int, max_rows: int | None, pages: int, truncated: bool
) -> None:
    """With `max_rows`, the loader asks no page that could take it past the cap, and says it stopped with
    pages left; a thread of rows it skips (system rows, read and dropped) is paged at most to the cap."""
    stored = [msg(f"m{i:04d}", t=i, role="system" if i < system else "user") for i in range(rows)][::-1]
    loader = HistoryLoader(
        boundary=None, max_messages=None, budget=TokenBudget(500, 100), count=flat, max_rows=max_rows
    )
    request = loader.next_page
    while request is not None:
        page, has_more = page_of(stored, request)
        request = loader.feed(page, has_more=has_more)
    assert (loader.pages, loader.truncated) == (pages, truncated)
    assert max_rows is None or loader.rows_read <= max_rows
    assert loader.loaded().truncated is truncated


# --- options ------


@pytest.mark.parametrize(
    ("max_tokens", "remove", "expected"),
    [
        (None, None, None),
        (100, None, TokenBudget(100, 25.0)),
        (100, 0, TokenBudget(100, 0)),
        (0, None, TokenBudget(0, 0.0)),
        (100.5, 100.5, TokenBudget(100.5, 100.5)),
    ],
)
def test_resolve_budget(max_tokens: float | None, remove: float | None, expected: TokenBudget | None) -> None:
    """atMaxRemoveTokens defaults to 25% of maxTokens; no maxTokens is no budget."""
    assert resolve_budget(max_tokens, remove) == expected


@pytest.mark.parametrize(
    ("max_tokens", "remove", "message"),
    [
        (None, 5, "messageHistory.maxTokens must be a finite non-negative number"),
        (
            10,
            11,
            "messageHistory.atMaxRemoveTokens must be a finite non-negative number no greater than maxTokens",
        ),
    ],
)
def test_resolve_budget_refuses_with_mastras_message(
    max_tokens: float | None, remove: float, message: str
) -> None:
    """Mastra's own validation messages."""
    with pytest.raises(InvalidInputError, match=message.replace(".", r"\.")):
        resolve_budget(max_tokens, remove)


def _request(memory: dict[str, Any] | None) -> bytes:
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": "r",
        "threadId": "t",
        "resourceId": "u",
        "createdAt": "2025-01-01T00:00:00.000Z",
        "messages": [{"role": "user", "content": "hi"}],
    }
    if memory is not None:
        event["memory"] = memory
    return json.dumps(event).encode()


@pytest.mark.parametrize(
    ("memory", "path", "reason"),
    [
        (
            {"maxTokens": -1},
            "memory.maxTokens",
            "messageHistory.maxTokens must be a finite non-negative number",
        ),
        (
            {"maxTokens": "10"},
            "memory.maxTokens",
            "messageHistory.maxTokens must be a finite non-negative number",
        ),
        (
            {"maxTokens": 10, "atMaxRemoveTokens": 20},
            "memory.atMaxRemoveTokens",
            "messageHistory.atMaxRemoveTokens must be a finite non-negative number no greater than maxTokens",
        ),
        ({"lastMessages": 1.5}, "memory.lastMessages", "lastMessages must be a finite non-negative integer"),
        ({"lastMessages": -1}, "memory.lastMessages", "lastMessages must be a finite non-negative integer"),
    ],
)
def test_bad_memory_options_are_refused_with_mastras_messages(
    memory: dict[str, Any], path: str, reason: str
) -> None:
    """Each becomes a dead letter whose reason is Mastra's message."""
    with pytest.raises(EventValidationError) as caught:
        decode_request(_request(memory))
    assert caught.value.path == path
    assert reason in str(caught.value)


DEFAULTS = MemoryDefaults(last_messages=40, max_tokens=None)
BUDGETED = MemoryDefaults(last_messages=40, max_tokens=1000, at_max_remove_tokens=100)


@pytest.mark.parametrize(
    ("memory", "defaults", "limit", "budget"),
    [
        pytest.param(None, DEFAULTS, 40, None, id="service-default-count"),
        pytest.param({"lastMessages": False}, DEFAULTS, 0, None, id="false-turns-history-off"),
        pytest.param({"lastMessages": 5}, DEFAULTS, 5, None, id="own-count"),
        pytest.param({"maxTokens": 200}, DEFAULTS, False, TokenBudget(200, 50.0), id="tokens-only"),
        pytest.param({"maxTokens": 200, "lastMessages": 7}, DEFAULTS, 7, TokenBudget(200, 50.0), id="both"),
        pytest.param({"maxTokens": 0}, DEFAULTS, 0, TokenBudget(0, 0.0), id="zero-tokens-off"),
        pytest.param(None, BUDGETED, False, TokenBudget(1000, 100), id="service-budget"),
        pytest.param({"atMaxRemoveTokens": 10}, BUDGETED, False, TokenBudget(1000, 10), id="own-remove"),
        pytest.param({"maxTokens": 50}, BUDGETED, False, TokenBudget(50, 12.5), id="own-budget-own-default"),
    ],
)
def test_turn_memory(
    memory: dict[str, Any] | None, defaults: MemoryDefaults, limit: Any, budget: TokenBudget | None
) -> None:
    """The request's options over the service defaults, as Mastra's Memory reads them."""
    resolved = turn_memory(decode_request(_request(memory)), defaults)
    assert (resolved.last_messages, resolved.budget) == (limit, budget)


def test_turn_memory_refuses_a_remove_share_without_any_budget() -> None:
    """atMaxRemoveTokens with no maxTokens anywhere is Mastra's maxTokens error (a dead letter)."""
    with pytest.raises(InvalidInputError, match="maxTokens must be"):
        turn_memory(decode_request(_request({"atMaxRemoveTokens": 10})), DEFAULTS)


async def test_another_budgets_boundary_is_ignored_and_replaced() -> None:
    """A boundary drawn under another budget does not limit loading; the new trim replaces it."""
    storage = InMemoryHistoryStorage()
    rows = [msg(f"m{i:02d}", t=i) for i in range(30)]
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=rows)
    history = MessageHistory(storage=storage)
    first = resolve_budget(120, 40)
    outcome = await history.recall(
        thread_id=THREAD, resource_id=RESOURCE, incoming=[], last_messages=False, budget=first
    )
    assert outcome.boundary is not None
    old = outcome.boundary
    second = resolve_budget(200, 50)
    outcome = await history.recall(
        thread_id=THREAD, resource_id=RESOURCE, incoming=[], last_messages=False, budget=second
    )
    # loaded from the start again (the old boundary is not this budget's), trimmed, and a boundary of its own
    assert outcome.trimmed
    assert outcome.trimmed[0] == "m00"  # under the old boundary m00 would not even have been loaded
    assert outcome.boundary is not None
    assert (outcome.boundary.max_tokens, outcome.boundary.at_max_remove_tokens) == (200, 50)
    thread = await storage.get_thread(THREAD)
    assert thread is not None
    assert thread.metadata[BOUNDARY_KEY] == outcome.boundary.to_metadata()
    assert old.to_metadata() != outcome.boundary.to_metadata()
