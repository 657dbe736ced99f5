"""What a batch of finished turns needs from storage before the rules can decide, said once (issue 25).

`plan_persist(response)` is the read plan of one response: the stored copies (and homes) of the ids it may
save, whether its thread's newest row may be needed (a response folded into the latest stored assistant
message, `tool_state.merge_turn`), and the ids the service derived for it with their pre-0.1.0 forms.
The persist path loads a whole batch's needs in one round trip (`consumers.collect`); a turn that turns out
to need more than was planned (its user message already stored, so it may continue the latest assistant
message) is a counted plan miss, not a silent extra read. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from message_history.core.rules import SOURCE_FIELD, PersistDecision, assign_thread
from message_history.core.tool_state import has_new_user_input, merge_turn
from schemas.events import AgentResponse, TurnMessage
from schemas.ids import alternate_message_id, derived_for_turn, legacy_ids
from schemas.messages import Message

_M = TypeVar("_M", bound=Message)


@dataclass(frozen=True, slots=True)
class PersistNeeds:
    """One response's reads: `lookup_ids` in `thread_id` (stored copies, and where each id is stored),
    `latest` (the thread's newest row), `legacy` (derived id -> its pre-0.1.0 id, looked up too)."""

    thread_id: str
    lookup_ids: tuple[str, ...]
    latest: bool
    legacy: Mapping[str, str] = field(default_factory=dict)


def plan_persist(response: AgentResponse) -> PersistNeeds:
    """The reads `response` needs; recalled messages (`source` "memory") are never saved (docs/rules.md#r6),
    so never looked up. The newest row is planned for a turn without user input of its own: only such a turn
    continues the thread's latest assistant message (a redelivered turn whose user message is stored already
    may too: a plan miss)."""
    own_input = [m for m in response.input if m.source != "memory"]
    legacy: dict[str, str] = {}
    if any(_may_be_derived(m.id) for m in (*response.input, *response.response)):
        legacy = legacy_ids(
            response.resourceId,
            response.threadId,
            response.requestId,
            [("input", response.input), ("response", response.response)],
        )
    ids = [m.id for m in own_input if m.id] + [m.id for m in response.response if m.id]
    return PersistNeeds(
        thread_id=response.threadId,
        lookup_ids=tuple(dict.fromkeys([*ids, *legacy.values()])),
        latest=not any(m.role == "user" for m in own_input),
        legacy=legacy,
    )


def saved_ids(response: AgentResponse) -> list[str]:
    """The ids a turn may save: its own input's (recalled messages are never saved) and its response's."""
    own = [m.id for m in response.input if m.source != "memory" and m.id]
    return own + [m.id for m in response.response if m.id]


def taken_derived_ids(
    response: AgentResponse, held_elsewhere: Callable[[str], bool], *, max_inputs: int
) -> frozenset[str]:
    """The ids of `response` that another thread holds and that the service itself derived for this turn
    (`schemas.ids.derived_for_turn`; its input's from the request's positions, below `max_inputs`): the
    ones that yield to their alternate. An id the client chose is never among them: its turn is refused
    (`MessageIdTakenError`) as before."""
    return taken_derived(
        saved_ids(response),
        held_elsewhere,
        resource_id=response.resourceId,
        thread_id=response.threadId,
        request_id=response.requestId,
        max_inputs=max_inputs,
        responses=len(response.response),
    )


def taken_derived(
    ids: Iterable[str],
    held_elsewhere: Callable[[str], bool],
    *,
    resource_id: str,
    thread_id: str,
    request_id: str,
    max_inputs: int,
    responses: int,
) -> frozenset[str]:
    """`taken_derived_ids` of a turn given as its saved `ids` (the library's `MessageHistory.persist_turn`):
    those another thread holds that were derived for one of its first `max_inputs` input or `responses`
    response positions."""
    taken = [i for i in ids if _may_be_derived(i) and held_elsewhere(i)]
    if not taken:
        return frozenset()
    return derived_for_turn(taken, resource_id, thread_id, request_id, inputs=max_inputs, responses=responses)


def may_be_derived(ids: Iterable[str | None]) -> list[str]:
    """The ids shaped like a derived id (a UUIDv5's text): the only ones that can yield to an alternate, so
    the only ones whose homes are worth a read."""
    return [i for i in ids if i is not None and _may_be_derived(i)]


def with_ids(messages: Sequence[_M], ids: Mapping[str, str]) -> list[_M]:
    """`messages`, each whose id is a key of `ids` given its value instead (copies; the rest as they are)."""
    return [
        m.model_copy(update={"id": ids[m.id]}) if m.id is not None and m.id in ids else m for m in messages
    ]


def replace_ids(response: AgentResponse, ids: Mapping[str, str]) -> None:
    """Give the messages of `response` whose id is a key of `ids` its value instead (in place)."""
    if not ids:
        return
    response.input = with_ids(response.input, ids)
    response.response = with_ids(response.response, ids)


def _may_be_derived(message_id: str | None) -> bool:
    """Whether `message_id` has the shape of a derived id (a UUIDv5's text): only then can it have a legacy
    id, and deriving the candidates (a UUIDv5 per message) is worth its cost."""
    return (
        message_id is not None
        and len(message_id) == 36
        and message_id[14] == "5"
        and message_id[8] == message_id[13] == message_id[18] == message_id[23] == "-"
    )


@dataclass(frozen=True, slots=True)
class BatchNeeds:
    """A batch's needs, merged: its threads, the ids to look up, the threads whose newest row to read."""

    thread_ids: tuple[str, ...]
    lookup_ids: tuple[str, ...]
    latest_of: tuple[str, ...]


def batch_needs(needs: Iterable[PersistNeeds]) -> BatchNeeds:
    """The union of the responses' needs, each in first-appearance order."""
    plans = list(needs)
    return BatchNeeds(
        thread_ids=tuple(dict.fromkeys(n.thread_id for n in plans)),
        lookup_ids=tuple(dict.fromkeys(i for n in plans for i in n.lookup_ids)),
        latest_of=tuple(dict.fromkeys(n.thread_id for n in plans if n.latest)),
    )


def alternates(taken: Iterable[str], keys: Sequence[bytes]) -> dict[str, str]:
    """Derived id -> its alternate under the current key (`keys[0]`), for each `taken` id, sorted."""
    return {i: alternate_message_id(keys[0], i) for i in sorted(taken)}


def previous_alternates(derived: str, keys: Sequence[bytes]) -> list[str]:
    """The alternates of `derived` under the previous keys (`keys[1:]`), newest key first: after a key
    rotation, one of them stored in the turn's own thread is kept (a replay updates that row)."""
    return [alternate_message_id(key, derived) for key in keys[1:]]


def kept_alternates(
    swap: Mapping[str, str], keys: Sequence[bytes], stored: Callable[[str], bool]
) -> dict[str, str]:
    """Of `swap` (derived -> current alternate), the current alternates whose previous alternate is
    `stored` in the turn's thread -> that previous alternate (the first stored, newest key first)."""
    kept: dict[str, str] = {}
    for derived, current in swap.items():
        old = next((i for i in previous_alternates(derived, keys) if stored(i)), None)
        if old is not None:
            kept[current] = old
    return kept


def turn_input(response: AgentResponse) -> list[Message]:
    """The response's input as plain messages carrying the `source` tag where the rules read it.

    `TurnMessage.source` is a declared field, while `rules.is_memory_sourced` reads the extra field: without
    this, recalled messages echoed back by the worker would be saved again (docs/rules.md#r6).
    """
    return [m.to_message() if m.source is None else _tagged(m) for m in response.input]


def saved_input(response: AgentResponse) -> list[Message]:
    """`turn_input` as `rules.select_for_persistence` uses it, without the copies it would undo: the
    memory-sourced messages (which it never saves, docs/rules.md#r6) left out, the others plain, untagged
    (issue 33: tagging each message, then copying it again to drop the tag, was ~8% of a persist batch's
    CPU). The decision is the same as from `turn_input(response)`: tests/unit/test_turn_input.py."""
    return [m.to_message() for m in response.input if m.source != "memory"]


def _tagged(message: TurnMessage) -> Message:
    """`with_source(message.to_message(), message.source)` in one construction instead of two copies.

    What `Message.model_construct` would set (the fields in their declared order, the extras then `source`,
    the fields set), set directly: its generic loop over the fields cost 3 of this function's 5 µs
    (issue 25). Only while `Message` has no post-init and no private attributes, which it would run."""
    values = {k: v for k, v in message.__dict__.items() if k != SOURCE_FIELD}
    extra = dict(message.model_extra or ())
    extra[SOURCE_FIELD] = message.source  # an extra, after the others, where `with_source` puts it
    fields_set = message.model_fields_set | {SOURCE_FIELD}
    if not _PLAIN_MESSAGE:
        return Message.model_construct(_fields_set=fields_set, **values, **extra)
    tagged = Message.__new__(Message)
    object.__setattr__(tagged, "__dict__", values)
    object.__setattr__(tagged, "__pydantic_fields_set__", fields_set)
    object.__setattr__(tagged, "__pydantic_extra__", extra)
    object.__setattr__(tagged, "__pydantic_private__", None)
    return tagged


_PLAIN_MESSAGE = Message.__pydantic_post_init__ is None and not Message.__private_attributes__


# --- the decision, from what was loaded (the library and the persist path both decide with `decide_turn`) --


@dataclass(frozen=True, slots=True)
class TurnWrite:
    """What a turn writes, before it meets its stored copies: `messages` stamped with `thread_id` and the
    owner, in save order; `response_ids`: which of them the model produced."""

    thread_id: str
    messages: list[Message]
    response_ids: frozenset[str]

    @property
    def ids(self) -> list[str]:
        """The ids it saves, in save order."""
        return [m.id for m in self.messages if m.id is not None]


def turn_write(
    decision: PersistDecision, *, thread_id: str, owner: str, response: Sequence[Message]
) -> TurnWrite:
    """The selected messages of a turn that is saved (`decision.skipped` is None), in its thread."""
    return TurnWrite(
        thread_id,
        assign_thread(decision.messages, thread_id=thread_id, resource_id=owner),
        frozenset(m.id for m in response if m.id is not None),
    )


class TurnReads(Protocol):
    """What a turn's decision reads, answered from what is loaded: per turn (the library's `OneTurnReads`)
    or from a batch's load and earlier writes (`consumers.collect.PersistBuffer`)."""

    def copies_now(self, thread_id: str, message_ids: Sequence[str]) -> Sequence[Message] | None:
        """The stored copies of `message_ids` in `thread_id`; None when they are not all loaded."""
        ...

    def has_latest(self, thread_id: str) -> bool:
        """Whether the thread's newest row is loaded."""
        ...

    def latest_now(self, thread_id: str) -> Message | None:
        """The thread's newest row (None: it has none); only when `has_latest`."""
        ...


@dataclass(frozen=True, slots=True)
class Decided:
    """A turn's decision: exactly what it writes (empty: nothing to save)."""

    messages: list[Message]


@dataclass(frozen=True, slots=True)
class NeedsRead:
    """A turn's decision needs a read first: the stored `copies` of these ids (None: none needed) and/or
    the thread's `latest` row. The caller reads them into its `TurnReads` and decides again."""

    copies: tuple[str, ...] | None = None
    latest: bool = False


# what a decision can ask for: the stored copies, then the thread's newest row; a caller that read both and
# is asked again meets a bug, and refuses the turn rather than read forever
MAX_READS = 2


def decide_turn(write: TurnWrite, reads: TurnReads) -> Decided | NeedsRead:
    """The one persist decision (`MessageHistory.persist_turn` and the persist path): the turn's messages
    meet their stored copies in its own thread and, for a turn without new user input, the thread's newest
    row (`tool_state.merge_turn`). Sync and pure; what it lacks, it asks for."""
    ids = write.ids
    copies = reads.copies_now(write.thread_id, ids)
    if copies is None:
        return NeedsRead(copies=tuple(ids))
    stored = _stored_copies(copies, write.thread_id)
    latest: Message | None = None
    if _needs_latest(write, stored):
        if not reads.has_latest(write.thread_id):
            return NeedsRead(latest=True)
        latest = reads.latest_now(write.thread_id)
    return Decided(_merged(write, stored, latest))


@dataclass(slots=True)
class OneTurnReads:
    """`TurnReads` of one turn, filled as its reads return (the library reads per turn)."""

    copies: Sequence[Message] | None = None
    latest: Message | None = None
    latest_read: bool = False

    def copies_now(self, thread_id: str, message_ids: Sequence[str]) -> Sequence[Message] | None:
        return self.copies

    def has_latest(self, thread_id: str) -> bool:
        return self.latest_read

    def latest_now(self, thread_id: str) -> Message | None:
        return self.latest


def _stored_copies(rows: Iterable[Message], thread_id: str) -> dict[str, Message]:
    """The stored copies among `rows`, by id: `thread_id`'s only."""
    return {row.id: row for row in rows if row.id is not None and row.threadId == thread_id}


def _needs_latest(write: TurnWrite, stored: Mapping[str, Message]) -> bool:
    """Whether the thread's newest row takes part: only a turn without new user input can continue the
    thread's latest assistant message."""
    return not has_new_user_input(write.messages, response_ids=write.response_ids, stored=stored)


def _merged(write: TurnWrite, stored: Mapping[str, Message], latest: Message | None) -> list[Message]:
    """What the turn writes once its messages meet their stored copies (`tool_state.merge_turn`)."""
    return merge_turn(write.messages, response_ids=write.response_ids, stored=stored, latest=latest)
