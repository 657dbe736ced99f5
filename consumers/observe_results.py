"""The observed path: observers' answers (`agent.memory.observed`) applied to `mastra_observational_memory`,
once each (issue 35; docs/observational-memory.md).

A result names the claim it answers (`recordId`, `generation`, `cycle`). It is applied only if that claim is
still the row's: the row is the newest of the result's own lookup key (`thread:<threadId>`, or
`resource:<resourceId>` with resource scope: a result cannot reach another tenant's row by its id), at that
generation and cycle, with its flag still set; the write itself is conditional on the same (`storage.
observational`), so two answers racing still apply once. A late answer (its claim timed out and was taken
again), a repeated one, or one whose row was forgotten changes nothing: it is counted
(`message_history_outcomes_total{path="observed"}`), not dead-lettered. A record that cannot be decoded is a
dead letter; an outage raises (the loop retries the batch; applying is idempotent).

* `ObserveResult`: the cycle's `observations` appended to the log after a message boundary (Mastra's
  `wrapObservations`), the log's tokens counted as Mastra OM counts them, `lastObservedAt` and the cycle's
  `observedMessageIds` set, the flag cleared (`updateActiveObservations`); its `currentTask` /
  `suggestedResponse` / `threadTitle`, when set, and the newest observed message's cursor
  (`lastObservedMessageCursor`) go where Mastra keeps them: the thread's `metadata.mastra.om`
  (`core.observation_hints`; with resource scope, each thread's own).
* `ReflectResult`: generation + 1 made from the `reflection` (`createReflectionGeneration`).
* either with `error`: the claim released, nothing else written (the thread's next turn tries again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from consumers.contract import Done, Emit, Record, Refused, Result
from consumers.observational import THREAD_OM
from consumers.runtime.containment import contain, containable
from message_history import metrics
from message_history.core.observation_hints import StoredStamp, last_observed_cursors, om_hints
from message_history.core.observation_resource import ThreadObservations, merge_thread_observations
from message_history.core.observation_text import append_observations
from message_history.core.om_tokens import count_observations
from message_history.errors import EventValidationError
from schemas.limits import Limits
from schemas.observational import ObserveResult, ReflectResult, decode_result
from storage.observational import Claim, ObservationalRecord, ObservationUpdate

__all__ = ["PATH", "ObserveResultsHandler", "ResultRows"]

log = logging.getLogger(__name__)

PATH: Final = "observed"


class ResultRows(Protocol):
    """The part of `storage.observational.MongoObservationalStore` the observed path uses."""

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None: ...

    async def release(self, claim: Claim, now: datetime) -> bool: ...

    async def apply_observation(self, claim: Claim, update: ObservationUpdate, now: datetime) -> bool: ...

    async def apply_reflection(
        self, claim: Claim, *, reflection: str, token_count: int, now: datetime
    ) -> ObservationalRecord | None: ...

    async def write_cursors(
        self, resource_id: str, cursors: Sequence[tuple[str, datetime, Mapping[str, object]]], now: datetime
    ) -> int: ...

    async def message_stamps(
        self, message_ids: Sequence[str], thread_ids: Collection[str], resource_id: str
    ) -> list[StoredStamp]: ...


class ThreadHints(Protocol):
    """The part of the storage that sets a thread's metadata keys (`save_thread_metadata`)."""

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None: ...


class ObserveResultsHandler:
    """Applies a batch of observer answers in order (one thread's answers are rare and few)."""

    path = PATH

    def __init__(self, *, rows: ResultRows, limits: Limits, threads: ThreadHints | None = None) -> None:
        self._rows = rows
        self._limits = limits
        self._threads = threads

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        """Each answer applied in MongoDB; nothing is emitted (`emit` unused)."""
        return [await self._one(record) for record in records]

    async def _one(self, record: Record) -> Result:
        """One answer applied (done), or why it is a dead letter."""
        if record.value is None:
            return Refused(EventValidationError("empty record (no value)"))
        try:
            outcome = await self._apply(decode_result(record.value, self._limits))
        except Exception as exc:
            if not containable(exc):
                raise
            return Refused(contain(exc, "process"))
        metrics.OUTCOMES.labels(path=PATH, outcome=outcome).inc()
        return Done(_done())

    async def _apply(self, result: ObserveResult | ReflectResult) -> str:
        """What became of `result`: `applied`, `released` (the observer failed), or `stale` (not current)."""
        kind: Any = "observe" if isinstance(result, ObserveResult) else "reflect"
        thread_id = result.threadId if result.scope == "thread" else None
        row = await self._rows.get(thread_id, result.resourceId)
        if row is None or row.id != result.recordId or row.generation != result.generation:
            return _stale(result, "not the row's current generation")
        if row.resource_id != result.resourceId:  # the key is the thread's: its owner must match too
            return _stale(result, "another resource's row")
        if row.cycle != result.cycle or not (row.is_observing if kind == "observe" else row.is_reflecting):
            return _stale(result, "not the row's current claim")
        claim = Claim(result.recordId, result.generation, result.cycle, kind)
        now = datetime.now(UTC)
        if result.error is not None:
            log.warning(
                "observer failed: claim released",
                extra={"thread_id": result.threadId, "request_id": result.requestId, "kind": kind},
            )
            return "released" if await self._rows.release(claim, now) else _stale(result, "raced")
        if isinstance(result, ObserveResult) and result.scope == "resource":
            applied = await self._apply_resource(claim, row, result, now)
        elif isinstance(result, ObserveResult):
            log_text = append_observations(row.active_observations, result.observations, row.last_observed_at)
            update = ObservationUpdate(
                log_text, count_observations(log_text), result.lastObservedAt, result.observedMessageIds
            )
            # read before the apply: an outage here leaves the claim current, so the retried batch applies
            # it with its hints; after the apply the retry would find it stale and write no hints
            cursors = await self._message_cursors(result, [result.threadId or ""])
            applied = await self._rows.apply_observation(claim, update, now)
            if applied:
                await self._hints(result, cursors)
        else:
            applied = (
                await self._rows.apply_reflection(
                    claim,
                    reflection=result.reflection,
                    token_count=count_observations(result.reflection),
                    now=now,
                )
                is not None
            )
        return f"{kind}-applied" if applied else _stale(result, "raced")

    async def _apply_resource(
        self, claim: Claim, row: ObservationalRecord, result: ObserveResult, now: datetime
    ) -> bool:
        """A resource-scoped answer, as `ResourceScopedObservationStrategy` persists it: each thread's
        observations merged into the log in its `<thread>` section, the row's `lastObservedAt` the newest
        thread's, `observedMessageIds` the old ones and this cycle's; once applied, each thread's cursor (and
        hints) in its `metadata.mastra.om`, the resource's threads only. A crash between the two leaves a
        cursor behind: the row's `observedMessageIds` still keeps those messages from being observed again."""
        threads = [
            ThreadObservations(t.threadId, t.observations, t.lastObservedAt) for t in result.threads or []
        ]
        log_text = merge_thread_observations(row.active_observations, threads)
        ids = list(dict.fromkeys([*row.observed_message_ids, *result.observedMessageIds]))
        newest = max((t.last_observed_at for t in threads), default=result.lastObservedAt)
        update = ObservationUpdate(log_text, count_observations(log_text), newest, ids)
        message_cursors = await self._message_cursors(result, [t.threadId for t in result.threads or []])
        if not await self._rows.apply_observation(claim, update, now):
            return False
        cursors = [
            (
                t.threadId,
                t.lastObservedAt,
                om_hints(
                    current_task=t.currentTask,
                    suggested_response=t.suggestedResponse,
                    thread_title=t.threadTitle,
                    cursor=message_cursors.get(t.threadId),
                ),
            )
            for t in result.threads or []
        ]
        await self._rows.write_cursors(result.resourceId, cursors, now)
        return True

    async def _hints(self, result: ObserveResult, cursors: Mapping[str, dict[str, str]]) -> None:
        """The answer's hints into the thread's `metadata.mastra.om` (thread scope), as Mastra's
        `setThreadOMMetadata` keeps them (`core.observation_hints`)."""
        if self._threads is None or result.scope != "thread" or not result.threadId:
            return
        hints = om_hints(
            current_task=result.currentTask,
            suggested_response=result.suggestedResponse,
            thread_title=result.threadTitle,
            cursor=cursors.get(result.threadId),
        )
        if hints:
            await self._threads.save_thread_metadata(
                result.threadId, {f"{THREAD_OM}.{key}": value for key, value in hints.items()}
            )

    async def _message_cursors(self, result: ObserveResult, threads: list[str]) -> dict[str, dict[str, str]]:
        """Each thread's `lastObservedMessageCursor` from its observed messages as stored (one projected
        `find`, the answer's threads and resource only): the answer names the ids, the rows give their
        dates, so a cursor never points past what the thread holds."""
        threads = [t for t in threads if t]
        if result.scope == "thread" and self._threads is None:
            return {}  # nowhere to write a thread's hints
        if not result.observedMessageIds or not threads:
            return {}
        found = await self._rows.message_stamps(result.observedMessageIds, threads, result.resourceId)
        return last_observed_cursors(result.observedMessageIds, found)


def _stale(result: ObserveResult | ReflectResult, why: str) -> str:
    log.info(
        "observer result not applied: %s",
        why,
        extra={"thread_id": result.threadId, "request_id": result.requestId, "cycle": result.cycle},
    )
    return "stale"


def _done() -> asyncio.Future[object]:
    """The acknowledgement of a record whose work is all in MongoDB (written before it is returned)."""
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
