"""`InMemoryHistoryStorage` keeps the semantics the MongoDB storage has (upsert, ownership, thread times)."""

from __future__ import annotations

import pytest

from message_history.errors import InvalidInputError, MessageIdTakenError, ThreadOwnershipError
from storage.memory import InMemoryHistoryStorage
from storage.protocol import HistoryStorage
from tests.rule_cases import RESOURCE, THREAD, at, msg, summarize


def test_implements_the_protocol() -> None:
    """The in-memory storage declares `HistoryStorage`: mypy checks it has all six operations (an explicit
    protocol subclass missing one cannot be instantiated), nothing probes it at run time."""
    storage: HistoryStorage = InMemoryHistoryStorage()
    assert HistoryStorage in type(storage).__mro__


async def test_new_thread_created_from_message_times() -> None:
    """A first save creates the thread: title '', metadata {}, times = earliest/newest message."""
    storage = InMemoryHistoryStorage()
    thread = await storage.save_messages(
        thread_id=THREAD, resource_id=RESOURCE, messages=[msg("b", t=20), msg("a", t=10)]
    )
    assert (thread.id, thread.resourceId, thread.title, thread.metadata) == (THREAD, RESOURCE, "", {})
    assert (thread.createdAt, thread.updatedAt) == (at(10), at(20))
    assert await storage.get_thread(THREAD) == thread


async def test_updated_at_only_moves_forward() -> None:
    """Saving older messages later never moves updatedAt back; newer ones move it forward."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("n", t=50)])
    older = await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("o", t=5)])
    assert (older.createdAt, older.updatedAt) == (at(50), at(50))
    newer = await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("z", t=90)])
    assert newer.updatedAt == at(90)


async def test_upsert_keeps_first_created_at_and_replaces_the_rest() -> None:
    """Re-saving an id updates its content but keeps the createdAt of the first insert."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("x", t=1, text="v1")])
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("x", t=99, text="v2")])
    (stored,) = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert (stored.createdAt, summarize(stored)) == (at(1), ["text:v2"])


async def test_list_newest_first_with_id_tie_break_limit_and_resource_filter() -> None:
    """Pages are newest first by (createdAt, id), limited, and filtered by resource when one is given."""
    storage = InMemoryHistoryStorage()
    rows = [msg("a", t=1), msg("c", t=2), msg("b", t=2), msg("x", t=3, resource="r2")]
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=rows)
    everything = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert [m.id for m in everything] == ["x", "c", "b", "a"]
    mine = await storage.list_messages(THREAD, resource_id=RESOURCE, limit=2)
    assert [m.id for m in mine] == ["c", "b"]
    assert await storage.list_messages(THREAD, resource_id=None, limit=0) == []
    assert await storage.list_messages("unknown", resource_id=None, limit=None) == []


async def test_ownership_refused_and_nothing_written() -> None:
    """A save into a thread of another resource raises and leaves messages and thread untouched."""
    storage = InMemoryHistoryStorage()
    before = await storage.save_messages(thread_id=THREAD, resource_id="r2", messages=[msg("a", t=1)])
    with pytest.raises(ThreadOwnershipError) as raised:
        await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("b", t=9)])
    assert (raised.value.owner, raised.value.resource_id) == ("r2", RESOURCE)
    assert [m.id for m in await storage.list_messages(THREAD, resource_id=None, limit=None)] == ["a"]
    assert await storage.get_thread(THREAD) == before


async def test_system_rows_are_stored_when_given() -> None:
    """The storage stores what it is given, system messages included (the rules decide what to save)."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("s", "system", t=1)])
    assert [m.role for m in await storage.list_messages(THREAD, resource_id=None, limit=None)] == ["system"]


async def test_a_message_id_stored_in_another_thread_refuses_the_save() -> None:
    """Re-saving an id into another thread is refused, nothing written (Mastra would move the message)."""
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("x", t=1)])
    messages = [msg("y", t=2, thread="t2"), msg("x", t=1, thread="t2")]
    with pytest.raises(MessageIdTakenError) as refused:
        await storage.save_messages(thread_id="t2", resource_id="other", messages=messages)
    assert THREAD not in str(refused.value)
    assert RESOURCE not in str(refused.value)
    assert [m.id for m in await storage.list_messages(THREAD, resource_id=None, limit=None)] == ["x"]
    assert await storage.get_thread("t2") is None
    assert await storage.list_messages("t2", resource_id=None, limit=None) == []


async def test_stored_state_cannot_be_changed_through_returned_objects() -> None:
    """Mutating what went in or came out does not change what is stored."""
    storage = InMemoryHistoryStorage()
    given = msg("x", t=1, text="kept")
    thread = await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[given])
    given.content.parts.clear()
    thread.metadata["tampered"] = True
    (out,) = await storage.list_messages(THREAD, resource_id=None, limit=None)
    out.content.parts.clear()
    (again,) = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert summarize(again) == ["text:kept"]
    stored_thread = await storage.get_thread(THREAD)
    assert stored_thread is not None
    assert stored_thread.metadata == {}


async def test_failed_save_writes_nothing() -> None:
    """A batch with a message lacking an id is refused whole: nothing from it is stored."""
    storage = InMemoryHistoryStorage()
    bare = msg("tmp", t=2).model_copy(update={"id": None})
    with pytest.raises(InvalidInputError):
        await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=[msg("a", t=1), bare])
    assert await storage.get_thread(THREAD) is None
    assert await storage.list_messages(THREAD, resource_id=None, limit=None) == []


@pytest.mark.parametrize("limit", [-1], ids=["negative"])
async def test_negative_limit_refused(limit: int) -> None:
    """A negative page size is an input error, not an empty page."""
    with pytest.raises(InvalidInputError):
        await InMemoryHistoryStorage().list_messages(THREAD, resource_id=None, limit=limit)
