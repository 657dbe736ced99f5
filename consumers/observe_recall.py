"""The recall path's Observational Memory hook: a request with OM is recalled with its thread's observation
log in place of the messages the log covers (issue 35; docs/observational-memory.md).

After the usual recall (its count or token budget applied), for a request whose `memory.observationalMemory`
(or the service default) enables OM, the thread's (resource's) newest `mastra_observational_memory` row is
read, and the enriched event becomes, as Mastra's `ObservationalMemory` processor puts it in the context:

1. the log's system messages (`OBSERVATION_CONTEXT_PROMPT` + instructions, `<observations>` and the log's
   chunks, optimized, dates given their distance from the request's `createdAt`, then `<current-task>` /
   `<suggested-response>` from the thread's `metadata.mastra.om`, where Mastra and the observed path keep
   them: `message_history.core.observation_text`), `source: "memory"`;
2. the continuation reminder (Mastra's `om-continuation` user message), `source: "memory"`;
3. the recalled messages the log does not cover (newer than `lastObservedAt`, not among the last cycle's
   `observedMessageIds`), then the input.

With resource scope the row is the resource's, the thread's messages are cut at the thread's own cursor, and
the other threads' unobserved messages come after the instructions as Mastra's `<other-conversation>` blocks
(`message_history.core.observation_others`).

`history.observed` says how many stored messages the log covers, `history.observationTokens` its tokens
(Mastra OM's count); both 0 when the thread has no log yet, absent without OM. The turn never waits for an
observation: it is recalled with what is observed so far.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from consumers.observational import Unobserved, request_settings, thread_hints
from consumers.observe_work import ResourceReads
from message_history.core.observation_others import other_conversations, others_unobserved
from message_history.core.observation_resource import thread_cursor
from message_history.core.observation_text import context_system_messages, continuation_message
from message_history.core.om_tokens import count_observations
from message_history.settings import Settings
from schemas.events import AgentRequest, EnrichedMessage, EnrichedRequest
from schemas.messages import Message
from storage.observational import ObservationalRecord
from storage.protocol import Thread

__all__ = ["ObservationRecall", "RecallRows"]

log = logging.getLogger(__name__)

_UNOBSERVED = Unobserved(
    "recall", "observations-failed", "observations not added: the request goes out as recalled", log
)

CONTEXT_ID = "om-observations-{}"
"""The ids of the log's system messages in the enriched event (`om-observations-0`, ...)."""
_EPOCH = "1970-01-01T00:00:00.000Z"  # as Mastra dates the continuation reminder: before every message


class ThreadReader(Protocol):
    """The part of the storage recall reads a thread's OM hints from (`get_thread`)."""

    async def get_thread(self, thread_id: str) -> Thread | None: ...


class RecallRows(ResourceReads, Protocol):
    """The part of `storage.observational.MongoObservationalStore` recall uses."""

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None: ...

    async def covered(self, record: ObservationalRecord) -> int: ...


class ObservationRecall:
    """Puts the observation log into a request's enriched event; see the module docstring."""

    def __init__(self, settings: Settings, rows: RecallRows, threads: ThreadReader | None = None) -> None:
        self._settings = settings
        self._rows = rows
        self._threads = threads

    def wants(self, request: AgentRequest) -> bool:
        """Whether the request has OM (its option over the service default)."""
        return request_settings(request.memory, self._settings) is not None

    async def enrich(
        self, request: AgentRequest, enriched: EnrichedRequest | bytes
    ) -> EnrichedRequest | bytes:
        """The enriched event with the log in place of what it covers (call only when `wants`). A failure
        that is neither an outage nor systemic (a bug, say) leaves the event as recalled, logged and counted
        (`outcome="observations-failed"`): the turn is never refused for its observations."""
        return await _UNOBSERVED.unless_failed(self._enrich(request, enriched), enriched, request.threadId)

    async def _enrich(self, request: AgentRequest, enriched: EnrichedRequest | bytes) -> EnrichedRequest:
        settings = request_settings(request.memory, self._settings)
        assert settings is not None  # the caller asked `wants`
        event = (
            enriched
            if isinstance(enriched, EnrichedRequest)
            else EnrichedRequest.model_validate_json(enriched)  # the service's own event: no input limits
        )
        thread_id = request.threadId if settings.scope == "thread" else None
        record = await self._rows.get(thread_id, request.resourceId)
        if record is None or not record.active_observations:
            return _with_history(event, event.messages, observed=0, tokens=0)
        covered = set(record.observed_message_ids)
        metadata = await self._metadata(request.threadId)
        # resource scope: this thread's own cursor (another thread's later cycle moves the row's
        # `lastObservedAt` past this thread's unobserved messages; Mastra keeps per-thread cursors for that)
        cursor = record.last_observed_at if thread_id is not None else thread_cursor(metadata)
        kept = [
            m
            for m in event.messages
            if m.source != "memory" or not (m.id in covered or (cursor is not None and m.createdAt <= cursor))
        ]
        task, suggested = thread_hints(metadata)
        others = await self._others(request, record) if thread_id is None else None
        texts = context_system_messages(
            record.active_observations, task, suggested, now=request.createdAt, other_conversations=others
        )
        context = [_memory(request, CONTEXT_ID.format(n), "system", text) for n, text in enumerate(texts)]
        reminder = Message.model_validate(continuation_message(request.threadId, request.resourceId))
        context.append(
            EnrichedMessage.from_message(
                reminder, "memory", thread_id=request.threadId, resource_id=request.resourceId
            )
        )
        return _with_history(
            event,
            [*context, *kept],
            observed=await self._rows.covered(record),
            tokens=count_observations(record.active_observations),
        )

    async def _others(self, request: AgentRequest, record: ObservationalRecord) -> str:
        """Resource scope: the resource's other threads' unobserved messages (each past its own cursor, else
        the row's `lastObservedAt`; one page), as Mastra's `<other-conversation>` blocks."""
        per_page = self._settings.max_rows_per_request
        cursors = await self._rows.resource_cursors(request.resourceId, per_page)
        others = {t: c or record.last_observed_at for t, c in cursors.items() if t != request.threadId}
        messages = await self._rows.resource_messages(request.resourceId, others, per_page)
        ids = frozenset(record.observed_message_ids)
        by_thread = others_unobserved(messages, others, request.threadId, record.last_observed_at, ids)
        return other_conversations(by_thread)

    async def _metadata(self, thread_id: str) -> dict[str, Any] | None:
        """The request's thread's metadata: its `metadata.mastra.om` hints (Mastra's or an observer's) for
        `<current-task>` / `<suggested-response>` (the current thread's, in either scope, as Mastra's
        `buildContextSystemMessages` reads them) and, with resource scope, its cursor."""
        if self._threads is None:
            return None
        thread = await self._threads.get_thread(thread_id)
        return thread.metadata if thread is not None else None


def _memory(request: AgentRequest, ident: str, role: str, text: str) -> EnrichedMessage:
    message = Message.model_validate(
        {
            "id": ident,
            "role": role,
            "createdAt": _EPOCH,
            "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
        }
    )
    return EnrichedMessage.from_message(
        message, "memory", thread_id=request.threadId, resource_id=request.resourceId
    )


def _with_history(
    event: EnrichedRequest, messages: list[EnrichedMessage], *, observed: int, tokens: int
) -> EnrichedRequest:
    """`event` with `messages` and the two OM fields of `history` (`recalled` counting the memory ones)."""
    recalled = sum(1 for m in messages if m.source == "memory")
    history = event.history.model_copy(
        update={"observed": observed, "observationTokens": tokens, "recalled": recalled}
    )
    return event.model_copy(update={"messages": messages, "history": history})
