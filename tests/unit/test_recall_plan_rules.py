"""`plan_recall` and `plain_page` as tables: what a request reads, and when a page is decided on bytes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.core.budget import BOUNDARY_KEY, resolve_budget
from message_history.core.echo import EchoPlan
from message_history.core.memory_options import TurnMemory
from message_history.core.recall_plan import PlainPage, PlainRow, load_boundary, plain_page, plan_recall
from schemas.messages import Message

T0 = datetime(2025, 1, 1, tzinfo=UTC)
MS0 = int((T0 - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000)
BUDGET = resolve_budget(1000, 100)
ZERO_BUDGET = resolve_budget(0, None)
KEPT = EchoPlan([], None, unchanged=True)
FILTERED = EchoPlan([], None, unchanged=False, needs=("a1",))


@pytest.mark.parametrize(
    ("last", "budget", "echo", "limit", "lookup", "plain"),
    [
        pytest.param(None, None, None, 40, (), True, id="default-40"),
        pytest.param(5, None, KEPT, 5, (), True, id="count-input-kept"),
        pytest.param(False, None, None, None, (), False, id="all-rows-not-plain"),
        pytest.param(0, None, FILTERED, 0, (), False, id="off-no-echo-lookup"),
        pytest.param(5, None, FILTERED, 5, ("a1",), False, id="echo-filter-looks-up"),
        pytest.param(False, BUDGET, None, None, (), False, id="budget"),
        pytest.param(5, ZERO_BUDGET, FILTERED, 5, (), False, id="zero-budget-is-off"),
    ],
)
def test_plan_recall(
    last: Any, budget: Any, echo: EchoPlan | None, limit: int | None, lookup: tuple[str, ...], plain: bool
) -> None:
    needs = plan_recall("t", "u", TurnMemory(last, budget, read_only=False, retain_full_input=False), echo)
    assert (needs.limit, needs.lookup, needs.plain) == (limit, lookup, plain)


@pytest.mark.parametrize(
    ("last", "budget", "cap", "limit", "read", "capped", "plain"),
    [
        pytest.param(None, None, None, 40, 40, False, True, id="no-cap"),
        pytest.param(40, None, 100, 40, 40, False, True, id="under-the-cap"),
        pytest.param(100, None, 100, 100, 100, False, True, id="at-the-cap"),
        pytest.param(101, None, 100, 100, 101, True, True, id="over-the-cap-reads-one-more"),
        pytest.param(2**53 - 1, None, 100, 100, 101, True, True, id="max-safe-integer"),
        pytest.param(False, None, 100, 100, 101, True, True, id="all-rows-capped-and-plain"),
        pytest.param(False, None, None, None, None, False, False, id="all-rows-uncapped"),
        pytest.param(0, None, 100, 0, 0, False, False, id="off-stays-off"),
        pytest.param(2**53 - 1, BUDGET, 100, 2**53 - 1, 2**53 - 1, False, False, id="budget-keeps-its-count"),
        pytest.param(False, BUDGET, 100, None, None, False, False, id="budget-all-rows"),
    ],
)
def test_plan_caps_the_rows_read(
    last: Any,
    budget: Any,
    cap: int | None,
    limit: int | None,
    read: int | None,
    capped: bool,
    plain: bool,
) -> None:
    """A count recall asking more than the cap reads the cap's newest rows and one more (to tell whether the
    cap cut); a budgeted one keeps its count and carries the cap to its loader (`max_rows`)."""
    memory = TurnMemory(last, budget, read_only=False, retain_full_input=False)
    needs = plan_recall("t", "u", memory, None, max_rows=cap)
    assert (needs.limit, needs.read_limit, needs.capped, needs.plain) == (limit, read, capped, plain)
    assert needs.max_rows == cap


@pytest.mark.parametrize(
    ("last", "rows_read", "cut"),
    [
        pytest.param(False, 101, True, id="thread-longer-than-the-cap"),
        pytest.param(False, 100, False, id="thread-exactly-the-cap"),
        pytest.param(False, 3, False, id="short-thread"),
        pytest.param(100, 100, False, id="asked-the-cap-itself"),
        pytest.param(40, 40, False, id="not-capped"),
    ],
)
def test_cut_says_whether_the_cap_left_rows_out(last: Any, rows_read: int, cut: bool) -> None:
    memory = TurnMemory(last, None, read_only=False, retain_full_input=False)
    assert plan_recall("t", "u", memory, None, max_rows=100).cut(rows_read) is cut


def _row(ident: str, ms: int, role: str = "user") -> PlainRow:
    return (ident, MS0 + ms, role, None, f'{{"id":"{ident}"}}'.encode())


def _input(ident: str | None, ms: int | None) -> Message:
    data: dict[str, Any] = {"role": "user", "content": {"format": 2, "parts": []}}
    if ident is not None:
        data["id"] = ident
    if ms is not None:
        data["createdAt"] = T0 + timedelta(milliseconds=ms)
    return Message.model_validate(data)


A, B = b'{"id":"a"}', b'{"id":"b"}'
NEW = [_input("n", 9)]


@pytest.mark.parametrize(
    ("rows", "limit", "incoming", "expected"),
    [
        pytest.param([], 5, NEW, PlainPage((b"", b""), 0), id="empty-page"),
        pytest.param([_row("b", 2), _row("a", 1)], 5, NEW, PlainPage((A + b"," + B, b""), 2), id="plain"),
        pytest.param([_row("b", 2), _row("a", 1)], 1, NEW, PlainPage((B, b""), 1), id="cut"),
        pytest.param([_row("b", 1), _row("a", 1)], 5, NEW, PlainPage((A + b"," + B, b""), 2), id="tie-by-id"),
        pytest.param([_row("b", 2), None], 5, NEW, None, id="odd-row"),
        pytest.param([_row("b", 2), None], 1, NEW, PlainPage((B, b""), 1), id="odd-row-cut-off"),
        pytest.param([_row("b", 2), _row("a", 1, "system")], 5, NEW, None, id="system-row"),
        pytest.param([_row("b", 2), _row("a", 1)], 5, [_input("a", 9)], None, id="input-repeats-an-id"),
        pytest.param([_row("a", 2), _row("a", 1)], 5, NEW, None, id="id-twice"),
        pytest.param([_row("a", 1), _row("b", 2)], 5, NEW, None, id="out-of-order"),
        pytest.param([_row("a", 1), _row("b", 1)], 5, NEW, None, id="tie-out-of-order"),
        pytest.param(
            [_row("b", 2), _row("a", 1)],
            5,
            [_input("n", 2)],
            PlainPage((A + b"," + B, b""), 2),
            id="input-tie-after-by-id",
        ),
        pytest.param(
            [_row("b", 2), _row("a", 1)],
            5,
            [_input("0", 2)],
            PlainPage((A, B), 2),
            id="input-tie-before-by-id",
        ),
        pytest.param(
            [_row("b", 2), _row("a", 1)], 5, [_input("n", 1)], PlainPage((A, B), 2), id="input-between"
        ),
        pytest.param(
            [_row("b", 2), _row("a", 1)],
            5,
            [_input("n", 0)],
            PlainPage((b"", A + b"," + B), 2),
            id="input-oldest",
        ),
        pytest.param(
            [_row("b", 2), _row("a", 1)],
            5,
            [_input("m", 0), _input("n", 1), _input("o", 5)],
            PlainPage((b"", A, B, b""), 2),
            id="inputs-spread",
        ),
        pytest.param(
            [_row("b", 2)], 5, [_input(None, None)], PlainPage((B, b""), 1), id="input-undated-last"
        ),
        pytest.param([_row("b", 2)], 5, [], PlainPage((B,), 1), id="no-input"),
    ],
)
def test_plain_page(
    rows: list[PlainRow | None], limit: int, incoming: list[Message], expected: PlainPage | None
) -> None:
    assert plain_page(rows, limit, incoming) == expected


def _stored(max_tokens: float, remove: float, created: Any = "2025-01-01T00:00:00.000Z") -> dict[str, Any]:
    value = {"createdAt": created, "messageIds": ["m1"], "maxTokens": max_tokens, "atMaxRemoveTokens": remove}
    return {BOUNDARY_KEY: value, "other": 1}


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        pytest.param(None, None, id="no-thread"),
        pytest.param({}, None, id="no-boundary"),
        pytest.param(_stored(1000, 100), ("2025-01-01T00:00:00.000Z", ("m1",)), id="this-budgets"),
        pytest.param(_stored(2000, 100), None, id="another-budgets-ignored"),
        pytest.param(_stored(1000, 100, created=5), None, id="malformed-ignored"),
    ],
)
def test_load_boundary(metadata: dict[str, Any] | None, expected: tuple[str, tuple[str, ...]] | None) -> None:
    """Where a budgeted request's pages start (the batch load and the decision both ask here)."""
    assert BUDGET is not None
    boundary = load_boundary(BUDGET, metadata)
    assert (None if boundary is None else (boundary.created_at, boundary.message_ids)) == expected
