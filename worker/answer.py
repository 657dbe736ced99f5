"""One turn, answered (`Answerer`): the enriched record decoded (an invalid one or a copy of an `eventId`
already answered is dropped), the user's handler called (whatever it raises, or a timeout, is a failed turn),
the `AgentResponse` sent and its acknowledgement awaited, retried while Kafka is out (the service's outage
policy and retry wait, `consumers.runtime.retry`); a response too large for Kafka is answered as a failed
turn. `worker.runner` runs turns in batches on the Kafka runtime."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final

from aiokafka import ConsumerRecord

from consumers.runtime.intake import Fetched
from consumers.runtime.retry import Backoff, Failure, retry_call, wait_to_retry
from message_history import tracing
from message_history.errors import InvalidInputError
from producers.output import OUTPUT_TOO_LARGE, Emit
from schemas.codec import decode_enriched, encode
from schemas.events import AgentResponse
from worker.turn import (
    FAILED,
    Reply,
    SeenEvents,
    Turn,
    build_response,
    failed_response,
    is_retry_later,
)

log = logging.getLogger("worker.runner")  # one logger for the worker's lines, as before the split

Handler = Callable[[Turn], Awaitable[Reply | str]]
"""The user's code: one turn in, its reply out (a string is one assistant text message)."""

PATH: Final = "worker"  # the runtime's name for the worker (metrics, logs)
RETRY_INITIAL_S: Final = 0.2
RETRY_MAX_S: Final = 5.0
_JITTER = random.Random()  # noqa: S311 -- retry jitter, not security


def backoff() -> Backoff:
    """The worker's retry backoff: the service's formula with its own bounds."""
    return Backoff(RETRY_INITIAL_S, RETRY_MAX_S, _JITTER.random)


@dataclasses.dataclass(slots=True)
class WorkerStats:
    """What the worker did since it started (for logs, tests, a metrics exporter of the user's)."""

    answered: int = 0
    failed: int = 0  # answered as failed turns (the handler raised or timed out)
    duplicates: int = 0  # dropped: the eventId was already answered
    invalid: int = 0  # skipped: not a valid EnrichedRequest
    retried: int = 0  # attempts the handler asked to redo later (RetryLater, or `retriable = True`)


@dataclasses.dataclass(slots=True)
class Answerer:
    """Answers one enriched record at a time (see the module docstring); counts in `stats`."""

    handler: Handler
    responses_topic: str
    clock: Callable[[], datetime]
    handler_timeout_s: float | None = None
    seen: SeenEvents = dataclasses.field(default_factory=SeenEvents)
    stats: WorkerStats = dataclasses.field(default_factory=WorkerStats)
    retry_later: tuple[float, float] = (1.0, 60.0)  # RetryLater's first and longest wait

    async def answer(self, record: Fetched, emit: Emit) -> None:
        """Answer `record`, its response through `emit` (`consumers.runtime.emit`: sent and acknowledged, or
        filed under the record's offset for its transaction)."""
        where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        try:
            event = decode_enriched(record.value if record.value is not None else b"")
        except InvalidInputError as exc:
            self.stats.invalid += 1
            log.error("not an EnrichedRequest: skipped", extra={**where, "reason": str(exc)})  # noqa: TRY400
            return
        if (record.partition, event.eventId) in self.seen:
            self.stats.duplicates += 1
            log.info("duplicate enriched request dropped", extra={**where, "event_id": event.eventId})
            return
        turn = Turn(event, record.partition, record.offset)
        ids = {"request_id": event.requestId, "thread_id": event.threadId}
        with tracing.output_span("agent turn", record, **{"messaging.message.id": event.requestId}) as span:
            response = await self.respond(turn, ids)
            headers = tracing.output_headers([(k, v or b"") for k, v in record.headers or ()], span)
            await self.send(emit, record, turn, response, headers)
        self.seen.add(record.partition, event.eventId)
        self.stats.answered += 1

    async def respond(self, turn: Turn, ids: dict[str, str]) -> AgentResponse:
        """The handler's reply as the response, or a failed turn's; a `RetryLater` (or `retriable = True`)
        backs off and calls the handler again for the same turn (the shutdown grace's end cancels the wait:
        left uncommitted)."""
        attempt = 0
        while True:
            try:
                if self.handler_timeout_s is None:
                    reply = await self.handler(turn)
                else:
                    reply = await asyncio.wait_for(self.handler(turn), self.handler_timeout_s)
                return build_response(turn, reply, now=self.clock())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the user's code: a failed turn (or a retry), never a stopped worker
                if not is_retry_later(exc):
                    self.stats.failed += 1
                    log.exception("handler failed: answering a failed turn", extra=ids)
                    return failed_response(turn, now=self.clock())
                attempt += 1
                delay = self._retry_later_delay(attempt, exc)
                self.stats.retried += 1
                log.warning(
                    "the handler asked to retry later: backing off, then the same turn again",
                    extra={**ids, "attempt": attempt, "delay_s": round(delay, 3), "error": repr(exc)},
                )
                await asyncio.sleep(delay)

    def _retry_later_delay(self, attempt: int, error: BaseException) -> float:
        """Doubling from the first wait up to the longest, equal jitter (as the TypeScript SDK's), and at
        least the error's `after_s`."""
        initial, maximum = self.retry_later
        ceiling = min(maximum, initial * 2 ** (attempt - 1))
        floor = float(getattr(error, "after_s", None) or 0.0)
        jittered: float = ceiling / 2 + _JITTER.random() * ceiling / 2
        return max(floor, jittered)

    async def send(
        self,
        emit: Emit,
        record: Fetched,
        turn: Turn,
        response: AgentResponse,
        headers: list[tuple[str, bytes]],
    ) -> None:
        """Emit the response and wait until it is durable (filed, exactly-once), retried while Kafka is out.
        A response too large for Kafka is answered as a failed turn."""
        sending = [response]  # a retry after an outage sends what the last try sent

        async def send() -> None:
            while True:
                try:
                    ack = await emit(
                        record,
                        self.responses_topic,
                        value=encode(sending[0]),
                        key=turn.thread_id.encode(),
                        headers=headers,
                    )
                    await ack
                    return  # noqa: TRY300 -- the loop's exit; the except redoes the send
                except OUTPUT_TOO_LARGE:
                    ids = {"request_id": turn.request_id}
                    if sending[0].finishReason == FAILED and not sending[0].response:
                        # even the bare input does not fit: nothing to say for this turn; the stream goes on
                        log.error("failed-turn response too large for Kafka: turn dropped", extra=ids)  # noqa: TRY400
                        return
                    log.error("response too large for Kafka: answering a failed turn", extra=ids)  # noqa: TRY400
                    self.stats.failed += 1
                    sending[0] = failed_response(turn, now=self.clock())

        async def wait(failure: Failure[None]) -> bool:
            said = "response not acknowledged, retrying"
            extra = {"request_id": turn.request_id, "attempt": failure.attempt}
            await wait_to_retry(
                PATH, "kafka", failure.delay, said, extra={**extra, "error": type(failure.error).__name__}
            )
            return False

        await retry_call(send, backoff=backoff(), wait=wait)

    async def refused(self, record: ConsumerRecord, error: BaseException, emit: Emit) -> object:
        """Exactly-once: the broker refused a response for its size (the topic's `max.message.bytes`): the
        turn is answered as failed instead, through `emit`, in the same transaction (as `send` does
        at-least-once)."""
        turn = Turn(decode_enriched(record.value or b""), record.partition, record.offset)
        log.error(
            "response refused by the broker for its size: answering a failed turn",
            extra={"request_id": turn.request_id, "partition": record.partition, "offset": record.offset},
        )
        self.stats.failed += 1
        failed = failed_response(turn, now=self.clock())
        key, value = turn.thread_id.encode(), encode(failed)
        return await emit(record, self.responses_topic, key=key, value=value, alone=True)
