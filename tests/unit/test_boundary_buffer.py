"""The recall batch's write-only boundary buffer: its states, one round trip, a thread's early flush."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.prefetch import BoundaryBuffer
from consumers.write_buffer import BufferState
from storage.memory import InMemoryHistoryStorage
from storage.sequential import SequentialBatches


class _Recording(SequentialBatches):
    def __init__(self, *, fail: bool = False) -> None:
        super().__init__(InMemoryHistoryStorage())
        self.writes: list[list[tuple[str, dict[str, Any]]]] = []
        self.fail = fail

    async def save_thread_metadata_many(self, updates: Any) -> None:
        if self.fail:
            raise ConnectionError("down")
        self.writes.append(list(updates))


async def test_collects_then_writes_once_and_takes_no_more() -> None:
    storage = _Recording()
    buffer = BoundaryBuffer(storage)
    buffer.write("a", {"k": 1})
    buffer.write("b", {"k": 2})
    buffer.write("a", {"k": 3})  # the thread's latest boundary wins
    assert storage.writes == []  # nothing written while collecting
    await buffer.flush()
    assert storage.writes == [[("a", {"k": 3}), ("b", {"k": 2})]]
    assert buffer.state is BufferState.DONE
    with pytest.raises(RuntimeError):
        buffer.write("a", {"k": 4})
    with pytest.raises(RuntimeError):
        await buffer.flush()


async def test_a_threads_early_flush_writes_it_alone_and_keeps_collecting() -> None:
    """Before a parked request of thread a reads MongoDB: a's boundary now, and not again at the end."""
    storage = _Recording()
    buffer = BoundaryBuffer(storage)
    buffer.write("a", {"k": 1})
    buffer.write("b", {"k": 2})
    await buffer.flush_thread("a")
    assert buffer.state is BufferState.COLLECTING
    buffer.write("c", {"k": 3})
    await buffer.flush()
    assert storage.writes == [[("a", {"k": 1})], [("b", {"k": 2}), ("c", {"k": 3})]]


async def test_a_failed_flush_leaves_it_failed() -> None:
    buffer = BoundaryBuffer(_Recording(fail=True))
    buffer.write("a", {"k": 1})
    with pytest.raises(ConnectionError):
        await buffer.flush()
    assert buffer.state is BufferState.FAILED
    with pytest.raises(RuntimeError):
        buffer.write("a", {"k": 2})


async def test_nothing_to_write_is_no_round_trip() -> None:
    storage = _Recording()
    buffer = BoundaryBuffer(storage)
    await buffer.flush_thread("a")
    await buffer.flush()
    assert storage.writes == []
    assert buffer.state is BufferState.DONE
