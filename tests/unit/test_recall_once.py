"""The recall path does each piece of a request's work once: one loader run per budgeted thread, the
client-echo probe answered by the prefetch, one `plan_echo` per request (counted through `RecallHandler`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from consumers.contract import Emit, delivered
from consumers.recall import RecallHandler
from consumers.turn_gate import TurnGate
from message_history.core import echo
from message_history.core.budget import BOUNDARY_KEY, HistoryLoader, resolve_budget
from message_history.core.turn_rules import TurnMarker
from message_history.processor import MessageHistory
from message_history.settings import Settings
from producers.enriched import EnrichedPublisher
from producers.output import Headers, Positioned
from schemas.messages import Message
from tests.paths import no_emit
from tests.unit.test_batch_stand_ins import T0, _CountingPages, _message, _seed


class _Sent(EnrichedPublisher):
    """Keeps what the handler sends; every send is acknowledged at once."""

    def __init__(self) -> None:
        super().__init__("enriched")
        self.values: list[bytes] = []

    async def _send(
        self, emit: Emit, record: Positioned, key: bytes, value: bytes, headers: Headers
    ) -> asyncio.Future[Any]:
        self.values.append(value)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _record(offset: int, thread: str, messages: Sequence[Message], memory: dict[str, Any]) -> Any:
    event = {
        "schemaVersion": 1,
        "requestId": f"r{offset}",
        "threadId": thread,
        "resourceId": "u",
        "createdAt": (T0 + timedelta(days=1)).isoformat(),
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in messages],
        "memory": memory,
    }
    value = json.dumps(event).encode()
    key = thread.encode()
    return SimpleNamespace(topic="requests", partition=0, offset=offset, key=key, value=value, headers=[])


async def _handle(
    storage: _CountingPages, records: Sequence[Any], *, write_boundaries: bool = False
) -> list[dict[str, Any]]:
    publisher = _Sent()
    handler = RecallHandler(Settings(), storage, publisher, write_boundaries=write_boundaries)
    for ack in await handler.handle(records, no_emit):
        await delivered(ack)
    return [json.loads(value) for value in publisher.values]


@pytest.fixture
def loader_runs(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The `HistoryLoader`s fed at least one page, wherever they were made."""
    fed: set[int] = set()
    feed = HistoryLoader.feed

    def counting(self: HistoryLoader, rows: Sequence[Message], *, has_more: bool) -> Any:
        fed.add(id(self))
        return feed(self, rows, has_more=has_more)

    monkeypatch.setattr(HistoryLoader, "feed", counting)
    return fed


@pytest.fixture
def echo_plans(monkeypatch: pytest.MonkeyPatch) -> list[echo.EchoPlan]:
    """Every `EchoPlan` made: `plan_echo` makes exactly one per call, whoever calls it."""
    made: list[echo.EchoPlan] = []
    plan = echo.EchoPlan

    def counting(*args: Any, **kwargs: Any) -> echo.EchoPlan:
        made.append(plan(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(echo, "EchoPlan", counting)
    return made


async def test_a_budgeted_request_runs_its_loader_once(loader_runs: set[int]) -> None:
    """The processor takes the prefetch's loaded history; it does not page the thread again."""
    storage = _CountingPages()
    for thread in ("a", "b"):
        await _seed(storage, thread, "u", 130)
    records = [
        _record(i, thread, [_message(f"in{i}", "user", "next?", 1000)], {"maxTokens": 100_000})
        for i, thread in enumerate(("a", "b"))
    ]
    enriched = await _handle(storage, records)
    assert [e["history"]["recalled"] for e in enriched] == [130, 130]
    assert len(loader_runs) == 2  # one per budgeted request (was two each: prefetch, then processor)


async def _echo_batch(storage: _CountingPages, memory: dict[str, Any]) -> list[dict[str, Any]]:
    """One request resending thread "a"'s stored history (useChat style), then a new user message."""
    await _seed(storage, "a", "u", 10)
    stored = await storage.storage.list_messages("a", resource_id="u", limit=2)
    reply = _message("a-reply", "assistant", "an answer", 11)
    await storage.storage.save_messages(thread_id="a", resource_id="u", messages=[reply])
    resent = [stored[1], stored[0], reply, _message("new", "user", "and now?", 12)]
    enriched = await _handle(storage, [_record(0, "a", resent, memory)])
    assert [m["id"] for m in enriched[0]["messages"] if m["source"] == "input"] == ["new"]
    return enriched


async def test_a_budgeted_echo_request_reads_storage_once() -> None:
    """The echo probe of a budgeted thread is answered by the prefetch's newest rows."""
    storage = _CountingPages()
    await _echo_batch(storage, {"maxTokens": 100_000})
    # one get_threads, one list_messages_many (newest rows), one get_messages (the echo's stored copies)
    assert storage.calls == {"get_threads": 1, "list_messages_many": 1, "get_messages": 1}


@pytest.mark.parametrize(
    "memory", [pytest.param({}, id="no-budget"), pytest.param({"maxTokens": 100_000}, id="budget")]
)
async def test_an_echo_request_is_planned_once(
    memory: dict[str, Any], echo_plans: list[echo.EchoPlan]
) -> None:
    """`plan_echo` once per request: the prefetch's id look-up and the processor's filter share it."""
    await _echo_batch(_CountingPages(), memory)
    assert len(echo_plans) == 1


async def test_a_boundary_moved_earlier_in_the_batch_is_loaded_anew() -> None:
    """Two budgeted requests of one thread: the first trims and moves the boundary, so the second's load is
    another one (from the new boundary), not the prefetch's; both match the processor over the storage."""
    batched, direct = _CountingPages(), _CountingPages()
    for storage in (batched, direct):
        await _seed(storage, "a", "u", 60)
    incoming = [[_message(f"in{i}", "user", "next?", 1000 + i)] for i in range(2)]
    enriched = await _handle(
        batched,
        [_record(i, "a", incoming[i], {"maxTokens": 60, "atMaxRemoveTokens": 30}) for i in range(2)],
        write_boundaries=True,
    )
    expected = []
    for messages in incoming:
        outcome = await MessageHistory(storage=direct).recall(
            thread_id="a",
            resource_id="u",
            incoming=messages,
            last_messages=False,
            budget=resolve_budget(60, 30),
        )
        boundary = outcome.boundary.to_metadata() if outcome.boundary is not None else None
        expected.append([outcome.recalled, outcome.trimmed, boundary])
    assert expected[0] != expected[1]  # the first request's trim changed what the second one loads
    got = [[e["history"]["recalled"], e["history"]["trimmed"], e["history"]["boundary"]] for e in enriched]
    assert got == expected


class _AnsweringMarkers:
    """Busy markers (policy enqueue) whose wait ends with the awaited turn answered: its reply saved into
    the thread first, as the persist path would, then the marker cleared."""

    def __init__(self, storage: _CountingPages) -> None:
        self.storage = storage
        self.pending: dict[str, str] = {}

    async def get_many(self, thread_ids: Sequence[str]) -> dict[str, TurnMarker]:
        return {t: TurnMarker(pending=self.pending[t]) for t in thread_ids if t in self.pending}

    async def mark(self, thread_id: str, request_id: str, *, resource_id: str | None = None) -> None:
        self.pending[thread_id] = request_id

    async def release(self, thread_id: str, request_id: str) -> None:
        if self.pending.get(thread_id) == request_id:
            del self.pending[thread_id]

    async def wait_answered(
        self, thread_id: str, awaited: str, timeout_s: float, stop: asyncio.Event | None = None
    ) -> TurnMarker | None:
        replies = [
            _message(f"{awaited}-reply-{i}", "assistant", "a long answer " * 3, 2000 + i) for i in range(20)
        ]
        await self.storage.storage.save_messages(thread_id=thread_id, resource_id="u", messages=replies)
        self.pending.pop(thread_id, None)
        return TurnMarker(pending=None, answered=(awaited,))


async def test_a_request_recalled_after_its_wait_keeps_the_boundary_it_moved() -> None:
    """Turn 1 trims (its boundary recorded for the batch's flush); turn 2 waits for turn 1's answer and is
    recalled from MongoDB. It reads turn 1's boundary (flushed first) and moves it on over the answer; the
    batch's flush at the end must not write turn 1's older boundary back over it."""
    storage = _CountingPages()
    await _seed(storage, "a", "u", 60)
    memory = {"maxTokens": 60, "atMaxRemoveTokens": 30}
    records = [_record(i, "a", [_message(f"in{i}", "user", "next?", 1000 + i)], memory) for i in range(2)]
    gate = TurnGate(barrier=None, markers=_AnsweringMarkers(storage), policy="enqueue", timeout_s=5.0)
    publisher = _Sent()
    handler = RecallHandler(Settings(), storage, publisher, gate=gate)
    for ack in await handler.handle(records, no_emit):
        await delivered(ack)
    first, second = (json.loads(v)["history"] for v in publisher.values)
    assert (first["waitedMs"], second["complete"]) == (0, True)
    assert second["boundary"] is not None
    assert second["boundary"] != first["boundary"]  # moved on over turn 1's answer
    thread = await storage.storage.get_thread("a")
    assert thread is not None
    assert thread.metadata[BOUNDARY_KEY] == second["boundary"]  # not turn 1's, written back by the flush


async def test_a_mark_names_the_requests_resource() -> None:
    """The busy mark carries the request's `resourceId`, so forgetting the resource finds the marker even of
    a thread that is never saved."""
    storage = _CountingPages()
    markers = _AnsweringMarkers(storage)
    marked: list[tuple[str, str, str | None]] = []

    async def mark(thread_id: str, request_id: str, *, resource_id: str | None = None) -> None:
        marked.append((thread_id, request_id, resource_id))

    markers.mark = mark  # type: ignore[method-assign]
    gate = TurnGate(barrier=None, markers=markers, policy="enqueue", timeout_s=5.0)
    handler = RecallHandler(Settings(), storage, _Sent(), gate=gate)
    for ack in await handler.handle([_record(0, "a", [_message("in0", "user", "hi", 1000)], {})], no_emit):
        await delivered(ack)
    assert marked == [("a", "r0", "u")]
