"""Stored rows no Mastra would read: skipped, counted, logged once, noted per batch (rules.md#stored-rows).

The database is an input: a row the service did not write (a Mastra app, an operator, a bug elsewhere) must
neither stop the loop nor fail every request of its batch. So:

* replies are read as raw BSON (`RawBSONDocument`: nothing decoded by the driver) and each document is
  decoded alone (`storage.raw_rows.decode_row`): a document the codec refuses (invalid UTF-8, a date out of
  range, nesting past the decoder's depth) is that row's fault, never the batch's;
* a row `schemas.stored_rows` refuses raises `UnreadableRowError`; the readers (`storage.mongo_recall`,
  `storage.mongo_threads`) call `skip` and go on without it;
* `skip` counts it (`message_history_unreadable_rows_total{path, collection, reason}`), logs it at WARNING
  once (a bounded memory of the rows already logged: a row met on every recall of its thread is not logged
  on every recall), and notes it in the current `SkipLedger`, if a batch opened one (`collecting`): the
  recall path says per request how many rows of its thread were skipped (`history.skipped`), the persist
  path refuses a turn whose own stored copy is unreadable (its dead letter names the row).

The ledger is a context variable: the tasks a batch starts (its concurrent reads, its threads' lanes) copy
the context, so they share the batch's one ledger object.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from message_history import metrics
from message_history.errors import UnreadableRowError

__all__ = ["SkipLedger", "collecting", "current", "skip"]

log = logging.getLogger(__name__)

_LOGGED_MAX: Final = 10_000
_logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()


class SkipLedger:
    """The unreadable rows one batch's reads skipped, by thread (`path`: the metric's label)."""

    __slots__ = ("_rows", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        # per thread, per row: its refusal and its rank in the thread's newest-first history (None: met
        # by a look-up by id, not by a history read)
        self._rows: dict[str, dict[str, tuple[UnreadableRowError, int | None]]] = {}

    def note(self, error: UnreadableRowError, rank: int | None = None) -> None:
        thread = error.thread_id if isinstance(error.thread_id, str) else ""
        rows = self._rows.setdefault(thread, {})
        key = repr(error.row_id)
        seen = rows.get(key)
        if seen is not None and seen[1] is not None and (rank is None or seen[1] <= rank):
            return
        rows[key] = (error, rank)

    def skipped(self, thread_id: str, limit: int | None = None) -> int:
        """How many unreadable rows a recall of `thread_id`'s newest `limit` readable rows (None: all the
        history the batch read) left out: the skipped ranks the newest-first read went past before it had
        `limit` readable rows."""
        ranks = sorted(r for _, r in self._rows.get(thread_id, {}).values() if r is not None)
        if limit is None:
            return len(ranks)
        count = 0
        for rank in ranks:
            if rank >= limit + count:
                break
            count += 1
        return count

    def unreadable(self, thread_id: str, message_ids: Collection[str]) -> UnreadableRowError | None:
        """The refusal of a row of `thread_id` whose id is among `message_ids`, if a read skipped one."""
        rows = self._rows.get(thread_id)
        if not rows:
            return None
        for message_id in message_ids:
            seen = rows.get(repr(message_id))
            if seen is not None:
                return seen[0]
        return None


_LEDGER: ContextVar[SkipLedger | None] = ContextVar("message_history_skip_ledger", default=None)


@contextmanager
def collecting(path: str) -> Iterator[SkipLedger]:
    """A new ledger for the reads made in this block (and the tasks it starts)."""
    ledger = SkipLedger(path)
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


def current() -> SkipLedger | None:
    """The ledger of the batch being read, if any."""
    return _LEDGER.get()


def skip(error: UnreadableRowError, rank: int | None = None) -> None:
    """A row left out of a read (`rank`: its place in its thread's newest-first history, when the read
    was one): counted, logged once, noted in the batch's ledger."""
    ledger = _LEDGER.get()
    path = ledger.path if ledger is not None else "other"
    metrics.UNREADABLE_ROWS.labels(path=path, collection=error.collection, reason=error.reason).inc()
    if ledger is not None:
        ledger.note(error, rank)
    key = (error.collection, repr(error.row_id)[:300], repr(error.thread_id)[:300])
    if key in _logged:
        _logged.move_to_end(key)
        return
    _logged[key] = None
    if len(_logged) > _LOGGED_MAX:
        _logged.popitem(last=False)
    log.warning(
        "stored row skipped: no Mastra would read it",
        extra={
            "collection": error.collection,
            "thread_id": _shown(error.thread_id),
            "row_id": _shown(error.row_id),
            "reason": error.reason,
            "detail": error.detail,
            "path": path,
        },
    )


def _shown(value: object) -> str:
    """An id as logged: a string as it is, anything else as its repr (bounded either way)."""
    return (value if isinstance(value, str) else repr(value))[:300]
