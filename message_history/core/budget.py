"""Token-limited recall as Mastra 1.71 does it, as pure rules: groups, paging, the limiter, the boundary.

Mastra 1.71's Memory recalls a thread in three steps, reproduced here without any I/O:

1. `HistoryLoader` (Mastra's `loadMessageHistory`): pages of 40 rows, newest first, each page ending
   (inclusively) at the oldest instant seen, starting (inclusively) at the stored boundary; system rows and
   transient signals (`signals`) are skipped, though they still move the page cursor; the loaded rows
   are split by `partition` into what fits and what overflows. The loader says which page it wants next;
   the caller fetches it (for a whole batch of threads at once, see `consumers.prefetch`).
2. `partition`: messages sharing a `toolCallId` form one group (`group_linked`); groups are kept newest first
   while both the count cap and `maxTokens − atMaxRemoveTokens` hold; the first group that does not fit, and
   everything older, overflows. When the first failure was on tokens, the overflow is handed on too.
3. `trim_memory` (the memory-only `TokenLimiterProcessor`): the total is 24 + the system messages + every
   message of the context; above `maxTokens`, whole groups made only of recalled messages are removed,
   oldest first, until the total is ≤ `maxTokens − atMaxRemoveTokens`.

`advance_boundary` then moves `thread.metadata.memoryTokenLimiter` (`Boundary`) to the newest removed instant,
never backwards. Later turns load only what is after it, so the context regrows from the target to
`maxTokens` before the next trim (hysteresis).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from message_history.core.signals import is_transient_signal
from message_history.core.tokens import TOKENS_PER_CONVERSATION, count_message, count_system_text
from message_history.errors import InvalidInputError
from schemas.events import AT_MAX_REMOVE_TOKENS_ERROR, MAX_TOKENS_ERROR
from schemas.messages import Message, TextPart, ToolInvocationPart, format_timestamp

__all__ = [
    "BOUNDARY_KEY",
    "PAGE_SIZE",
    "Boundary",
    "HistoryLoader",
    "LoadedHistory",
    "PageRequest",
    "Partition",
    "TokenBudget",
    "advance_boundary",
    "boundary_for",
    "group_linked",
    "is_after",
    "partition",
    "read_boundary",
    "resolve_budget",
    "trim_memory",
]

PAGE_SIZE: Final = 40
"""Mastra's `DEFAULT_HISTORY_PAGE_SIZE`."""

BOUNDARY_KEY: Final = "memoryTokenLimiter"
"""Where the boundary lives in `thread.metadata`."""

AT_MAX_REMOVE_SHARE: Final = 0.25

Counter = Callable[[Message], float]


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """`maxTokens` and `atMaxRemoveTokens`; `target` is where a trim stops."""

    max_tokens: float
    at_max_remove_tokens: float

    @property
    def target(self) -> float:
        return self.max_tokens - self.at_max_remove_tokens


def resolve_budget(max_tokens: float | None, at_max_remove_tokens: float | None) -> TokenBudget | None:
    """Mastra's `normalizeMessageHistoryConfig` for the token part: None = no budget.

    Raises `InvalidInputError` with Mastra's messages for a bad pair.
    """
    if max_tokens is None:
        if at_max_remove_tokens is not None:
            raise InvalidInputError(MAX_TOKENS_ERROR)
        return None
    if max_tokens < 0:
        raise InvalidInputError(MAX_TOKENS_ERROR)
    remove = max_tokens * AT_MAX_REMOVE_SHARE if at_max_remove_tokens is None else at_max_remove_tokens
    if remove < 0 or remove > max_tokens:
        raise InvalidInputError(AT_MAX_REMOVE_TOKENS_ERROR)
    return TokenBudget(max_tokens, remove)


# --- the boundary ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Boundary:
    """`thread.metadata.memoryTokenLimiter`: rows at or before `created_at` (minus the listed ids there)
    were trimmed under this budget and are not loaded again."""

    created_at: str  # as stored (Mastra writes `toISOString()`)
    message_ids: tuple[str, ...]
    max_tokens: float
    at_max_remove_tokens: float
    instant: datetime = field(compare=False)

    def to_metadata(self) -> dict[str, Any]:
        """The stored shape, key for key as Mastra writes it."""
        return {
            "createdAt": self.created_at,
            "messageIds": list(self.message_ids),
            "maxTokens": self.max_tokens,
            "atMaxRemoveTokens": self.at_max_remove_tokens,
        }


def _parse_instant(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def read_boundary(metadata: Mapping[str, Any] | None) -> Boundary | None:
    """Mastra's `getMemoryTokenBoundary`: the stored boundary, or None when absent or malformed."""
    value = (metadata or {}).get(BOUNDARY_KEY)
    if not isinstance(value, Mapping):
        return None
    created, ids = value.get("createdAt"), value.get("messageIds")
    if not isinstance(created, str) or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return None
    if not _is_number(value.get("maxTokens")) or not _is_number(value.get("atMaxRemoveTokens")):
        return None
    instant = _parse_instant(created)
    if instant is None:
        return None
    return Boundary(created, tuple(ids), value["maxTokens"], value["atMaxRemoveTokens"], instant)


def boundary_for(budget: TokenBudget | None, stored: Boundary | None) -> Boundary | None:
    """The stored boundary when it was drawn under this very budget; another budget's is ignored."""
    if budget is None or stored is None:
        return None
    if stored.max_tokens == budget.max_tokens and stored.at_max_remove_tokens == budget.at_max_remove_tokens:
        return stored
    return None


def _instant(message: Message) -> datetime:
    assert message.createdAt is not None  # stored rows and normalized input always carry one
    return message.createdAt


def is_after(message: Message, boundary: Boundary) -> bool:
    """Later than the boundary, or at its instant and not one of the ids it trimmed there."""
    created = _instant(message)
    return created > boundary.instant or (
        created == boundary.instant and message.id not in boundary.message_ids
    )


def advance_boundary(
    previous: Boundary | None, removed: Sequence[Message], budget: TokenBudget
) -> Boundary | None:
    """Mastra's `advanceMemoryTokenBoundary`: the newest removed instant, never moving back.

    Returns `previous` itself when nothing changes (so the caller writes nothing).
    """
    if not removed:
        return previous
    newest = max(_instant(m) for m in removed)
    if previous is not None and newest < previous.instant:
        return previous
    ids = [m.id or "" for m in removed if _instant(m) == newest]
    if previous is not None and newest == previous.instant:
        ids = [*previous.message_ids, *ids]
    return Boundary(
        format_timestamp(newest),
        tuple(dict.fromkeys(ids)),
        budget.max_tokens,
        budget.at_max_remove_tokens,
        newest,
    )


# --- groups and partition --------------------------------------------------------------------------------


def _tool_call_ids(message: Message) -> list[str]:
    ids: dict[str, None] = {}
    for part in message.content.parts:
        if isinstance(part, ToolInvocationPart) and part.toolInvocation.toolCallId:
            ids[part.toolInvocation.toolCallId] = None
    for invocation in message.content.toolInvocations or ():
        call_id = invocation.get("toolCallId")
        if isinstance(call_id, str) and call_id:
            ids[call_id] = None
    return list(ids)


def group_linked(messages: Sequence[Message]) -> list[list[Message]]:
    """Messages linked by a shared `toolCallId` (even far apart), each group in the given order.

    Groups come in the order of their first member; a message without tool calls is a group of one.
    """
    parent = list(range(len(messages)))

    def find(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first_by_call: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call_id in _tool_call_ids(message):
            first = first_by_call.setdefault(call_id, index)
            if first != index:
                left, right = find(first), find(index)
                if left != right:
                    parent[right] = left
    groups: dict[int, list[Message]] = {}
    for index, message in enumerate(messages):
        groups.setdefault(find(index), []).append(message)
    return list(groups.values())


@dataclass(frozen=True, slots=True)
class Partition:
    """What fits (`kept`) and what does not (`overflow`), both oldest first, and why the first miss missed."""

    kept: list[Message]
    overflow: list[Message]
    reason: Literal["tokens", "messages"] | None


def partition(
    newest_first: Sequence[Message],
    *,
    max_messages: int | None,
    budget: TokenBudget | None,
    count: Counter = count_message,
) -> Partition:
    """Mastra's `partitionMessages`: whole groups, newest first, under the count cap and the token target."""
    limit = budget.target if budget is not None else None
    messages = 0
    counted: float = 0
    reached = False
    reason: Literal["tokens", "messages"] | None = None
    kept_ids: set[str | None] = set()
    for group in group_linked(newest_first):
        group_tokens: float = 0
        if budget is not None:
            for message in group:
                group_tokens += count(message)
        over_count = max_messages is not None and messages + len(group) > max_messages
        over_tokens = limit is not None and counted + group_tokens > limit
        if reached or over_count or over_tokens:
            if not reached:
                reason = "tokens" if over_tokens else "messages"
            reached = True
            continue
        messages += len(group)
        counted += group_tokens
        kept_ids.update(m.id for m in group)
    kept = [m for m in newest_first if m.id in kept_ids]
    overflow = [m for m in newest_first if m.id not in kept_ids]
    kept.reverse()
    overflow.reverse()
    return Partition(kept, overflow, reason)


# --- the paged loader ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PageRequest:
    """One `listMessages` page: rows of the thread with `start ≤ createdAt ≤ end` (None = open), ordered
    `(createdAt, id)` descending, `page × per_page` skipped, at most `per_page` returned."""

    start: datetime | None
    end: datetime | None
    page: int
    per_page: int = PAGE_SIZE


def _desc_key(message: Message) -> tuple[datetime, str]:
    return _instant(message), message.id or ""


@dataclass(slots=True, kw_only=True, eq=False)
class HistoryLoader:
    """Mastra's `loadMessageHistory` as a state machine: `next_page` says what to fetch, `feed` takes it.

    Usage: `request = loader.next_page; while request: request = loader.feed(rows, has_more)`; then
    `loader.result()` (oldest first) is what Mastra's `MessageHistory` adds to the context: the kept
    messages, preceded by the overflow when the first miss was on tokens.

    `max_rows` (None: no cap, as Mastra) bounds the rows it reads: it asks no page that could take it past
    the cap, and `truncated` then says that it stopped with pages left (a thread of rows it skips, system
    rows say, would otherwise be paged to its end).
    """

    boundary: Boundary | None
    max_messages: int | None
    budget: TokenBudget | None
    count: Counter = count_message
    max_rows: int | None = None
    rows_read: int = field(default=0, init=False)
    truncated: bool = field(default=False, init=False)
    pages: int = field(default=0, init=False)
    next_page: PageRequest | None = field(init=False)
    _loaded: dict[str, Message] = field(default_factory=dict, init=False)
    _end: datetime | None = field(default=None, init=False)
    _cutoff: datetime | None = field(default=None, init=False)
    _partition: Partition = field(default_factory=lambda: Partition([], [], None), init=False)

    def __post_init__(self) -> None:
        self.next_page = self._request(0)

    def _request(self, page: int) -> PageRequest:
        start = self.boundary.instant if self.boundary is not None else None
        return PageRequest(start=start, end=self._end, page=page)

    def feed(self, rows: Sequence[Message], *, has_more: bool) -> PageRequest | None:
        """Take the page asked for (`rows` newest first, `has_more` = rows exist past it); the next ask."""
        assert self.next_page is not None, "the loader is done"
        self.pages += 1
        self.rows_read += len(rows)
        added = 0
        for message in rows:
            if (
                message.role == "system"
                or is_transient_signal(message)
                or (self.boundary is not None and not is_after(message, self.boundary))
            ):
                continue
            key = message.id or ""
            if key not in self._loaded:
                self._loaded[key] = message
                added += 1
        ordered = sorted(self._loaded.values(), key=_desc_key, reverse=True)
        self._partition = partition(
            ordered, max_messages=self.max_messages, budget=self.budget, count=self.count
        )
        if self._partition.overflow:
            self._cutoff = _instant(self._partition.overflow[-1])
        oldest = _instant(rows[-1]) if rows else None
        crossed = self._cutoff is not None and oldest is not None and oldest < self._cutoff
        at_boundary = self.boundary is not None and oldest is not None and oldest < self.boundary.instant
        if not has_more or crossed or at_boundary or oldest is None:
            self.next_page = None
        elif self._end == oldest and added == 0:
            self.next_page = self._request(self.next_page.page + 1)
        else:
            self._end = oldest
            self.next_page = self._request(0)
        cap = self.max_rows
        if self.next_page is not None and cap is not None and self.rows_read + self.next_page.per_page > cap:
            self.next_page = None
            self.truncated = True
        return self.next_page

    def result(self) -> list[Message]:
        """The recalled messages, oldest first (overflow included when the first miss was on tokens)."""
        if self._partition.reason == "tokens":
            return [*self._partition.overflow, *self._partition.kept]
        return list(self._partition.kept)

    def loaded(self) -> LoadedHistory:
        """`result()`, and whether the row cap stopped the paging."""
        return LoadedHistory(self.result(), self.truncated)


@dataclass(frozen=True, slots=True)
class LoadedHistory:
    """A finished `HistoryLoader`: its `result()` (oldest first) and its `truncated`."""

    messages: list[Message]
    truncated: bool = False


def page_of(rows_newest_first: Sequence[Message], request: PageRequest) -> tuple[list[Message], bool]:
    """The rows a `PageRequest` selects from rows already ordered newest first, and whether more follow."""
    window = [
        m
        for m in rows_newest_first
        if (request.start is None or _instant(m) >= request.start)
        and (request.end is None or _instant(m) <= request.end)
    ]
    offset = request.page * request.per_page
    return window[offset : offset + request.per_page], offset + request.per_page < len(window)


# --- the memory-only limiter -----------------------------------------------------------------------------


def _system_text(message: Message) -> str:
    if message.content.content is not None:
        return message.content.content
    return "".join(p.text for p in message.content.parts if isinstance(p, TextPart))


def trim_memory(
    context: Sequence[tuple[Message, Literal["memory", "input"]]],
    budget: TokenBudget,
    *,
    system: Iterable[str] = (),
    count: Counter = count_message,
) -> tuple[list[Message], float]:
    """The memory-only `TokenLimiterProcessor`: (the removed messages, oldest group first; the total after).

    `context` is the turn's context in order; its system messages count as system instructions, like the
    extra `system` texts. Only groups made purely of recalled (memory), non-system messages are removable.
    """
    total: float = TOKENS_PER_CONVERSATION
    for text in system:
        total += count_system_text(text)
    messages: list[Message] = []
    removable: set[str | None] = set()
    for message, source in context:
        if message.role == "system":
            total += count_system_text(_system_text(message))
            continue
        messages.append(message)
        if source == "memory":
            removable.add(message.id)
    counts: dict[str | None, float] = {}
    for message in messages:
        tokens = count(message)
        counts[message.id] = tokens
        total += tokens
    if total <= budget.max_tokens:
        return [], total
    removed: list[Message] = []
    for group in group_linked(sorted(messages, key=_instant)):
        if total <= budget.target:
            break
        if not all(m.id in removable for m in group):
            continue
        removed.extend(group)
        for message in group:
            total -= counts.get(message.id, 0)
    return removed, total
