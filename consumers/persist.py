"""The persist path's batch handler: `agent.responses` in, MongoDB written, `agent.history.persisted` out.

Named steps per batch (issue 25): **decode** every record (a bad one, or one not keyed by its `threadId`, is
a dead letter; forgotten turns set aside), **load** what the batch's read plan says (`core.persist_plan`:
threads, stored copies, newest rows, and on MongoDB the homes the write's ownership check needs, one round
trip; the copy under a pre-0.1.0 id is kept by the turn: `_keep_legacy_ids`), decide **per thread** with the
same decision functions as `MessageHistory.persist_turn` (responses of one thread in batch order), **write**
the batch buffer (`consumers.collect.PersistBuffer`, one `save_many`; every outcome final when it returns),
and **emit** one `HistoryPersisted` per response. A turn refused for ownership (its thread's, or a message
id stored in another thread), by the decision or by the write, is a dead letter. With busy markers
(`storage/turns.py`), one more bulk write after the flush records the batch's turns as answered, beside the
`HistoryPersisted` sends and part of their acknowledgements.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Protocol, runtime_checkable

from consumers.collect import Loaded, PersistBuffer, ReadsForSaves, Slot, load_batch
from consumers.contract import Ack, Done, Emit, Record, Refused, Result, ack_after
from consumers.handler import PathHandler
from consumers.lanes import Failed
from consumers.observe_emit import ObservationEmitter
from consumers.runtime.containment import contain, containable, decode_each
from message_history import metrics, tracing
from message_history.core.persist_plan import (
    MAX_READS,
    Decided,
    NeedsRead,
    TurnWrite,
    alternates,
    batch_needs,
    decide_turn,
    kept_alternates,
    plan_persist,
    previous_alternates,
    replace_ids,
    saved_ids,
    saved_input,
    taken_derived_ids,
    turn_write,
)
from message_history.core.rules import PersistDecision, SkipReason, check_owner, select_for_persistence
from message_history.errors import InvalidInputError
from message_history.settings import Settings
from producers.persisted import PersistedPublisher
from schemas.codec import decode_response, keyed_by_thread, persisted_value
from schemas.events import AgentResponse, Skipped
from storage.document_size import check_document_sizes, may_exceed
from storage.protocol import BatchHistoryStorage, Thread, TombstoneReader

PATH = "persist"

log = logging.getLogger(__name__)


class AnsweredTurns(Protocol):
    """What the persist path needs of `storage.turns.MongoTurnMarkers`: record that turns were answered."""

    async def answered(self, turns: dict[str, list[str]], *, existing_only: Set[str] = ...) -> None: ...


@runtime_checkable
class MessageHomes(Protocol):
    """A storage that tells the thread each stored id is in, reading ids and threads only (replay's; a
    capability passed in, `PersistHandler(homes=...)`)."""

    async def message_homes(self, message_ids: Collection[str]) -> dict[str, str | None]: ...


@dataclass(frozen=True, slots=True)
class _Item:
    record: Record
    response: AgentResponse


@dataclass(frozen=True, slots=True)
class _Done:
    """A turn's decision: the ids it saves (in save order) or why it saves nothing, and its buffer slot,
    whose result (the thread as written, or the write's refusal) is final once the buffer is flushed."""

    saved_ids: list[str]
    skipped: SkipReason | None
    slot: Slot


def _selected(response: AgentResponse) -> PersistDecision:
    """What the turn saves before it meets its stored copies (`rules.select_for_persistence`), or why it
    saves nothing."""
    return select_for_persistence(
        saved_input(response),
        response.response,
        finish_reason=response.finishReason,
        read_only=bool(response.memory and response.memory.readOnly),
        has_thread=True,
    )


class PersistHandler(PathHandler[PersistedPublisher]):
    """Saves a batch of finished turns with one bulk write."""

    path = PATH

    def __init__(
        self,
        settings: Settings,
        storage: BatchHistoryStorage,
        publisher: PersistedPublisher,
        *,
        tombstones: TombstoneReader | None = None,
        markers: AnsweredTurns | None = None,
        id_keys: Sequence[bytes] = (),
        save_reads: ReadsForSaves | None = None,
        homes: MessageHomes | None = None,
        observation: ObservationEmitter | None = None,
    ) -> None:
        """`save_reads`, `homes`: what the storage can do beyond `BatchHistoryStorage` (the same storage,
        decided once when wired: `message_history.app.capabilities`)."""
        super().__init__(settings, storage, publisher)
        self._save_reads = save_reads
        self._message_homes = homes
        self._tombstones = tombstones  # forgotten threads/resources (None: nothing is ever forgotten)
        self._markers = markers
        # the deployment's message-id keys, current first (`storage.message_id_keys`); none: a derived id
        # another thread holds refuses its turn, as an id a client chose does
        self._id_keys = tuple(id_keys)
        self._observation = observation  # Observational Memory's work after the save (None: off)

    async def _handle(self, records: Sequence[Record], spans: tracing.BatchSpans, emit: Emit) -> list[Result]:
        """A turn whose own stored copy is a row the batch's reads skipped (`storage.unreadable`) is refused
        (`PersistBuffer.copies_now`), naming the row."""
        started = time.perf_counter()
        results, items = decode_each(records, spans, self._decode)
        decoded = time.perf_counter()
        metrics.STAGE_SECONDS.labels(path=PATH, stage="decode").observe(decoded - started)

        # the tombstone read beside the batch's reads, not before them: one round trip less per batch (a
        # forgotten turn's reads are loaded and unused; reads only, nothing of it is written or sent)
        (items, forgotten), loaded = await asyncio.gather(self._split_forgotten(items), self._load(items))
        buffer = PersistBuffer(self.storage, loaded, save_reads=self._save_reads)

        outcomes = await self._decide_all(buffer, items, spans)
        await buffer.flush()  # the one bulk write; an outage raises here and the batch is retried
        marks = self._mark_answered(items, outcomes, forgotten)
        metrics.STAGE_SECONDS.labels(path=PATH, stage="persist").observe(time.perf_counter() - decoded)

        await self._answer(emit, results, items, outcomes, forgotten, marks, spans)
        if self._observation is not None:  # Observational Memory: work for observers, after the save
            work = [(i, item.record, item.response) for i, item in items]
            await self._observation.after_save(results, work, emit)
        done = [r for r in results if r is not None]
        assert len(done) == len(records)  # every record persisted, skipped or refused
        return done

    async def _decide_all(
        self, buffer: PersistBuffer, items: Sequence[tuple[int, _Item]], spans: tracing.BatchSpans
    ) -> list[_Done | Failed]:
        """Every turn's decision, one thread's in batch order. From the batch's reads alone, in one pass
        without a task per thread (the lanes cost ~4 µs a turn); a turn that needs a read they lack (a plan
        miss), and its thread's later turns, go to `per_thread`, its lanes reading concurrently."""
        outcomes: list[_Done | Failed | None] = []
        waiting: set[str] = set()  # threads with a turn left to `per_thread`: their later turns follow it
        for index, item in items:
            response = item.response
            outcome: _Done | Failed | None = None
            if response.threadId not in waiting:
                spans.identify(index, response.requestId)
                try:
                    now = _decide_now(buffer, index, response)
                    outcome = None if isinstance(now, NeedsRead) else now
                except Exception as exc:
                    if not containable(exc):
                        raise
                    outcome = Failed(contain(exc, "process"))  # as `per_thread` contains it
            if outcome is None:
                waiting.add(response.threadId)
            outcomes.append(outcome)
        if waiting:
            await self._decide_late(buffer, items, outcomes, spans)
        decided = [o for o in outcomes if o is not None]
        assert len(decided) == len(items)  # every turn decided, now or late
        return decided

    async def _decide_late(
        self,
        buffer: PersistBuffer,
        items: Sequence[tuple[int, _Item]],
        outcomes: list[_Done | Failed | None],
        spans: tracing.BatchSpans,
    ) -> None:
        """The turns `_decide_all` left (None in `outcomes`), decided in their threads' lanes, filled in."""
        left = [(n, entry) for n, (entry, o) in enumerate(zip(items, outcomes, strict=True)) if o is None]

        async def decide(entry: tuple[int, tuple[int, _Item]]) -> _Done:
            index, item = entry[1]
            spans.identify(index, item.response.requestId)
            return await _decide(buffer, index, item.response)

        late = await self.per_thread(left, lambda entry: entry[1].response.threadId, decide)
        for (n, _), outcome in zip(left, late, strict=True):
            outcomes[n] = outcome

    async def _load(self, items: Sequence[tuple[int, _Item]]) -> Loaded:
        """What the batch's read plan says, in one round trip; each response then keeps the pre-0.1.0 ids
        its thread already stores."""
        needs = [plan_persist(item.response) for _, item in items]
        loaded = await load_batch(self.storage, batch_needs(needs), self._save_reads)
        for (_, item), need in zip(items, needs, strict=True):
            _keep_legacy_ids(item.response, need.legacy, loaded)
        if self._id_keys:
            await self._yield_taken_ids(items, loaded)
        return loaded

    async def _yield_taken_ids(self, items: Sequence[tuple[int, _Item]], loaded: Loaded) -> None:
        """A message whose id the service derived for its turn, and which another thread already holds (a
        tenant who predicted it stored a message under it first), is saved under its alternate instead
        (`schemas.ids.alternate_message_id`: keyed with the deployment's secret, the same on every replay),
        so that no one can make another's turn fail through ids it can compute. Holders: the stored rows
        (the homes the batch read for the write's ownership check) and the batch's earlier turns. The
        alternate's own reads are the buffer's plan misses (rare: only turns that met a taken id)."""
        homes = await self._homes(items, loaded)
        claimed: dict[str, str] = {}  # ids saved by the batch's earlier turns -> their thread
        swapped: list[tuple[AgentResponse, dict[str, str]]] = []
        for _, item in items:
            response = item.response
            thread = response.threadId

            def elsewhere(message_id: str, thread: str = thread) -> bool:
                if message_id in homes and homes[message_id] != thread:
                    return True
                return claimed.get(message_id, thread) != thread

            taken = taken_derived_ids(response, elsewhere, max_inputs=self.limits.max_messages_per_event)
            if taken:
                swap = alternates(taken, self._id_keys)
                replace_ids(response, swap)
                swapped.append((response, swap))
                log.warning(
                    "derived message ids held by another thread: saved under their alternates",
                    extra={"thread_id": thread, "request_id": response.requestId, "count": len(swap)},
                )
            for message_id in saved_ids(response):
                claimed.setdefault(message_id, thread)
        if swapped and len(self._id_keys) > 1:
            await self._keep_previous_alternates(swapped)

    async def _homes(self, items: Sequence[tuple[int, _Item]], loaded: Loaded) -> Mapping[str, str | None]:
        """The thread each stored id of the batch's turns is in: read with the batch on MongoDB (the write's
        ownership check), else one look-up across threads."""
        if loaded.save_reads is not None:
            return loaded.save_reads.homes
        ids = list(dict.fromkeys(i for _, item in items for i in saved_ids(item.response)))
        if not ids:
            return {}
        if self._message_homes is not None:  # replay's storage: ids and threads only
            return await self._message_homes.message_homes(ids)
        return {m.id: m.threadId for m in await self.storage.get_messages(ids) if m.id is not None}

    async def _keep_previous_alternates(
        self, swapped: Sequence[tuple[AgentResponse, dict[str, str]]]
    ) -> None:
        """After a key rotation: an alternate made under a previous key and stored in the turn's own thread is
        kept (a replay updates that row instead of adding a copy under the current key's alternate)."""
        keys = self._id_keys
        threads = list(dict.fromkeys(response.threadId for response, _ in swapped))
        ids = list(
            dict.fromkeys(i for _, swap in swapped for d in swap for i in previous_alternates(d, keys))
        )
        stored = {(m.threadId, m.id) for m in await self.storage.get_messages(ids, thread_ids=threads)}
        for response, swap in swapped:
            replace_ids(response, kept_alternates(swap, keys, partial(_in_thread, stored, response.threadId)))

    async def _answer(
        self,
        emit: Emit,
        results: list[Result | None],
        items: Sequence[tuple[int, _Item]],
        outcomes: Sequence[_Done | Failed],
        forgotten: Sequence[tuple[int, _Item]],
        marks: asyncio.Future[None] | None,
        spans: tracing.BatchSpans,
    ) -> None:
        """One `HistoryPersisted` per response (or its dead letter), into `results`; after the write, as
        every outcome: a retried batch sends them once."""
        for index, item in forgotten:
            ack = await self._answer_forgotten(emit, index, item, spans)
            results[index] = Done(ack if marks is None else ack_after(marks, ack))
        labels: list[str] = []
        for (index, item), outcome in zip(items, outcomes, strict=True):
            result = _failed(outcome) if isinstance(outcome, Failed) else _outcome(outcome)
            if isinstance(result, InvalidInputError):
                results[index] = Refused(result)
                spans.fail(index, result)
                continue
            response, (saved_ids, skipped, updated_at) = item.response, result
            _describe(spans, index, saved_ids, skipped)
            value = persisted_value(
                response, saved_ids=saved_ids, skipped=skipped, thread_updated_at=updated_at
            )
            headers = spans.headers(index, item.record)
            ack = await self.publisher.publish_value(
                emit, item.record, response.threadId, value, headers=headers
            )
            spans.end_when_done(index, ack)
            results[index] = Done(ack if marks is None else ack_after(marks, ack))
            labels.append("persisted" if skipped is None else f"skipped-{skipped}")
        _count_outcomes(labels)

    def _mark_answered(
        self,
        items: Sequence[tuple[int, _Item]],
        outcomes: Sequence[_Done | Failed],
        forgotten: Sequence[tuple[int, _Item]],
    ) -> asyncio.Future[None] | None:
        """The busy-thread markers' write for this batch's answers, started now; None when there is none.

        After the messages are written, so a request released by it sees them; beside the persisted events'
        sends, and part of their acknowledgements, so a failed write retries those records.
        """
        if self._markers is None:
            return None
        answered = _answered(items, outcomes)
        # a forgotten turn is answered too, so its thread does not stay busy, but forget removed its marker:
        # only one still there is updated (a thread answered in this batch too keeps its usual upsert)
        existing_only = {item.response.threadId for _, item in forgotten} - answered.keys()
        for _, item in forgotten:
            answered.setdefault(item.response.threadId, []).append(item.response.requestId)
        if not answered:
            return None
        return asyncio.ensure_future(self._markers.answered(answered, existing_only=existing_only))

    def _decode(self, record: Record, value: bytes) -> _Item:
        """The record's response, refused (`InvalidInputError`) when it cannot be stored as it is."""
        response = keyed_by_thread(record.key, decode_response(value, self.limits))
        if may_exceed(len(value)):
            # only events this large can hold such a message; the exact check dumps every content of what
            # the turn selects to save (never a system message, a transient signal, a recalled echo, a
            # read-only or failed turn's), as the processor selects it; the tool-state merge with stored
            # copies comes later and is not checked here
            decision = _selected(response)
            check_document_sizes(
                decision.messages,
                thread_id=response.threadId,
                resource_id=response.resourceId,
            )
        return _Item(record, response)

    async def _answer_forgotten(self, emit: Emit, index: int, item: _Item, spans: tracing.BatchSpans) -> Ack:
        response = item.response
        skipped = persisted_value(response, saved_ids=[], skipped="forgotten", thread_updated_at=None)
        headers = spans.headers(index, item.record)
        ack = await self.publisher.publish_value(
            emit, item.record, response.threadId, skipped, headers=headers
        )
        spans.end_when_done(index, ack)
        metrics.OUTCOMES.labels(path=PATH, outcome="skipped-forgotten").inc()
        return ack

    async def _split_forgotten(
        self, items: list[tuple[int, _Item]]
    ) -> tuple[list[tuple[int, _Item]], list[tuple[int, _Item]]]:
        """(turns to persist, forgotten turns): one tombstone read for the batch (see `Tombstones`)."""
        if self._tombstones is None or not items:
            return items, []
        tombstones = await self._tombstones.tombstones(
            thread_ids=list(dict.fromkeys(item.response.threadId for _, item in items)),
            resource_ids=list(dict.fromkeys(item.response.resourceId for _, item in items)),
        )
        if not tombstones.threads and not tombstones.resources:
            return items, []
        kept: list[tuple[int, _Item]] = []
        forgotten: list[tuple[int, _Item]] = []
        for entry in items:
            response = entry[1].response
            gone = tombstones.forgets(
                thread_id=response.threadId, resource_id=response.resourceId, created_at=response.createdAt
            )
            (forgotten if gone else kept).append(entry)
        return kept, forgotten


async def _decide(buffer: PersistBuffer, order: int, response: AgentResponse) -> _Done:
    """`_decide_now`, reading what the batch's reads lack first (a plan miss, counted by the buffer): the
    turn's selection made once, its decision asked again after each read."""
    write = _write_of(response)
    for reads_left in range(MAX_READS, -1, -1):
        decided = _decided(write, buffer)
        if not isinstance(decided, NeedsRead):
            return _take(buffer, order, response, decided)
        if not reads_left:
            break
        await buffer.read(response.threadId, decided)
    raise RuntimeError(f"the persist decision still needs a read after {MAX_READS}: {decided}")


def _decide_now(buffer: PersistBuffer, order: int, response: AgentResponse) -> _Done | NeedsRead:
    """One turn, as `MessageHistory.persist_turn` decides it (`select_for_persistence`, then the one
    decision `core.persist_plan.decide_turn`), from the batch's reads: the turn's write, or why it writes
    nothing, taken by the buffer; or, with nothing taken, the read it needs first. Refuses a thread owned
    by another resource (`ThreadOwnershipError`)."""
    decided = _decided(_write_of(response), buffer)
    return decided if isinstance(decided, NeedsRead) else _take(buffer, order, response, decided)


def _write_of(response: AgentResponse) -> TurnWrite | SkipReason:
    """What the turn writes before it meets its stored copies, or why it writes nothing."""
    decision = _selected(response)
    if decision.skipped is not None:
        return decision.skipped
    return turn_write(
        decision, thread_id=response.threadId, owner=response.resourceId, response=response.response
    )


def _decided(write: TurnWrite | SkipReason, reads: PersistBuffer) -> Decided | SkipReason | NeedsRead:
    return write if isinstance(write, str) else decide_turn(write, reads)


def _take(buffer: PersistBuffer, order: int, response: AgentResponse, decided: Decided | SkipReason) -> _Done:
    """The decision taken by the buffer: the turn's write, or its skip (after the ownership check)."""
    thread_id, resource_id = response.threadId, response.resourceId
    if isinstance(decided, Decided) and decided.messages:
        messages = decided.messages
        slot = buffer.write(order, thread_id=thread_id, resource_id=resource_id, messages=messages)
        return _Done([m.id for m in messages if m.id is not None], None, slot)
    skipped: SkipReason = "nothing-to-save" if isinstance(decided, Decided) else decided
    check_owner(buffer.thread(thread_id), thread_id, resource_id)
    return _Done([], skipped, buffer.skip(order, thread_id))


def _in_thread(stored: Set[tuple[str | None, str | None]], thread_id: str, message_id: str) -> bool:
    return (thread_id, message_id) in stored


def _failed(outcome: Failed) -> InvalidInputError:
    assert isinstance(outcome.error, InvalidInputError)  # per_thread fails a turn only with a refusal
    return outcome.error


def _keep_legacy_ids(response: AgentResponse, ids: Mapping[str, str], loaded: Loaded) -> None:
    """A message whose row is already stored in its thread under its pre-0.1.0 id keeps that id.

    So a replay (or a late redelivery) of a response written before ids were scoped to the tenant and thread
    updates the rows it made then instead of adding copies. Only the turn's own thread is looked at.
    """
    keep = {new: old for new, old in ids.items() if loaded.copy(response.threadId, old) is not None}
    replace_ids(response, keep)


def _outcome(done: _Done) -> tuple[list[str], Skipped | None, datetime | None] | InvalidInputError:
    """The outcome event's fields (saved ids, skipped, the thread's updatedAt), from the flushed buffer:
    the thread as written, or the write's refusal."""
    result = done.slot.result
    if isinstance(result, InvalidInputError):
        return result  # ThreadOwnershipError found by the write itself
    return done.saved_ids, done.skipped, result.updatedAt if isinstance(result, Thread) else None


def _describe(spans: tracing.BatchSpans, index: int, saved_ids: list[str], skipped: Skipped | None) -> None:
    span = spans.span(index)
    if span is not None:
        span.set_attribute("message_history.skipped", skipped or "")
        span.set_attribute("message_history.saved", len(saved_ids))


def _count_outcomes(labels: Sequence[str]) -> None:
    """OUTCOMES for a batch: one label look-up per distinct outcome, not per record."""
    for label, count in Counter(labels).items():
        metrics.OUTCOMES.labels(path=PATH, outcome=label).inc(count)


def _answered(items: Sequence[tuple[int, _Item]], outcomes: Sequence[_Done | Failed]) -> dict[str, list[str]]:
    """Request ids answered by this batch, per thread: every response decoded and not refused (saved,
    skipped, failed turns alike)."""
    turns: dict[str, list[str]] = {}
    for (_, item), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, Failed):
            continue
        if isinstance(outcome.slot.result, InvalidInputError):
            continue  # refused by the write itself (ownership)
        turns.setdefault(item.response.threadId, []).append(item.response.requestId)
    return turns
