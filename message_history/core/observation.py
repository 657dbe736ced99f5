"""When a thread is observed or reflected, and on which messages: Mastra OM's rules (pure, no I/O).

As `@mastra/memory` 1.31.0's `ObservationalMemory` decides them (`observational-memory.ts`,
`thresholds.ts`, `message-utils.ts`), on stored messages as JSON data and a record's view
(`ObservedState`, what `storage/observational.py` reads):

* **settings**: `memory.observationalMemory` is `true` or `{scope, shareTokenBudget, observation:
  {messageTokens}, reflection: {observationTokens}}`, over the service's defaults (Mastra's: 30 000 and
  40 000); with `shareTokenBudget` the message threshold is the range `{min: messageTokens, max:
  messageTokens + observationTokens}`;
* **unobserved messages** (`getUnobservedMessages`): not `system`, not a working-memory state signal, not in
  `observedMessageIds`; a message Mastra marked (`data-om-observation-*` parts) keeps only its parts after the
  last completed observation; any other message counts when it has no `createdAt`, the record has no
  `lastObservedAt`, or it is newer;
* **observe** when `pendingMessageTokens + countMessages(unobserved) ≥ threshold`, the threshold shrinking
  towards its minimum as the log grows (`calculateDynamicThreshold`);
* **reflect** when the log's `observationTokenCount ≥ observationTokens`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from message_history.core.om_tokens import count_om_messages
from schemas.observational import Scope

__all__ = [
    "DEFAULT_MESSAGE_TOKENS",
    "DEFAULT_OBSERVATION_TOKENS",
    "ObservationDecision",
    "ObservationSettings",
    "ObservedState",
    "Threshold",
    "decide_observation",
    "dynamic_threshold",
    "resolve_settings",
    "should_reflect",
    "unobserved_messages",
]

DEFAULT_MESSAGE_TOKENS: Final = 30_000
"""Mastra's `observation.messageTokens`: unobserved message tokens that trigger an observation."""
DEFAULT_OBSERVATION_TOKENS: Final = 40_000
"""Mastra's `reflection.observationTokens`: observation log tokens that trigger a reflection."""

_MARKER_PREFIX: Final = "data-om-observation-"
_START: Final = "data-om-observation-start"
_END: Final = "data-om-observation-end"
_FAILED: Final = "data-om-observation-failed"
_WORKING_MEMORY_STATE_ID: Final = "working-memory"


@dataclass(frozen=True, slots=True)
class Threshold:
    """A message threshold: fixed (`low == high`), or Mastra's `{min, max}` shared-budget range."""

    low: int
    high: int


@dataclass(frozen=True, slots=True)
class ObservationSettings:
    """One request's OM settings (`memory.observationalMemory` over the service's defaults)."""

    scope: Scope = "thread"
    message_tokens: Threshold = Threshold(DEFAULT_MESSAGE_TOKENS, DEFAULT_MESSAGE_TOKENS)
    observation_tokens: int = DEFAULT_OBSERVATION_TOKENS


@dataclass(frozen=True, slots=True)
class ObservedState:
    """What the rules read of a thread's (resource's) newest `mastra_observational_memory` row."""

    last_observed_at: datetime | None = None
    observed_message_ids: frozenset[str] = field(default_factory=frozenset)
    pending_message_tokens: int = 0
    observation_token_count: int = 0


@dataclass(frozen=True, slots=True)
class ObservationDecision:
    """Whether to observe now, on which messages, and the counts the decision compared."""

    observe: bool
    messages: list[dict[str, Any]]
    pending_tokens: int
    threshold: int


def resolve_settings(option: Any, defaults: ObservationSettings | None = None) -> ObservationSettings | None:
    """The request's `memory.observationalMemory` over `defaults` (None: OM off for this request).

    `true` is the defaults, `false`/absent is off (the caller decides whether the service default turns it
    on), an object overrides what it names; a value of another type is off.
    """
    base = defaults or ObservationSettings()
    if option is True:
        return base
    if not isinstance(option, Mapping):
        return None
    if option.get("enabled") is False:
        return None
    scope: Scope = "resource" if option.get("scope") == "resource" else "thread"
    message_tokens = _positive_int(_field(option, "observation", "messageTokens"), base.message_tokens.low)
    observation_tokens = _positive_int(
        _field(option, "reflection", "observationTokens"), base.observation_tokens
    )
    if option.get("shareTokenBudget") is True:
        threshold = Threshold(message_tokens, message_tokens + observation_tokens)
    else:
        threshold = Threshold(message_tokens, message_tokens)
    return ObservationSettings(scope, threshold, observation_tokens)


def _field(option: Mapping[str, Any], group: str, name: str) -> Any:
    inner = option.get(group)
    return inner.get(name) if isinstance(inner, Mapping) else None


def _positive_int(value: Any, fallback: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return fallback
    try:
        number = float(value)
    except OverflowError:  # an integer past every float: JavaScript's Infinity, not a finite count
        return fallback
    if not math.isfinite(number) or number <= 0:
        return fallback
    return int(value)


def dynamic_threshold(threshold: Threshold, observation_tokens: int) -> int:
    """`calculateDynamicThreshold`: a range's total budget minus the log, never below its minimum."""
    if threshold.low == threshold.high:
        return threshold.high
    return round(max(threshold.high - observation_tokens, threshold.low))


def _parts(message: Mapping[str, Any]) -> list[Any] | None:
    content = message.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return parts if isinstance(parts, list) else None


def _kind(part: Any) -> Any:
    return part.get("type") if isinstance(part, Mapping) else None


def _is_state_signal(message: Mapping[str, Any]) -> bool:
    """`isWorkingMemoryStateSignal`: a `signal` row holding the working-memory state."""
    if message.get("role") != "signal":
        return False
    content = message.get("content")
    metadata = content.get("metadata") if isinstance(content, Mapping) else None
    signal = metadata.get("signal") if isinstance(metadata, Mapping) else None
    if not isinstance(signal, Mapping):
        return False
    kind = signal.get("type", message.get("type"))
    inner = signal.get("metadata")
    state = inner.get("state") if isinstance(inner, Mapping) else None
    return kind == "state" and isinstance(state, Mapping) and state.get("id") == _WORKING_MEMORY_STATE_ID


def _in_progress(parts: Sequence[Any]) -> bool:
    """`hasInProgressObservation`: the last start marker comes after the last end/failed marker."""
    last_start = last_end = -1
    for index, part in enumerate(parts):
        kind = _kind(part)
        if kind == _START:
            last_start = index
        elif kind in (_END, _FAILED):
            last_end = index
    return last_start != -1 and last_start > last_end


def _is_marker(part: Any) -> bool:
    kind = _kind(part)
    return isinstance(kind, str) and kind.startswith(_MARKER_PREFIX)


def _last_end(parts: Sequence[Any]) -> int:
    for index in range(len(parts) - 1, -1, -1):
        if _kind(parts[index]) == _END:
            return index
    return -1


def _parse_date(value: Any) -> datetime | None:
    """A stored `createdAt` (a date, or an ISO string) as an aware datetime; a naive one is UTC."""
    moment: datetime | None = None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def unobserved_messages(messages: Iterable[Mapping[str, Any]], state: ObservedState) -> list[dict[str, Any]]:
    """Mastra's `getUnobservedMessages` (oldest first, as given): what the next observation covers."""
    result: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "system" or _is_state_signal(message):
            continue
        ident = message.get("id")
        if isinstance(ident, str) and ident in state.observed_message_ids:
            continue  # (an id of another type, a list say, is in no set of ids, as in Mastra's `Set.has`)
        parts = _parts(message) or []
        end = _last_end(parts)
        if _in_progress(parts):
            result.append(dict(message))
        elif end != -1:
            rest = [p for p in parts[end + 1 :] if not _is_marker(p)]
            if rest:
                result.append({**message, "content": {**message["content"], "parts": rest}})
        else:
            created = _parse_date(message.get("createdAt"))
            cursor = _parse_date(state.last_observed_at)
            if created is None or cursor is None or created > cursor:
                result.append(dict(message))
    return result


def decide_observation(
    messages: Iterable[Mapping[str, Any]], state: ObservedState, settings: ObservationSettings
) -> ObservationDecision:
    """`meetsObservationThreshold` over the thread's messages: observe the unobserved ones when due."""
    pending = unobserved_messages(messages, state)
    tokens = state.pending_message_tokens + count_om_messages(pending)
    threshold = dynamic_threshold(settings.message_tokens, state.observation_token_count)
    due = bool(pending) and tokens >= threshold
    return ObservationDecision(due, pending if due else [], tokens, threshold)


def should_reflect(observation_token_count: int, settings: ObservationSettings) -> bool:
    """Reflection is due once the log reaches `reflection.observationTokens`."""
    return observation_token_count >= settings.observation_tokens
