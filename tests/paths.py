"""A no-Kafka harness for the recall and the persist path: their whole batch logic, tested in milliseconds.

Modelled on faststream's `TestKafkaBroker` / `FakeProducer` (a broker whose producer hands records to the
handlers in process): events become `FakeRecord`s (`consumers.contract.Record`), the real publishers
(`EnrichedPublisher`, `PersistedPublisher`) send through the at-least-once channel (`SendNow`) to a
`RecordingProducer`, the storage is the in-memory one (`storage.memory.InMemoryHistoryStorage`, batch forms
by `SequentialBatches`), tombstones and busy-marker writes are recorded, and `RecallHandler` /
`PersistHandler` are driven through `handle(records, emit)` as the loop
drives them: a refused record is a dead letter, every other acknowledgement is awaited.

Only the handlers' contract is used (their constructors and `handle`), never their internals, so the tests
written with it hold across a rewrite of either path. What the tests assert on is what a worker reads: the
output events' JSON, their keys, and the dead letters' reasons.

    paths = Paths()
    turn = response("t1", input=[user("m1", "hi", 1)], output=[assistant("m2", "yo", 2)])
    batch = await paths.persist(turn)
    assert batch.events[0]["savedMessageIds"] == ["m1", "m2"]
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from consumers.contract import Done, Record, Refused, settled
from consumers.persist import PersistHandler
from consumers.recall import RecallHandler
from consumers.runtime.emit import SendNow
from message_history.app.capabilities import storage_capabilities
from message_history.errors import InvalidInputError
from message_history.settings import Settings
from producers.enriched import EnrichedPublisher
from producers.output import Headers, OutputProducer, Positioned
from producers.persisted import PersistedPublisher
from schemas.codec import decode_enriched, decode_persisted
from storage.memory import InMemoryHistoryStorage
from storage.protocol import BatchHistoryStorage, HistoryStorage, Tombstones
from storage.sequential import SequentialBatches

T0 = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
RESOURCE = "u1"


def at(seconds: float) -> str:
    """`T0` plus `seconds`, as the wire carries it (ISO-8601, ms)."""
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


# --- events -------------------------------------------------------------------------------------------


def message(mid: str | None, role: str, text: str, seconds: float, **extra: Any) -> dict[str, Any]:
    """A wire message (Mastra's format 2) with one text part; `mid=None` leaves the id out."""
    out: dict[str, Any] = {
        "role": role,
        "createdAt": at(seconds),
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
        **extra,
    }
    if mid is not None:
        out["id"] = mid
    return out


def user(mid: str | None, text: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return message(mid, "user", text, seconds, **extra)


def assistant(mid: str | None, text: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return message(mid, "assistant", text, seconds, **extra)


def request(
    thread: str,
    messages: Sequence[dict[str, Any]],
    *,
    resource: str = RESOURCE,
    request_id: str | None = None,
    memory: dict[str, Any] | None = None,
    seconds: float = 1000,
) -> dict[str, Any]:
    """An `AgentRequest` as a client sends it."""
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": request_id or f"req-{thread}-{seconds:g}",
        "threadId": thread,
        "resourceId": resource,
        "createdAt": at(seconds),
        "messages": list(messages),
    }
    if memory is not None:
        event["memory"] = memory
    return event


def response(
    thread: str,
    *,
    input: Sequence[dict[str, Any]] = (),  # the event's field name
    output: Sequence[dict[str, Any]] = (),
    resource: str = RESOURCE,
    request_id: str | None = None,
    finish_reason: str | None = "stop",
    memory: dict[str, Any] | None = None,
    seconds: float = 1000,
) -> dict[str, Any]:
    """An `AgentResponse` as a worker sends it (`output` is the event's `response` list)."""
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": request_id or f"resp-{thread}-{seconds:g}",
        "threadId": thread,
        "resourceId": resource,
        "createdAt": at(seconds),
        "input": list(input),
        "response": list(output),
        "finishReason": finish_reason,
    }
    if memory is not None:
        event["memory"] = memory
    return event


# --- Kafka, faked -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FakeRecord:
    """A consumed record (`consumers.contract.Record`) built in memory."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] | None = ()


@dataclass(frozen=True, slots=True)
class Sent:
    """One record a publisher sent."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def event(self) -> dict[str, Any]:
        assert self.value is not None
        decoded: dict[str, Any] = json.loads(self.value)
        return decoded


class RecordingProducer(OutputProducer):
    """The shared producer's interface; keeps what is sent, and acknowledges each send at once."""

    def __init__(self) -> None:
        super().__init__(Settings())
        self.sent: list[Sent] = []

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> asyncio.Future[Any]:
        self.sent.append(Sent(topic, key, value, tuple(headers)))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def flush(self) -> None:
        return None


@dataclass
class RecordedTombstones:
    """A `storage.protocol.TombstoneReader` over tombstones set by the test; counts its reads."""

    forgotten: Tombstones = field(default_factory=Tombstones)
    reads: int = 0

    def forget_thread(self, thread_id: str, seconds: float) -> None:
        self.forgotten.threads[thread_id] = datetime.fromisoformat(at(seconds))

    def forget_resource(self, resource_id: str, seconds: float) -> None:
        self.forgotten.resources[resource_id] = datetime.fromisoformat(at(seconds))

    async def tombstones(self, *, thread_ids: Sequence[str], resource_ids: Sequence[str]) -> Tombstones:
        self.reads += 1
        return Tombstones(
            threads={t: self.forgotten.threads[t] for t in thread_ids if t in self.forgotten.threads},
            resources={r: self.forgotten.resources[r] for r in resource_ids if r in self.forgotten.resources},
        )


@dataclass
class RecordedMarkers:
    """The persist path's busy-marker writes (`consumers.persist.AnsweredTurns`), as called."""

    calls: list[tuple[dict[str, list[str]], frozenset[str]]] = field(default_factory=list)

    async def answered(self, turns: dict[str, list[str]], *, existing_only: Set[str] = frozenset()) -> None:
        self.calls.append(({t: list(ids) for t, ids in turns.items()}, frozenset(existing_only)))

    def answered_ids(self) -> dict[str, list[str]]:
        """Every request id recorded as answered, per thread, over all calls."""
        out: dict[str, list[str]] = {}
        for turns, _ in self.calls:
            for thread, ids in turns.items():
                out.setdefault(thread, []).extend(ids)
        return out


# --- a batch through a path -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Batch:
    """What one `handle(records)` produced: per input record its output event or its dead letter's error,
    and every record sent, in send order."""

    outcomes: list[dict[str, Any] | InvalidInputError]
    sent: list[Sent]

    @property
    def events(self) -> list[dict[str, Any]]:
        """The output events, in send order."""
        return [s.event() for s in self.sent]

    @property
    def dead(self) -> dict[int, InvalidInputError]:
        """Dead letters by input index."""
        return {i: o for i, o in enumerate(self.outcomes) if isinstance(o, InvalidInputError)}

    def event(self, index: int) -> dict[str, Any]:
        """The output event of input `index`; fails the test when that input was dead-lettered."""
        outcome = self.outcomes[index]
        assert not isinstance(outcome, InvalidInputError), f"input {index} dead-lettered: {outcome!r}"
        return outcome


class Paths:
    """The two paths over one in-memory storage, with recording publishers, tombstones and busy markers."""

    def __init__(
        self,
        settings: Settings | None = None,
        storage: BatchHistoryStorage | None = None,
        *,
        id_keys: Sequence[bytes] = (),
    ) -> None:
        """`storage`: the in-memory one unless given (the MongoDB storage, for a test against the server);
        `id_keys`: the persist path's message-id keys (none: a taken derived id refuses its turn)."""
        self.settings = settings or Settings()
        self.storage: HistoryStorage = storage or InMemoryHistoryStorage()
        self.producer = RecordingProducer()
        self.emit = SendNow(self.producer)  # the at-least-once channel the loop hands each batch
        self.tombstones = RecordedTombstones()
        self.markers = RecordedMarkers()
        batches = storage or SequentialBatches(self.storage)
        capabilities = storage_capabilities(batches)  # wired as the service wires its storage
        self.recall_handler = RecallHandler(
            self.settings,
            batches,
            EnrichedPublisher(self.settings.enriched_topic),
            raw_rows=capabilities.raw_rows,
        )
        self.persist_handler = PersistHandler(
            self.settings,
            batches,
            PersistedPublisher(self.settings.persisted_topic),
            tombstones=self.tombstones,
            markers=self.markers,
            id_keys=id_keys,
            save_reads=capabilities.save_reads,
            homes=capabilities.homes,
        )
        self._offsets: dict[str, int] = {}

    def records(
        self, topic: str, events: Sequence[dict[str, Any] | BaseModel | bytes], *, partition: int = 0
    ) -> list[FakeRecord]:
        """Records of `events` on `topic`, keyed by their `threadId`, at the topic's next offsets. Bytes
        are sent as they are (keyed `None`)."""
        out: list[FakeRecord] = []
        for event in events:
            offset = self._offsets.get(topic, 0)
            self._offsets[topic] = offset + 1
            if isinstance(event, bytes):
                out.append(FakeRecord(topic, partition, offset, None, event, ()))
                continue
            body = event.model_dump(mode="json", exclude_none=True) if isinstance(event, BaseModel) else event
            key = str(body.get("threadId", "")).encode()
            headers = [("trace", f"{topic}:{offset}".encode())]
            out.append(FakeRecord(topic, partition, offset, key, json.dumps(body).encode(), headers))
        return out

    async def recall(self, *events: dict[str, Any] | BaseModel | bytes) -> Batch:
        """One batch of requests through the recall path."""
        return await self.drive(self.recall_handler, self.records(self.settings.requests_topic, events))

    async def persist(self, *events: dict[str, Any] | BaseModel | bytes) -> Batch:
        """One batch of responses through the persist path."""
        return await self.drive(self.persist_handler, self.records(self.settings.responses_topic, events))

    async def drive(self, handler: RecallHandler | PersistHandler, records: Sequence[Record]) -> Batch:
        """`handler.handle(records)` and its acknowledgements settled, as the loop does; each output event is
        matched to its input by `requestId` (every output of these paths carries its input's)."""
        first = len(self.producer.sent)
        results = [await settled(result) for result in await handler.handle(records, self.emit)]
        assert len(results) == len(records)
        for result in results:
            if isinstance(result, Done):
                await result.sent
        sent = self.producer.sent[first:]
        for output in sent:  # every output must be what a worker (or a persisted-event reader) can decode
            assert output.value is not None
            if output.topic == self.settings.enriched_topic:
                decode_enriched(output.value)
            else:
                decode_persisted(output.value)
        by_request = {s.event()["requestId"]: s.event() for s in sent}
        outcomes: list[dict[str, Any] | InvalidInputError] = []
        for record, result in zip(records, results, strict=True):
            if isinstance(result, Refused):
                outcomes.append(result.error)
                continue
            assert record.value is not None
            outcomes.append(by_request[json.loads(record.value)["requestId"]])
        return Batch(outcomes, sent)

    async def stored_ids(self, thread_id: str) -> list[str]:
        """The thread's stored message ids, oldest first."""
        rows = await self.storage.list_messages(thread_id, resource_id=None, limit=None)
        return [m.id or "" for m in reversed(rows)]


async def no_emit(
    record: Positioned,
    topic: str,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: Headers = (),
    alone: bool = False,
) -> asyncio.Future[Any]:
    """The `Emit` for a test whose publisher keeps what it sends itself (it overrides `_send`)."""
    raise AssertionError("nothing goes through the channel here: the test's publisher keeps its outputs")
