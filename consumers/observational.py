"""Observational Memory on the paths (issue 35): which requests have it, and with which thresholds.

The persist path's hook (`consumers.observe_emit`), the observed path (`consumers.observe_results`) and the
recall path's hook (`consumers.observe_recall`) all resolve a turn's OM settings here: the request's (or
response's) `memory.observationalMemory` over the service default (`MESSAGE_HISTORY_OBSERVATIONAL_MEMORY`,
the thresholds `MESSAGE_HISTORY_OBSERVATION_MESSAGE_TOKENS` / `..._REFLECTION_OBSERVATION_TOKENS`). Design:
docs/observational-memory.md. The two hooks keep a failure of OM's own work from failing the turn they serve
in the same way (`Unobserved`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from consumers.runtime.containment import containable
from message_history import metrics
from message_history.core.observation import ObservationSettings, Threshold, resolve_settings
from message_history.settings import Settings

__all__ = ["OPTION", "THREAD_OM", "Unobserved", "observation_defaults", "request_settings", "thread_hints"]

T = TypeVar("T")

OPTION = "observationalMemory"
"""The memory option's name, as Mastra's `Memory` options spell it."""

THREAD_OM = "mastra.om"
"""Where Mastra keeps a thread's OM hints in its metadata (`setThreadOMMetadata`: `metadata.mastra.om`, with
`currentTask` and `suggestedResponse`): the service writes and reads the same, so each sees the other's."""


def thread_hints(metadata: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """`getThreadOMMetadata(metadata)`'s `currentTask` and `suggestedResponse` (None: absent, or not text)."""
    mastra = metadata.get("mastra") if isinstance(metadata, Mapping) else None
    om = mastra.get("om") if isinstance(mastra, Mapping) else None
    if not isinstance(om, Mapping):
        return None, None
    task, response = om.get("currentTask"), om.get("suggestedResponse")
    return (
        task if isinstance(task, str) and task else None,
        response if isinstance(response, str) and response else None,
    )


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
    or Mastra's object) over the service default; absent, the service default decides. `scope: "resource"`
    keeps one log for the resource's threads (`core.observation_resource`)."""
    option = _option(memory)
    defaults = observation_defaults(settings)
    if option is None:
        return defaults if settings.observational_memory else None
    return resolve_settings(option, defaults)


@dataclass(frozen=True, slots=True)
class Unobserved:
    """How a hook's OM work fails without failing the turn: a failure that is neither an outage nor systemic
    (a hostile row, a bug) is logged with its traceback (`message`, on the hook's `log`), counted
    (`message_history_outcomes_total{path, outcome}`) and the turn goes on as without OM; an outage or a
    systemic refusal raises (the batch is retried, or the service stops)."""

    path: str
    outcome: str
    message: str
    log: logging.Logger

    async def unless_failed(self, work: Awaitable[T], fallback: T, thread_id: str | None) -> T:
        """`work`'s result, or `fallback` when it fails containably."""
        try:
            return await work
        except Exception as exc:
            if not containable(exc):
                raise
            metrics.OUTCOMES.labels(path=self.path, outcome=self.outcome).inc()
            self.log.exception(self.message, extra={"thread_id": thread_id, "error_type": type(exc).__name__})
            return fallback
