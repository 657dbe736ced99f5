"""The persist path's batch handler: `agent.responses` in, MongoDB written, `agent.history.persisted` out.

Per batch: decode every record (a bad one is a dead letter), prefetch the batch's threads (one query), run
`MessageHistory.persist_turn` per response against a collecting storage (responses of one thread in batch
order), write every collected turn with one `save_many`, and only then send one `HistoryPersisted` per
response. A turn refused for thread ownership, by the collector or by `save_many`, is a dead letter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from consumers.lanes import Failed, run_lanes
from consumers.loop import Ack, record_headers
from message_history import metrics
from message_history.batch_storage import BatchHistoryStorage, CollectedTurn, CollectingHistory
from message_history.errors import EventValidationError, InvalidInputError
from message_history.processor import MessageHistory, PersistOutcome
from message_history.rules import with_source
from producers.persisted import PersistedPublisher
from schemas.events import AgentResponse, HistoryPersisted, decode_response
from schemas.limits import Limits
from schemas.messages import Message
from storage.protocol import Thread

PATH = "persist"


@dataclass(frozen=True, slots=True)
class _Item:
    record: Any  # aiokafka ConsumerRecord
    response: AgentResponse


@dataclass(frozen=True, slots=True)
class _Done:
    outcome: PersistOutcome
    saved: CollectedTurn | None  # this turn's write
    before: CollectedTurn | None  # the latest earlier write to the same thread in this batch


def turn_input(response: AgentResponse) -> list[Message]:
    """The response's input as plain messages carrying the `source` tag where the rules read it.

    `TurnMessage.source` is a declared field, while `rules.is_memory_sourced` reads the extra field: without
    this, recalled messages echoed back by the worker would be saved again (R6).
    """
    out: list[Message] = []
    for message in response.input:
        plain = message.to_message()
        out.append(with_source(plain, message.source) if message.source is not None else plain)
    return out


class PersistHandler:
    """Saves a batch of finished turns with one bulk write."""

    def __init__(
        self,
        *,
        storage: BatchHistoryStorage,
        publisher: PersistedPublisher,
        limits: Limits,
        max_in_flight_threads: int,
    ) -> None:
        self._storage = storage
        self._publisher = publisher
        self._limits = limits
        self._max_in_flight = max_in_flight_threads

    async def handle(self, records: Sequence[Any]) -> list[Ack | InvalidInputError]:
        started = time.perf_counter()
        results: list[Ack | InvalidInputError | None] = [None] * len(records)
        items: list[tuple[int, _Item]] = []
        for index, record in enumerate(records):
            try:
                if record.value is None:
                    raise EventValidationError("empty record (no value)")
                items.append((index, _Item(record, decode_response(record.value, self._limits))))
            except InvalidInputError as exc:
                results[index] = exc
        decoded = time.perf_counter()
        metrics.STAGE_SECONDS.labels(path=PATH, stage="decode").observe(decoded - started)

        # stored copies for the tool-state merge: of what may be saved (recalled messages never are, R6)
        message_ids = [
            m.id for _, item in items for m in item.response.input if m.id and m.source != "memory"
        ]
        message_ids += [m.id for _, item in items for m in item.response.response if m.id]
        no_user_input = [
            item.response.threadId
            for _, item in items
            if not any(m.role == "user" and m.source != "memory" for m in item.response.input)
        ]
        batch = await CollectingHistory.load(
            self._storage, [item.response.threadId for _, item in items], message_ids, no_user_input
        )
        last_write: dict[str, CollectedTurn] = {}

        async def persist(entry: tuple[int, _Item]) -> _Done:
            response = entry[1].response
            turn = batch.for_turn()
            before = last_write.get(response.threadId)
            outcome = await MessageHistory(storage=turn).persist_turn(
                thread_id=response.threadId,
                resource_id=response.resourceId,
                input=turn_input(response),
                response=response.response,
                finish_reason=response.finishReason,
                read_only=bool(response.memory and response.memory.readOnly),
            )
            if turn.saved is not None:
                last_write[response.threadId] = turn.saved
            return _Done(outcome, turn.saved, before)

        outcomes = await run_lanes(
            items,
            key=lambda entry: entry[1].response.threadId,
            work=persist,
            max_concurrent=self._max_in_flight,
            item_errors=(InvalidInputError,),
        )
        await batch.flush()  # the one bulk write; an outage raises here and the batch is retried
        written = time.perf_counter()
        metrics.STAGE_SECONDS.labels(path=PATH, stage="persist").observe(written - decoded)

        for (index, item), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Failed):
                assert isinstance(outcome.error, InvalidInputError)
                results[index] = outcome.error
                continue
            event = self._persisted(item.response, outcome)
            if isinstance(event, InvalidInputError):
                results[index] = event
                continue
            results[index] = await self._publisher.publish(event, headers=record_headers(item.record))
            label = "persisted" if event.skipped is None else f"skipped-{event.skipped}"
            metrics.OUTCOMES.labels(path=PATH, outcome=label).inc()
        done = [r for r in results if r is not None]
        assert len(done) == len(records)  # every record persisted, skipped or refused
        return done

    @staticmethod
    def _persisted(response: AgentResponse, done: _Done) -> HistoryPersisted | InvalidInputError:
        """The outcome event, from what `save_many` reported (or, when skipped, the thread as it stands)."""
        outcome = done.outcome
        if done.saved is not None:
            result = done.saved.result
            if isinstance(result, InvalidInputError):
                return result  # ThreadOwnershipError found by the write itself
            assert result is not None  # flushed
            return HistoryPersisted.for_response(
                response, saved_ids=outcome.saved_ids, skipped=None, thread_updated_at=result.updatedAt
            )
        thread = outcome.thread
        if done.before is not None and isinstance(done.before.result, Thread):
            thread = done.before.result  # an earlier turn of this batch wrote the thread: as written
        return HistoryPersisted.for_response(
            response,
            saved_ids=[],
            skipped=outcome.skipped,
            thread_updated_at=thread.updatedAt if thread is not None else None,
        )
