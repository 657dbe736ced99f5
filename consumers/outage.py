"""Where the outage and containment policy used to be: the retry policy is `consumers.runtime.retry`,
containment `consumers.runtime.containment`. These names stay importable here for importers not moved yet.
"""

from consumers.runtime.containment import (
    Contained,
    contain,
    containable,
    is_systemic,
    report_unexpected,
    settle_outcomes,
)
from consumers.runtime.retry import (
    Backoff,
    ChunkLimit,
    Failure,
    backoff_delay,
    is_outage,
    outage_dependency,
    retry_batch,
    retry_call,
)

__all__ = [
    "Backoff",
    "ChunkLimit",
    "Contained",
    "Failure",
    "backoff_delay",
    "contain",
    "containable",
    "is_outage",
    "is_systemic",
    "outage_dependency",
    "report_unexpected",
    "retry_batch",
    "retry_call",
    "settle_outcomes",
]
