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
from typing import TypeVar

from message_history.core.rules import PersistDecision, assign_thread
from message_history.core.tool_state import has_new_user_input, merge_turn
from schemas.events import AgentResponse
from schemas.ids import derived_for_turn, legacy_ids
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


# --- the decision, from what was loaded (the library and the persist path both use these) ----------------


@dataclass(frozen=True, slots=True)
class TurnWrite:
    """What a turn writes, before it meets its stored copies: `messages` stamped with the thread and owner,
    in save order; `response_ids`: which of them the model produced."""

    messages: list[Message]
    response_ids: frozenset[str]


def turn_write(
    decision: PersistDecision, *, thread_id: str, owner: str, response: Sequence[Message]
) -> TurnWrite:
    """The selected messages of a turn that is saved (`decision.skipped` is None), in its thread."""
    return TurnWrite(
        assign_thread(decision.messages, thread_id=thread_id, resource_id=owner),
        frozenset(m.id for m in response if m.id is not None),
    )


def stored_copies(write: TurnWrite, rows: Iterable[Message], thread_id: str) -> dict[str, Message]:
    """The stored copies among `rows` of the ids `write` saves, by id: this thread's only."""
    return {row.id: row for row in rows if row.id is not None and row.threadId == thread_id}


def needs_latest(write: TurnWrite, stored: Mapping[str, Message]) -> bool:
    """Whether the thread's newest row takes part: only a turn without new user input can continue the
    thread's latest assistant message."""
    return not has_new_user_input(write.messages, response_ids=write.response_ids, stored=stored)


def merged(write: TurnWrite, stored: Mapping[str, Message], latest: Message | None) -> list[Message]:
    """What the turn writes once its messages meet their stored copies (`tool_state.merge_turn`)."""
    return merge_turn(write.messages, response_ids=write.response_ids, stored=stored, latest=latest)
