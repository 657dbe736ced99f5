"""Mastra 1.71's agent signals, as far as memory cares: which messages are transient.

A transient signal is delivered to the model in the turn it arrives in and never kept. Mastra 1.71 applies
one predicate (`isTransientSignalMessage`, packages/core/src/agent/signals.ts) in exactly two places, and so
does this service (docs/rules.md#r7):

* before saving (`filterMessagesForPersistence`): the turn's input and response alike
  (`message_history.core.rules.filter_for_persistence`);
* on the pages of token-limited recall (`loadMessageHistory`; `message_history.core.budget.HistoryLoader`).

Count-capped recall does not look (a stored one, written by someone else, is recalled as it is), and the
turn's own transient signals stay in the context the model sees.
"""

from __future__ import annotations

from schemas.messages import Message

__all__ = ["SIGNAL_ROLE", "is_transient_signal"]

SIGNAL_ROLE = "signal"


def is_transient_signal(message: Message) -> bool:
    """True for a `signal` message whose `content.metadata.signal` is an object with `transient: true`.

    Mastra's test, value for value: another role with the flag, a `"true"` string, `1`, or a `signal` that is
    an array or null do not count.
    """
    if message.role != SIGNAL_ROLE:
        return False
    metadata = message.content.metadata
    if not isinstance(metadata, dict):
        return False
    signal = metadata.get("signal")
    # `is True`: JSON `true` only; 1 == True in Python, but Mastra compares with ===
    return isinstance(signal, dict) and signal.get("transient") is True
