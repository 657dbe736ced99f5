"""The client libraries' per-attempt error lines, rate-limited: an outage is said by the service, not
shouted by its drivers.

aiokafka logs an ERROR for every attempt that fails while a broker is away ("Unable connect to node with id
1", "Unable to update metadata", "Failed fetch messages", "Group Coordinator Request failed", ...): about
2,500 lines in a minute of outage, every one of them a condition the service handles by design and
reports itself (`consumers.outage_log`: one WARNING, a summary every 30 s, one INFO when it is back).
`QuietLines`, a filter on the log handler, lets through the first line of each kind (logger and message
template) and then at most one per `interval_s`; the one that passes after a pause carries `repeated`,
how many like it were held back. Levels are kept: the first line of each kind still says what happened.

The same holds for asyncio's "Task exception was never retrieved" when the exception is a retriable one (a
Kafka request that failed during the outage, left behind by a call that was cut off). Nothing else is
touched: the service's own lines, and any other logger, go through as they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

QUIETED_LOGGERS = ("aiokafka", "kafka", "pymongo")
"""The client libraries whose repeated lines are held back (with their child loggers)."""

INTERVAL_S = 60.0
"""At most one line of a kind per this many seconds, after the first."""

_MAX_KINDS = 1024  # kinds remembered; past it the oldest are forgotten (a kind forgotten passes again)


class QuietLines(logging.Filter):
    """Rate-limits repeated lines of the `loggers` (and retriable task errors asyncio reports)."""

    def __init__(
        self,
        loggers: Iterable[str] = QUIETED_LOGGERS,
        *,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._prefixes = tuple(loggers)
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (last passed, held since)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._applies(record):
            return True
        kind = (record.name, _template(record))
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self._interval_s:
            self._kinds[kind] = (seen[0], seen[1] + 1)
            return False
        if seen is not None and seen[1]:
            record.repeated = seen[1]  # an `extra` field of the JSON line
        self._kinds.pop(kind, None)
        self._kinds[kind] = (now, 0)
        if len(self._kinds) > _MAX_KINDS:
            del self._kinds[next(iter(self._kinds))]
        return True

    def _applies(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncio":
            error = record.exc_info[1] if record.exc_info else None
            return bool(getattr(error, "retriable", False))
        return any(record.name == p or record.name.startswith(f"{p}.") for p in self._prefixes)


def _template(record: logging.LogRecord) -> str:
    """The message before its arguments: one kind whatever the node, error or task it names."""
    return str(record.msg).split("\n", 1)[0]
