"""Observational Memory with resource scope: which messages, when, and how the log is shaped (pure, no I/O).

As `@mastra/memory` 1.31.0's `ResourceScopedObservationStrategy` and `ObservationStrategy` do it: one log
(`resource:<resourceId>`) for all the resource's threads, each thread's messages observed from its own
cursor, the thread's `metadata.mastra.om.lastObservedAt` (`getThreadOMMetadata`), so that observing one
thread never moves another's boundary:

* **per-thread cursors** (`thread_cursor`): a thread with no cursor is unobserved from its beginning (the
  row's `lastObservedAt` is not a fallback here, as in Mastra's `prepare`);
* **unobserved** (`unobserved_by_thread`): per thread, its messages newer than its cursor, not `system`, not
  in the row's `observedMessageIds`;
* **due** (`decide_resource_observation`) when `pendingMessageTokens` plus the unobserved messages' tokens
  reach the (dynamic) threshold; then the threads are taken largest first until their tokens reach the
  threshold's maximum (Mastra's `threadsBySize`), and sent oldest first (`sortThreadsByOldestMessage`);
* **the log** (`merge_thread_observations`): each thread's observations wrapped in `<thread id="…">`
  (`wrapWithThreadTag`, the Observer's own thread tags stripped) and merged into the log
  (`replaceOrAppendThreadSection`: into the thread's section of the same `Date:`, else appended after a
  message boundary); each thread's new cursor is its newest observed message's `createdAt`
  (`getMaxMessageTimestamp`), the row's `lastObservedAt` the newest of all, and its `observedMessageIds`
  the union of the old ones and this cycle's.

Decision (docs/observational-memory.md): Mastra's `getStatus` adds the other threads' unobserved text
(`<other-conversation>` blocks) to the resource's unobserved messages, counting those messages twice; the
service counts each unobserved message once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from message_history.core.observation import (
    ObservationSettings,
    ObservedState,
    _parse_date,
    dynamic_threshold,
)
from message_history.core.observation_dates import JS_SPACE, JS_SPACE_CHARS
from message_history.core.observation_text import js_trim, message_boundary
from message_history.core.om_tokens import count_om_messages

__all__ = [
    "ResourceDecision",
    "ThreadObservations",
    "decide_resource_observation",
    "max_created_at",
    "merge_thread_observations",
    "oldest_first",
    "replace_or_append_thread_section",
    "strip_thread_tags",
    "thread_cursor",
    "unobserved_by_thread",
    "wrap_with_thread_tag",
]

_THREAD_TAG: Final = re.compile(r"</?thread\b[^>]{0,1024}>", re.IGNORECASE)
_THREAD_OPEN: Final = re.compile(r'<thread id="([^"]+)">')
_DATE: Final = re.compile(rf"Date:[{JS_SPACE}]*([A-Za-z]+[{JS_SPACE}]+[0-9]+,[{JS_SPACE}]+[0-9]+)")
_CLOSE: Final = "</thread>"


@dataclass(frozen=True, slots=True)
class ResourceDecision:
    """Whether to observe the resource now; the threads to observe (oldest first) and their messages."""

    observe: bool
    threads: list[tuple[str, list[dict[str, Any]]]]
    pending_tokens: int
    threshold: int

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The work's messages: thread by thread, each thread's oldest first."""
        return [message for _, messages in self.threads for message in messages]


@dataclass(frozen=True, slots=True)
class ThreadObservations:
    """One thread's part of a resource's observation: the Observer's text and the thread's new cursor."""

    thread_id: str
    observations: str
    last_observed_at: datetime


def thread_cursor(metadata: Any) -> datetime | None:
    """`getThreadOMMetadata(thread.metadata)?.lastObservedAt`: where the thread's observed messages end
    (plain objects only, as Mastra's `isPlainObject`; an unreadable date is no cursor)."""
    mastra = metadata.get("mastra") if isinstance(metadata, Mapping) else None
    om = mastra.get("om") if isinstance(mastra, Mapping) else None
    value = om.get("lastObservedAt") if isinstance(om, Mapping) else None
    return _parse_date(value) if isinstance(value, str | datetime) else None


def unobserved_by_thread(
    messages: Iterable[Mapping[str, Any]],
    cursors: Mapping[str, datetime | None],
    observed_message_ids: frozenset[str],
) -> dict[str, list[dict[str, Any]]]:
    """The resource's unobserved messages per thread (`prepare`), in the order given (oldest first): newer
    than their thread's cursor, not `system`, not in `observed_message_ids`. Threads absent from `cursors`
    have no cursor."""
    result: dict[str, list[dict[str, Any]]] = {}
    for message in messages:
        thread = message.get("threadId")
        if not isinstance(thread, str) or message.get("role") == "system":
            continue
        ident = message.get("id")
        if isinstance(ident, str) and ident in observed_message_ids:
            continue
        cursor = cursors.get(thread)
        created = _parse_date(message.get("createdAt"))
        if cursor is not None and created is not None and created <= cursor:
            continue
        result.setdefault(thread, []).append(dict(message))
    return result


def _oldest(messages: Sequence[Mapping[str, Any]]) -> float:
    times = [moment.timestamp() for m in messages if (moment := _parse_date(m.get("createdAt"))) is not None]
    return min(times) if times else float("inf")


def decide_resource_observation(
    by_thread: Mapping[str, Sequence[Mapping[str, Any]]], state: ObservedState, settings: ObservationSettings
) -> ResourceDecision:
    """Observe the resource when its unobserved messages reach the threshold; which threads then (largest
    first until the threshold's maximum is reached), sent oldest thread first."""
    counts = {thread: count_om_messages(list(messages)) for thread, messages in by_thread.items() if messages}
    pending = state.pending_message_tokens + count_om_messages(
        [message for thread in counts for message in by_thread[thread]]
    )
    threshold = dynamic_threshold(settings.message_tokens, state.observation_token_count)
    if not counts or pending < threshold:
        return ResourceDecision(False, [], pending, threshold)
    chosen: list[str] = []
    accumulated = 0
    for thread in sorted(counts, key=lambda t: -counts[t]):  # stable, as JavaScript's sort
        if accumulated >= settings.message_tokens.high:
            break
        chosen.append(thread)
        accumulated += counts[thread]
    chosen.sort(key=lambda t: _oldest(by_thread[t]))
    return ResourceDecision(True, [(t, [dict(m) for m in by_thread[t]]) for t in chosen], pending, threshold)


def oldest_first(
    by_thread: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every thread with messages, oldest first (`sortThreadsByOldestMessage`): all that is unobserved."""
    threads = sorted(
        (t for t, messages in by_thread.items() if messages), key=lambda t: _oldest(by_thread[t])
    )
    return [(t, [dict(m) for m in by_thread[t]]) for t in threads]


def max_created_at(messages: Iterable[Mapping[str, Any]]) -> datetime | None:
    """`getMaxMessageTimestamp`: the newest `createdAt` (None when no message has one)."""
    times = [moment for m in messages if (moment := _parse_date(m.get("createdAt"))) is not None]
    return max(times) if times else None


def strip_thread_tags(observations: str) -> str:
    """`stripThreadTags`: the Observer's own `<thread>` tags removed (attribution is the service's)."""
    return js_trim(_THREAD_TAG.sub("", observations))


def wrap_with_thread_tag(thread_id: str, observations: str) -> str:
    """`wrapWithThreadTag` (thread ids not obscured, no retrieval mode): the thread's section of the log."""
    return f'<thread id="{thread_id}">\n{strip_thread_tags(observations)}\n{_CLOSE}'


def replace_or_append_thread_section(existing: str, section: str, last_observed_at: datetime | None) -> str:
    """`replaceOrAppendThreadSection`: `section` merged into the thread's first section when that one has
    the same `Date:` line, else appended after a message boundary."""
    if not existing:
        return section
    merged = _merged(existing, section)
    if merged is not None:
        return merged
    boundary = message_boundary(last_observed_at) if last_observed_at is not None else "\n\n"
    return f"{existing}{boundary}{section}"


def _merged(existing: str, section: str) -> str | None:
    """The log with `section`'s observations (after its `Date:` line) added at the end of the thread's
    first section of the same date; None when there is no such section (or nothing to add)."""
    thread_match = _THREAD_OPEN.search(section)
    date_match = _DATE.search(section)
    if thread_match is None or date_match is None:
        return None
    start = existing.find(f'<thread id="{thread_match.group(1)}">')
    close = existing.find(_CLOSE, start) if start != -1 else -1
    if close == -1:
        return None
    end = close + len(_CLOSE)
    old = existing[start:end]
    date = date_match.group(1)
    if f"Date: {date}" not in old and f"Date:{date}" not in old:
        return None
    date_line_end = section.find("\n", section.find("Date:"))
    new_close = section.rfind(_CLOSE)
    if date_line_end == -1 or new_close == -1:
        return None
    content = js_trim(section[date_line_end + 1 : new_close])
    if not content:
        return None
    merged = f"{_js_trim_end(old[: len(old) - len(_CLOSE)])}\n{content}\n{_CLOSE}"
    return existing[:start] + merged + existing[end:]


def _js_trim_end(text: str) -> str:
    """JavaScript's `trimEnd` (a `str.rstrip` of its whitespace: no regex, linear on any input)."""
    return text.rstrip(JS_SPACE_CHARS)


def merge_thread_observations(existing: str, threads: Sequence[ThreadObservations]) -> str:
    """The log after a resource cycle: each thread's section merged in the order given (`process`)."""
    log = existing
    for thread in threads:
        section = wrap_with_thread_tag(thread.thread_id, thread.observations)
        log = replace_or_append_thread_section(log, section, thread.last_observed_at)
    return log
