"""An observer worker for Observational Memory: `agent.memory.observe` in, `agent.memory.observed` out.

    async def observe(work: ObserveRequest) -> str:
        return await my_model(OBSERVER_PROMPT, work.activeObservations, work.messages)

    async with ObserverWorker(observer_handler(observe), bootstrap_servers="localhost:9092") as worker:
        await worker.run()  # until worker.stop()

`observer_handler(observe, reflect)` turns the user's functions into the answer to one work record (pure of
Kafka: tests and other loops call it directly): an `ObserveResult` echoing the claim (`recordId`,
`generation`, `cycle`) with the observations, the observed messages' ids and the newest one's `createdAt`;
a `ReflectResult` with the condensed log. Resource-scoped work (several threads' messages) calls `observe`
once per thread, on that thread's messages, and answers with `threads` (each thread's observations and
cursor). A function that raises answers with `error` (the service releases the claim; the thread's next
turn asks again). The service applies an answer once, to the claim it names, so
answering twice, or late, is harmless (docs/observational-memory.md).

`ObserverWorker` is the loop around it: at-least-once (offsets committed after the answers are acknowledged),
records in order, each answer keyed as its work record (the thread, or the resource).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from message_history.errors import InvalidInputError
from message_history.settings import Settings
from producers.connection import kafka_options
from schemas.codec import encode
from schemas.messages import Message, format_timestamp
from schemas.observational import (
    ObserveRequest,
    ObserveResult,
    ReflectRequest,
    ReflectResult,
    decode_work,
)

__all__ = ["Observation", "ObserverHandler", "ObserverWorker", "observer_handler"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Observation:
    """What an observer returns beside the text: Mastra's `<current-task>`, `<suggested-response>` and
    `<thread-title>` (kept in the thread's `metadata.mastra.om`, as Mastra keeps them; the title also made
    the thread's title unless `metadata.titlePinned`), and `extracted`: custom extractors' values by key
    (an extractor's slug), merged into the thread's `metadata.mastra.om.extracted` as Mastra merges its
    `observation.extract`' (JSON, at most `schemas.observational.EXTRACTED_MAX_BYTES` and
    `EXTRACTED_MAX_DEPTH`)."""

    observations: str
    current_task: str | None = None
    suggested_response: str | None = None
    thread_title: str | None = None
    extracted: Mapping[str, Any] | None = None


ObserveFn = Callable[[ObserveRequest], Awaitable[Observation | str]]
ReflectFn = Callable[[ReflectRequest], Awaitable[str]]
ObserverHandler = Callable[[ObserveRequest | ReflectRequest], Awaitable[ObserveResult | ReflectResult]]


def _echo(work: ObserveRequest | ReflectRequest) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": work.requestId,
        "createdAt": format_timestamp(datetime.now(UTC)),
        "scope": work.scope,
        "threadId": work.threadId,
        "resourceId": work.resourceId,
        "recordId": work.recordId,
        "generation": work.generation,
        "cycle": work.cycle,
    }


def _newest(messages: Sequence[Message], fallback: datetime) -> str:
    dates = [m.createdAt for m in messages if m.createdAt is not None]
    return format_timestamp(max(dates) if dates else fallback)


def _by_thread(work: ObserveRequest) -> list[tuple[str, list[Message]]]:
    """A resource's work split by thread, in the order the threads come (the service sends the oldest
    thread first), each thread's messages in order; a message without a thread is the work's own."""
    threads: dict[str, list[Message]] = {}
    for message in work.messages:
        threads.setdefault(message.threadId or work.resourceId, []).append(message)
    return list(threads.items())


def _found(answer: Observation | str) -> dict[str, Any]:
    found = answer if isinstance(answer, Observation) else Observation(answer)
    values: dict[str, Any] = {"observations": found.observations}
    if found.current_task is not None:
        values["currentTask"] = found.current_task
    if found.suggested_response is not None:
        values["suggestedResponse"] = found.suggested_response
    if found.thread_title is not None:
        values["threadTitle"] = found.thread_title
    if found.extracted is not None:
        values["extracted"] = dict(found.extracted)
    return values


def observer_handler(observe: ObserveFn, reflect: ReflectFn | None = None) -> ObserverHandler:
    """The answer to one work event from the user's `observe` (and `reflect`); see the module docstring."""

    async def handle(work: ObserveRequest | ReflectRequest) -> ObserveResult | ReflectResult:
        if isinstance(work, ReflectRequest):
            return await _reflect(work)
        return await _observe(work)

    async def _observe(work: ObserveRequest) -> ObserveResult:
        ids = [m.id for m in work.messages if m.id is not None]
        values: dict[str, Any] = {
            **_echo(work),
            "type": "ObserveResult",
            "observedMessageIds": ids,
            "lastObservedAt": _newest(work.messages, work.createdAt),
            "observations": "",
        }
        try:
            if work.scope == "resource":
                values["threads"] = [
                    await _thread(work, thread, messages) for thread, messages in _by_thread(work)
                ]
                return ObserveResult.model_validate(values)
            # built here too: an answer the service would refuse (a title or `extracted` past its bounds)
            # answers `error`, rather than stopping the worker or sending a dead letter
            return ObserveResult.model_validate({**values, **_found(await observe(work))})
        except Exception as exc:  # noqa: BLE001 -- the user's model failed: the service releases the claim
            log.warning("observer failed", exc_info=True, extra={"thread_id": work.threadId})
            values.pop("threads", None)
            values["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            return ObserveResult.model_validate(values)

    async def _thread(work: ObserveRequest, thread: str, messages: list[Message]) -> dict[str, Any]:
        """Resource scope: `observe` called on one thread's messages (the log as it is), its answer that
        thread's entry of `threads` (the thread's cursor: its newest observed message)."""
        answer = await observe(work.model_copy(update={"messages": messages}))
        return {"threadId": thread, "lastObservedAt": _newest(messages, work.createdAt), **_found(answer)}

    async def _reflect(work: ReflectRequest) -> ReflectResult:
        values: dict[str, Any] = {**_echo(work), "type": "ReflectResult", "reflection": ""}
        if reflect is None:
            values["error"] = "this observer does not reflect"
            return ReflectResult.model_validate(values)
        try:
            values["reflection"] = await reflect(work)
        except Exception as exc:  # noqa: BLE001 -- the user's model failed: the service releases the claim
            log.warning("reflector failed", exc_info=True, extra={"thread_id": work.threadId})
            values["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        return ReflectResult.model_validate(values)

    return handle


class ObserverWorker:
    """The Kafka loop around an `ObserverHandler` (at-least-once; see the module docstring)."""

    def __init__(
        self,
        handler: ObserverHandler,
        *,
        bootstrap_servers: str = "127.0.0.1:9092",
        group_id: str = "message-history-observer",
        work_topic: str = "agent.memory.observe",
        results_topic: str = "agent.memory.observed",
        settings: Settings | None = None,
    ) -> None:
        self._handler = handler
        self._settings = settings or Settings(kafka_bootstrap_servers=bootstrap_servers)
        self._group_id = group_id
        self._work_topic = work_topic
        self._results_topic = results_topic
        self._stop = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.answered = 0

    @classmethod
    def from_settings(
        cls, handler: ObserverHandler, settings: Settings, *, group_id: str = "message-history-observer"
    ) -> ObserverWorker:
        """A worker on the service's topics and connection settings."""
        return cls(
            handler,
            group_id=group_id,
            work_topic=settings.observe_requests_topic,
            results_topic=settings.observe_results_topic,
            settings=settings,
        )

    async def __aenter__(self) -> ObserverWorker:
        options = kafka_options(self._settings, client_id="message-history-observer")
        self._consumer = AIOKafkaConsumer(
            self._work_topic,
            **options,
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        self._producer = AIOKafkaProducer(**options, acks="all", enable_idempotence=True)
        await self._producer.start()
        await self._consumer.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        consumer, producer, self._consumer, self._producer = self._consumer, self._producer, None, None
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Answer work until `stop()`; returns how many records were answered."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("ObserverWorker.run outside its `async with`")
        while not self._stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for partition, records in batch.items():
                await self._answer_all(records)
                await consumer.commit({partition: records[-1].offset + 1})
        return self.answered

    async def _answer_all(self, records: Sequence[ConsumerRecord]) -> None:
        producer = self._producer
        assert producer is not None  # inside `async with`
        sends = []
        for record in records:
            try:
                work = decode_work(record.value or b"")
            except InvalidInputError as exc:  # the service never writes one; skipped, said
                log.warning("undecodable observe record skipped: %s", exc, extra={"offset": record.offset})
                continue
            result = await self._handler(work)
            headers = [(k, v or b"") for k, v in record.headers or ()]
            sends.append(
                await producer.send(
                    self._results_topic, key=record.key, value=encode(result), headers=headers
                )
            )
            self.answered += 1
        await asyncio.gather(*sends)
