"""The persist path's Observational Memory hook: after a batch is saved, observation work for the threads
whose unobserved messages passed the threshold (issue 35; docs/observational-memory.md).

For each thread (resource, with resource scope) with OM among the batch's saved turns, once per batch, after
the write:

1. its newest `mastra_observational_memory` row is read (generation 0 made, as Mastra's
   `initializeObservationalMemory`, when there is none);
2. **reflection** first: a log at or past `reflection.observationTokens` is claimed (`isReflecting`) and a
   `ReflectRequest` sent;
3. else **observation**: the thread's messages since `lastObservedAt` are read (one page, the newest
   `MAX_ROWS_PER_REQUEST`), the unobserved ones counted as Mastra OM counts them, and when they reach the
   threshold the row is claimed (`isObserving`) and an `ObserveRequest` sent.

A claim held by a live observation (younger than `OBSERVATION_TIMEOUT_S`) makes the claim fail and nothing is
sent: at most one observation (reflection) in flight. A claim older than that is taken again by the thread's
next saved turn, and the work sent again (a crashed or slow observer never leaves it stuck); an answer to the
old claim is then dropped by the observed path (`consumers.observe_results`).

The sends go through the batch's `emit` under the thread's last record in the batch and are part of that
record's acknowledgement (exactly once: filed under its offset, so in its transaction): a send that fails
retries that record, whose save is idempotent. The claim remembers the request that made it (`claimed_by`):
when that same turn comes again (the retried batch, or a redelivery after the service died between the claim
and its commit), among any of its thread's turns in the batch (a later turn may have arrived meanwhile: the
batch's work is decided on its last), the live claim's work is sent again, under the same cycle and the
claiming request's id, instead of waiting out the timeout. A second copy of the work is harmless: the answer
applies once. A claim whose turn never comes again is the observed path's sweep's (`consumers.observe_sweep`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from consumers.contract import Done, Emit, Result, ack_after
from consumers.observational import Unobserved, request_settings
from consumers.observe_work import (
    ResourceRows,
    WorkSent,
    observe_request,
    observed_state,
    reflect_request,
    resource_unobserved,
    since_observed,
    work_fields,
)
from message_history import metrics
from message_history.core.observation import (
    ObservationDecision,
    ObservationSettings,
    decide_observation,
    should_reflect,
)
from message_history.core.observation_resource import ResourceDecision, decide_resource_observation
from message_history.settings import Settings
from producers.observe import ObservePublisher
from producers.output import Positioned
from schemas.events import AgentResponse
from storage.observational import Claim, ObservationalRecord, lookup_key
from storage.protocol import BatchHistoryStorage

__all__ = ["ObservationEmitter", "ObservationalRows", "om_config"]

log = logging.getLogger(__name__)

_UNOBSERVED = Unobserved(
    "persist",
    "observe-failed",
    "observation work failed: the turn is saved, its thread not observed this time",
    log,
)


class ObservationalRows(ResourceRows, Protocol):
    """The part of `storage.observational.MongoObservationalStore` the OM paths use."""

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None: ...

    async def initialize(
        self,
        *,
        scope: Any,
        thread_id: str | None,
        resource_id: str,
        config: Any,
        now: datetime,
        observed_timezone: str | None = None,
    ) -> ObservationalRecord: ...

    async def claim(
        self, record: ObservationalRecord, kind: Any, now: datetime, *, by: str | None = None
    ) -> Claim | None: ...


def om_config(settings: ObservationSettings) -> dict[str, Any]:
    """The row's `config`, in Mastra's option shape (what the thresholds were when it was made)."""
    return {
        "scope": settings.scope,
        "observation": {"messageTokens": settings.message_tokens.low},
        "reflection": {"observationTokens": settings.observation_tokens},
        "shareTokenBudget": settings.message_tokens.low != settings.message_tokens.high,
    }


@dataclass(frozen=True, slots=True)
class _Subject:
    """One lookup key's work in the batch: its settings, and the last saved turn of it (whose ack waits);
    `requests`: the request ids of all its saved turns in the batch (the claiming turn may be among them)."""

    index: int
    record: Positioned
    response: AgentResponse
    settings: ObservationSettings
    requests: frozenset[str] = frozenset()

    @property
    def thread_id(self) -> str | None:
        return self.response.threadId if self.settings.scope == "thread" else None


class ObservationEmitter:
    """Sends observation (reflection) work for a persist batch's threads with OM; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        rows: ObservationalRows,
        storage: BatchHistoryStorage,
        publisher: ObservePublisher,
        *,
        on_work: WorkSent | None = None,
    ) -> None:
        self._settings = settings
        self._on_work = on_work
        self._rows = rows
        self._storage = storage
        self._publisher = publisher
        self._timeout = timedelta(seconds=settings.observation_timeout_s)
        self._max_rows = settings.max_rows_per_request

    async def after_save(
        self,
        results: list[Result | None],
        items: Sequence[tuple[int, Positioned, AgentResponse]],
        emit: Emit,
    ) -> None:
        """The work for the batch's saved turns with OM, through `emit`; each send joins the `Done` of its
        subject's last record in `results` (a refused record has no work)."""
        subjects: dict[str, _Subject] = {}
        for index, record, response in items:
            if not isinstance(results[index], Done):
                continue
            om = request_settings(response.memory, self._settings)
            if om is None:
                continue
            key = f"thread:{response.threadId}" if om.scope == "thread" else f"resource:{response.resourceId}"
            earlier = subjects[key].requests if key in subjects else frozenset()
            subjects[key] = _Subject(index, record, response, om, earlier | {response.requestId})
        if not subjects:
            return
        sends = await asyncio.gather(*(self._guarded(subject, emit) for subject in subjects.values()))
        for subject, send in zip(subjects.values(), sends, strict=True):
            done = results[subject.index]
            if send is not None and isinstance(done, Done):
                results[subject.index] = Done(ack_after(send, done.sent))

    async def _guarded(self, subject: _Subject, emit: Emit) -> asyncio.Future[Any] | None:
        """`_one`, whose failure never fails the saved turn: an outage or a systemic refusal raises (the batch
        is retried; saves are idempotent), anything else (a hostile row, a bug) is logged, counted
        (`outcome="observe-failed"`) and the turn goes on unobserved; its thread's next turn tries again."""
        return await _UNOBSERVED.unless_failed(self._one(subject, emit), None, subject.response.threadId)

    async def _one(self, subject: _Subject, emit: Emit) -> asyncio.Future[Any] | None:
        now = datetime.now(UTC)
        response = subject.response
        record = await self._rows.get(subject.thread_id, response.resourceId)
        if record is None:
            record = await self._rows.initialize(
                scope=subject.settings.scope,
                thread_id=subject.thread_id,
                resource_id=response.resourceId,
                config=om_config(subject.settings),
                now=now,
            )
        if should_reflect(record.observation_token_count, subject.settings):
            return await self._reflect(subject, record, now, emit)
        if record.is_observing and not self._stale(record, now):
            if record.claimed_by not in subject.requests:
                return None  # one observation in flight: no read, no claim
            # the turn that made the live claim, again (maybe with later turns of its thread): its work (maybe
            # never sent) sent again, same cycle
            again = Claim(record.id, record.generation, record.cycle, "observe")
            return await self._observe(subject, record, now, emit, again=again)
        return await self._observe(subject, record, now, emit)

    def _stale(self, record: ObservationalRecord, now: datetime) -> bool:
        return record.updated_at is None or record.updated_at < now - self._timeout

    async def _observe(
        self,
        subject: _Subject,
        record: ObservationalRecord,
        now: datetime,
        emit: Emit,
        again: Claim | None = None,
    ) -> asyncio.Future[Any] | None:
        response = subject.response
        decision = await self._decide(subject, record)
        if not decision.observe:
            return None
        claim = again or await self._rows.claim(record, "observe", now, by=response.requestId)
        if claim is None:
            return None  # another instance (or a Mastra app) holds it
        work = _work(subject, claim, now, by=record.claimed_by if again else None)
        event = observe_request(
            work, record, decision.messages, pending=decision.pending_tokens, threshold=decision.threshold
        )
        metrics.OUTCOMES.labels(path="persist", outcome="observe-requested").inc()
        self._sent(subject, claim)
        log.info(
            "observation requested",
            extra={
                "thread_id": response.threadId,
                "request_id": response.requestId,
                "messages": len(decision.messages),
                "pending_tokens": decision.pending_tokens,
                "cycle": claim.cycle,
            },
        )
        return await self._publisher.publish(emit, subject.record, event)

    async def _decide(
        self, subject: _Subject, record: ObservationalRecord
    ) -> ObservationDecision | ResourceDecision:
        """Thread scope: the thread's messages since `lastObservedAt`; resource scope: the resource's threads'
        messages, each from its own cursor (`core.observation_resource`)."""
        if subject.settings.scope == "resource":
            by_thread = await resource_unobserved(
                self._rows, record, self._max_rows, include=subject.response.threadId
            )
            return decide_resource_observation(by_thread, observed_state(record), subject.settings)
        messages = await since_observed(self._storage, subject.response.threadId, record, self._max_rows)
        return decide_observation(messages, observed_state(record), subject.settings)

    async def _reflect(
        self, subject: _Subject, record: ObservationalRecord, now: datetime, emit: Emit
    ) -> asyncio.Future[Any] | None:
        request_id = subject.response.requestId
        claim: Claim | None
        by: str | None = None
        if record.is_reflecting and not self._stale(record, now):
            if record.claimed_by not in subject.requests:
                return None
            claim = Claim(record.id, record.generation, record.cycle, "reflect")  # the same turn again
            by = record.claimed_by
        else:
            claim = await self._rows.claim(record, "reflect", now, by=request_id)
        if claim is None:
            return None
        event = reflect_request(
            _work(subject, claim, now, by=by), record, subject.settings.observation_tokens
        )
        metrics.OUTCOMES.labels(path="persist", outcome="reflect-requested").inc()
        self._sent(subject, claim)
        return await self._publisher.publish(emit, subject.record, event)

    def _sent(self, subject: _Subject, claim: Claim) -> None:
        if self._on_work is not None:
            key = lookup_key(subject.thread_id, subject.response.resourceId)
            self._on_work(subject.record, claim, subject.response.threadId, key)


def _work(subject: _Subject, claim: Claim, now: datetime, by: str | None = None) -> dict[str, Any]:
    """The fields every OM event carries (`schemas.observational.WorkBase`), for `claim`; `by`: the request
    that made it, when the work is a live claim's sent again (default: the subject's last turn)."""
    return work_fields(
        claim,
        now,
        request_id=by or subject.response.requestId,
        scope=subject.settings.scope,
        thread_id=subject.thread_id,
        resource_id=subject.response.resourceId,
    )
