"""The write-only batch buffers' one base: a batch's writes collected, then written in one round trip.

Two buffers are built on it: the persist path's `consumers.collect.PersistBuffer` (the turns' messages, one
`save_many`) and the recall path's `consumers.prefetch.BoundaryBuffer` (the token boundaries a batch moves,
one `save_thread_metadata_many`). Their state is explicit and the same: `COLLECTING` (takes writes) ->
`FLUSHING` (the one round trip) -> `DONE`, or `FAILED` when that write fails (the loop retries the batch
with a new buffer). Nothing is written while collecting, and nothing is taken once flushing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar


class BufferState(enum.Enum):
    COLLECTING = "collecting"
    FLUSHING = "flushing"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class WriteBuffer:
    """A write-only batch buffer; a subclass says what it writes (`_write`), called once by `flush`."""

    what: ClassVar[str] = "write"  # the buffer's name in its errors ("the persist buffer ...")
    state: BufferState = field(default=BufferState.COLLECTING, kw_only=True)

    def _collecting(self, refused: str = "takes no writes") -> None:
        """Refuse (`RuntimeError`) what only a collecting buffer does, once it is not collecting."""
        if self.state is not BufferState.COLLECTING:
            raise RuntimeError(f"the {self.what} buffer {refused} once {self.state.value}")

    async def flush(self) -> None:
        """Write what was collected, once: then `DONE`, or `FAILED` with the write's error raised."""
        self._collecting("is not flushed again")
        self.state = BufferState.FLUSHING
        try:
            await self._write()
        except BaseException:
            self.state = BufferState.FAILED
            raise
        self.state = BufferState.DONE

    async def _write(self) -> None:
        raise NotImplementedError
