"""The worker SDK: consume `EnrichedRequest`s, call an async handler per turn, produce `AgentResponse`s.

`AgentWorker` (Kafka, `worker.runner`; one turn: `worker.answer`) around the pure `Turn` / `Reply` /
`build_response` (`worker.turn`).
See docs/worker.md. The names are imported on first use, so `worker.turn` alone loads no Kafka client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.answer import Handler, WorkerStats
    from worker.runner import AgentWorker
    from worker.turn import (
        Reply,
        RetryLater,
        SeenEvents,
        Turn,
        assistant_text,
        build_response,
        failed_response,
    )

_WHERE = {
    "AgentWorker": "worker.runner",
    "Handler": "worker.answer",
    "WorkerStats": "worker.answer",
    "Reply": "worker.turn",
    "RetryLater": "worker.turn",
    "SeenEvents": "worker.turn",
    "Turn": "worker.turn",
    "assistant_text": "worker.turn",
    "build_response": "worker.turn",
    "failed_response": "worker.turn",
}

__all__ = [
    "AgentWorker",
    "Handler",
    "Reply",
    "RetryLater",
    "SeenEvents",
    "Turn",
    "WorkerStats",
    "assistant_text",
    "build_response",
    "failed_response",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
