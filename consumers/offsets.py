"""Which input offset may be committed: the contiguous completed watermark of each partition. Pure, no I/O.

Records of one partition complete out of order (different threads run concurrently, a dead letter is
acknowledged before a slow enrichment). Kafka keeps one committed offset per partition, meaning "everything
below this is done", so the offset to commit is the lowest offset still pending, or one past the highest
fetched offset when nothing is pending. Offsets need not be contiguous (transaction markers and compaction
leave gaps); only fetched offsets count.

Each assignment of a partition gets a fresh `PartitionOffsets`. A batch keeps references to the objects it
tracked, so work finishing after its partition was revoked lands on a detached object and cannot move the new
owner's watermark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class PartitionOffsets:
    """Fetched and completed offsets of one partition, for one assignment of it."""

    __slots__ = ("_committed", "_done", "_next", "_pending")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # fetched and not yet known done, ascending
        self._done: set[int] = set()  # done offsets still inside `_pending`
        self._next: int | None = None  # one past the highest fetched offset
        self._committed: int | None = None  # last offset handed out as committed (or the start)

    def track(self, offset: int) -> None:
        """Record a fetched offset. Offsets at or below one already tracked are ignored (a re-fetch)."""
        if self._next is not None and offset < self._next:
            return
        if self._committed is None:
            self._committed = offset  # committing the first fetched offset would say nothing new
        self._pending.append(offset)
        self._next = offset + 1

    def done(self, offset: int) -> None:
        """Mark a tracked offset complete: every output it caused is acknowledged."""
        if not self._pending or offset < self._pending[0] or self._next is None or offset >= self._next:
            return  # not tracked here (already below the watermark, or from an older assignment)
        self._done.add(offset)
        while self._pending and self._pending[0] in self._done:
            self._done.discard(self._pending.popleft())

    def watermark(self) -> int | None:
        """Lowest pending offset, or one past the highest fetched offset; None before any fetch."""
        if self._pending:
            return self._pending[0]
        return self._next

    def committable(self) -> int | None:
        """The watermark when it moved past the last committed offset, else None."""
        mark = self.watermark()
        if mark is None or (self._committed is not None and mark <= self._committed):
            return None
        return mark

    def mark_committed(self, offset: int) -> None:
        """Remember that `offset` was committed (it only ever moves forward)."""
        if self._committed is None or offset > self._committed:
            self._committed = offset

    @property
    def pending(self) -> int:
        """Fetched records not yet complete."""
        return len(self._pending) - len(self._done)


class OffsetTracker(Generic[K]):
    """`PartitionOffsets` for every partition currently assigned, keyed by partition."""

    def __init__(self) -> None:
        self._parts: dict[K, PartitionOffsets] = {}

    def partition(self, key: K) -> PartitionOffsets:
        """The current assignment's tracker for `key`, created on first use."""
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = PartitionOffsets()
        return part

    def track(self, key: K, offset: int) -> PartitionOffsets:
        """Record a fetched offset; returns the tracker to call `done` on later."""
        part = self.partition(key)
        part.track(offset)
        return part

    def committable(self, keys: Iterable[K] | None = None) -> dict[K, int]:
        """Offsets to commit now (only partitions whose watermark moved), optionally limited to `keys`."""
        selected = self._parts if keys is None else {k: self._parts[k] for k in keys if k in self._parts}
        out: dict[K, int] = {}
        for key, part in selected.items():
            mark = part.committable()
            if mark is not None:
                out[key] = mark
        return out

    def watermark(self, key: K) -> int | None:
        """The partition's contiguous done watermark; None when not assigned or nothing fetched yet."""
        part = self._parts.get(key)
        return part.watermark() if part is not None else None

    def mark_committed(self, offsets: Mapping[K, int]) -> None:
        """Record a successful commit of `offsets`."""
        for key, offset in offsets.items():
            part = self._parts.get(key)
            if part is not None:
                part.mark_committed(offset)

    def forget(self, keys: Iterable[K]) -> None:
        """Drop partitions that were revoked; their late completions no longer count."""
        for key in keys:
            self._parts.pop(key, None)

    def owns(self, key: K, part: PartitionOffsets) -> bool:
        """True when `part` is still the tracker of the current assignment of `key`."""
        return self._parts.get(key) is part

    def pending(self) -> int:
        """Records fetched and not complete, over all partitions."""
        return sum(p.pending for p in self._parts.values())

    def keys(self) -> list[K]:
        return list(self._parts)
