"""What a request's recall needs from storage, and the plain last-N recall decided on a whole page (pure).

`plan_recall` says what one request reads: its thread's newest `limit` rows (0: none), under a token budget
or not, and the stored copies the client-echo filter looks up. A request whose page is `plain` (a count cap,
no budget, an input the echo filter keeps whole) is decided by `plain_page` from its page's rows as bytes,
without building a model per row, when the page meets the preconditions under which `rules.build_context`
is "the page reversed, the input merged in by time" (see `plain_page`); otherwise the processor decides
(the same rules on models), from the same loaded rows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from operator import lt
from typing import Any, Final, cast

from message_history.core.budget import Boundary, TokenBudget, boundary_for, read_boundary
from message_history.core.echo import EchoPlan
from message_history.core.memory_options import TurnMemory
from message_history.core.rules import normalize_limit, sort_key
from schemas.messages import Message

__all__ = ["PlainPage", "PlainRow", "RecallNeeds", "load_boundary", "plain_page", "plan_recall"]

PlainRow = tuple[str, int, str, str | None, bytes]
"""A stored row in the plain shape: (id, createdAt in BSON milliseconds, role, type or None, its
`EnrichedMessage` JSON tagged `"source":"memory"`), as `storage.row_codec.rows_from_raw` gives it."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RecallNeeds:
    """What one request reads: `limit` newest rows of its thread (None = all, 0 = none), `budget` (pages
    under a token budget instead), `lookup` (the ids the echo filter needs), `plain` (see the module).

    `max_rows`: the most rows its history may read (None = no cap). Without a budget the cap is already in
    `limit`, and `capped` says it cut the asked count: one row more is read (`read_limit`) to tell whether the
    thread has more (`cut`). Under a budget it bounds the loader's pages (`HistoryLoad.max_rows`).
    """

    thread_id: str
    resource_id: str | None
    limit: int | None
    budget: TokenBudget | None
    lookup: tuple[str, ...]
    plain: bool
    max_rows: int | None = None
    capped: bool = False

    @property
    def off(self) -> bool:
        """History is off for the request (a limit of 0, a budget of 0 tokens): no page, no echo filter."""
        return self.limit == 0 or (self.budget is not None and self.budget.max_tokens == 0)

    @property
    def read_limit(self) -> int | None:
        """The rows a count recall reads: `limit`, and one more when the cap cut the asked count."""
        return self.limit + 1 if self.capped and self.limit is not None else self.limit

    def cut(self, rows_read: int) -> bool:
        """True when the cap left rows out: it cut the asked count and the thread had more than it."""
        return self.capped and self.limit is not None and rows_read > self.limit


def plan_recall(
    thread_id: str,
    resource_id: str | None,
    memory: TurnMemory,
    echo: EchoPlan | None,
    *,
    max_rows: int | None = None,
) -> RecallNeeds:
    """The request's needs. `echo`: `plan_echo` of its input, None when the input is kept whole;
    `max_rows`: the most rows its history may read (None: no cap, as Mastra).

    As `MessageHistory.recall`: a limit of 0 (or a budget of 0 tokens) reads no page and runs no echo
    filter; a filter whose plan keeps the input unchanged reads nothing. A count recall asking more than
    `max_rows` (or all) reads the newest `max_rows`; a budgeted one keeps its count cap and pages at most
    `max_rows` rows.
    """
    limit = normalize_limit(memory.last_messages)
    budget = memory.budget
    off = limit == 0 or (budget is not None and budget.max_tokens == 0)
    capped = False
    if budget is None and max_rows is not None and (limit is None or limit > max_rows):
        limit, capped = max_rows, True
    filtering = echo is not None and not echo.unchanged and not off
    lookup = echo.needs if echo is not None and filtering else ()
    plain = not off and budget is None and not filtering and limit is not None
    return RecallNeeds(thread_id, resource_id, limit, budget, lookup, plain, max_rows, capped)


def load_boundary(budget: TokenBudget, metadata: Mapping[str, Any] | None) -> Boundary | None:
    """Where a budgeted request's pages start: its thread's stored boundary (`metadata`, None for a thread
    not stored) when drawn under this very budget. The batch load plans the pages from it, and the
    decision asks for the load it names: one rule, so that a batch's load is the one the decision wants."""
    return boundary_for(budget, read_boundary(metadata))


@dataclass(frozen=True, slots=True)
class PlainPage:
    """A decided plain page: the recalled rows' `EnrichedMessage` JSON in context order, as `runs` (each a
    comma-joined run of rows, maybe empty) to interleave with the input: the context is `runs[0]`, input 0,
    `runs[1]`, input 1, ..., `runs[-1]` (`len(runs)` = inputs + 1); `recalled` is how many rows it holds."""

    runs: tuple[bytes, ...]
    recalled: int


def plain_page(rows: Sequence[PlainRow | None], limit: int, incoming: Sequence[Message]) -> PlainPage | None:
    """`build_context(page, incoming)` with the page's rows as bytes, or None when the page does not qualify.

    `rows`: the thread's newest rows, newest first (the first `limit` are the page); `incoming`: the
    context's input part (`build_context((), input)`, in order). The page qualifies when every row is in
    the plain shape (not None), no row is a `system` one (dropped by docs/rules.md#r4), no id is twice in
    the page (the newest copy wins) nor among the input's (the input's copy wins, #r5), the `(createdAt, id)`
    keys strictly decrease along the page (the reversed page is in context order, #r3), and every input
    message's time is comparable with a stored (UTC) one. Under these, `build_context` keeps every row, in
    reverse page order, and places each input message after the rows whose key is not greater than its own
    (the sort is stable and rows come before the input in it).
    """
    page = rows[:limit]
    if None in page:
        return None
    plain = cast("list[PlainRow]", page)
    bodies: tuple[bytes, ...] = ()
    if plain:
        # one transposition in C, then whole-column checks: a per-row Python loop was most of this function
        ids, created, roles, _, bodies = zip(*plain, strict=True)
        if not _ordered(ids, created, roles, incoming):
            return None
    chronological = plain[::-1]
    cuts: list[int] = []
    for message in incoming:
        when = message.createdAt
        if when is not None and when.tzinfo is None:
            return None  # not comparable with a stored (UTC) time: let the rules decide
        cuts.append(bisect_right(chronological, sort_key(message), lo=cuts[-1] if cuts else 0, key=_row_key))
    bounds = [0, *cuts, len(chronological)]
    forward = bodies[::-1]
    runs = tuple(b",".join(forward[start:end]) for start, end in pairwise(bounds))
    return PlainPage(runs, len(chronological))


def _row_key(row: PlainRow) -> tuple[datetime, str]:
    return _EPOCH + timedelta(milliseconds=row[1]), row[0]


def _ordered(
    ids: Sequence[str], created: Sequence[int], roles: Sequence[str], incoming: Sequence[Message]
) -> bool:
    """No system row, no id twice nor among the input's, `(createdAt, id)` strictly decreasing: the page's
    columns (newest first)."""
    if "system" in roles:
        return False
    unique = set(ids)
    if len(unique) < len(ids) or not unique.isdisjoint([m.id for m in incoming if m.id is not None]):
        return False
    keys = list(zip(created, ids, strict=True))
    return all(map(lt, keys[1:], keys))
