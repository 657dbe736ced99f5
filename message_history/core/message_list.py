"""`MessageList`: the context of one turn, with the source of every message.

A Python cut of Mastra's `MessageList` (`packages/core/src/agent/message-list`), limited to what the
MessageHistory steps and an agent loop need:

* **Sources.** Each message belongs to one or more of `input` (the caller's turn), `memory` (recalled),
  `response` (model output) and `context` (extra context, never saved). System messages are kept apart, in
  the system list, as in Mastra; a system message added from `memory` is ignored.
* **Order.** Views are ordered by `(createdAt, id)`: the docs/rules.md#r3 tie-break instead of Mastra's
  insertion-stable sort on `createdAt` alone.
* **Duplicates by id**, in linear time (a dict keyed by id):
  - a `memory` copy of an id already in the list is skipped when the list holds a non-memory copy (the
    incoming copy wins, docs/rules.md#r5) or an equal one; a different memory copy of a memory-only message
    replaces it;
  - a non-memory add of an existing id replaces the message (the newer add wins) and joins its source; the
    `memory` tag is dropped, since the stored copy is no longer what the list holds.
* **Hydration** of non-memory adds: a missing `id` becomes a UUID4; a missing `createdAt` becomes "now", or
  the latest `createdAt` in the list + 1 ms when "now" is not later (so messages added in order stay in
  order); a missing `threadId` / `resourceId` is taken from the list. A non-memory message naming another
  thread or resource raises `InvalidInputError` ("wrong threadId", as Mastra throws). Recalled messages keep
  their own fields.

**The assistant merge (docs/rules.md#r11) is not done here** but when a turn is saved
(`MessageHistory.persist_turn` with `message_history.core.tool_state.merge_turn`): a response continuing the
thread's latest assistant message is folded into it there, against the stored copy, so the in-process library
and the Kafka paths fold alike.

Sorting is lazy: adds are O(1) (amortised) and the first read after a change sorts once; reads in between
reuse the sorted order. A 2,000-message thread therefore costs one O(n log n) sort per read-after-write.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from message_history.core.rules import sort_key
from message_history.errors import InvalidInputError
from schemas.messages import Message, utc_now_ms

__all__ = ["MessageList", "MessageSource"]

MessageSource = Literal["input", "memory", "response", "context"]
_SOURCES: frozenset[str] = frozenset(get_args(MessageSource))
_ONE_MS = timedelta(milliseconds=1)


@dataclass(slots=True)
class _Entry:
    message: Message
    sources: set[MessageSource] = field(default_factory=set)


class MessageList:
    """The messages of one turn, each with its sources, ordered by `(createdAt, id)`."""

    def __init__(
        self,
        *,
        thread_id: str | None = None,
        resource_id: str | None = None,
        now: Callable[[], datetime] = utc_now_ms,
    ) -> None:
        self.thread_id = thread_id
        self.resource_id = resource_id
        self._now = now
        self._entries: dict[str, _Entry] = {}
        self._system: dict[str, _Entry] = {}
        self._order: list[_Entry] | None = []  # None: changed since the last sort
        self._latest: datetime | None = None

    # --- adding --------------------------------------------------------------------------------------------

    def add(
        self,
        messages: Message | Mapping[str, Any] | Iterable[Message | Mapping[str, Any]],
        source: MessageSource,
    ) -> MessageList:
        """Add one message or several (models or wire dicts) from `source`; returns the list itself."""
        if source not in _SOURCES:
            raise ValueError(f"unknown message source {source!r}; expected one of {sorted(_SOURCES)}")
        items: Iterable[Message | Mapping[str, Any]]
        items = [messages] if isinstance(messages, Message | Mapping) else messages
        for item in items:
            message = item if isinstance(item, Message) else Message.model_validate(item)
            self._add_one(message, source)
        return self

    def _add_one(self, message: Message, source: MessageSource) -> None:
        if source == "memory":
            if message.role == "system":
                return  # Mastra ignores system messages recalled from storage (docs/rules.md#r4)
            if message.id is None:
                message = message.model_copy(update={"id": str(uuid.uuid4())})
        else:
            message = self._hydrate(message)
        assert message.id is not None  # both branches above give every message an id
        table = self._system if message.role == "system" else self._entries
        existing = table.get(message.id)
        if existing is None:
            table[message.id] = _Entry(message, {source})
        elif source == "memory":
            if existing.sources != {"memory"} or existing.message == message:
                return  # the incoming copy wins (docs/rules.md#r5); an equal copy changes nothing
            existing.message = message
        else:
            existing.message = message
            existing.sources.discard("memory")
            existing.sources.add(source)
        if message.createdAt is not None and (self._latest is None or message.createdAt > self._latest):
            self._latest = message.createdAt
        if table is self._entries:
            self._order = None

    def _hydrate(self, message: Message) -> Message:
        if self.thread_id is not None and message.threadId not in (None, self.thread_id):
            raise InvalidInputError(
                f"Received input message with wrong threadId: {message.threadId!r} in a list for thread "
                f"{self.thread_id!r}"
            )
        if self.resource_id is not None and message.resourceId not in (None, self.resource_id):
            raise InvalidInputError(
                f"Received input message with wrong resourceId: {message.resourceId!r} in a list for "
                f"resource {self.resource_id!r}"
            )
        update: dict[str, Any] = {}
        if message.id is None:
            update["id"] = str(uuid.uuid4())
        if message.createdAt is None:
            now = self._now()
            if self._latest is not None and now <= self._latest:
                now = self._latest + _ONE_MS
            update["createdAt"] = now
        if message.threadId is None and self.thread_id is not None:
            update["threadId"] = self.thread_id
        if message.resourceId is None and self.resource_id is not None:
            update["resourceId"] = self.resource_id
        return message.model_copy(update=update) if update else message

    # --- views ---------------------------------------------------------------------------------------------

    def _sorted(self) -> list[_Entry]:
        if self._order is None:
            # Entries are mostly added in time order, which Timsort turns into a near-linear pass.
            self._order = sorted(self._entries.values(), key=lambda entry: sort_key(entry.message))
        return self._order

    def _with(self, source: MessageSource) -> list[Message]:
        return [entry.message for entry in self._sorted() if source in entry.sources]

    def get_all(self) -> list[Message]:
        """Every non-system message, ordered by `(createdAt, id)`."""
        return [entry.message for entry in self._sorted()]

    def get_input(self) -> list[Message]:
        """The caller's messages of this turn (`input` source), in order."""
        return self._with("input")

    def get_response(self) -> list[Message]:
        """The model's messages of this turn (`response` source), in order."""
        return self._with("response")

    def get_remembered(self) -> list[Message]:
        """The messages recalled from storage (`memory` source), in order."""
        return self._with("memory")

    def get_context(self) -> list[Message]:
        """Extra context messages (`context` source), which are never saved."""
        return self._with("context")

    def get_system(self) -> list[Message]:
        """System messages, in the order they were first added."""
        return [entry.message for entry in self._system.values()]

    def get_sources(self, message_id: str) -> frozenset[MessageSource]:
        """The sources of the message with this id (empty when it is not in the list)."""
        entry = self._entries.get(message_id) or self._system.get(message_id)
        return frozenset(entry.sources) if entry else frozenset()

    def get(self, message_id: str) -> Message | None:
        """The message with this id, or None."""
        entry = self._entries.get(message_id) or self._system.get(message_id)
        return entry.message if entry else None

    def ids(self) -> set[str]:
        """The ids of every message in the list, system messages included."""
        return set(self._entries) | set(self._system)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._entries or message_id in self._system

    def __repr__(self) -> str:
        return (
            f"MessageList(thread_id={self.thread_id!r}, resource_id={self.resource_id!r}, "
            f"messages={len(self._entries)}, system={len(self._system)})"
        )
