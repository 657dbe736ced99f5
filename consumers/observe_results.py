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
  `suggestedResponse` / `threadTitle` (`null` when absent, as Mastra's `undefined` is stored), `extracted`
  (merged) and the newest observed message's cursor (`lastObservedMessageCursor`) go where Mastra's
  `patchThread` puts them: the thread's `metadata.mastra.om`, and the title into the thread's `title`
  unless pinned (`core.observation_hints`; with resource scope, each thread's own; the owner in every
  write's filter).
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
from consumers.runtime.containment import contain, containable
from message_history import metrics
from message_history.core.observation_hints import StoredStamp, last_observed_cursors, om_hints, title_update
from message_history.core.observation_resource import ThreadObservations, merge_thread_observations
from message_history.core.observation_text import append_observations
from message_history.core.om_tokens import count_observations
from message_history.errors import EventValidationError
from schemas.limits import Limits
from schemas.observational import ObserveResult, ReflectResult, decode_result
from schemas.observational import ThreadObservations as ThreadAnswer
from storage.observational import Claim, ObservationalRecord, ObservationUpdate
from storage.observational_resource import ThreadRead

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

    async def hint_rows(self, resource_id: str, thread_ids: Sequence[str]) -> dict[str, ThreadRead]: ...

    async def write_threads(
        self,
        resource_id: str,
        cursors: Sequence[tuple[str, datetime | None, Mapping[str, object]]],
        titles: Sequence[tuple[str, str, object]],
        now: datetime,
    ) -> int: ...

    async def message_stamps(
        self, message_ids: Sequence[str], thread_ids: Collection[str], resource_id: str
    ) -> list[StoredStamp]: ...


class ObserveResultsHandler:
    """Applies a batch of observer answers in order (one thread's answers are rare and few)."""

    path = PATH

    def __init__(self, *, rows: ResultRows, limits: Limits) -> None:
        self._rows = rows
        self._limits = limits

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
            thread = result.threadId or ""
            cursors = await self._message_cursors(result, [thread])
            reads = await self._rows.hint_rows(result.resourceId, [thread])
            applied = await self._rows.apply_observation(claim, update, now)
            if applied:
                await self._write_threads(result.resourceId, [(thread, None, result)], reads, cursors, now)
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
        reads = await self._rows.hint_rows(result.resourceId, [t.threadId for t in result.threads or []])
        if not await self._rows.apply_observation(claim, update, now):
            return False
        entries = [(t.threadId, t.lastObservedAt, t) for t in result.threads or []]
        await self._write_threads(result.resourceId, entries, reads, message_cursors, now)
        return True

    async def _write_threads(
        self,
        resource_id: str,
        entries: Sequence[tuple[str, datetime | None, ObserveResult | ThreadAnswer]],
        reads: Mapping[str, ThreadRead],
        cursors: Mapping[str, dict[str, str]],
        now: datetime,
    ) -> None:
        """Each thread's hints into its `metadata.mastra.om` and, unless pinned, its title, as Mastra's
        `patchThread(setThreadOMMetadata(...))` leaves the row (`core.observation_hints`); the resource's
        threads only (the owner is in both writes' filters). `reads`: the threads as read before the apply
        (a thread missing there gets no title: it is missing, another's, or its row could not be read)."""
        hints, titles = [], []
        for thread, cursor, answer in entries:
            read = reads.get(thread)
            hints.append(
                (
                    thread,
                    cursor,
                    om_hints(
                        current_task=answer.currentTask,
                        suggested_response=answer.suggestedResponse,
                        thread_title=answer.threadTitle,
                        cursor=cursors.get(thread),
                        extracted=answer.extracted,
                        extracted_was=read.extracted if read is not None else None,
                    ),
                )
            )
            title = title_update(read.title, read.metadata, answer.threadTitle) if read is not None else None
            if read is not None and title is not None:
                titles.append((thread, title, read.title))
        await self._rows.write_threads(resource_id, hints, titles, now)

    async def _message_cursors(self, result: ObserveResult, threads: list[str]) -> dict[str, dict[str, str]]:
        """Each thread's `lastObservedMessageCursor` from its observed messages as stored (one projected
        `find`, the answer's threads and resource only): the answer names the ids, the rows give their
        dates, so a cursor never points past what the thread holds."""
        threads = [t for t in threads if t]
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
