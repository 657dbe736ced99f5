"""What a request's recall needs from storage, and the plain last-N recall decided on a whole page (pure).

`plan_recall` says what one request reads: its thread's newest `limit` rows (0: none), under a token budget
or not, and the stored copies the client-echo filter looks up. A request whose page is `plain` (a count cap,
no budget, an input the echo filter keeps whole) is decided by `plain_page` from its page's rows as bytes,
without building a model per row, when the page meets the preconditions under which `rules.build_context`
is "the page reversed, then the input" (see `plain_page`); otherwise the processor decides (the same rules
on models), from the same loaded rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from message_history.core.budget import TokenBudget
from message_history.core.echo import EchoPlan
from message_history.core.memory_options import TurnMemory
from message_history.core.rules import normalize_limit, sort_key
from schemas.messages import Message

__all__ = ["PlainPage", "PlainRow", "RecallNeeds", "plain_page", "plan_recall"]

PlainRow = tuple[str, int, str, str | None, bytes]
"""A stored row in the plain shape: (id, createdAt in BSON milliseconds, role, type or None, its
`EnrichedMessage` JSON tagged `"source":"memory"`), as `storage.row_codec.rows_from_raw` gives it."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RecallNeeds:
    """What one request reads: `limit` newest rows of its thread (None = all, 0 = none), `budget` (pages
    under a token budget instead), `lookup` (the ids the echo filter needs), `plain` (see the module)."""

    thread_id: str
    resource_id: str | None
    limit: int | None
    budget: TokenBudget | None
    lookup: tuple[str, ...]
    plain: bool


def plan_recall(
    thread_id: str, resource_id: str | None, memory: TurnMemory, echo: EchoPlan | None
) -> RecallNeeds:
    """The request's needs. `echo`: `plan_echo` of its input, None when the input is kept whole.

    As `MessageHistory.recall`: a limit of 0 (or a budget of 0 tokens) reads no page and runs no echo
    filter; a filter whose plan keeps the input unchanged reads nothing.
    """
    limit = normalize_limit(memory.last_messages)
    budget = memory.budget
    off = limit == 0 or (budget is not None and budget.max_tokens == 0)
    filtering = echo is not None and not echo.unchanged and not off
    lookup = echo.needs if echo is not None and filtering else ()
    plain = not off and budget is None and not filtering and limit is not None
    return RecallNeeds(thread_id, resource_id, limit, budget, lookup, plain)


@dataclass(frozen=True, slots=True)
class PlainPage:
    """A decided plain page: the `messages` array body of its recalled rows (chronological, comma-joined)
    and how many rows it holds."""

    fragment: bytes
    recalled: int


def plain_page(rows: Sequence[PlainRow | None], limit: int, incoming: Sequence[Message]) -> PlainPage | None:
    """`build_context(page, incoming)`'s memory part as bytes, or None when the page does not qualify.

    `rows`: the thread's newest rows, newest first (the first `limit` are the page); `incoming`: the
    context's input part (`build_context((), input)`, in order). The page qualifies when, for every row:
    it is in the plain shape (not None), its role is not `system` (dropped by docs/rules.md#r4), its id is
    neither among the input's ids (the input's copy wins, #r5) nor another row's (the newest copy wins);
    along the page the `(createdAt, id)` keys strictly decrease (the reversed page is in context order,
    #r3); and every input message sorts after the page's newest row (the context is the page, then the
    input).
    Under these, `build_context` keeps every row, in reverse page order, before the input.
    """
    page = rows[:limit]
    if not page:
        return PlainPage(b"", 0)
    plain = [row for row in page if row is not None]
    if len(plain) < len(page) or not _ordered(plain, incoming) or not _input_after(plain[0], incoming):
        return None
    return PlainPage(b",".join(row[4] for row in reversed(plain)), len(plain))


def _ordered(page: Sequence[PlainRow], incoming: Sequence[Message]) -> bool:
    """No system row, no id twice nor among the input's, `(createdAt, id)` strictly decreasing."""
    seen = {m.id for m in incoming if m.id is not None}
    previous: tuple[int, str] | None = None
    for ident, created, role, _, _ in page:
        if role == "system" or ident in seen:
            return False
        seen.add(ident)
        key = (created, ident)
        if previous is not None and not key < previous:
            return False
        previous = key
    return True


def _input_after(newest: PlainRow, incoming: Sequence[Message]) -> bool:
    """Every input message sorts after the page's newest row (`incoming` is in context order)."""
    if not incoming:
        return True
    first = incoming[0].createdAt
    if first is not None and first.tzinfo is None:
        return False  # not comparable with a stored (UTC) time: let the rules decide
    return sort_key(incoming[0]) > (_EPOCH + timedelta(milliseconds=newest[1]), newest[0])
