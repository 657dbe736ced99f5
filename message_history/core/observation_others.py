"""Resource scope's recall: the other threads' unobserved messages, as Mastra puts them in the context (pure).

As `@mastra/memory` 1.31.0's `getOtherThreadsContext` / `formatUnobservedContextBlocks` and
`formatMessagesForObserver` (`maxPartLength: 500`) write them: per other thread of the resource with
unobserved messages (newer than the thread's cursor, else than the row's `lastObservedAt`; not in the row's
`observedMessageIds`; not a working-memory state signal), an `<other-conversation id="<threadId>">` block of
its messages as lines (`Mar 1 2025:` date headers, `User (9:05 AM): text`, the time only when it changes;
each part cut at 500 UTF-16 units with `... [truncated N characters]`), blocks joined by a blank line.
`core.observation_text.context_system_messages` puts them after the instructions.

Dates and times are UTC (Mastra formats them in the process's zone; the interop test runs Node with
`TZ=UTC`). Only text-like parts are rendered (`text`, `reasoning`, a string `content`, a legacy
`content.content`): Mastra's renderings of tool calls, tool results and attachments are not reproduced, and
such parts are left out (docs/observational-memory.md, To do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from message_history.core.observation import _is_state_signal, _parse_date

__all__ = ["MAX_PART_LENGTH", "format_messages_for_observer", "other_conversations", "others_unobserved"]

MAX_PART_LENGTH: Final = 500
"""`formatUnobservedContextBlocks`' `maxPartLength`."""
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
    """`formatMessagesForObserver` (text-like parts; see the module docstring)."""
    sections: list[str] = []
    previous_date: str | None = None
    previous_time: str | None = None
    for message in messages:
        output: list[str] = []
        for date, time, title, body in _lines(message, max_part_length):
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


def _lines(message: Mapping[str, Any], max_len: int) -> list[tuple[str, str, str, str]]:
    role = message.get("role")
    role = role[:1].upper() + role[1:] if isinstance(role, str) else ""
    created = _parse_date(message.get("createdAt"))
    lines: list[tuple[str, str, str, str]] = []

    def push(title: str, body: Any, at: Any = None) -> None:
        if not isinstance(body, str) or not body:
            return
        moment = _parse_date(at) or created
        lines.append((_date(moment), _time(moment), title, _truncate(body, max_len)))

    content = message.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    if isinstance(content, str):
        push(role, content)
    elif isinstance(parts, list) and parts:
        for part in parts:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") == "text":
                push(role, part.get("text"), part.get("createdAt"))
            elif part.get("type") == "reasoning":
                push("Reasoning", part.get("reasoning"), part.get("createdAt"))
    elif isinstance(content, Mapping):
        push(role, content.get("content"))
    return lines


def _date(moment: datetime | None) -> str:
    """`formatObserverDate`: `Mar 1 2025` (UTC)."""
    if moment is None:
        return ""
    at = moment.astimezone(UTC)
    return f"{_MONTHS[at.month - 1]} {at.day} {at.year}"


def _time(moment: datetime | None) -> str:
    """`formatObserverTime`: `9:05 AM` (en-US, 12-hour, UTC)."""
    if moment is None:
        return ""
    at = moment.astimezone(UTC)
    hour = at.hour % 12 or 12
    return f"{hour}:{at.minute:02d} {'AM' if at.hour < 12 else 'PM'}"


def _truncate(text: str, max_len: int) -> str:
    """`maybeTruncate` with `safeSlice`: lengths in UTF-16 code units, a surrogate pair never cut."""
    units = text.encode("utf-16-le")
    length = len(units) // 2
    if not max_len or length <= max_len:
        return text
    end = max_len
    high = int.from_bytes(units[2 * (end - 1) : 2 * end], "little")
    if 0xD800 <= high <= 0xDBFF:
        end -= 1
    kept = units[: 2 * end].decode("utf-16-le")
    return f"{kept}\n... [truncated {length - end} characters]"
