"""What a worker's handler gets (`Turn`) and gives back (`Reply`), the `AgentResponse` built from them, and
the bounded memory of answered `eventId`s. Pure: no Kafka, no asyncio.

The response follows docs/events.md#6-responses so the persist path saves the right messages:

- `requestId`, `threadId`, `resourceId` and `metadata` are the enriched request's;
- `input` is every message the worker was given, with its `source` tag, so recalled (`"memory"`) messages are
  not saved again and the turn's own (`"input"`) are;
- `response` is what the handler produced; a message without `id`/`createdAt` gets them from the service
  (an id derived from the resource, thread, request and position: docs/events.md#11-ids-and-timestamps), so
  an answer produced twice is stored once; the SDK never sets response ids itself (an id the handler sets
  must be unique across all threads: a UUID);
- `createdAt` is now, but never before the context's newest message (+1 ms), so the answer sorts after its
  question even when the worker's clock is behind the client's;
- `finishReason` is the handler's (`"stop"` by default); a failed turn is `"error"` with no response
  message, which the persist path skips as `failed-turn`, saving nothing of it (no orphaned user message);
- `memory.readOnly` is the request's unless the reply says otherwise; `memory.observationalMemory` is the
  request's (the service's persist path decides observation by it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Generic, Self, TypeVar, overload

from schemas.events import AgentResponse, EnrichedMessage, EnrichedRequest
from schemas.messages import Message, format_timestamp

FAILED: Final = "error"
"""The `finishReason` of a turn whose handler raised."""

DEFAULT_SEEN_PER_PARTITION: Final = 10_000

_T = TypeVar("_T")


class RetryLater(Exception):  # noqa: N818 -- the TypeScript SDK's name: what the handler asks for
    """Raised by a handler (or any exception with `retriable = True`): the turn cannot be answered NOW (a
    provider's rate limit, an overloaded model); not a failed turn, which would save nothing of the user's
    message. The worker backs off (doubling from `retry_later_initial_s`, jittered, at least `after_s`) and
    calls the handler again for the same turn (the thread's next turns wait behind it), until it answers or
    fails, or the shutdown grace is over (the turn is then left uncommitted for the next owner)."""

    retriable: Final = True

    def __init__(self, message: str = "retry later", *, after_s: float | None = None) -> None:
        super().__init__(message)
        self.after_s = after_s
        """Wait at least this long before the next attempt (e.g. the provider's Retry-After)."""


def is_retry_later(error: BaseException) -> bool:
    """A `RetryLater`, or any exception marked `retriable = True` (the TypeScript SDK's `retriable: true`)."""
    return getattr(error, "retriable", False) is True


class _FromEvent(Generic[_T]):
    """A `Turn` attribute that is its enriched request's field, typed as the field (read-only)."""

    def __init__(self, read: Callable[[EnrichedRequest], _T]) -> None:
        self._read = read

    @overload
    def __get__(self, turn: None, owner: type[Turn]) -> Self: ...
    @overload
    def __get__(self, turn: Turn, owner: type[Turn]) -> _T: ...
    def __get__(self, turn: Turn | None, owner: type[Turn]) -> _T | Self:
        return self if turn is None else self._read(turn.event)


@dataclass(frozen=True, slots=True)
class Turn:
    """One enriched request, as the handler sees it: the context to give the model and the turn's ids."""

    event: EnrichedRequest
    partition: int = 0
    offset: int = 0

    # the request's own fields, read through (`_FromEvent`)
    request_id = _FromEvent(lambda event: event.requestId)
    event_id = _FromEvent(lambda event: event.eventId)
    thread_id = _FromEvent(lambda event: event.threadId)
    resource_id = _FromEvent(lambda event: event.resourceId)
    metadata = _FromEvent(lambda event: event.metadata)
    history = _FromEvent(lambda event: event.history)
    """How many messages were recalled (`recalled`) under which `lastMessages` limit (`limit`)."""
    messages = _FromEvent(lambda event: event.messages)
    """The whole context, oldest first: recalled history then the turn's input (each with `source`)."""

    @property
    def memory(self) -> list[EnrichedMessage]:
        """The recalled history (`source: "memory"`)."""
        return [m for m in self.event.messages if m.source == "memory"]

    @property
    def input(self) -> list[EnrichedMessage]:
        """The turn's own messages (`source: "input"`)."""
        return [m for m in self.event.messages if m.source == "input"]

    @property
    def read_only(self) -> bool:
        """The request asked that nothing of this turn be saved."""
        return bool(self.event.memory and self.event.memory.readOnly)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler returns: the assistant's messages (`MastraDBMessage`s, or plain dicts of them)."""

    messages: Sequence[Message | Mapping[str, Any]] = ()
    finish_reason: str | None = "stop"
    read_only: bool | None = None  # None: the request's `memory.readOnly`
    metadata: Mapping[str, Any] | None = field(default=None)  # None: the request's metadata

    @classmethod
    def text(cls, text: str, *, finish_reason: str | None = "stop") -> Reply:
        """One assistant message with one text part."""
        return cls([assistant_text(text)], finish_reason=finish_reason)


def assistant_text(text: str) -> dict[str, Any]:
    """A format-2 assistant message holding `text` (id and createdAt are filled in by the service)."""
    return {"role": "assistant", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def build_response(turn: Turn, reply: Reply | str, *, now: datetime) -> AgentResponse:
    """The `AgentResponse` answering `turn` with `reply` (a string is one assistant text message)."""
    if isinstance(reply, str):
        reply = Reply.text(reply)
    event = turn.event
    # Never before the context's newest message: a worker clock behind the client's must not sort the answer
    # before its question (the service stamps response messages from this createdAt).
    newest = max((m.createdAt for m in event.messages), default=now)
    values: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": event.requestId,
        "threadId": event.threadId,
        "resourceId": event.resourceId,
        "createdAt": format_timestamp(max(now, newest + timedelta(milliseconds=1))),
        "input": [m.wire() for m in event.messages],
        "response": [m.wire() if isinstance(m, Message) else dict(m) for m in reply.messages],
    }
    metadata = reply.metadata if reply.metadata is not None else event.metadata
    if metadata is not None:
        values["metadata"] = dict(metadata)
    if reply.finish_reason is not None:
        values["finishReason"] = reply.finish_reason
    read_only = reply.read_only if reply.read_only is not None else (event.memory and event.memory.readOnly)
    if read_only is not None:
        values["memory"] = {"readOnly": bool(read_only)}
    observational = (event.memory.model_extra or {}).get("observationalMemory") if event.memory else None
    if observational is not None:  # persist reads it: docs/events.md#20-observational-memory
        values.setdefault("memory", {})["observationalMemory"] = observational
    return AgentResponse.model_validate(values)


def failed_response(turn: Turn, *, now: datetime) -> AgentResponse:
    """The response of a turn that failed: its input, no response message, `finishReason: "error"`."""
    return build_response(turn, Reply((), finish_reason=FAILED), now=now)


class SeenEvents:
    """The `eventId`s answered lately, per partition, at most `per_partition` each (least recent dropped).

    What it guarantees: a copy of an enriched request is dropped when the worker answered the same `eventId`
    on that partition within its last `per_partition` distinct events, in this process. Redeliveries come
    from the service re-emitting after a crash (soon after the first copy, same partition, as the key is the
    thread) and from this worker's own uncommitted offsets after a rebalance or restart; the second kind is
    not covered across processes: a new owner answers again. That duplicate is harmless to the history (the
    service upserts by message id, and derives response ids from the turn's `requestId`), only a second
    model call is spent.
    """

    def __init__(self, per_partition: int = DEFAULT_SEEN_PER_PARTITION) -> None:
        if per_partition < 1:
            raise ValueError("per_partition must be at least 1")
        self._per_partition = per_partition
        self._seen: dict[int, OrderedDict[str, None]] = {}

    def __contains__(self, key: tuple[int, str]) -> bool:
        partition, event_id = key
        seen = self._seen.get(partition)
        if seen is None or event_id not in seen:
            return False
        seen.move_to_end(event_id)
        return True

    def add(self, partition: int, event_id: str) -> None:
        seen = self._seen.setdefault(partition, OrderedDict())
        seen[event_id] = None
        seen.move_to_end(event_id)
        while len(seen) > self._per_partition:
            seen.popitem(last=False)

    def size(self, partition: int) -> int:
        return len(self._seen.get(partition, ()))
