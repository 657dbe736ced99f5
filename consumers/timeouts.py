"""A MongoDB operation that times out again and again for the same record is that record's fault.

An operation that does not finish within the MongoDB timeout is an outage for the batch (`runtime.retry`):
the loop pauses, backs off and retries, and after each failure it halves the chunk it tries
(`ChunkLimit`), so a batch that cannot be read or written in time is narrowed down until one record is
tried alone. If that lone record's own operation still times out (`OperationTimedOutError`: the server was
reached, as opposed to a refused connection or a server selection timeout) while a cheap `ping` of the
server answers right after, the server is up and only this record's work does not fit: a strike against the
record. After `tries` strikes the record is dead-lettered with `error.type` `StorageTimeout` and the stream
goes on, instead of its path pausing forever.

A parked request (`consumers.parking`) is retried alone in its thread's lane: its lane asks the same
`judge` after each outage of its work (keyed by the parked entry).

A real outage never strikes: a server that is down refuses connections (not a timeout), and a frozen or
overloaded one does not answer the ping either. A timeout met by a chunk of several records never strikes
(it may be any of them, or their sum): halving goes on first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Final

from consumers.contract import BatchHandler, Emit, Record, Refused, Result
from message_history.errors import OperationTimedOutError, StorageTimeoutError

log = logging.getLogger(__name__)

_KEPT: Final = 10_000  # records with strikes remembered at most (the oldest forgotten first)

Ping = Callable[[], Awaitable[None]]


def counts_against_record(error: BaseException, *, alone: bool, server_answers: bool) -> bool:
    """The attribution rule: a failure is a strike against a record only when it is an operation timeout
    (the server was reached), met with the record alone in its attempt, while the server answers a ping."""
    return isinstance(error, OperationTimedOutError) and alone and server_answers


class TimeoutStrikes:
    """A batch handler that dead-letters a record once its own operation timed out `tries` times (see the
    module). `ping` must raise when the server does not answer (promptly); `tries` is at least 1."""

    def __init__(self, inner: BatchHandler, *, ping: Ping, tries: int, path: str) -> None:
        if tries < 1:
            raise ValueError("tries must be at least 1")
        self.inner = inner
        self._ping = ping
        self.tries = tries
        self.path = path
        self._strikes: OrderedDict[Hashable, int] = OrderedDict()

    def strikes(self, record: Record) -> int:
        """The strikes `record` has now (0 once it is handled or dead-lettered)."""
        return self._strikes.get(_key(record), 0)

    async def judge(
        self, key: Hashable, error: BaseException, name: str | None = None
    ) -> StorageTimeoutError | None:
        """After the work of `key` (one record's, tried alone; `name` says which in the log) failed with
        `error`: its dead letter's error once it has `tries` strikes, else None (retry it as an outage)."""
        if not isinstance(error, OperationTimedOutError):
            return None
        if not counts_against_record(error, alone=True, server_answers=await self._server_answers()):
            return None
        strikes = self._strikes.pop(key, 0) + 1
        log.warning(
            "a record's own MongoDB operation timed out while the server answers",
            extra={
                "path": self.path,
                "record": name or str(key),
                "strikes": strikes,
                "tries": self.tries,
                "error": str(error)[:200],
            },
        )
        if strikes >= self.tries:
            return StorageTimeoutError(strikes, str(error))
        self._strikes[key] = strikes
        while len(self._strikes) > _KEPT:
            self._strikes.popitem(last=False)
        return None

    def forget(self, key: Hashable) -> None:
        """`key`'s work is done (or dropped): its strikes go."""
        self._strikes.pop(key, None)

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        try:
            results = await self.inner.handle(records, emit)
        except OperationTimedOutError as exc:
            if len(records) != 1:
                raise
            verdict = await self.judge(_key(records[0]), exc)
            if verdict is None:
                raise
            return [Refused(verdict)]
        for record in records:
            self.forget(_key(record))
        return results

    async def _server_answers(self) -> bool:
        try:
            await self._ping()
        except Exception:  # noqa: BLE001 -- any failure of the ping means "not shown to answer"
            return False
        return True


def _key(record: Record) -> Hashable:
    """A record's key in the strikes: `topic[partition]@offset` (also what the log line names)."""
    return f"{record.topic}[{record.partition}]@{record.offset}"
