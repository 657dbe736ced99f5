"""The worker SDK: consume `EnrichedRequest`s, call an async handler per turn, produce `AgentResponse`s.

`AgentWorker` (Kafka, `worker.runner`) around the pure `Turn` / `Reply` / `build_response` (`worker.turn`).
See docs/worker.md.
"""

from worker.runner import AgentWorker, Handler, WorkerStats
from worker.turn import Reply, SeenEvents, Turn, assistant_text, build_response, failed_response

__all__ = [
    "AgentWorker",
    "Handler",
    "Reply",
    "SeenEvents",
    "Turn",
    "WorkerStats",
    "assistant_text",
    "build_response",
    "failed_response",
]
