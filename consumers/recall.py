"""The recall path's batch handler: `agent.requests` in, `agent.requests.enriched` out.

Per batch: decode every record (a bad one is a dead letter) and plan its reads (`plan_recall`), load the
batch's threads, pages and look-ups in one concurrent round trip (under a token budget, then the pages every
budgeted thread needs: one round trip per paging round for the whole batch; `consumers.prefetch`), then per
request the decision (a plain page on its bytes, else the library's `recall_from` on the loaded reads) and
one `EnrichedRequest` sent without waiting; the loop gathers the acknowledgements. Requests of one thread
run in batch order, so their enriched events leave in the order the requests came. Token boundaries the
memory-only limiter advanced go to a write-only buffer, written with one round trip at the end of the batch.

Each request's thread row (prefetched) is checked first: a request of another resource is a dead letter
(`ThreadOwnershipError`) before any gate, wait or look-up of the owner's turns. With a `TurnGate` (the turn
barrier, the busy-thread policy; `consumers/turn_gate.py`), its per-batch look-ups run beside the prefetch; a
request that must wait, and every later request of a thread that has one parked, is parked in its thread's
lane (`consumers.parking`) and answered with a `Parked` the loop settles in the background: there it waits,
is recalled from MongoDB (the prefetch may predate the turn it waited for; its thread's boundary recorded
earlier in the batch is written first, and its own is written directly) and sent. The others pass `admit` at
once; a refused one is a dead letter. A thread is marked busy while its enriched event is sent (the mark is
part of the record's acknowledgement).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from consumers.contract import Ack, Done, Emit, Parked, Record, Refused, Result
from consumers.handler import PathHandler
from consumers.lanes import Failed
from consumers.observe_recall import ObservationRecall
from consumers.parking import Lane, LaneKey, ParkedLanes
from consumers.prefetch import PrefetchedHistory, RawRecallStorage
from consumers.runtime.containment import decode_each
from consumers.runtime.retry import Backoff
from consumers.turn_gate import GO, Admission, BatchGate, TurnGate
from message_history import metrics, tracing
from message_history.core.echo import EchoPlan, plan_echo
from message_history.core.memory_options import MemoryDefaults, TurnMemory, turn_memory
from message_history.core.recall_plan import PlainPage, RecallNeeds, plain_page, plan_recall
from message_history.core.rules import build_context, check_owner
from message_history.core.turn_rules import TurnMarker, foreign_pending
from message_history.errors import InvalidInputError, RetriableError, ThreadOwnershipError
from message_history.processor import MessageHistory, RecallOutcome
from message_history.settings import Settings, settings_slice
from producers.enriched import EnrichedPublisher
from producers.output import Headers
from schemas.codec import decode_request, keyed_by_thread
from schemas.events import AgentRequest, EnrichedRequest
from schemas.recalled import encode_enriched, encode_enriched_fragment, materialized
from storage import unreadable
from storage.protocol import BatchHistoryStorage, RecallQuery

# `turn_memory` is looked up here per record (tests patch it)
__all__ = ["PATH", "RecallHandler", "turn_memory"]

log = logging.getLogger(__name__)

PATH = "recall"


@dataclass(frozen=True, slots=True)
class _Item:
    record: Record
    request: AgentRequest
    memory: TurnMemory
    echo: EchoPlan | None  # the client-echo filter's plan (None: the input is kept whole), made once
    needs: RecallNeeds


class RecallHandler(PathHandler[EnrichedPublisher]):
    """Enriches a batch of requests with their threads' history."""

    path = PATH

    def __init__(
        self,
        settings: Settings,
        storage: BatchHistoryStorage,
        publisher: EnrichedPublisher,
        *,
        gate: TurnGate | None = None,
        write_boundaries: bool = True,
        fast_recall: bool = True,
        raw_rows: RawRecallStorage | None = None,
        observation: ObservationRecall | None = None,
    ) -> None:
        super().__init__(settings, storage, publisher)
        self._observation = observation  # Observational Memory's log in the context (None: off)
        self.fast_recall = fast_recall  # False: every request through the processor (the reference route)
        # the storage's byte reads, when it has them (`app.capabilities`): plain pages read as bytes
        self.raw_rows = raw_rows
        self._gate = gate
        self._defaults = settings_slice(MemoryDefaults, settings)
        self.max_rows = settings.max_rows_per_request  # the most rows one request's recall reads
        self._write_boundaries = write_boundaries  # False for a dry-run replay: recall, but change nothing
        # requests that must wait, parked in their thread's lane (see `consumers.parking`)
        self.parking: ParkedLanes[TurnMarker | None] = ParkedLanes(
            path=PATH,
            capacity=settings.max_in_flight_threads,
            backoff=Backoff(settings.retry_initial_backoff_s, settings.retry_max_backoff_s, random.random),
            stop=gate.stop if gate is not None else None,
        )

    def _decode(self, record: Record, value: bytes) -> _Item:
        request = keyed_by_thread(record.key, decode_request(value, self.limits))
        memory = turn_memory(request, self._defaults)
        echo = None if memory.retain_full_input else plan_echo(request.messages)
        needs = plan_recall(request.threadId, request.resourceId, memory, echo, max_rows=self.max_rows)
        return _Item(record, request, memory, echo, needs)

    async def _handle(self, records: Sequence[Record], spans: tracing.BatchSpans, emit: Emit) -> list[Result]:
        """decode -> load -> per thread (decide, send) -> write (the boundaries) -> the results.

        Each enriched event says how many of its thread's stored rows the batch's reads skipped (the
        ledger `PathHandler.handle` opens, `storage.unreadable`)."""
        started = time.perf_counter()
        self.parking.begin_batch()
        results, items = decode_each(records, spans, self._decode)
        decoded = time.perf_counter()
        metrics.STAGE_SECONDS.labels(path=PATH, stage="decode").observe(decoded - started)
        batch = await self._load(items, spans, emit)
        metrics.STAGE_SECONDS.labels(path=PATH, stage="recall").observe(time.perf_counter() - decoded)
        sent_from = time.perf_counter()
        outcomes = await self._enrich_all(items, batch)
        metrics.STAGE_SECONDS.labels(path=PATH, stage="build").observe(time.perf_counter() - sent_from)
        return self._results(records, results, items, outcomes, spans, batch.history)

    async def _load(
        self, items: Sequence[tuple[int, _Item]], spans: tracing.BatchSpans, emit: Emit
    ) -> _Batch:
        """The batch's reads, once: threads, pages and echo look-ups, beside the turn gate's look-ups."""
        history, batch_gate = await asyncio.gather(
            PrefetchedHistory.load(
                self.storage,
                [self._query(item) for _, item in items],
                raw=self.raw_rows if self.fast_recall else None,
            ),
            self._open_gate(items),
        )
        return _Batch(self, spans, history, batch_gate, emit)

    def _results(
        self,
        records: Sequence[Record],
        results: list[Result | None],
        items: Sequence[tuple[int, _Item]],
        outcomes: Sequence[Done | Parked | Failed],
        spans: tracing.BatchSpans,
        history: PrefetchedHistory,
    ) -> list[Result]:
        """Each record's result, in record order."""
        for (index, _), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Failed):
                assert isinstance(outcome.error, InvalidInputError)
                results[index] = Refused(outcome.error)
                spans.fail(index, outcome.error)
            else:
                results[index] = outcome
        _count_enriched(outcomes)
        if history.misses:
            log.debug("recall prefetch missed", extra={"path": PATH, "misses": history.misses})
        done = [r for r in results if r is not None]
        assert len(done) == len(records)  # every record decoded-and-enriched or refused
        return done

    async def _enrich(self, batch: _Batch, entry: tuple[int, _Item]) -> Done | Parked:
        """One request, in its thread's order: ownership, the gate (park, refuse, retry or go), the
        decision (a plain page from its bytes, else the processor), the busy mark, the send."""
        index, item = entry
        request = item.request
        spans, history, batch_gate = batch.spans, batch.history, batch.gate
        spans.identify(index, request.requestId)
        # ownership first: a foreign request never waits in the owner's lane nor learns its pending turn
        await self._refuse_foreign(item, history, batch_gate)
        admission = GO
        if batch_gate is not None:
            key = (item.record.partition, request.threadId)
            if self.parking.holds(key) or batch_gate.must_wait(*key, request.requestId):
                headers = spans.headers(index, item.record)
                parked = self._park(key, item, batch_gate, batch, headers)
                spans.end_when_done(index, parked.settled)
                return parked
            admission = await batch_gate.admit(item.record.partition, request.threadId, request.requestId)
            if admission.refused is not None:
                raise admission.refused
            if admission.retry is not None:
                return Done(_failed(admission.retry))
        enriched = await self._decide(batch, item, admission)
        mark = (
            batch_gate.enriched(request.threadId, request.requestId, request.resourceId)
            if batch_gate
            else None
        )
        ack = await self._publish(batch.emit, item, enriched, spans.headers(index, item.record))
        spans.end_when_done(index, ack)
        return Done(
            ack if batch_gate is None else batch_gate.sent(request.threadId, request.requestId, mark, ack)
        )

    async def _decide(self, batch: _Batch, item: _Item, admission: Admission) -> EnrichedRequest | bytes:
        """The request's enriched event, from what the batch loaded (or, after a wait, from MongoDB)."""
        history = batch.history
        if admission.fresh:
            await history.flush(item.request.threadId)  # the boundaries this batch moved, before reading
        else:
            plain = self._plain(item, history, admission)
            if plain is not None:
                return plain
        if admission.fresh:
            outcome = await self._recall(batch.fresh, item)
        else:
            outcome = await history.recall(
                item.needs, item.request.messages, item.echo, read_only=self._read_only(item)
            )
        metrics.RECALLED_MESSAGES.observe(outcome.recalled)
        return self._enriched(item.request, outcome, admission)

    async def _enrich_all(
        self, items: Sequence[tuple[int, _Item]], batch: _Batch
    ) -> list[Done | Parked | Failed]:
        """`enrich` per thread, the batch's busy marks (one bulk write, started), then the batch's boundary
        writes (one round trip, before any offset commits); `batch.flushed` is set after them. When either
        fails the loop tries the whole batch again, so what it parked is dropped first (parked again)."""
        try:
            try:
                outcomes = await self.per_thread(items, lambda item: item.request.threadId, batch.enrich)
            finally:
                batch.write_marks()  # the marks of what was sent, also when the batch fails after a send
            await batch.history.flush()
        except BaseException:
            await self.parking.abort_batch()
            raise
        batch.flushed.set()
        return outcomes

    async def _refuse_foreign(
        self, item: _Item, history: PrefetchedHistory, batch_gate: BatchGate | None
    ) -> None:
        """Raise `ThreadOwnershipError` for a request on another resource's thread: its stored owner (the
        prefetched row), or, for a thread not saved yet, the resource with a turn pending on it."""
        request = item.request
        thread = await history.get_thread(request.threadId)
        check_owner(thread, request.threadId, request.resourceId)
        if thread is not None or batch_gate is None or request.resourceId is None:
            return
        key = (item.record.partition, request.threadId)
        marker = self.parking.last_state(key, batch_gate.markers.get(request.threadId))
        owner = foreign_pending(marker, request.resourceId, abandoned_before=batch_gate.abandoned_before)
        if owner is not None:
            raise ThreadOwnershipError(request.threadId, request.resourceId, owner)

    def _park(
        self,
        key: LaneKey,
        item: _Item,
        batch_gate: BatchGate,
        batch: _Batch,
        headers: Headers,
    ) -> Parked:
        """Park a request that must wait behind its thread's parked work; the loop settles it later.

        When its lane reaches it, it waits (its partition's barrier target as its batch saw it, its thread's
        marker as the lane last left it), is recalled from MongoDB once its batch's boundary writes are done
        (its batch's prefetch predates the wait, and a boundary the batch recorded for the thread must neither
        be missed nor written back over the one this recall moves), marks its thread and is sent.
        `waitedMs` counts from when it was parked.
        """
        partition, thread_id = key
        request = item.request
        target = batch_gate.behind.get(partition)
        parked_at = time.monotonic()
        gate = batch_gate.gate
        fresh, flushed, marked, emit = batch.fresh, batch.flushed, batch.marked, batch.emit

        async def work(lane: Lane[TurnMarker | None]) -> Ack:
            # its batch's busy marks first: a wait for the thread's pending turn reads the stored markers,
            # which must hold the mark its batch made for the turn before it
            await marked.wait()
            own = gate.for_parked(partition, target, thread_id, lane.state)
            admission = await own.admit(partition, thread_id, request.requestId)
            if admission.refused is not None:
                raise admission.refused
            if admission.retry is not None:
                raise admission.retry
            waited = round((time.monotonic() - parked_at) * 1000)
            admission = dataclasses.replace(admission, fresh=True, waited_ms=max(admission.waited_ms, waited))
            lane.state = own.markers.get(thread_id, lane.state)
            # the boundaries its batch moved, before reading them (and never written back over its own)
            await flushed.wait()
            outcome = await self._recall(fresh, item)
            enriched = self._enriched(request, outcome, admission)
            metrics.RECALLED_MESSAGES.observe(outcome.recalled)
            mark = own.enriched(thread_id, request.requestId, request.resourceId)
            lane.state = own.markers.get(thread_id, lane.state)
            ack = await self._publish(emit, item, enriched, headers)
            metrics.OUTCOMES.labels(path=PATH, outcome="enriched").inc()
            return own.sent(thread_id, request.requestId, mark, ack)

        return self.parking.park(key, work, batch_gate.markers.get(thread_id))

    def _read_only(self, item: _Item) -> bool:
        return item.memory.read_only or not self._write_boundaries

    async def _recall(self, processor: MessageHistory, item: _Item) -> RecallOutcome:
        """The library's recall of one request from MongoDB (after a wait), with its memory options and
        echo plan."""
        request = item.request
        return await processor.recall(
            thread_id=request.threadId,
            resource_id=request.resourceId,
            incoming=request.messages,
            last_messages=item.memory.last_messages,
            budget=item.memory.budget,
            read_only=self._read_only(item),
            echo=item.echo or False,
        )

    def _plain(self, item: _Item, history: PrefetchedHistory, admission: Admission) -> bytes | None:
        """The enriched event of a plain request decided on its page's bytes (`plain_page`), or None when
        the processor must decide it (a page that does not qualify, or one not read as bytes)."""
        needs = item.needs
        if not needs.plain or not self.fast_recall or not self.publisher.sends_encoded:
            return None
        assert needs.limit is not None  # a plain request has a count cap
        read = needs.read_limit
        assert read is not None
        request = item.request
        incoming = [message for message, _ in build_context((), request.messages)]
        # the page decided natively on its bytes where it can be, else on its rows (the reference)
        fused = history.plain_page_of(needs.thread_id, needs.resource_id, read, needs.limit, incoming)
        page: PlainPage | None
        if fused is not None:
            page, count = fused
        else:
            rows = history.plain(needs.thread_id, needs.resource_id, read)
            if rows is None:
                return None
            page, count = plain_page(rows, needs.limit, incoming), len(rows)  # the page: the first `limit`
        if page is None:
            return None
        metrics.RECALLED_MESSAGES.observe(page.recalled)
        return encode_enriched_fragment(
            request,
            page.runs,
            incoming,
            recalled=page.recalled,
            limit=needs.limit,
            complete=admission.complete,
            waited_ms=admission.waited_ms,
            tokens=None,
            trimmed=[],
            boundary=None,
            truncated=needs.cut(count),
            skipped=_skipped(request.threadId, needs.limit),
        )

    def _enriched(
        self, request: AgentRequest, outcome: RecallOutcome, admission: Admission
    ) -> EnrichedRequest | bytes:
        """The enriched event: as bytes (recalled rows spliced) when the publisher only sends it."""
        summary: dict[str, Any] = {
            "recalled": outcome.recalled,
            "limit": outcome.limit,
            "complete": admission.complete,
            "waited_ms": admission.waited_ms,
            "tokens": outcome.tokens,
            "trimmed": outcome.trimmed,
            "boundary": outcome.boundary.to_metadata() if outcome.boundary is not None else None,
            "truncated": outcome.truncated,
            "skipped": _skipped(request.threadId, None if outcome.tokens is not None else outcome.limit),
        }
        if self.publisher.sends_encoded:
            return encode_enriched(request, outcome.context, **summary)
        return EnrichedRequest.from_request(request, materialized(outcome.context), **summary)

    async def _publish(
        self, emit: Emit, item: _Item, enriched: EnrichedRequest | bytes, headers: Headers
    ) -> asyncio.Future[Any]:
        """The request's enriched event, through its batch's `emit`."""
        record, publisher = item.record, self.publisher
        if self._observation is not None and self._observation.wants(
            item.request
        ):  # consumers.observe_recall
            enriched = await self._observation.enrich(item.request, enriched)
        if isinstance(enriched, bytes):
            thread_id = item.request.threadId
            return await publisher.publish_encoded(emit, record, thread_id, enriched, headers=headers)
        return await publisher.publish(emit, record, enriched, headers=headers)

    async def _open_gate(self, items: Sequence[tuple[int, _Item]]) -> BatchGate | None:
        if self._gate is None or not items:
            return None
        started = time.perf_counter()
        gate = await self._gate.open_batch(
            [(i.record.partition, i.request.threadId) for _, i in items], defer_marks=True
        )
        metrics.STAGE_SECONDS.labels(path=PATH, stage="barrier").observe(time.perf_counter() - started)
        return gate

    def _query(self, item: _Item) -> RecallQuery:
        needs = item.needs
        limit = needs.limit if needs.budget is not None else needs.read_limit
        return RecallQuery(
            needs.thread_id, needs.resource_id, limit, needs.budget, needs.lookup, needs.max_rows
        )


class _Batch:
    """One batch's loaded inputs, its turn gate, and the library's processor over MongoDB (for a request
    that waited: its batch's load predates the turn it waited for)."""

    def __init__(
        self,
        handler: RecallHandler,
        spans: tracing.BatchSpans,
        history: PrefetchedHistory,
        gate: BatchGate | None,
        emit: Emit,
    ) -> None:
        last = handler._defaults.last_messages
        self.emit = emit  # where its outputs go (the loop's checkpoint's channel)
        self.spans = spans
        self.history = history
        self.gate = gate
        self.fresh = MessageHistory(storage=handler.storage, last_messages=last, max_rows=handler.max_rows)
        self.flushed = asyncio.Event()  # the boundary writes are done: a parked recall reads after them
        self.marked = asyncio.Event()  # the busy marks' write is settled: a parked request waits after it
        self._handler = handler

    def write_marks(self) -> None:
        """Start the busy marks the batch's requests made (held by its gate: one bulk write for the batch);
        `marked` is set once they are settled."""
        if self.gate is None:
            self.marked.set()
            return
        self.gate.write_marks().add_done_callback(lambda _: self.marked.set())

    async def enrich(self, entry: tuple[int, _Item]) -> Done | Parked:
        return await self._handler._enrich(self, entry)


def _skipped(thread_id: str, limit: int | None) -> int:
    """The thread's stored rows a recall of its newest `limit` rows (None: a token-budgeted recall, all the
    batch read of it) left out: noted by the batch's reads (none outside a batch's ledger)."""
    if limit == 0:
        return 0
    ledger = unreadable.current()
    return ledger.skipped(thread_id, limit) if ledger is not None else 0


def _count_enriched(outcomes: Sequence[Done | Parked | Failed]) -> None:
    """OUTCOMES for a batch's enriched events (a parked one counts when sent): one label look-up per
    batch, not per record."""
    enriched = sum(1 for outcome in outcomes if isinstance(outcome, Done))
    if enriched:
        metrics.OUTCOMES.labels(path=PATH, outcome="enriched").inc(enriched)


async def _failed(error: RetriableError) -> object:
    """An acknowledgement that fails with `error`: the loop retries the record (or leaves it, stopping)."""
    raise error
