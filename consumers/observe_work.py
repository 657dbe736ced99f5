"""Observation (reflection) work built from an OM row: what the persist path's hook (`consumers.observe_emit`)
and the observed path's sweep (`consumers.observe_sweep`) both send (issue 35; docs/observational-memory.md).

The thread's messages since the row's `lastObservedAt` (one page, the newest `per_page`, oldest first), the
row's observed state, the fields every OM event carries (`schemas.observational.WorkBase`) and the two work
events: each in one place, so the two senders cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from message_history.core.observation import ObservedState
from message_history.core.observation_resource import unobserved_by_thread
from producers.output import Positioned
from schemas.messages import format_timestamp
from schemas.observational import ObserveRequest, ReflectRequest
from storage.observational import Claim, ObservationalRecord
from storage.observational_resource import Position, ThreadPage
from storage.protocol import HistoryStorage, PageQuery

__all__ = [
    "ResourceReads",
    "ResourceRows",
    "WorkSent",
    "observe_request",
    "observed_state",
    "reflect_request",
    "resource_unobserved",
    "since_observed",
    "work_fields",
]

WorkSent = Callable[[Positioned, Claim, str, str], None]
"""Told of each claim whose work is sent: the record it is filed under, the claim, the thread id and the
claimed row's lookup key (a replay with `--observe` waits for those claims to be settled before its row's
next record: `message_history.app.replay.observe_wait`)."""


async def since_observed(
    storage: HistoryStorage, thread_id: str, record: ObservationalRecord, per_page: int
) -> list[dict[str, Any]]:
    """`thread_id`'s messages from `record`'s `lastObservedAt` on, in wire form, oldest first (one page: the
    newest `per_page`)."""
    page = await storage.list_page(
        PageQuery(
            thread_id=thread_id,
            resource_id=None,
            start=record.last_observed_at,
            end=None,
            page=0,
            per_page=per_page,
        )
    )
    return [m.wire() for m in reversed(page.messages)]


class ResourceReads(Protocol):
    """The part of `storage.observational.MongoObservationalStore` resource scope's recall reads."""

    async def resource_cursors(self, resource_id: str, max_threads: int) -> dict[str, datetime | None]: ...

    async def resource_messages(
        self, resource_id: str, cursors: Mapping[str, datetime | None], limit: int
    ) -> list[dict[str, Any]]: ...


class ResourceRows(ResourceReads, Protocol):
    """The part of `storage.observational.MongoObservationalStore` resource scope's work reads."""

    async def resource_threads(
        self, resource_id: str, limit: int, after: Position | None, *, include: str | None = None
    ) -> ThreadPage: ...

    async def keep_threads_after(self, record_id: str, after: Position | None) -> None: ...


async def resource_unobserved(
    rows: ResourceRows, record: ObservationalRecord, per_page: int, *, include: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The resource's unobserved messages per thread, each thread's oldest first: of the next page of its
    threads (`per_page`, after where the row's last page ended, wrapping round; and `include`, the thread
    that just spoke), one page of the newest `per_page` messages past their threads' cursors. The row then
    keeps where the next page starts, so every thread is read within `ceil(threads / per_page)` calls: a
    resource's threads past the `per_page` most recently updated are never left unread."""
    page = await rows.resource_threads(record.resource_id, per_page, record.threads_after, include=include)
    if page.after != record.threads_after:
        await rows.keep_threads_after(record.id, page.after)
    messages = await rows.resource_messages(record.resource_id, page.cursors, per_page)
    return unobserved_by_thread(messages, page.cursors, frozenset(record.observed_message_ids))


def observed_state(record: ObservationalRecord) -> ObservedState:
    """What `record` says is observed already (Mastra OM's counting reads it)."""
    return ObservedState(
        last_observed_at=record.last_observed_at,
        observed_message_ids=frozenset(record.observed_message_ids),
        pending_message_tokens=record.pending_message_tokens,
        observation_token_count=record.observation_token_count,
    )


def work_fields(
    claim: Claim, now: datetime, *, request_id: str, scope: str, thread_id: str | None, resource_id: str
) -> dict[str, Any]:
    """The fields every OM event carries (`schemas.observational.WorkBase`), for `claim`."""
    return {
        "schemaVersion": 1,
        "requestId": request_id,
        "createdAt": format_timestamp(now),
        "scope": scope,
        "threadId": thread_id,
        "resourceId": resource_id,
        "recordId": claim.record_id,
        "generation": claim.generation,
        "cycle": claim.cycle,
    }


def observe_request(
    work: Mapping[str, Any],
    record: ObservationalRecord,
    messages: list[dict[str, Any]],
    *,
    pending: int,
    threshold: int,
) -> ObserveRequest:
    """The `ObserveRequest` of `work` (`work_fields`): `messages` to observe over `record`'s log."""
    return ObserveRequest.model_validate(
        {
            **work,
            "type": "ObserveRequest",
            "messages": messages,
            "activeObservations": record.active_observations,
            "observationTokenCount": record.observation_token_count,
            "pendingTokens": pending,
            "messageTokens": threshold,
        }
    )


def reflect_request(
    work: Mapping[str, Any], record: ObservationalRecord, observation_tokens: int
) -> ReflectRequest:
    """The `ReflectRequest` of `work` (`work_fields`): `record`'s whole log, to condense."""
    return ReflectRequest.model_validate(
        {
            **work,
            "type": "ReflectRequest",
            "activeObservations": record.active_observations,
            "observationTokenCount": record.observation_token_count,
            "observationTokens": observation_tokens,
        }
    )
