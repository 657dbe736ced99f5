"""Observational Memory on the paths (issue 35): which requests have it, and with which thresholds.

The persist path's hook (`consumers.observe_emit`), the observed path (`consumers.observe_results`) and the
recall path's hook (`consumers.observe_recall`) all resolve a turn's OM settings here: the request's (or
response's) `memory.observationalMemory` over the service default (`MESSAGE_HISTORY_OBSERVATIONAL_MEMORY`,
the thresholds `MESSAGE_HISTORY_OBSERVATION_MESSAGE_TOKENS` / `..._REFLECTION_OBSERVATION_TOKENS`). Design:
docs/observational-memory.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from message_history.core.observation import ObservationSettings, Threshold, resolve_settings
from message_history.settings import Settings

__all__ = ["OPTION", "observation_defaults", "request_settings"]

OPTION = "observationalMemory"
"""The memory option's name, as Mastra's `Memory` options spell it."""


def observation_defaults(settings: Settings) -> ObservationSettings:
    """The service's thresholds (thread scope; a request may say `scope: "resource"`)."""
    tokens = settings.observation_message_tokens
    return ObservationSettings(
        scope="thread",
        message_tokens=Threshold(tokens, tokens),
        observation_tokens=settings.reflection_observation_tokens,
    )


def _option(memory: object) -> Any:
    if memory is None:
        return None
    if isinstance(memory, Mapping):
        return memory.get(OPTION)
    extra = getattr(memory, "model_extra", None)  # a MemoryOptions: the option is one of its extra fields
    return extra.get(OPTION) if isinstance(extra, Mapping) else None


def request_settings(memory: object, settings: Settings) -> ObservationSettings | None:
    """A turn's OM settings, or None when it has no OM: its `memory.observationalMemory` (`true`, `false`,
    or Mastra's object) over the service default; absent, the service default decides."""
    option = _option(memory)
    defaults = observation_defaults(settings)
    if option is None:
        return defaults if settings.observational_memory else None
    return resolve_settings(option, defaults)
