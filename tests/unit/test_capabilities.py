"""A storage's capabilities are decided once, when the paths are wired (`app.capabilities`), not probed per
batch: a path uses a capability only when it is given one (issue 32 item 4)."""

from __future__ import annotations

from collections.abc import Sequence

from message_history.app.capabilities import storage_capabilities
from storage.memory import InMemoryHistoryStorage
from storage.protocol import RecallQuery
from storage.sequential import SequentialBatches
from tests.paths import Paths, request, user
from tests.raw_storage import RawRowStorage


class _CountingRaw(RawRowStorage):
    def __init__(self) -> None:
        super().__init__()
        self.raw_reads = 0

    async def recall_raw_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[bytes]]:
        self.raw_reads += 1
        return await super().recall_raw_many(queries)


def test_the_capabilities_are_what_the_storage_has() -> None:
    plain = storage_capabilities(SequentialBatches(InMemoryHistoryStorage()))
    assert (plain.raw_rows, plain.save_reads, plain.homes) == (None, None, None)
    raw = RawRowStorage()
    assert storage_capabilities(raw).raw_rows is raw


async def test_the_recall_path_reads_bytes_only_when_wired_to() -> None:
    """Wired with its storage's capabilities (`tests.paths.Paths`, as the service), the recall path reads
    a plain page as bytes; the same handler given none reads models, though the storage could."""
    wired = _CountingRaw()
    await Paths(storage=wired).recall(request("t1", [user("u1", "hi", 1)]))
    assert wired.raw_reads == 1
    unwired = _CountingRaw()
    paths = Paths(storage=unwired)
    paths.recall_handler.raw_rows = None
    await paths.recall(request("t1", [user("u1", "hi", 1)]))
    assert unwired.raw_reads == 0
