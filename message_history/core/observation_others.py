"""Resource scope's recall: the other threads' unobserved messages, as Mastra puts them in the context (pure).

As `@mastra/memory` 1.31.0's `getOtherThreadsContext` / `formatUnobservedContextBlocks` and
`formatMessagesForObserver` (`maxPartLength: 500`) write them: per other thread of the resource with
unobserved messages (newer than the thread's cursor, else than the row's `lastObservedAt`; not in the row's
`observedMessageIds`; not a working-memory state signal), an `<other-conversation id="<threadId>">` block of
its messages as lines (`Mar 1 2025:` date headers, `User (9:05 AM): text`, the time only when it changes;
each part cut at 500 UTF-16 units with `... [truncated N characters]`), blocks joined by a blank line.
`core.observation_text.context_system_messages` puts them after the instructions.

Every part is written as `formatObserverMessage` writes it: text and reasoning; a tool call once per
`toolCallId` across the thread's messages (`createObserverToolFormattingState`: the line at its first part,
with the terminal invocation's arguments when it has them, `Tool Call <name>: <outline>`), its outcome at its
terminal part (`Tool Result` / `Tool Error` / `Tool Denied`); image and file parts as numbered placeholders
(`Image: [Image #1: cat.png]`); a `__temporal_…` gap marker as its text; other part kinds (`step-start`,
`source`, data parts) and `experimental_attachments` are not written, as in Mastra. The tool and attachment
renderings are `core.observer_parts`. Dates and times are in the process's local zone (the `TZ` environment
variable, else the system's), as Mastra formats them in its process's: a service and a Mastra app run in one
zone write the same blocks (a container without `TZ` is in UTC). A time that zone cannot hold in Python's
range (around the years 1 and 9999) is written in UTC.

A part Mastra's renderer throws on (a row written by hand: a non-string `text`, a `toolInvocation` that is
not an object, a non-string `filename`) or past `observer_parts.MAX_SERIALIZED` is left out quietly (all
its lines: this pure function has no counter to report to), never the other parts or the recall.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from message_history.core.observation import _is_state_signal, _parse_date
from message_history.core.observer_parts import (
    UNDEFINED,
    AttachmentCounter,
    UnrenderableError,
    attachment_placeholder,
    format_tool_arguments,
    format_tool_result,
    js_string,
    js_trim,
    js_truthy,
    truncate16,
    without_attachments,
)

__all__ = ["MAX_PART_LENGTH", "format_messages_for_observer", "other_conversations", "others_unobserved"]

MAX_PART_LENGTH: Final = 500
"""`formatUnobservedContextBlocks`' `maxPartLength`."""
_CALL_STATES: Final = frozenset({"call", "partial-call", "approval-requested", "approval-responded"})
_TERMINAL_STATES: Final = frozenset({"result", "output-error", "output-denied"})
_MONTHS: Final = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def others_unobserved(
    messages: Iterable[Mapping[str, Any]],
    cursors: Mapping[str, datetime | None],
    current_thread: str,
    last_observed_at: datetime | None,
    observed_message_ids: frozenset[str],
) -> dict[str, list[dict[str, Any]]]:
    """`getOtherThreadsContext`'s messages: per other thread (in `cursors`' order), its unobserved ones."""
    result: dict[str, list[dict[str, Any]]] = {t: [] for t in cursors if t != current_thread}
    for message in messages:
        thread = message.get("threadId")
        if not isinstance(thread, str) or thread not in result or _is_state_signal(message):
            continue
        ident = message.get("id")
        if isinstance(ident, str) and ident in observed_message_ids:
            continue
        cursor = cursors.get(thread) or last_observed_at
        created = _parse_date(message.get("createdAt"))
        if cursor is not None and (created is None or created <= cursor):
            continue  # Mastra's date range: a message without a date is not in it
        result[thread].append(dict(message))
    return {thread: rows for thread, rows in result.items() if rows}


def other_conversations(by_thread: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """`formatUnobservedContextBlocks`: one `<other-conversation>` block per thread with lines to show."""
    blocks = []
    for thread, messages in by_thread.items():
        formatted = format_messages_for_observer(messages)
        if formatted:
            blocks.append(f'<other-conversation id="{thread}">\n{formatted}\n</other-conversation>')
    return "\n\n".join(blocks)


def format_messages_for_observer(
    messages: Iterable[Mapping[str, Any]], max_part_length: int = MAX_PART_LENGTH
) -> str:
    """`formatMessagesForObserver(messages, {maxPartLength})`: every part as Mastra writes it."""
    rows = list(messages)
    counter = AttachmentCounter()
    tools = _ToolState(rows)
    sections: list[str] = []
    previous_date: str | None = None
    previous_time: str | None = None
    for message in rows:
        output: list[str] = []
        for date, time, title, body in _lines(message, max_part_length, counter, tools):
            if date and date != previous_date:
                output.append(f"{date}:")
                previous_date = date
                previous_time = None
            label = f"({time})" if time and time != previous_time else ""
            if not title:
                output.append(f"{label}: {body}" if label else body)
            else:
                output.append(f"{title}{' ' + label if label else ''}: {body}")
            previous_time = time or previous_time
        text = "\n".join(output)
        if text:
            sections.append(text)
    return "\n".join(sections)


def _call_key(value: Any) -> Hashable:
    """A `toolCallId` as a `Map` key (SameValueZero): a string, a number, null, undefined, else identity."""
    if isinstance(value, str):
        return ("s", value)
    if value is None or isinstance(value, bool):
        return ("c", value)
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf if value > 0 else -math.inf
        return ("n", "NaN" if math.isnan(number) else number + 0.0)
    return ("o", id(value))


def _invocation(part: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The part's `toolInvocation`; None where Mastra throws (null or missing); an empty one for another
    value (a string, a number, a list: its `state`, `toolCallId`, `toolName`, `args` are undefined)."""
    invocation = part.get("toolInvocation")
    if invocation is None:
        return None
    return invocation if isinstance(invocation, Mapping) else {}


def _call_like(invocation: Mapping[str, Any]) -> bool:
    return invocation.get("state") in _CALL_STATES


def _terminal(invocation: Mapping[str, Any]) -> bool:
    return invocation.get("state") in _TERMINAL_STATES


class _Exchange:
    __slots__ = ("first", "signature", "terminal", "terminal_at")

    def __init__(self, first: int) -> None:
        self.first = first
        self.signature: Mapping[str, Any] | None = None
        self.terminal: Mapping[str, Any] | None = None
        self.terminal_at = -1


class _ToolState:
    """`createObserverToolFormattingState`: per tool call, its first part (where its call line goes), the
    invocation whose name and arguments that line shows, and its terminal part (where its outcome goes)."""

    def __init__(self, messages: Sequence[Mapping[str, Any]]) -> None:
        self.exchanges: dict[Hashable, _Exchange] = {}
        self.occurrences: dict[int, int] = {}
        self.emitted_calls: set[Hashable] = set()
        self.emitted_outcomes: set[Hashable] = set()
        occurrence = 0
        for message in messages:
            content = message.get("content")
            parts = content.get("parts") if isinstance(content, Mapping) else None
            if not isinstance(parts, list):
                continue
            for part in parts:
                if not isinstance(part, Mapping) or part.get("type") != "tool-invocation":
                    continue
                invocation = _invocation(part)
                if invocation is None:
                    continue  # left out when rendered (Mastra throws here)
                self.occurrences[id(part)] = occurrence
                if not _call_like(invocation) and not _terminal(invocation):
                    occurrence += 1
                    continue
                key = _call_key(invocation.get("toolCallId", UNDEFINED))
                exchange = self.exchanges.setdefault(key, _Exchange(occurrence))
                if _call_like(invocation) and ("args" in invocation or exchange.signature is None):
                    exchange.signature = invocation
                if _terminal(invocation):
                    exchange.terminal, exchange.terminal_at = invocation, occurrence
                occurrence += 1
        for exchange in self.exchanges.values():
            if (exchange.terminal is not None and "args" in exchange.terminal) or (
                exchange.signature is None and exchange.terminal is not None
            ):
                exchange.signature = exchange.terminal


def _tool_arguments(args: Any, max_len: int) -> str:
    """`formatObserverToolArguments`."""
    if args is UNDEFINED:
        return truncate16("[arguments unavailable]", max_len)
    return format_tool_arguments(args, max_len or math.inf)


def _optional_text(holder: Any, key: str) -> str | None:
    """`holder?.key?.trim() ? holder.key : …`: the text when it has more than whitespace (a non-string
    one, on which Mastra's `trim` throws, counts as absent)."""
    value = holder.get(key) if isinstance(holder, Mapping) else None
    return value if isinstance(value, str) and js_trim(value) else None


def _tool_lines(
    part: Mapping[str, Any], tools: _ToolState, counter: AttachmentCounter, max_len: int
) -> list[tuple[str, str]]:
    """The lines of one `tool-invocation` part (`formatObserverMessage`'s branch for them)."""
    invocation = _invocation(part)
    if invocation is None:
        raise UnrenderableError("toolInvocation is null")  # Mastra: reading a property of it throws
    lines: list[tuple[str, str]] = []
    occurrence = tools.occurrences.get(id(part))
    key = _call_key(invocation.get("toolCallId", UNDEFINED))
    exchange = tools.exchanges.get(key)
    if (
        exchange is not None
        and occurrence == exchange.first
        and exchange.signature is not None
        and key not in tools.emitted_calls
    ):
        tools.emitted_calls.add(key)
        name = js_string(exchange.signature.get("toolName", UNDEFINED))
        lines.append(
            (f"Tool Call {name}", _tool_arguments(exchange.signature.get("args", UNDEFINED), max_len))
        )
    terminal_here = exchange is not None and exchange.terminal_at == occurrence
    name = invocation.get("toolName", UNDEFINED)
    state = invocation.get("state")
    if state == "result":
        result = invocation.get("result", UNDEFINED)
        metadata = part.get("providerMetadata")
        mastra = metadata.get("mastra") if isinstance(metadata, Mapping) else None
        if isinstance(mastra, Mapping) and "modelOutput" in mastra:
            result = mastra["modelOutput"]
        result = without_attachments(result, counter)
        if terminal_here and key not in tools.emitted_outcomes:
            tools.emitted_outcomes.add(key)
            has_result = result is not UNDEFINED and (not isinstance(result, str) or bool(js_trim(result)))
            if has_result:
                body = format_tool_result(result)
            elif js_truthy(invocation.get("isError")):
                body = _optional_text(invocation, "errorText") or "Tool execution failed"
            else:
                body = "[empty result]"
            kind = "Tool Error" if js_truthy(invocation.get("isError")) else "Tool Result"
            lines.append((f"{kind} {js_string(name)}", truncate16(body, max_len)))
        return lines
    if terminal_here and key not in tools.emitted_outcomes:
        tools.emitted_outcomes.add(key)
        if state == "output-error":
            text = _optional_text(invocation, "errorText") or "Tool execution failed"
            lines.append((f"Tool Error {js_string(name)}", truncate16(text, max_len)))
        elif state == "output-denied":
            reason = _optional_text(invocation.get("approval"), "reason")
            text = reason or "Tool call was not approved by the user"
            lines.append((f"Tool Denied {js_string(name)}", truncate16(text, max_len)))
        return lines
    if exchange is None:
        lines.append(
            (f"Tool Call {js_string(name)}", _tool_arguments(invocation.get("args", UNDEFINED), max_len))
        )
    return lines


def _gap_text(message: Mapping[str, Any]) -> str | None:
    """`getTemporalGapMarkerText` of a `__temporal_…` marker message."""
    ident = message.get("id")
    if not isinstance(ident, str) or not ident.startswith("__temporal_"):
        return None
    content = message.get("content")
    metadata = content.get("metadata") if isinstance(content, Mapping) else None
    if not isinstance(metadata, Mapping):
        return None
    if metadata.get("reminderType") == "temporal-gap" and isinstance(metadata.get("gapText"), str):
        return str(metadata["gapText"])
    reminder = metadata.get("systemReminder")
    if isinstance(reminder, Mapping) and reminder.get("type") == "temporal-gap":
        gap = reminder.get("gapText")
        return gap if isinstance(gap, str) else None
    return None


def _text(value: Any, max_len: int) -> str:
    """`maybeTruncate` of a part's text; Mastra throws on a non-string one."""
    if not isinstance(value, str):
        raise UnrenderableError("text is not a string")
    return truncate16(value, max_len)


def _lines(  # noqa: PLR0912 -- Mastra's branches, one per part kind
    message: Mapping[str, Any], max_len: int, counter: AttachmentCounter, tools: _ToolState
) -> list[tuple[str, str, str, str]]:
    """`formatObserverMessage`'s lines (date, time, title, body); a part it cannot render is left out."""
    role = message.get("role")
    role = role[:1].upper() + role[1:] if isinstance(role, str) else ""
    created = _moment(message.get("createdAt"))
    lines: list[tuple[str, str, str, str]] = []

    def push(title: str, body: str, at: datetime | None) -> None:
        if body:
            lines.append((_date(at), _time(at), title, body))

    content = message.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    gap = _gap_text(message)
    if gap:
        push("", gap, created)
    elif isinstance(content, str):
        push(role, truncate16(content, max_len), created)
    elif isinstance(parts, list) and parts:
        for part in parts:
            if not isinstance(part, Mapping):
                continue  # Mastra: reading `part.type` of null throws
            try:
                at = _moment(part.get("createdAt")) or created
                kind = part.get("type")
                if kind == "text":
                    push(role, _text(part.get("text"), max_len), at)
                elif kind == "tool-invocation":
                    for title, body in _tool_lines(part, tools, counter, max_len):
                        push(title, body, at)
                elif kind == "reasoning":
                    reasoning = part.get("reasoning")
                    if js_truthy(reasoning):
                        push("Reasoning", _text(reasoning, max_len), at)
                elif kind in ("image", "file"):
                    push("Image" if kind == "image" else "File", attachment_placeholder(part, counter), at)
            except (UnrenderableError, RecursionError, MemoryError, ValueError, TypeError, ArithmeticError):
                continue  # the builtins: a bound this port missed; the part is left out, not the recall
    elif isinstance(content, Mapping) and isinstance(content.get("content"), str):
        push(role, truncate16(content["content"], max_len), created)  # (Mastra throws on another truthy one)
    return lines


def _moment(value: Any) -> datetime | None:
    """`normalizeObserverCreatedAt`: a date, an ISO string, or milliseconds since the epoch."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            if not math.isfinite(value):
                return None
            return datetime.fromtimestamp(math.trunc(value) / 1000, UTC)
        except (OverflowError, ValueError, OSError):
            return None
    return _parse_date(value)


def _date(moment: datetime | None) -> str:
    """`formatObserverDate`: `Mar 1 2025` (the local zone's date)."""
    if moment is None:
        return ""
    at = _local(moment)
    return f"{_MONTHS[at.month - 1]} {at.day} {at.year}"


def _time(moment: datetime | None) -> str:
    """`formatObserverTime`: `9:05 AM` (en-US, 12-hour, the local zone's time)."""
    if moment is None:
        return ""
    at = _local(moment)
    hour = at.hour % 12 or 12
    return f"{hour}:{at.minute:02d} {'AM' if at.hour < 12 else 'PM'}"


def _local(moment: datetime) -> datetime:
    """`moment` as JavaScript's `Date` getters read it: in the process's zone (`TZ`), at that instant's
    offset (summer time included); in UTC where the local time is past Python's range."""
    try:
        return moment.astimezone()
    except (OverflowError, ValueError, OSError):
        return moment.astimezone(UTC)
