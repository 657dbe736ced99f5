"""Mastra 1.71's `MemoryInputFilter` as pure rules: a client that resends the stored history (useChat style)
has its echo dropped from the turn's input, so only what is new is treated as new.

`plan_echo(input)` says what the filter would keep and which stored copies it needs to decide; `filter_echo`
decides, given whether the thread has any stored message and the stored copies by id:

* input ending with a user message: keep what follows the last assistant message; that assistant message
  contributes only tool parts that advance a call its stored copy still has pending;
* input ending with an assistant message: keep only its trailing client tool updates (`approval-responded`,
  `result`, `output-error`, `output-denied`; `data-*` parts skipped over); none, and that message is stored
  in this thread: nothing is new (the input becomes empty); not stored here: the input is kept whole;
* an empty thread takes the whole input as its seed, with `providerMetadata` / `providerOptions` removed from
  the assistant's parts that are not client tool updates.

System messages are not input to the filter (Mastra keeps them apart); they are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from message_history.core.tool_state import advances, is_client_update
from schemas.messages import Message, ToolInvocationPart

__all__ = ["EchoPlan", "filter_echo", "plan_echo"]

_PROVIDER_KEYS = ("providerMetadata", "providerOptions")


@dataclass(frozen=True, slots=True)
class EchoPlan:
    """What the filter keeps before looking at storage; `needs` are the ids whose stored copies matter.

    `unchanged`: the filter keeps the input as it is whatever is stored (no storage read is needed).
    """

    retained: list[Message]
    boundary_assistant: Message | None
    unchanged: bool
    needs: tuple[str, ...] = ()


def _is_update(part: Any) -> bool:
    return isinstance(part, ToolInvocationPart) and is_client_update(part.toolInvocation.state)


def _with_parts(message: Message, parts: Sequence[Any]) -> Message:
    content = message.content.model_copy(update={"content": "", "parts": list(parts)})
    return message.model_copy(update={"content": content})


def plan_echo(input: Sequence[Message]) -> EchoPlan:
    """The storage-free half of the filter (the input's non-system messages, in order)."""
    messages = [m for m in input if m.role != "system"]
    if not messages:
        return EchoPlan(list(input), None, unchanged=True)
    last = messages[-1]
    boundary: Message | None = None
    if last.role == "user":
        index = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        retained = messages[index + 1 :]
        boundary = messages[index] if index >= 0 else None
    elif last.role == "assistant":
        trailing: list[Any] = []
        for part in reversed(last.content.parts):
            if getattr(part, "type", "").startswith("data-"):
                continue
            if not _is_update(part):
                break
            trailing.insert(0, part)
        retained = [_with_parts(last, trailing)] if trailing else []
    else:
        return EchoPlan(list(input), None, unchanged=True)
    if len(retained) == len(messages) and all(a is b for a, b in zip(retained, messages, strict=True)):
        return EchoPlan(list(input), None, unchanged=True)
    needs = tuple(m.id for m in (boundary, last) if m is not None and m.role == "assistant" and m.id)
    return EchoPlan(retained, boundary, unchanged=False, needs=needs)


def _strip_provider(message: Message) -> Message:
    if message.role != "assistant":
        return message
    parts = []
    for part in message.content.parts:
        extra = part.model_extra or {}
        if _is_update(part) or not any(k in extra for k in _PROVIDER_KEYS):
            parts.append(part)
            continue
        data = part.model_dump(exclude_unset=True)
        for key in _PROVIDER_KEYS:
            data.pop(key, None)
        parts.append(type(part).model_validate(data))
    return message.model_copy(update={"content": message.content.model_copy(update={"parts": parts})})


def _advancing(boundary: Message, stored: Message | None, thread_id: str) -> Message | None:
    updates = [p for p in boundary.content.parts if _is_update(p)]
    if not updates or stored is None or stored.threadId != thread_id:
        return None
    states = {
        p.toolInvocation.toolCallId: p.toolInvocation.state
        for p in stored.content.parts
        if isinstance(p, ToolInvocationPart)
    }
    kept = [
        p
        for p in updates
        if isinstance(p, ToolInvocationPart)
        and p.toolInvocation.toolCallId in states
        and advances(states[p.toolInvocation.toolCallId], p.toolInvocation.state)
    ]
    return _with_parts(boundary, kept) if kept else None


def filter_echo(
    input: Sequence[Message],
    plan: EchoPlan,
    *,
    thread_empty: bool,
    stored: Mapping[str, Message],
    thread_id: str,
) -> list[Message]:
    """The turn's input after the filter (system messages first, as they came, then what is kept)."""
    if plan.unchanged:
        return list(input)
    # Only a copy in this thread counts: one elsewhere (another tenant's, say) must neither empty the input
    # nor, by changing the outcome, tell the client that its id exists there.
    stored = {i: m for i, m in stored.items() if m.threadId == thread_id}
    system = [m for m in input if m.role == "system"]
    messages = [m for m in input if m.role != "system"]
    if thread_empty:
        return [*system, *(_strip_provider(m) for m in messages)]
    retained = list(plan.retained)
    last = messages[-1]
    if not retained and (last.id is None or last.id not in stored):
        return list(input)
    if plan.boundary_assistant is not None and plan.boundary_assistant.id is not None:
        advanced = _advancing(plan.boundary_assistant, stored.get(plan.boundary_assistant.id), thread_id)
        if advanced is not None:
            retained.insert(0, advanced)
    return [*system, *retained]
