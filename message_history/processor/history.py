"""`MessageHistory`: Mastra's hybrid memory processor, in Python, over any `HistoryStorage`.

The input step recalls a thread's recent messages into the turn's `MessageList`; the output step saves the
turn's input and response messages. The rules themselves live in `message_history.core.rules`; this module
only wires them to a storage. Two public coroutines carry the work and are what the Kafka paths call directly:

* `recall(...)`: one `get_thread` (ownership) and at most one `list_messages`, then `rules.build_context`;
  under a token budget, pages and the memory-only limiter (`budget`) instead, and the boundary written to
  the thread; with `echo`, Mastra's `MemoryInputFilter` first (`core.echo`: a `list_messages(limit=1)`
  probe and a `get_messages` of the resent ids);
* `persist_turn(...)`: `rules.select_for_persistence`, the tool-state merge against the stored copies
  (`tool_state.merge_turn`, on storages with `get_messages`), then one `save_messages` (or, when nothing is
  saved, one `get_thread` to enforce ownership and report the thread).

`recall` plans (`core.recall_plan.plan_recall`), reads per turn and decides with `recall_from`
(`processor/recall.py`), which the recall path calls on a whole batch's loaded reads (`RecallReads`): one
decision, two ways to load. `persist_turn` decides with `core.persist_plan.decide_turn`, as the persist path.
Storage errors propagate (docs/rules.md#r12): a failed read is never an empty history, and a failed step
writes nothing.

Differences from Mastra, on purpose:
* a turn on a thread owned by another resource raises `ThreadOwnershipError` in both steps
  (docs/events.md#14-storage-layout); that is why a skipped save still reads the thread;
* `memoryConfig.lastMessages` in the request context overrides the processor's `last_messages` for one turn;
* a continuation is folded into the latest stored assistant message on persist (docs/rules.md#r11,
  `tool_state`), not in `MessageList`;
* no tracing (`tracing_context` is accepted and ignored). Like Mastra 1.71,
  `process_output_result` pauses 10 ms after a save; `persist_turn` (the Kafka paths) does not.

One job, the processor class (hence its length); every rule it applies is in `message_history.core`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, Protocol

from message_history.core.budget import (
    TokenBudget,
)
from message_history.core.echo import EchoPlan, plan_echo
from message_history.core.memory_options import TurnMemory
from message_history.core.message_list import MessageList
from message_history.core.persist_plan import (
    MAX_READS,
    NeedsRead,
    OneTurnReads,
    TurnWrite,
    alternates,
    decide_turn,
    kept_alternates,
    may_be_derived,
    previous_alternates,
    taken_derived,
    turn_write,
    with_ids,
)
from message_history.core.recall_plan import plan_recall
from message_history.core.request_context import (
    USE_DEFAULT,
    MemoryContext,
    RequestContext,
    UseDefault,
    parse_memory_context,
)
from message_history.core.rules import (
    LastMessages,
    SkipReason,
    build_context,
    check_owner,
    normalize_limit,
    select_for_persistence,
)
from message_history.core.tokens import CountCache
from message_history.errors import AbortError
from message_history.processor.recall import RecallOutcome, StorageReads, recall_from
from schemas.messages import Message
from storage import unreadable
from storage.protocol import (
    HistoryStorage,
    Thread,
)

_PAUSE_AFTER_SAVE_S: Final = 0.010

Abort = Callable[[str | None], NoReturn]
"""The `abort(reason)` function a step receives: it raises and never returns."""


def abort(reason: str | None = None) -> NoReturn:
    """Stop the turn: raises `AbortError(reason)`. Whatever has not been written by then is not written."""
    raise AbortError(reason)


@dataclass(frozen=True, slots=True)
class OutputResult:
    """What the agent run produced, as far as the output step cares (Mastra's `OutputResult`, trimmed)."""

    finishReason: str | None = None  # noqa: N815 -- Mastra's field name
    text: str | None = None


@dataclass(frozen=True, slots=True)
class PersistOutcome:
    """The result of saving a finished turn.

    `saved_ids`: ids written, in save order (empty when skipped); `skipped`: None, or why nothing was written;
    `thread`: the thread after the save (when skipped: as stored, or None if it does not exist);
    `messages`: exactly what was handed to `save_messages`.
    """

    saved_ids: list[str]
    skipped: SkipReason | None
    thread: Thread | None
    messages: list[Message] = field(default_factory=list)


class InputProcessor(Protocol):
    """Anything with Mastra's `processInput` step, in Python form."""

    async def process_input(
        self,
        *,
        messages: Sequence[Message],
        message_list: MessageList,
        abort: Abort,
        request_context: RequestContext | None = None,
        tracing_context: object | None = None,
    ) -> MessageList: ...


class OutputProcessor(Protocol):
    """Anything with Mastra's `processOutputResult` step, in Python form."""

    async def process_output_result(
        self,
        *,
        messages: Sequence[Message],
        message_list: MessageList,
        abort: Abort,
        request_context: RequestContext | None = None,
        tracing_context: object | None = None,
        result: OutputResult | Mapping[str, Any] | None = None,
    ) -> MessageList: ...


def _thread_and_resource(
    memory: MemoryContext | None, message_list: MessageList
) -> tuple[str | None, str | None]:
    """The turn's thread and resource: the request context's `MastraMemory` when it names a thread, else the
    list's own (as Mastra 1.71)."""
    if memory is not None and memory.thread_id:
        return memory.thread_id, memory.resource_id
    return message_list.thread_id, message_list.resource_id


def _finish_reason(result: OutputResult | Mapping[str, Any] | None) -> str | None:
    if result is None:
        return None
    value = result.get("finishReason") if isinstance(result, Mapping) else result.finishReason
    return value if isinstance(value, str) else None


class MessageHistory:
    """Recalls a thread's history before the model runs and saves the turn after it (Mastra's processor).

    `storage`: any `HistoryStorage`. `last_messages`: how many stored messages to recall: `None` = the
    storage default of 40 (not "all", whatever Mastra's reference page says), `0` = none (the turn is still
    saved), `False` = all of them. `max_rows`: the most stored rows one recall reads (None: no cap, as
    Mastra; the service passes `MAX_ROWS_PER_REQUEST`). `message_id_keys`: the deployment's keys of derived
    ids' alternates, current first (`MESSAGE_ID_KEY`, then `MESSAGE_ID_PREVIOUS_KEYS`): given them, a turn
    saved with its `request_id` yields a derived id another thread holds to its alternate, as the service
    does (docs/events.md#11-ids-and-timestamps); without them such a turn is refused (`MessageIdTakenError`).
    """

    id: Final = "message-history"
    name: Final = "MessageHistory"

    def __init__(
        self,
        *,
        storage: HistoryStorage,
        last_messages: LastMessages = None,
        max_rows: int | None = None,
        message_id_keys: Sequence[bytes] = (),
    ) -> None:
        normalize_limit(last_messages)  # fail at construction, not at the first turn
        self.storage = storage
        self.last_messages: LastMessages = last_messages
        self.max_rows = max_rows
        self.message_id_keys = tuple(message_id_keys)

    def __repr__(self) -> str:
        return f"MessageHistory(storage={self.storage!r}, last_messages={self.last_messages!r})"

    # --- the two Mastra steps -------------------------------------------------------------------------

    async def process_input(
        self,
        *,
        messages: Sequence[Message] = (),
        message_list: MessageList,
        abort: Abort = abort,
        request_context: RequestContext | None = None,
        tracing_context: object | None = None,
    ) -> MessageList:
        """Add the thread's recent stored messages to `message_list`, tagged `memory`; return the list.

        The thread comes from `request_context["MastraMemory"]` (else from the list's own `thread_id`, as in
        Mastra 1.71). Without a thread nothing happens (docs/rules.md#r1). `messages` is ignored, as upstream:
        the list is the context. Stored messages whose id is already in the list are not added (the list's
        copy wins).
        """
        del messages, abort, tracing_context  # part of the step's signature; not needed to recall
        memory = parse_memory_context(request_context)
        thread_id, resource_id = _thread_and_resource(memory, message_list)
        if thread_id is None:
            return message_list
        last = memory.last_messages if memory is not None else USE_DEFAULT
        outcome = await self.recall(
            thread_id=thread_id,
            resource_id=resource_id,
            incoming=[*message_list.get_all(), *message_list.get_system()],
            last_messages=last,
        )
        message_list.add([message for message, source in outcome.context if source == "memory"], "memory")
        return message_list

    async def process_output_result(
        self,
        *,
        messages: Sequence[Message] = (),
        message_list: MessageList,
        abort: Abort = abort,
        request_context: RequestContext | None = None,
        tracing_context: object | None = None,
        result: OutputResult | Mapping[str, Any] | None = None,
    ) -> MessageList:
        """Save the list's `input` then `response` messages (filtered by the rules); return the list.

        Skips without writing when there is no thread (docs/rules.md#r1), when `memoryConfig.readOnly` is
        true, when a turn failed (`result.finishReason == "error"`) without any response (docs/rules.md#r8),
        or when nothing is left to save. `messages` is ignored, as upstream.
        """
        del messages, abort, tracing_context
        memory = parse_memory_context(request_context)
        thread_id, resource_id = _thread_and_resource(memory, message_list)
        outcome = await self.persist_turn(
            thread_id=thread_id,
            resource_id=resource_id,
            input=message_list.get_input(),
            response=message_list.get_response(),
            finish_reason=_finish_reason(result),
            read_only=memory.read_only if memory else False,
        )
        if outcome.skipped is None:
            # As Mastra 1.71: a next turn started right away stamps its input "now", which could otherwise
            # fall in the same millisecond as this turn's last saved message and sort before it.
            await asyncio.sleep(_PAUSE_AFTER_SAVE_S)
        return message_list

    # --- the work, callable directly (the Kafka paths do) ------------------------------------------------

    async def recall(
        self,
        *,
        thread_id: str | None,
        resource_id: str | None,
        incoming: Sequence[Message],
        last_messages: LastMessages | UseDefault = USE_DEFAULT,
        budget: TokenBudget | None = None,
        system: Sequence[str] = (),
        read_only: bool = False,
        echo: EchoPlan | bool = False,
        counter: Callable[[Message], float] | None = None,
    ) -> RecallOutcome:
        """Build the context for a turn: recalled history plus `incoming`, ordered, deduplicated by id.

        With a token `budget` (not 0), recall is Mastra 1.71 Memory's: paged loading after the thread's
        boundary under the count cap and `maxTokens − atMaxRemoveTokens` (tool-linked groups whole), then the
        memory-only limiter (the `system` texts and the input count towards the budget), and the advanced
        boundary stored in the thread's metadata unless `read_only` (see `message_history.core.budget`).
        `echo` runs Mastra 1.71's `MemoryInputFilter` on `incoming` first (`message_history.core.echo`): a
        client's resent history is dropped from the input; the outcome's context holds what is left. Pass
        True to plan it here, or `plan_echo(incoming)` when the caller has it already (False: no filter).

        `last_messages`: the per-turn value (`None` = 40, `0` = nothing, `False` = all), or `USE_DEFAULT` for
        the processor's own. Without a thread id: no storage call, the context is `incoming` alone
        (docs/rules.md#r1). Otherwise one `get_thread` (a thread of another resource raises
        `ThreadOwnershipError`, nothing is recalled) and, unless the limit is 0, one `list_messages` filtered
        by thread and resource. The plan (`plan_recall`) and the decision (`recall_from`) are the recall
        path's, which loads a whole batch's reads at once; here they are read from the storage per turn.
        """
        last = self.last_messages if isinstance(last_messages, UseDefault) else last_messages
        limit = normalize_limit(last)
        if not thread_id:
            return RecallOutcome(context=build_context((), incoming), recalled=0, limit=limit)
        thread = await self.storage.get_thread(thread_id)
        check_owner(thread, thread_id, resource_id)
        plan = plan_echo(incoming) if echo is True else (echo or None)
        memory = TurnMemory(last, budget, read_only=read_only, retain_full_input=plan is None)
        needs = plan_recall(thread_id, resource_id, memory, plan, max_rows=self.max_rows)
        recalled = await recall_from(
            StorageReads(self.storage),
            needs,
            thread,
            incoming,
            plan,
            system=system,
            read_only=read_only,
            count=counter or CountCache(),
        )
        if recalled.update is not None:
            await self.storage.save_thread_metadata(thread_id, recalled.update)
        return recalled.outcome

    async def persist_turn(
        self,
        *,
        thread_id: str | None,
        resource_id: str | None,
        input: Sequence[Message],
        response: Sequence[Message],
        finish_reason: str | None = None,
        read_only: bool = False,
        request_id: str | None = None,
    ) -> PersistOutcome:
        """Save a turn's `input` (minus memory-sourced) then `response`, filtered (docs/rules.md#r4 to #r9).

        Messages without `threadId` / `resourceId` get the turn's; a message naming another thread or resource
        raises `InvalidInputError` before anything is written. The resource is `resource_id`, or the stored
        thread's owner, or the thread id (Mastra's fallback). Without a thread id: no storage call. When the
        rules skip the save: one `get_thread` (ownership, and the thread for the outcome). Otherwise one
        `save_messages`, which creates a missing thread and moves `updatedAt` forward
        (docs/rules.md#r9, #r10). With `message_id_keys` (the constructor's) and the turn's `request_id` and
        `resource_id`: an id derived for this turn that another thread holds is saved under its alternate
        (`_yield_taken_ids`); else such an id refuses the turn (`MessageIdTakenError`).
        """
        decision = select_for_persistence(
            input, response, finish_reason=finish_reason, read_only=read_only, has_thread=bool(thread_id)
        )
        if not thread_id:
            return PersistOutcome(saved_ids=[], skipped=decision.skipped, thread=None)
        if decision.skipped is None and self.message_id_keys and request_id and resource_id:
            saved = [m.id for m in decision.messages]
            swap = await self._yield_taken_ids(thread_id, resource_id, request_id, saved, input, response)
            if swap:
                input, response = with_ids(input, swap), with_ids(response, swap)
                decision = select_for_persistence(
                    input, response, finish_reason=finish_reason, read_only=read_only, has_thread=True
                )
        thread: Thread | None = None
        if decision.skipped is not None or resource_id is None:
            thread = await self.storage.get_thread(thread_id)
            check_owner(thread, thread_id, resource_id)
        if decision.skipped is not None:
            return PersistOutcome(saved_ids=[], skipped=decision.skipped, thread=thread)
        owner = resource_id or (thread.resourceId if thread is not None and thread.resourceId else thread_id)
        write = turn_write(decision, thread_id=thread_id, owner=owner, response=response)
        to_save = await self._merge_with_stored(thread_id, write)
        if not to_save:
            thread = thread or await self.storage.get_thread(thread_id)
            check_owner(thread, thread_id, resource_id)
            return PersistOutcome(saved_ids=[], skipped="nothing-to-save", thread=thread)
        saved_thread = await self.storage.save_messages(
            thread_id=thread_id, resource_id=owner, messages=to_save
        )
        return PersistOutcome(
            saved_ids=[m.id for m in to_save if m.id is not None],
            skipped=None,
            thread=saved_thread,
            messages=to_save,
        )

    async def _yield_taken_ids(
        self,
        thread_id: str,
        resource_id: str,
        request_id: str,
        saved: Sequence[str | None],
        input: Sequence[Message],
        response: Sequence[Message],
    ) -> dict[str, str]:
        """Derived id -> the id it is saved under: its alternate (`schemas.ids.alternate_message_id`, the
        current key), for each id the turn saves (`saved`) derived for it (`core.persist_plan.taken_derived`:
        input positions below the input's length) that another thread holds; an alternate made under a
        previous key and stored in this thread is kept instead (a replay after a rotation updates that row).
        One look-up of the derived-shaped ids across threads, one more only when one yields."""
        ids = may_be_derived(saved)
        if not ids:
            return {}
        homes = {m.id: m.threadId for m in await self.storage.get_messages(ids) if m.id is not None}
        taken = taken_derived(
            ids,
            lambda i: i in homes and homes[i] != thread_id,
            resource_id=resource_id,
            thread_id=thread_id,
            request_id=request_id,
            max_inputs=len(input),
            responses=len(response),
        )
        keys = self.message_id_keys
        swap = alternates(taken, keys)
        olds = [old for derived in swap for old in previous_alternates(derived, keys)]
        if olds:
            stored = {m.id for m in await self.storage.get_messages(olds, thread_ids=(thread_id,))}
            kept = kept_alternates(swap, keys, stored.__contains__)
            swap = {derived: kept.get(current, current) for derived, current in swap.items()}
        return swap

    async def _merge_with_stored(self, thread_id: str, write: TurnWrite) -> list[Message]:
        """Fold the turn into its stored copies (`tool_state.merge_turn`): one lookup by id, one latest row
        when the turn may continue it (the plan and decision of `core.persist_plan`, read per turn here).

        Only this thread's copies are looked up. A turn carrying an id stored in another thread is refused
        by the save itself (`MessageIdTakenError`): an id never lets one thread, or one resource, overwrite
        another's message (Mastra's processors would).
        """
        reads = OneTurnReads()
        for _ in range(MAX_READS + 1):
            need = decide_turn(write, reads)
            if not isinstance(need, NeedsRead):
                return need.messages
            if need.copies is not None:
                ids = list(need.copies)
                with unreadable.collecting("other") as ledger:
                    reads.copies = await self.storage.get_messages(ids, thread_ids=(thread_id,))
                error = ledger.unreadable(thread_id, ids)
                if error is not None:  # its own stored copy is a row no Mastra would read: never written over
                    raise error
            if need.latest:
                latest = await self.storage.list_messages(thread_id, resource_id=None, limit=1)
                reads.latest, reads.latest_read = (latest[0] if latest else None), True
        raise RuntimeError(f"the persist decision still needs a read after {MAX_READS}: {need}")
