"""The processor layer: Mastra's `MessageHistory` applied to any `HistoryStorage`, one event at a time.

This is the library API (docs/library.md): `from message_history.processor import MessageHistory`. It sits
above the pure rules (`message_history.core`) and the storage contract (`storage.protocol`), and below the
Kafka paths (`consumers`), which drive it with batch stand-ins.
"""

from message_history.core.message_list import MessageList
from message_history.core.request_context import MASTRA_MEMORY, USE_DEFAULT, RequestContext
from message_history.processor.history import (
    Abort,
    InputProcessor,
    MessageHistory,
    OutputProcessor,
    OutputResult,
    PersistOutcome,
    abort,
)
from message_history.processor.recall import RecallOutcome

__all__ = [
    "MASTRA_MEMORY",
    "USE_DEFAULT",
    "Abort",
    "InputProcessor",
    "MessageHistory",
    "MessageList",
    "OutputProcessor",
    "OutputResult",
    "PersistOutcome",
    "RecallOutcome",
    "RequestContext",
    "abort",
]
