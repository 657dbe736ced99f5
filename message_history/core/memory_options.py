"""A request's memory options over the service defaults, as Mastra 1.71's Memory reads them (pure).

Used by the recall path to decide what each request recalls (`consumers/recall.py`) and by the bench.
"""

from __future__ import annotations

from dataclasses import dataclass

from message_history.core.budget import TokenBudget, resolve_budget
from message_history.core.rules import LastMessages
from schemas.events import AgentRequest, MemoryOptions

__all__ = ["MemoryDefaults", "TurnMemory", "turn_last_messages", "turn_memory"]


@dataclass(frozen=True, slots=True)
class MemoryDefaults:
    """The service-wide memory settings a request's own `memory` options override (the settings of the
    same names: `settings_slice(MemoryDefaults, settings)`)."""

    last_messages: int = 40
    max_tokens: float | None = None
    at_max_remove_tokens: float | None = None
    retain_full_input: bool = False


@dataclass(frozen=True, slots=True)
class TurnMemory:
    """What one request's recall does: the count cap (`False` = none), the token budget, read-only."""

    last_messages: LastMessages
    budget: TokenBudget | None
    read_only: bool
    retain_full_input: bool


def turn_memory(request: AgentRequest, defaults: MemoryDefaults) -> TurnMemory:
    """The request's memory options over the service defaults, as Mastra 1.71's Memory reads them.

    * `lastMessages`: a count caps the recall; `false` (or `0`) turns history off; absent/null means the
      service default, except under a token budget, where it means no count cap (tokens only).
    * `maxTokens` / `atMaxRemoveTokens`: the request's pair, else the service's; `0` turns history off.
    Raises `InvalidInputError` with Mastra's message when the pair is inconsistent.
    """
    memory = request.memory or MemoryOptions()
    if memory.maxTokens is not None:
        budget = resolve_budget(memory.maxTokens, memory.atMaxRemoveTokens)
    else:
        remove = memory.atMaxRemoveTokens
        if remove is None and defaults.max_tokens is not None:
            remove = defaults.at_max_remove_tokens
        budget = resolve_budget(defaults.max_tokens, remove)
    limit: LastMessages
    if memory.lastMessages is False:
        limit = 0
    elif memory.lastMessages is not None:
        limit = memory.lastMessages
    else:
        limit = False if budget is not None else defaults.last_messages
    if budget is not None and budget.max_tokens == 0:
        limit = 0
    retain = memory.retainFullInput if memory.retainFullInput is not None else defaults.retain_full_input
    return TurnMemory(limit, budget, bool(memory.readOnly), retain)


def turn_last_messages(request: AgentRequest, default: int) -> LastMessages:
    """The request's recall count: its own `lastMessages` (`false` = none), else the service's `default`."""
    return turn_memory(request, MemoryDefaults(last_messages=default)).last_messages
