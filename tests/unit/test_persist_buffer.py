"""The persist path's read plan, batch load and write-only buffer (issue 25): the batch decides each turn as
`MessageHistory.persist_turn` does, from one load, writes once, and every outcome is final at the flush.

Pure logic on the in-memory storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from consumers.collect import PersistBuffer, load_batch
from consumers.lanes import Failed
from consumers.persist import _decide, _Done, _keep_legacy_ids, _outcome
from consumers.write_buffer import BufferState
from message_history import metrics
from message_history.core.persist_plan import PersistNeeds, batch_needs, plan_persist, turn_input
from message_history.errors import InvalidInputError, ThreadOwnershipError
from message_history.processor import MessageHistory
from schemas.events import AgentResponse, TurnMessage
from schemas.ids import derived_message_id, legacy_message_id
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from storage.protocol import HistoryStorage, RecallQuery, SaveTurn, Thread
from storage.sequential import SequentialBatches
from tests.rule_cases import RESOURCE, T0, THREAD, msg, seed, summarize, tool


def _turn(m: Message, source: str | None = None) -> TurnMessage:
    data = m.model_dump(exclude_unset=True)
    if source is not None:
        data["source"] = source
    return TurnMessage.model_validate(data)


def response(
    request: str,
    input: Sequence[Message] = (),
    reply: Sequence[Message] = (),
    *,
    thread: str = THREAD,
    resource: str = RESOURCE,
    recalled: Sequence[Message] = (),
    **fields: Any,
) -> AgentResponse:
    return AgentResponse(
        requestId=request,
        threadId=thread,
        resourceId=resource,
        createdAt=T0,
        input=[*(_turn(m, "memory") for m in recalled), *(_turn(m) for m in input)],
        response=list(reply),
        **fields,
    )


def _misses() -> float:
    return metrics.REGISTRY.get_sample_value("message_history_plan_misses_total", {"path": "persist"}) or 0.0


async def run_batch(
    storage: InMemoryHistoryStorage, responses: Sequence[AgentResponse]
) -> tuple[list[_Done | Failed], PersistBuffer]:
    """The persist path's load -> per turn -> write on `responses` (one thread's turns in batch order)."""
    batch = SequentialBatches(storage)
    buffer = PersistBuffer(batch, await load_batch(batch, batch_needs(plan_persist(r) for r in responses)))
    outcomes: list[_Done | Failed] = []
    for order, r in enumerate(responses):
        try:
            outcomes.append(await _decide(buffer, order, r))
        except ThreadOwnershipError as exc:
            outcomes.append(Failed(exc))
    await buffer.flush()
    return outcomes, buffer


async def _rows(storage: HistoryStorage, thread: str = THREAD) -> dict[str, list[str]]:
    rows = await storage.list_messages(thread, resource_id=None, limit=None)
    return {m.id or "": summarize(m) for m in reversed(rows)}


# --- the plan, table-style -------------------------------------------------------------------------------


def _derived(kind: str, i: int) -> str:
    return derived_message_id("r", "t", "q", kind, i)  # type: ignore[arg-type]


PLAN_CASES = [
    pytest.param(
        response("q", [msg("u1", t=1)], [msg("a1", "assistant", t=2)], thread="t", resource="r"),
        PersistNeeds("t", ("u1", "a1"), latest=False),
        id="user-input-no-latest",
    ),
    pytest.param(
        response("q", [], [msg("a1", "assistant", t=2)], thread="t", resource="r"),
        PersistNeeds("t", ("a1",), latest=True),
        id="no-user-input-plans-the-latest-row",
    ),
    pytest.param(
        response("q", [], [msg("a1", "assistant", t=2)], thread="t", resource="r", recalled=[msg("m1", t=0)]),
        PersistNeeds("t", ("a1",), latest=True),
        id="recalled-messages-are-never-looked-up-nor-count-as-user-input",
    ),
    pytest.param(
        response("q", [msg(_derived("input", 0), t=1)], [], thread="t", resource="r"),
        PersistNeeds(
            "t",
            (_derived("input", 0), legacy_message_id("q", "input", 0)),
            latest=False,
            legacy={_derived("input", 0): legacy_message_id("q", "input", 0)},
        ),
        id="a-derived-id-looks-its-legacy-id-up-too",
    ),
]


def test_only_an_id_shaped_as_a_derived_one_looks_for_a_legacy_id() -> None:
    """The UUIDv5-shape shortcut never hides a derived id (every position and kind of a long event)."""
    input_ids = [_derived("input", i) for i in range(5)]
    reply_ids = [_derived("response", i) for i in range(5)]
    event = response(
        "q",
        [msg(i, t=1) for i in input_ids],
        [msg(i, "assistant", t=2) for i in reply_ids],
        thread="t",
        resource="r",
    )
    legacy = plan_persist(event).legacy
    assert legacy == {
        **{i: legacy_message_id("q", "input", n) for n, i in enumerate(input_ids)},
        **{i: legacy_message_id("q", "response", n) for n, i in enumerate(reply_ids)},
    }


@pytest.mark.parametrize(("event", "needs"), PLAN_CASES)
def test_plan_persist(event: AgentResponse, needs: PersistNeeds) -> None:
    assert plan_persist(event) == needs


def test_batch_needs_merge_in_first_appearance_order() -> None:
    merged = batch_needs(
        [
            PersistNeeds("a", ("1", "2"), latest=True),
            PersistNeeds("b", ("2", "3"), latest=False),
            PersistNeeds("a", ("4",), latest=False),
        ]
    )
    assert (merged.thread_ids, merged.lookup_ids, merged.latest_of) == (
        ("a", "b"),
        ("1", "2", "3", "4"),
        ("a",),
    )


# --- the batch decides as the library does ---------------------------------------------------------------


def _pending() -> list[Message]:
    return [
        msg("u1", t=1, text="Which file?"),
        msg("a1", "assistant", t=2, parts=[{"type": "text", "text": "Asking."}, tool("ask", "call", "c1")]),
    ]


SCENARIOS = [
    pytest.param([], response("q", [msg("u1", t=1)], [msg("a1", "assistant", t=2)]), id="new-thread"),
    pytest.param(
        _pending(),
        response(
            "q",
            [msg("a1", "assistant", t=2, parts=[tool("ask", "result", "c1")])],
            [msg("a2", "assistant", t=5, text="Done.")],
        ),
        id="client-result-echo-then-continuation",
    ),
    pytest.param(
        _pending(), response("q", [], [msg("a2", "assistant", t=5, text="More.")]), id="fold-into-latest"
    ),
    pytest.param(
        _pending(),
        response("q", [msg("u1", t=1, text="Which file?")], [msg("a2", "assistant", t=5, text="Again.")]),
        id="redelivered-user-message-folds-too",
    ),
    pytest.param(_pending(), response("q", [msg("u2", t=3)], memory={"readOnly": True}), id="read-only"),
    pytest.param(_pending(), response("q", [msg("u2", t=3)], [], finishReason="error"), id="failed-turn"),
    pytest.param(_pending(), response("q", [], [], recalled=_pending()), id="nothing-to-save"),
]


@pytest.mark.parametrize(("stored", "event"), SCENARIOS)
async def test_the_batch_decides_as_the_library(stored: list[Message], event: AgentResponse) -> None:
    """Same stored rows, same saved ids and skip reason, same thread, through the library and the batch."""
    library, batch = InMemoryHistoryStorage(), InMemoryHistoryStorage()
    for storage in (library, batch):
        if stored:
            await seed(storage, stored)
    expected = await MessageHistory(storage=library).persist_turn(
        thread_id=event.threadId,
        resource_id=event.resourceId,
        input=turn_input(event),
        response=event.response,
        finish_reason=event.finishReason,
        read_only=bool(event.memory and event.memory.readOnly),
    )
    [done], _ = await run_batch(batch, [event])
    assert isinstance(done, _Done)
    assert (done.saved_ids, done.skipped) == (expected.saved_ids, expected.skipped)
    assert await _rows(batch) == await _rows(library)
    thread = await batch.get_thread(THREAD)
    assert done.slot.result == thread


# --- one load, one write, outcomes final at the flush -------------------------------------------------


class _Counting(SequentialBatches):
    def __init__(self, storage: InMemoryHistoryStorage) -> None:
        super().__init__(storage)
        self.calls: list[str] = []

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        self.calls.append("get_threads")
        return await super().get_threads(thread_ids)

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        self.calls.append("list_messages_many")
        return await super().list_messages_many(queries)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        self.calls.append("list_messages")
        return await super().list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
        self.calls.append("save_many")
        return await super().save_many(turns)


async def test_two_turns_of_a_thread_one_load_one_write_and_an_intruder_refused() -> None:
    storage = _Counting(InMemoryHistoryStorage())
    first = response("q1", [msg("1", t=1)])
    second = response("q2", [msg("2", t=2)])
    intruder = response("q3", [msg("3", t=3, resource="mallory")], resource="mallory")
    responses = [first, second, intruder]
    buffer = PersistBuffer(
        storage, await load_batch(storage, batch_needs(plan_persist(r) for r in responses))
    )
    done = [await _decide(buffer, 0, first), await _decide(buffer, 1, second)]
    with pytest.raises(ThreadOwnershipError):
        await _decide(buffer, 2, intruder)
    assert storage.calls == ["get_threads"]  # no latest row planned: every turn brings its user message
    assert buffer.state is BufferState.COLLECTING
    await buffer.flush()
    assert buffer.state.value == "done"
    assert storage.calls == ["get_threads", "save_many"]
    assert [d.saved_ids for d in done] == [["1"], ["2"]]
    assert all(isinstance(d.slot.result, Thread) and d.slot.result.resourceId == RESOURCE for d in done)
    assert list(await _rows(storage.storage)) == ["1", "2"]


async def test_a_skipped_turn_after_a_write_reports_the_thread_as_written() -> None:
    """Final at the flush: the read-only turn's thread is the one its batch's earlier turn wrote."""
    storage = InMemoryHistoryStorage()
    outcomes, _ = await run_batch(
        storage, [response("q1", [msg("1", t=1)]), response("q2", [msg("2", t=2)], memory={"readOnly": True})]
    )
    saved, skipped = outcomes
    assert isinstance(saved, _Done)
    assert isinstance(skipped, _Done)
    assert skipped.skipped == "read-only"
    assert skipped.slot.result == saved.slot.result == await storage.get_thread(THREAD)
    outcome = _outcome(skipped)
    assert not isinstance(outcome, Exception)
    assert outcome[2] == saved.slot.result.updatedAt  # type: ignore[union-attr]


async def test_a_skipped_turn_of_a_missing_thread_reports_none() -> None:
    outcomes, _ = await run_batch(
        InMemoryHistoryStorage(), [response("q", [msg("1", t=1)], memory={"readOnly": True})]
    )
    [done] = outcomes
    assert isinstance(done, _Done)
    assert done.slot.result is None


async def test_a_stored_owner_refuses_the_turn_and_nothing_is_written() -> None:
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg("0", t=0)], owner="alice")
    outcomes, buffer = await run_batch(
        storage, [response("q", [msg("9", t=9, resource="bob")], resource="bob")]
    )
    assert isinstance(outcomes[0], Failed)
    assert buffer.slots == []
    assert list(await _rows(storage)) == ["0"]


async def test_a_thread_without_owner_takes_any_resource() -> None:
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id=THREAD, resource_id="", messages=[msg("1", t=1, resource=None)])
    [done], _ = await run_batch(storage, [response("q", [msg("3", t=3, resource="carol")], resource="carol")])
    assert isinstance(done, _Done)
    assert isinstance(done.slot.result, Thread)


async def test_the_buffer_takes_no_write_once_flushed_and_fails_with_its_write() -> None:
    buffer = PersistBuffer(
        SequentialBatches(InMemoryHistoryStorage()),
        await load_batch(SequentialBatches(InMemoryHistoryStorage()), batch_needs([])),
    )
    await buffer.flush()
    with pytest.raises(RuntimeError, match="once done"):
        buffer.skip(0, THREAD)

    class _Down(SequentialBatches):
        async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | InvalidInputError]:
            raise ConnectionError("down")

    down = _Down(InMemoryHistoryStorage())
    failing = PersistBuffer(down, await load_batch(down, batch_needs([])))
    failing.write(0, thread_id=THREAD, resource_id=RESOURCE, messages=[msg("1", t=1)])
    with pytest.raises(ConnectionError):
        await failing.flush()
    assert failing.state is BufferState.FAILED


async def test_a_planned_batch_makes_no_extra_read_and_counts_no_miss() -> None:
    """The latest row a fold needs is in the load: one `list_messages_many`, no `list_messages`."""
    inner = InMemoryHistoryStorage()
    await seed(inner, _pending())
    storage = _Counting(inner)
    event = response("q", [], [msg("a2", "assistant", t=5, text="More.")])
    before = _misses()
    buffer = PersistBuffer(storage, await load_batch(storage, batch_needs([plan_persist(event)])))
    done = await _decide(buffer, 0, event)
    await buffer.flush()
    assert done.saved_ids == ["a1"]
    assert "list_messages" not in storage.calls
    assert _misses() == before


async def test_a_plan_that_proves_short_is_counted_logged_and_read(caplog: pytest.LogCaptureFixture) -> None:
    """A redelivered turn whose user message is stored may continue the latest assistant message, which its
    plan did not load: one counted, logged read, and the same fold as the library's."""
    inner = InMemoryHistoryStorage()
    await seed(inner, _pending())
    storage = _Counting(inner)
    event = response("q", [msg("u1", t=1, text="Which file?")], [msg("a2", "assistant", t=5, text="Again.")])
    before = _misses()
    buffer = PersistBuffer(storage, await load_batch(storage, batch_needs([plan_persist(event)])))
    with caplog.at_level("INFO", logger="consumers.collect"):
        done = await _decide(buffer, 0, event)
    await buffer.flush()
    assert _misses() == before + 1
    assert storage.calls.count("list_messages") == 1
    assert any("persist plan miss" in r.getMessage() for r in caplog.records)
    assert done.saved_ids == ["u1", "a1"]


async def test_legacy_id_kept_when_stored_under_it() -> None:
    """Through the handler's load: a derived id whose pre-0.1.0 copy is stored keeps the old id."""
    new_id = derived_message_id(RESOURCE, THREAD, "q", "input", 0)
    old_id = legacy_message_id("q", "input", 0)
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg(old_id, t=1)])
    event = response("q", [msg(new_id, t=1)])
    needs = plan_persist(event)
    loaded = await load_batch(SequentialBatches(storage), batch_needs([needs]))
    _keep_legacy_ids(event, needs.legacy, loaded)
    assert [m.id for m in event.input] == [old_id]


class _ReadsNothing(PersistBuffer):
    """A buffer whose `read` answers nothing: the decision keeps asking (a bug not to spin on)."""

    reads: int = 0

    async def read(self, thread_id: str, need: Any) -> None:
        self.reads += 1
        assert self.reads <= 10, "the decision kept asking for reads"


async def test_a_decision_asks_for_at_most_two_reads_then_refuses_the_turn() -> None:
    """A read that does not answer (a bug) ends the turn with an error (contained as the record's dead
    letter), not a lane reading forever: the copies, then the newest row, then stop."""
    storage = InMemoryHistoryStorage()
    batch = SequentialBatches(storage)
    r = response("q", [msg("u1", t=1)], [msg("a1", "assistant", t=2)])
    buffer = _ReadsNothing(batch, await load_batch(batch, batch_needs([])))  # nothing loaded: a plan miss
    with pytest.raises(RuntimeError, match="still needs a read"):
        await _decide(buffer, 0, r)
    assert buffer.reads == 2
