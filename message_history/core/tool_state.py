"""Tool-invocation states and their monotonic merge, as Mastra 1.71's `MessageList` has them (pure).

A tool call moves forward only: `partial-call` 0 < `call` 1 < `approval-requested` 2 < `approval-responded` 3
< `result` / `output-error` / `output-denied` 4, and a terminal state (4) never moves again. On that order:

* `advances(stored, incoming)`: whether an incoming state moves a stored one forward;
* `client_outcomes(stored, live)`: the tool parts of a client's copy of a stored message that fill in a
  call the stored copy still has pending (with a state a client produces: an approval answer or an outcome);
* `merge_into_stored(stored, incoming)`: the stored copy wins (text, arguments, `createdAt`, metadata); only
  the advancing outcomes of the incoming copy are taken (Mastra's memory/input fold);
* `merge_response(stored, response)`: a response with a stored id, merged into the stored message: tool parts
  advance their calls (a result replaces a call, a call never overwrites a result), other new parts are
  placed as in `continue_assistant` when both are assistant messages, else appended;
* `continue_assistant(latest, response)`: a response with a new id folded into the thread's latest assistant
  message as Mastra's `MessageMerger.merge` folds it: calls advance in place, new parts go after their
  anchors, a part the message already holds as often is not added again, and a `step-start` is synthesized
  only before a text part that would follow a tool part.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from schemas.messages import Message, StepStartPart, ToolInvocationPart

__all__ = [
    "STATE_RANK",
    "advances",
    "client_outcomes",
    "continue_assistant",
    "has_new_user_input",
    "is_client_update",
    "is_terminal",
    "merge_into_stored",
    "merge_response",
    "merge_turn",
    "merged_parts",
    "part_key",
]

STATE_RANK: Final[dict[str, int]] = {
    "partial-call": 0,
    "call": 1,
    "approval-requested": 2,
    "approval-responded": 3,
    "result": 4,
    "output-error": 4,
    "output-denied": 4,
}
_TERMINAL: Final = 4
_OUTCOME_FIELDS: Final = ("result", "errorText", "approval")


def is_terminal(state: str) -> bool:
    """`result`, `output-error`, `output-denied`: a call that is over."""
    return STATE_RANK.get(state) == _TERMINAL


def is_client_update(state: str) -> bool:
    """A state a client contributes for a call the server left pending: an approval answer or an outcome."""
    return state == "approval-responded" or is_terminal(state)


def advances(stored: str, incoming: str) -> bool:
    """Whether `incoming` moves a stored invocation in state `stored` forward."""
    return not is_terminal(stored) and STATE_RANK.get(incoming, -1) > STATE_RANK.get(stored, -1)


def _calls(message: Message) -> dict[str, ToolInvocationPart]:
    return {
        p.toolInvocation.toolCallId: p for p in message.content.parts if isinstance(p, ToolInvocationPart)
    }


def _advanced_part(stored: ToolInvocationPart, live: ToolInvocationPart) -> ToolInvocationPart:
    """The stored call with the live state and outcome fields (arguments and metadata stay as stored)."""
    live_inv = live.toolInvocation
    update: dict[str, Any] = {"state": live_inv.state}
    extra = live_inv.model_extra or {}
    if "result" in live_inv.model_fields_set:
        update["result"] = live_inv.result
    for name in _OUTCOME_FIELDS[1:]:
        if name in extra:
            update[name] = extra[name]
    invocation = stored.toolInvocation.model_copy(update=update)
    return stored.model_copy(update={"toolInvocation": invocation})


def client_outcomes(stored: Message, live: Message) -> list[ToolInvocationPart]:
    """Mastra's `clientToolOutcomes`: the live tool parts that advance a call pending in `stored`."""
    calls = _calls(stored)
    out: list[ToolInvocationPart] = []
    for part in live.content.parts:
        if not isinstance(part, ToolInvocationPart):
            continue
        state = part.toolInvocation.state
        stored_call = calls.get(part.toolInvocation.toolCallId)
        if stored_call is None or not is_client_update(state):
            continue
        if not advances(stored_call.toolInvocation.state, state):
            continue
        if (stored_call.model_extra or {}).get("providerExecuted") and state != "approval-responded":
            continue  # the provider, not the client, produces a provider-executed call's outcome
        out.append(_advanced_part(stored_call, part))
    return out


def _with_parts(message: Message, parts: Sequence[Any]) -> Message:
    return message.model_copy(update={"content": message.content.model_copy(update={"parts": list(parts)})})


def merge_into_stored(stored: Message, incoming: Message) -> Message | None:
    """The stored copy, with the incoming copy's advancing outcomes folded in; None when nothing advances."""
    outcomes = {p.toolInvocation.toolCallId: p for p in client_outcomes(stored, incoming)}
    if not outcomes:
        return None
    parts = [
        outcomes.get(p.toolInvocation.toolCallId, p) if isinstance(p, ToolInvocationPart) else p
        for p in stored.content.parts
    ]
    return _with_parts(stored, parts)


def _fold_parts(base: Sequence[Any], incoming: Sequence[Any]) -> list[Any]:
    """`base` with `incoming` folded in: tool parts advance their calls (never back), new parts append."""
    parts = list(base)
    index_of_call = {
        p.toolInvocation.toolCallId: i for i, p in enumerate(parts) if isinstance(p, ToolInvocationPart)
    }
    for part in incoming:
        if isinstance(part, ToolInvocationPart):
            at = index_of_call.get(part.toolInvocation.toolCallId)
            if at is not None:
                current = parts[at]
                if advances(current.toolInvocation.state, part.toolInvocation.state):
                    parts[at] = _advanced_part(current, part)
                continue
            index_of_call[part.toolInvocation.toolCallId] = len(parts)
            parts.append(part)
        elif part not in parts:
            parts.append(part)
    return parts


def merge_response(stored: Message, response: Message) -> Message:
    """A response saved under a stored message's id: merged into it, the stored `createdAt` kept.

    Two assistant messages merge as Mastra's `MessageMerger.merge` merges them (`merged_parts`, the same
    parts as `continue_assistant`); any other pair folds tool parts forward and appends new parts.
    """
    if stored.role == "assistant" and response.role == "assistant":
        return _with_parts(stored, merged_parts(stored, response))
    return _with_parts(stored, _fold_parts(stored.content.parts, response.content.parts))


_ITEM_ID_PROVIDERS: Final = ("openai", "azure")


def _provider_item_keys(metadata: Any) -> str:
    """Mastra's `appendResponseProviderItemKeys`: the Responses-API item ids that tell equal texts apart."""
    if not isinstance(metadata, dict):
        return ""
    ids = {
        p: (metadata.get(p) or {}).get("itemId")
        for p in _ITEM_ID_PROVIDERS
        if isinstance(metadata.get(p), dict)
    }
    if isinstance(ids.get("azure"), str) and ids.get("azure") == ids.get("openai"):
        return f"|azure:{ids['azure']}"
    return "".join(f"|{p}:{i}" for p, i in ids.items() if isinstance(i, str))


def part_key(part: Any) -> str:
    """Mastra 1.71's `CacheKeyGenerator.fromDBParts` for one part: what makes two parts equal on merge."""
    wire: dict[str, Any] = part.model_dump(mode="json", exclude_unset=True)
    kind = str(wire.get("type", ""))
    key = kind
    if kind.startswith("data-"):
        return key + json.dumps(wire.get("data"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if kind == "text":
        key += str(wire.get("text", "")) + _provider_item_keys(wire.get("providerMetadata"))
    elif kind == "tool-invocation":
        invocation = wire.get("toolInvocation") or {}
        key += f"{invocation.get('toolCallId')}{invocation.get('state')}"
    elif kind == "reasoning":
        details = wire.get("details") or []
        size = sum(
            len(d.get("text") or "") + len(d.get("signature") or "")
            for d in details
            if isinstance(d, dict) and d.get("type") == "text"
        )
        key += f"{wire.get('reasoning', '')}{size}" + _provider_item_keys(wire.get("providerMetadata"))
    elif kind == "file":
        key += f"{wire.get('data')}{wire.get('mediaType') or wire.get('mimeType')}"
    return key


def _step_start(parts: Sequence[Any]) -> StepStartPart:
    """The synthesized boundary: it names the model of the message's last step when that one does."""
    previous = next((p for p in reversed(parts) if isinstance(p, StepStartPart)), None)
    model = (previous.model_extra or {}).get("model") if previous is not None else None
    return StepStartPart(type="step-start", model=model) if model else StepStartPart(type="step-start")


def _push_part(parts: list[Any], incoming: Sequence[Any], i: int, insert_at: int | None) -> int:
    """Mastra's `MessageMerger.pushNewPart`: how many parts it inserted (0, 1, or 2 with a `step-start`)."""
    part = incoming[i]
    key = part_key(part)
    if sum(part_key(p) == key for p in parts) >= sum(part_key(p) == key for p in incoming):
        return 0  # the message already holds this part as often as the response does
    needs_step = (
        part.type == "text"
        and not (i > 0 and isinstance(incoming[i - 1], StepStartPart))
        and bool(parts)
        and isinstance(parts[-1], ToolInvocationPart)
    )
    new = [_step_start(parts), part] if needs_step else [part]
    at = len(parts) if insert_at is None else insert_at
    parts[at:at] = new
    return len(new)


def continue_assistant(latest: Message, response: Message) -> Message:
    """A new-id response after the thread's latest assistant message, folded into it (`merged_parts`)."""
    return _with_parts(latest, merged_parts(latest, response))


def merged_parts(latest: Message, response: Message) -> list[Any]:
    """The parts of `latest` with `response` merged in, as Mastra 1.71's `MessageMerger.merge` gives them.

    A tool part for a call the message already has advances it in place (never back) and anchors the parts
    around it; every other part is inserted after its left anchor (appended when there is none), unless the
    message already holds it as often as the response does; a `step-start` is synthesized only before a text
    part when the message's last part is a tool part and the response has no `step-start` right before that
    text.
    """
    parts: list[Any] = list(latest.content.parts)
    incoming = list(response.content.parts)
    anchors: dict[int, int] = {}  # response index -> index in `parts` of the call it advanced
    for i, part in enumerate(incoming):
        if not isinstance(part, ToolInvocationPart):
            continue
        call_id = part.toolInvocation.toolCallId
        at = next(
            (
                j
                for j in range(len(parts) - 1, -1, -1)
                if isinstance(parts[j], ToolInvocationPart) and parts[j].toolInvocation.toolCallId == call_id
            ),
            None,
        )
        if at is None:
            continue
        if advances(parts[at].toolInvocation.state, part.toolInvocation.state):
            parts[at] = _advanced_part(parts[at], part)
        anchors[i] = at
    previous_left, drift = -1, 0
    for i, part in enumerate(incoming):
        if i in anchors:
            continue
        if not anchors:
            _push_part(parts, incoming, i, None)
            continue
        left = max((k for k in anchors if k < i), default=-1)
        right = min((k for k in anchors if k > i), default=-1)
        if left != previous_left:
            previous_left, drift = left, 0
        insert_at = (anchors[left] if left != -1 else 0) + (i if left == -1 else i - left) + drift
        right_at = anchors[right] if right != -1 else len(parts)
        key = part_key(part)
        if not 0 <= insert_at <= right_at or any(part_key(p) == key for p in parts[insert_at:right_at]):
            continue
        inserted = _push_part(parts, incoming, i, insert_at)
        if inserted == 0:
            continue
        drift += inserted - 1
        for k, at in anchors.items():
            if at >= insert_at:
                anchors[k] = at + inserted
    return parts


def has_new_user_input(
    messages: Sequence[Message], *, response_ids: Collection[str], stored: Mapping[str, Message]
) -> bool:
    """Whether the turn brings a user message that is not stored yet (then no response folds back)."""
    return any(m.role == "user" and m.id not in stored and m.id not in response_ids for m in messages)


def merge_turn(
    messages: Sequence[Message],
    *,
    response_ids: Collection[str],
    stored: Mapping[str, Message],
    latest: Message | None,
) -> list[Message]:
    """What a turn writes once its messages meet their stored copies (Mastra 1.71's `MessageList` folds).

    `messages` are the turn's filtered messages to save (input then response), `response_ids` which of them
    the model produced, `stored` the stored copies by id (this thread's), `latest` the thread's newest stored
    message. In order:
    * an input message with a stored id: the stored copy wins and is written again, with the input's
      outcomes that advance its pending calls (`merge_into_stored`), as Mastra re-saves it (so a redelivered
      turn writes the same ids);
    * a response with a stored id is merged into the stored message (`merge_response`);
    * a response assistant message with a new id, later than the thread's latest message when that is an
      assistant message, in a turn without new user input, is folded into it (`continue_assistant`);
    * anything else is written as it is.
    The result keeps first-appearance order, one entry per id.
    """
    out: dict[str, Message] = {}
    new_user = has_new_user_input(messages, response_ids=response_ids, stored=stored)
    fold_into = latest if latest is not None and latest.role == "assistant" and not new_user else None
    for message in messages:
        key = message.id or ""
        base = stored.get(key)
        if key not in response_ids:
            if base is None:
                out[key] = message
            else:
                current = out.get(key, base)
                out[key] = merge_into_stored(current, message) or current
            continue
        if base is not None:
            out[key] = merge_response(out.get(key, base), message)
        elif (
            fold_into is not None
            and message.role == "assistant"
            and fold_into.id is not None
            and message.createdAt is not None
            and fold_into.createdAt is not None
            and message.createdAt > fold_into.createdAt
        ):
            target = out.get(fold_into.id, fold_into)
            out[fold_into.id] = continue_assistant(target, message)
        else:
            out[key] = message
    return list(out.values())
