"""The persist path's reads on MongoDB (issue 25): a batch reads its threads once, its write nothing.

`PersistHandler.handle` on a real server, commands counted with PyMongo command monitoring; the publisher
records the outcomes (no Kafka: the handler's contract is records in, acknowledgements out).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.database import AsyncDatabase

from consumers.contract import Done, Emit, Record
from consumers.persist import PersistHandler
from message_history import metrics
from message_history.settings import Settings
from producers.persisted import PersistedPublisher
from schemas.codec import decode_persisted
from schemas.events import HistoryPersisted
from storage import mongo_upserts
from storage.documents import MESSAGES, THREADS
from storage.mongodb import MongoHistoryStorage
from storage.update_command import update_statements

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Db = AsyncDatabase[dict[str, Any]]


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []  # (command, collection)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in {"find", "update", "insert"}:
            self.sent.append((event.command_name, str(event.command.get(event.command_name))))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@dataclass(frozen=True)
class _Record:
    key: bytes | None
    value: bytes | None
    topic: str = "agent.responses"
    partition: int = 0
    offset: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


class _Recording:
    def __init__(self) -> None:
        self.events: list[HistoryPersisted] = []

    async def publish_value(
        self, emit: Any, record: Any, thread_id: str, value: bytes, *, headers: Any
    ) -> asyncio.Future[Any]:
        self.events.append(decode_persisted(value))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest_asyncio.fixture
async def monitored(mongo_uri: str, mongo_db: Db) -> AsyncIterator[tuple[MongoHistoryStorage, _Commands]]:
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri, event_listeners=[commands])
    try:
        store = MongoHistoryStorage(client[mongo_db.name])
        await store.ensure_indexes()
        commands.sent.clear()
        yield store, commands
    finally:
        await client.close()


def _response(thread: str, turn: int, *, user: bool = True) -> _Record:
    def message(role: str, n: int) -> dict[str, Any]:
        return {
            "id": f"{thread}-{turn}-{role}",
            "role": role,
            "createdAt": f"2025-03-01T10:00:{n:02d}.000Z",
            "content": {"format": 2, "parts": [{"type": "text", "text": f"{role} {turn}"}]},
        }

    event = {
        "schemaVersion": 1,
        "requestId": f"{thread}-{turn}",
        "threadId": thread,
        "resourceId": "r1",
        "createdAt": f"2025-03-01T10:00:{2 * turn:02d}.000Z",
        "input": [message("user", 2 * turn)] if user else [],
        "response": [message("assistant", 2 * turn + 1)],
        "finishReason": "stop",
    }
    return _Record(thread.encode(), json.dumps(event).encode())


def _misses() -> float:
    return metrics.REGISTRY.get_sample_value("message_history_plan_misses_total", {"path": "persist"}) or 0.0


async def _handle(storage: MongoHistoryStorage, records: Sequence[_Record]) -> list[HistoryPersisted]:
    publisher = _Recording()
    handler = PersistHandler(Settings(), storage, cast(PersistedPublisher, publisher), save_reads=storage)
    acks = await handler.handle(cast(Sequence[Record], records), cast(Emit, None))  # the publisher sends
    assert all(isinstance(a, Done) for a in acks), acks
    return publisher.events


async def test_a_batch_reads_its_threads_once_and_the_write_reads_nothing(
    monitored: tuple[MongoHistoryStorage, _Commands],
) -> None:
    storage, commands = monitored
    await _handle(storage, [_response("a", 0), _response("b", 0)])  # both threads exist now
    commands.sent.clear()
    before = _misses()
    events = await _handle(
        storage, [_response("a", 1), _response("b", 1), _response("a", 2), _response("c", 0)]
    )
    finds = [collection for name, collection in commands.sent if name == "find"]
    # the load: threads, and message homes with stored copies in one find (no newest row: every turn
    # brings its user message); the write: thread c created, then the messages and threads a, b together
    assert sorted(finds) == ["mastra_messages", "mastra_threads"]
    writes = commands.sent[len(finds) :]
    assert writes[0] == ("update", "mastra_threads")
    assert sorted(writes[1:]) == [("update", "mastra_messages"), ("update", "mastra_threads")]
    assert _misses() == before
    assert [e.savedMessageIds for e in events] == [
        ["a-1-user", "a-1-assistant"],
        ["b-1-user", "b-1-assistant"],
        ["a-2-user", "a-2-assistant"],
        ["c-0-user", "c-0-assistant"],
    ]
    assert all(e.skipped is None and e.threadUpdatedAt is not None for e in events)


async def test_a_turn_without_user_input_has_its_newest_row_in_the_load(
    monitored: tuple[MongoHistoryStorage, _Commands],
) -> None:
    """The fold into the latest assistant message is planned: one more find in the load, none later."""
    storage, commands = monitored
    await _handle(storage, [_response("a", 0)])
    commands.sent.clear()
    before = _misses()
    [event] = await _handle(storage, [_response("a", 1, user=False)])
    assert [name for name, _ in commands.sent] == ["find"] * 3 + ["update", "update"]
    assert _misses() == before
    assert event.savedMessageIds == ["a-0-assistant"]  # folded into the stored assistant message


def _watched(log: list[tuple[str, str]]) -> Any:
    """`update_statements` (every bulk write of the storage) noting when each bulk starts and ends."""

    async def write(collection: Any, statements: Any, **kwargs: Any) -> Any:
        log.append(("start", collection.name))
        try:
            return await update_statements(collection, statements, **kwargs)
        finally:
            log.append(("end", collection.name))

    return write


async def test_the_messages_and_the_existing_threads_are_written_together(
    monitored: tuple[MongoHistoryStorage, _Commands], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: the write of a batch that creates no thread is one round trip, its two bulk writes in
    flight together (one after the other, each would end before the next starts)."""
    storage, _ = monitored
    await _handle(storage, [_response("a", 0), _response("b", 0)])
    log: list[tuple[str, str]] = []
    monkeypatch.setattr(mongo_upserts, "update_statements", _watched(log))
    events = await _handle(storage, [_response("a", 1), _response("b", 1)])
    assert [kind for kind, _ in log] == ["start", "start", "end", "end"]
    assert {name for _, name in log} == {MESSAGES, THREADS}
    assert [e.savedMessageIds for e in events] == [
        ["a-1-user", "a-1-assistant"],
        ["b-1-user", "b-1-assistant"],
    ]
    threads = await storage.get_threads(["a", "b"])  # the touch landed: updatedAt as the events say
    assert [threads[e.threadId].updatedAt for e in events] == [e.threadUpdatedAt for e in events]
