"""The MessageHistory rules as pure functions: what a turn recalls and what a finished turn persists.

No I/O and no driver or event-loop imports, so the in-process library (`message_history.processor`) and the
Kafka paths apply the very same rules. Rule tags: docs/rules.md#r1-to-r12.
Every function here is linear in the number of messages (plus the characters of the text it scans), and
none mutates its arguments: changed messages are copies.

Decisions worth knowing:
* Ties on `createdAt` are broken by `id` (docs/rules.md#r3), so order is the same in every storage.
* A duplicate id between stored history and the incoming turn keeps the incoming copy (docs/rules.md#r5,
  Mastra 1.0.x).
* Messages are "memory-sourced" when they carry the top-level field `source: "memory"` (the tag the recall
  path puts on `EnrichedRequest` messages); such input messages are never re-saved (docs/rules.md#r6). The
  `source` tag is a transport annotation, not part of a Mastra message, so it is removed from what gets saved.
* The persistence filter is Mastra 1.71.0's (docs/rules.md#r7): whitespace is trimmed only where a
  working-memory block was actually removed, and transient signals are never saved (the failed-turn check
  still sees them, as upstream: a response made only of one saves the input).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

from message_history.core.signals import is_transient_signal
from message_history.errors import InvalidInputError, ThreadOwnershipError
from schemas.messages import Message, TextPart, ToolInvocationPart

__all__ = [
    "DEFAULT_LAST_MESSAGES",
    "LastMessages",
    "PersistDecision",
    "SkipReason",
    "Source",
    "assign_thread",
    "build_context",
    "check_owner",
    "filter_for_persistence",
    "is_memory_sourced",
    "normalize_limit",
    "owner_refusal",
    "remove_working_memory_tags",
    "select_for_persistence",
    "sort_key",
    "with_source",
    "without_source",
]

Source = Literal["memory", "input"]
"""Where a message of the model's context came from: recalled from storage, or the turn's own input."""

SkipReason = Literal["read-only", "no-thread", "failed-turn", "nothing-to-save"]
"""Why a finished turn wrote nothing (the `skipped` field of `HistoryPersisted`)."""

LastMessages = int | Literal[False] | None
"""`lastMessages` as Mastra takes it: a count, `False` for no limit, `None` for the storage default (40)."""

DEFAULT_LAST_MESSAGES: Final = 40
"""Mastra's storage default page size (`normalizePerPage`); the processor keeps it (docs/rules.md#r2)."""

WORKING_MEMORY_START_TAG: Final = "<working_memory>"
WORKING_MEMORY_END_TAG: Final = "</working_memory>"
UPDATE_WORKING_MEMORY_TOOL: Final = "updateWorkingMemory"
SOURCE_FIELD: Final = "source"

# A message without createdAt sorts after every dated one, as Mastra stamps such messages "now". Callers
# (MessageList, the Kafka paths) fill createdAt in before ordering matters; this only keeps sort total.
_UNDATED: Final = datetime.max.replace(tzinfo=UTC)

# JavaScript's String.prototype.trim() set (WhiteSpace + LineTerminator), so trimming matches Mastra's:
# Python's str.strip() would also eat U+001C..U+001F and keep U+FEFF.
_JS_WHITESPACE: Final = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


# --- recall ----------------------------------------------------------------------------------------------


def normalize_limit(last_messages: LastMessages) -> int | None:
    """The page size for a recall: `None` → 40, `False` → `None` (no limit), `0` → 0 (recall nothing), n → n.

    Negative counts (and `True`, which is no count) raise `InvalidInputError`, a `ValueError`.
    """
    # bool is a subclass of int: test for False/True before treating the value as a count.
    if last_messages is False:
        return None
    if last_messages is True:
        raise InvalidInputError("lastMessages must be a non-negative integer, false or null, not true")
    if last_messages is None:
        return DEFAULT_LAST_MESSAGES
    if not isinstance(last_messages, int):
        raise InvalidInputError(
            f"lastMessages must be a non-negative integer, false or null, not {last_messages!r}"
        )
    if last_messages < 0:
        raise InvalidInputError(f"lastMessages must not be negative, got {last_messages}")
    return last_messages


def sort_key(message: Message) -> tuple[datetime, str]:
    """The context order, `(createdAt, id)` ascending (docs/rules.md#r3); undated messages last."""
    created = message.createdAt if message.createdAt is not None else _UNDATED
    return created, message.id or ""


def build_context(
    recalled_newest_first: Sequence[Message], incoming: Sequence[Message]
) -> list[tuple[Message, Source]]:
    """The context the model sees: recalled history and the turn's input, ordered by `(createdAt, id)`.

    * System rows from storage are dropped (docs/rules.md#r4); the turn's own system messages stay, as input.
    * A recalled message whose id is also incoming is dropped: the incoming copy wins (docs/rules.md#r5). A
      recalled row without an id is kept. Recalled duplicates keep their newest copy.
    * Several incoming messages with one id keep the last one (a later add replaces an earlier one).
    * Order is `(createdAt ASC, id ASC)` (docs/rules.md#r3). The page comes newest first, so it is reversed;
      the sort then merges two ordered runs, which Timsort does in linear time.
    Messages are returned as given (no copies, no `source` field added; see `with_source`).
    """
    kept_input = _last_copy_per_id(list(incoming))
    seen = {message.id for message in kept_input if message.id is not None}
    memory = _first_per_id((m for m in recalled_newest_first if m.role != "system"), seen)
    memory.reverse()

    tagged: list[tuple[Message, Source]] = [(m, "memory") for m in memory]
    tagged.extend((m, "input") for m in kept_input)
    tagged.sort(key=lambda entry: sort_key(entry[0]))
    return tagged


def with_source(message: Message, source: Source) -> Message:
    """A copy of `message` carrying the top-level `source` tag of `EnrichedRequest` messages."""
    return message.model_copy(update={SOURCE_FIELD: source})


def without_source(message: Message) -> Message:
    """`message` without a top-level `source` tag (the same object when it has none).

    The tag is usually an extra field; a `Message` subclass declaring `source` gives a plain `Message` back.
    """
    if SOURCE_FIELD in type(message).__pydantic_fields__:  # not `model_fields`: a deprecation shim's cost
        return Message.model_validate(message.model_dump(exclude={SOURCE_FIELD}, exclude_unset=True))
    extra = message.model_extra
    if not extra or SOURCE_FIELD not in extra:
        return message
    copy = message.model_copy()
    assert copy.__pydantic_extra__ is not None  # a copy of a model with extras has its own extras dict
    del copy.__pydantic_extra__[SOURCE_FIELD]
    copy.__pydantic_fields_set__.discard(SOURCE_FIELD)
    return copy


def is_memory_sourced(message: Message) -> bool:
    """True when the message carries `source: "memory"`, i.e. it was recalled, not sent by the caller.

    Reads the tag whether it is an extra field or a field a `Message` subclass declares.
    """
    if SOURCE_FIELD in type(message).__pydantic_fields__:
        return bool(getattr(message, SOURCE_FIELD) == "memory")
    # the extras directly: `getattr` with a default on a model without the tag raises and catches an
    # AttributeError inside pydantic's `__getattr__` (issue 33: ~4% of a persist batch's CPU)
    extra = message.__pydantic_extra__
    return extra is not None and extra.get(SOURCE_FIELD) == "memory"


# --- persistence -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PersistDecision:
    """What a finished turn saves: `messages` in save order, or why nothing is saved (`skipped`)."""

    messages: list[Message] = field(default_factory=list)
    skipped: SkipReason | None = None


def remove_working_memory_tags(text: str) -> str:
    """`text` without its complete `<working_memory>…</working_memory>` blocks (shortest match each).

    From an opening tag that is never closed, the rest of the text is kept as it is. A scan with `find`,
    not a regular expression, so it stays linear whatever the input (Mastra does the same against ReDoS).
    """
    pieces: list[str] = []
    pos = 0
    while pos < len(text):
        start = text.find(WORKING_MEMORY_START_TAG, pos)
        if start == -1:
            pieces.append(text[pos:])
            break
        pieces.append(text[pos:start])
        end = text.find(WORKING_MEMORY_END_TAG, start + len(WORKING_MEMORY_START_TAG))
        if end == -1:
            pieces.append(text[start:])
            break
        pos = end + len(WORKING_MEMORY_END_TAG)
    return "".join(pieces)


def _clean_text(text: str) -> str:
    # Mastra 1.71.0 trims only text it changed, so streamed fragments like ' access' keep their space.
    cleaned = remove_working_memory_tags(text)
    return cleaned.strip(_JS_WHITESPACE) if cleaned != text else text


def _filter_parts(parts: Iterable[Any]) -> tuple[list[Any], bool]:
    kept: list[Any] = []
    changed = False
    for part in parts:
        if isinstance(part, ToolInvocationPart):
            invocation = part.toolInvocation
            # partial-call: arguments still streaming, never final. `call` is kept on purpose: for a
            # client-side tool it is the final server-side state (Mastra PR #11630).
            if invocation.state == "partial-call" or invocation.toolName == UPDATE_WORKING_MEMORY_TOOL:
                changed = True
                continue
        elif isinstance(part, TextPart):
            text = _clean_text(part.text)
            if text != part.text:
                part = part.model_copy(update={"text": text})  # noqa: PLW2901 -- the cleaned copy replaces it
                changed = True
        kept.append(part)
    return kept, changed


def filter_for_persistence(messages: Iterable[Message]) -> list[Message]:
    """Mastra 1.71.0's `filterMessagesForPersistence` (docs/rules.md#r4 + #r7), without mutating anything.

    * `system` messages and transient signals (`message_history.core.signals`) are dropped.
    * `content.content`: complete working-memory blocks are removed (trimmed only if something was removed).
    * `content.parts`: `tool-invocation` parts in state `partial-call` and `updateWorkingMemory` calls are
      removed, `text` parts are cleaned like `content.content`; a message left with no parts is dropped.
    * Tool invocations in state `call` are kept (client-side tools end there).
    * The legacy `content.toolInvocations` array is left as it is: neither 1.0.4 nor 1.71.0 filters it, so an
      `updateWorkingMemory` entry there survives, exactly as upstream (newer upstream removes it).
    Unchanged messages are returned as the same objects; changed ones are copies.
    """
    result: list[Message] = []
    for message in messages:
        if message.role == "system" or is_transient_signal(message):
            continue
        content = message.content
        update: dict[str, Any] = {}
        if content.content:
            text = _clean_text(content.content)
            if text != content.content:
                update["content"] = text
        parts, parts_changed = _filter_parts(content.parts)
        if not parts:
            continue
        if parts_changed:
            update["parts"] = parts
        if update:
            message = message.model_copy(update={"content": content.model_copy(update=update)})  # noqa: PLW2901
        result.append(message)
    return result


def select_for_persistence(
    input: Sequence[Message],
    response: Sequence[Message],
    *,
    finish_reason: str | None,
    read_only: bool,
    has_thread: bool,
) -> PersistDecision:
    """The one choke point deciding what a finished turn saves (docs/rules.md#r1 #r4 #r6 #r7 #r8, read-only).

    In order, as Mastra 1.71.0 does it:
    1. no thread → skipped `"no-thread"` (docs/rules.md#r1); 2. read-only → `"read-only"`;
    3. the candidates are `input` (minus memory-sourced messages, docs/rules.md#r6) then `response`; none →
       `"nothing-to-save"`;
    4. `finish_reason == "error"` with no response message → `"failed-turn"` (docs/rules.md#r8: no orphaned
       user message; a failed turn that produced output is saved);
    5. the persistence filter (docs/rules.md#r7); nothing left → `"nothing-to-save"`.
    The saved list keeps input order then response order; an id appearing twice keeps its last copy, at
    that copy's place. Saved messages lose the transport-only `source` tag.
    """
    if not has_thread:
        return PersistDecision(skipped="no-thread")
    if read_only:
        return PersistDecision(skipped="read-only")
    candidates = [m for m in input if not is_memory_sourced(m)]
    candidates.extend(response)
    if not candidates:
        return PersistDecision(skipped="nothing-to-save")
    if finish_reason == "error" and not response:
        return PersistDecision(skipped="failed-turn")
    filtered = filter_for_persistence(candidates)
    if not filtered:
        return PersistDecision(skipped="nothing-to-save")
    return PersistDecision(messages=[without_source(m) for m in _last_copy_per_id(filtered)])


def _first_per_id(messages: Iterable[Message], seen: set[str]) -> list[Message]:
    """Each id's first message, in order, leaving out ids in `seen` (which grows); id-less ones all kept."""
    kept: list[Message] = []
    for message in messages:
        if message.id is not None:
            if message.id in seen:
                continue
            seen.add(message.id)
        kept.append(message)
    return kept


def _last_copy_per_id(messages: list[Message]) -> list[Message]:
    """Each id's last message, in the order of those last copies."""
    kept = _first_per_id(reversed(messages), set())
    kept.reverse()
    return kept


def assign_thread(messages: Iterable[Message], *, thread_id: str, resource_id: str) -> list[Message]:
    """Messages stamped with the turn's thread and resource where they have none (Mastra's hydration).

    A message naming another thread or resource, or without an id, is refused with `InvalidInputError`: a
    turn writes into its own thread only, and only messages that can be upserted by id. Messages that already
    match are returned as the same objects.
    """
    stamped: list[Message] = []
    for message in messages:
        if not message.id:
            # Ids must come from the caller (MessageList, or the event for the Kafka paths) so that saving
            # the same turn twice upserts instead of duplicating.
            raise InvalidInputError("a message to save has no id")
        if message.threadId is not None and message.threadId != thread_id:
            raise InvalidInputError(
                f"message {message.id!r} has threadId {message.threadId!r}, not the turn's {thread_id!r}"
            )
        if message.resourceId is not None and message.resourceId != resource_id:
            raise InvalidInputError(
                f"message {message.id!r} has resourceId {message.resourceId!r}, "
                f"not the turn's {resource_id!r}"
            )
        update: dict[str, str] = {}
        if message.threadId is None:
            update["threadId"] = thread_id
        if message.resourceId is None:
            update["resourceId"] = resource_id
        stamped.append(message.model_copy(update=update) if update else message)
    return stamped


# --- ownership --------------------------------------------------------------------------------------------


class Owned(Protocol):
    """A stored thread as far as ownership goes (`storage.protocol.Thread`)."""

    @property
    def resourceId(self) -> str | None: ...  # noqa: N802 -- Mastra's field name


def owner_refusal(
    thread: Owned | None, thread_id: str, resource_id: str | None
) -> ThreadOwnershipError | None:
    """The refusal of a turn of `resource_id` on `thread`, None when it may use the thread: the one
    ownership rule (docs/events.md#14-storage-layout) of the library, the paths and both storages.

    A thread stored without a resourceId is unowned, as in Mastra: any resource may use it; a missing thread
    or an unknown resource refuses nothing."""
    if thread is None or resource_id is None or not thread.resourceId or thread.resourceId == resource_id:
        return None
    return ThreadOwnershipError(thread_id, resource_id, thread.resourceId)


def check_owner(thread: Owned | None, thread_id: str, resource_id: str | None) -> None:
    """Raise `owner_refusal`'s `ThreadOwnershipError`, if any."""
    refusal = owner_refusal(thread, thread_id, resource_id)
    if refusal is not None:
        raise refusal
