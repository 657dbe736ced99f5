"""The process's local zone for the tests: resource scope's `<other-conversation>` blocks are written in it
(as Mastra writes them in its process's; docs/observational-memory.md#resource-scope). The suite runs in UTC
(`tests/conftest.py` pins it, child processes included), so expected texts hold on any machine;
`local_zone` sets another for one test and puts the previous one back."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

__all__ = ["local_zone", "pin_utc"]


def _set(name: str | None) -> None:
    if name is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = name
    time.tzset()


def pin_utc() -> None:
    """The suite's zone: UTC for this process and every process it starts."""
    _set("UTC")


@contextlib.contextmanager
def local_zone(name: str) -> Iterator[None]:
    """The process in zone `name` (an IANA name, as `TZ` takes it) for the block."""
    before = os.environ.get("TZ")
    _set(name)
    try:
        yield
    finally:
        _set(before)
