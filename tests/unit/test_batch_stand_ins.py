"""The recall path's batch load: the library's decision (`recall_from`) per request over what the batch
loaded; storage sees one round trip per batch (the persist side: tests/unit/test_persist_buffer.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers.prefetch import PrefetchedHistory
from message_history.core.budget import BOUNDARY_KEY, TokenBudget, resolve_budget
from message_history.core.memory_options import TurnMemory
from message_history.core.recall_plan import plan_recall
from message_history.core.rules import LastMessages
from message_history.errors import InvalidInputError, ThreadOwnershipError
from message_history.processor import MessageHistory, RecallOutcome
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from storage.protocol import Page, PageQuery, RecallQuery, SaveTurn, Thread
from storage.sequential import SequentialBatches

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _message(mid: str, role: str, text: str, at: int) -> Message:
    return Message.model_validate(
        {
            "id": mid,
            "role": role,
            "createdAt": (T0 + timedelta(seconds=at)).isoformat(),
            "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
        }
    )


class _Counting(SequentialBatches):
    """Counts calls per storage operation."""

    def __init__(self) -> None:
        super().__init__(InMemoryHistoryStorage())
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    async def get_thread(self, thread_id: str) -> Thread | None:
        self._count("get_thread")
        return await super().get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        self._count("list_messages")
        return await super().list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        self._count("get_threads")
        return await super().get_threads(thread_ids)

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        self._count("list_messages_many")
        return await super().list_messages_many(queries)

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
        self._count("save_many")
        return await super().save_many(turns)


async def _recall(
    view: PrefetchedHistory,
    thread: str,
    incoming: Sequence[Message] = (),
    *,
    last_messages: LastMessages = 40,
    budget: TokenBudget | None = None,
    read_only: bool = False,
) -> RecallOutcome:
    """One request's recall from the batch's load, as the recall path decides it (no echo filter)."""
    memory = TurnMemory(last_messages, budget, read_only=read_only, retain_full_input=True)
    needs = plan_recall(thread, "u", memory, None)
    return await view.recall(needs, incoming, None, read_only=read_only)


async def _seed(storage: _Counting, thread: str, owner: str, count: int) -> None:
    messages = [_message(f"{thread}-{i}", "user", f"m{i}", i) for i in range(count)]
    await storage.storage.save_messages(thread_id=thread, resource_id=owner, messages=messages)


@pytest.mark.parametrize(
    ("asked", "expected_ids", "misses"),
    [
        pytest.param(3, ["t-5", "t-4", "t-3"], 0, id="prefetched-page"),
        pytest.param(2, ["t-5", "t-4"], 0, id="smaller-page-sliced"),
        pytest.param(None, [f"t-{i}" for i in range(5, -1, -1)], 1, id="larger-page-goes-to-storage"),
        pytest.param(0, [], 0, id="zero-is-nothing"),
    ],
)
async def test_prefetch_answers_from_memory(asked: int | None, expected_ids: list[str], misses: int) -> None:
    """Reads covered by the prefetch need no storage call; others fall through and are counted as misses."""
    storage = _Counting()
    await _seed(storage, "t", "u", 6)
    view = await PrefetchedHistory.load(storage, [RecallQuery("t", "u", 3)])
    got = await view.newest("t", "u", asked)
    assert [m.id for m in got] == expected_ids
    assert view.misses == misses
    assert storage.calls.get("list_messages", 0) == misses


async def test_recall_batch_is_one_prefetch() -> None:
    """Recalling for many threads (one twice) costs one get_threads and one list_messages_many."""
    storage = _Counting()
    for thread in ("a", "b", "c"):
        await _seed(storage, thread, "u", 4)
    queries = [RecallQuery(t, "u", 40) for t in ("a", "b", "a", "c", "new")]
    view = await PrefetchedHistory.load(storage, queries)
    for query in queries:
        outcome = await _recall(view, query.thread_id, [_message("in", "user", "x", 100)])
        assert outcome.recalled == (0 if query.thread_id == "new" else 4)
    assert storage.calls == {"get_threads": 1, "list_messages_many": 1}
    assert view.misses == 0


class _CountingPages(_Counting):
    """Also counts the token-limited recall's page reads and boundary writes, and look-ups by id."""

    async def list_page(self, query: PageQuery) -> Page:
        self._count("list_page")
        return await super().list_page(query)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        self._count("get_messages")
        return await super().get_messages(message_ids, thread_ids=thread_ids)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        self._count("save_thread_metadata")
        await super().save_thread_metadata(thread_id, update)


async def test_budgeted_recall_batch_prefetches_pages_and_writes_boundaries_once() -> None:
    """Budgeted recalls of a batch are answered from pages fetched in rounds; boundaries wait for flush()."""
    storage = _CountingPages()
    for thread in ("a", "b"):
        await _seed(storage, thread, "u", 100)
    budget = resolve_budget(60, 30)
    queries = [RecallQuery(t, "u", None, budget) for t in ("a", "b")]
    view = await PrefetchedHistory.load(storage, queries)
    # the first page comes with the threads (their newest rows); this budget needs no second one
    assert storage.calls == {"get_threads": 1, "list_messages_many": 1}
    assert view.page_rounds == 0
    pages_before = storage.calls.get("list_page", 0)
    outcomes = []
    for query in queries:
        outcomes.append(
            await _recall(
                view, query.thread_id, [_message("in", "user", "x", 1000)], last_messages=False, budget=budget
            )
        )
    assert view.misses == 0  # every page the decision needed was loaded
    assert storage.calls.get("list_page", 0) == pages_before
    assert all(o.trimmed and o.boundary is not None for o in outcomes)
    assert "save_thread_metadata" not in storage.calls  # recorded, not written
    await view.flush()
    assert storage.calls["save_thread_metadata"] == 2
    for query, outcome in zip(queries, outcomes, strict=True):
        stored = await storage.storage.get_thread(query.thread_id)
        assert stored is not None
        assert outcome.boundary is not None
        assert stored.metadata[BOUNDARY_KEY] == outcome.boundary.to_metadata()


async def test_a_fresh_recall_sees_the_boundary_the_batch_moved_and_keeps_its_own() -> None:
    """Request 1 of thread a moves its boundary in the batch (recorded for the flush); request 2 waited at the
    turn gate and is recalled from MongoDB. `flush("a")` writes request 1's boundary first, so request 2 reads
    it, and takes it out of the batch's flush, which would otherwise write request 1's older boundary over
    request 2's (the boundary moved back)."""
    storage = _CountingPages()
    await _seed(storage, "a", "u", 100)
    await _seed(storage, "b", "u", 100)
    budget = resolve_budget(60, 30)
    view = await PrefetchedHistory.load(storage, [RecallQuery(t, "u", None, budget) for t in ("a", "b")])
    for thread in ("a", "b"):  # the batch's first requests: boundaries recorded, not written
        await _recall(view, thread, last_messages=False, budget=budget)
    first = view.boundaries.pending["a"][BOUNDARY_KEY]
    await view.flush("a")  # what the recall path does before a fresh recall of thread a
    stored = await storage.storage.get_thread("a")
    assert stored is not None
    assert stored.metadata[BOUNDARY_KEY] == first
    await storage.storage.save_messages(
        thread_id="a",
        resource_id="u",
        messages=[_message(f"a-new-{i}", "user", "new", 200 + i) for i in range(20)],
    )
    fresh = await MessageHistory(storage=storage).recall(
        thread_id="a", resource_id="u", incoming=[], last_messages=False, budget=budget
    )
    assert fresh.boundary is not None
    own = fresh.boundary.to_metadata()
    assert own != first
    await view.flush()  # the batch's end: thread b only
    stored = await storage.storage.get_thread("a")
    assert stored is not None
    assert stored.metadata[BOUNDARY_KEY] == own
    assert set(view.boundaries.pending) == set()
    assert storage.calls["save_thread_metadata"] == 3  # a (before the fresh recall), a (its own), b


async def test_budgeted_recall_read_only_writes_no_boundary() -> None:
    """Read-only: the limiter still trims, but the thread's metadata is left alone."""
    storage = _CountingPages()
    await _seed(storage, "a", "u", 50)
    budget = resolve_budget(60, 30)
    view = await PrefetchedHistory.load(storage, [RecallQuery("a", "u", None, budget)])
    outcome = await _recall(view, "a", last_messages=False, budget=budget, read_only=True)
    await view.flush()
    assert outcome.trimmed
    assert outcome.boundary is None
    assert "save_thread_metadata" not in storage.calls
    thread = await storage.storage.get_thread("a")
    assert thread is not None
    assert BOUNDARY_KEY not in thread.metadata


async def test_a_thread_without_resource_is_unowned() -> None:
    """A thread stored with no resourceId is usable by any resource (recall and save), as in Mastra (the
    persist batch's side: tests/unit/test_persist_buffer.py)."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id="t", resource_id="", messages=[_message("1", "user", "hi", 1)])
    history = MessageHistory(storage=storage)
    recalled = await history.recall(thread_id="t", resource_id="bob", incoming=[], last_messages=False)
    assert recalled.thread is not None
    assert recalled.thread.resourceId == ""
    saved = await history.persist_turn(
        thread_id="t", resource_id="bob", input=[_message("2", "user", "again", 2)], response=[]
    )
    assert saved.saved_ids == ["2"]
    # ...while a thread with an owner still refuses everyone else
    await storage.save_messages(
        thread_id="owned", resource_id="alice", messages=[_message("4", "user", "x", 4)]
    )
    with pytest.raises(ThreadOwnershipError):
        await history.recall(thread_id="owned", resource_id="bob", incoming=[])


async def test_budgeted_prefetch_pages_on_in_rounds_when_the_history_is_long() -> None:
    """A budget larger than one page: later pages come in rounds; the processor still misses none."""
    storage = _CountingPages()
    for thread in ("a", "b", "c"):
        await _seed(storage, thread, "u", 130)
    budget = resolve_budget(100_000, 0)
    queries = [RecallQuery(t, "u", None, budget) for t in ("a", "b", "c")]
    view = await PrefetchedHistory.load(storage, queries)
    assert view.page_rounds >= 2  # the pages after the first, all threads together in each round
    assert storage.calls["list_page"] == 3 * view.page_rounds
    for query in queries:
        outcome = await _recall(view, query.thread_id, last_messages=False, budget=budget)
        assert outcome.recalled == 130
    assert view.misses == 0
