"""Run a batch's work grouped by thread: one thread's items strictly in order, different threads concurrently.

Each distinct key is a lane; a lane runs its items one after the other in batch order, and at most
`max_concurrent` lanes run at the same time. Errors named in `item_errors` (bad input: a dead letter) are
that item's result and its lane goes on; any other error is a batch failure: the remaining lanes are
cancelled and the error propagates, so the caller retries or stops the whole batch and nothing of a thread
runs past an item that did not finish.

`run_lanes` is the one lane runner: the recall and persist paths (`consumers.handler.PathHandler.per_thread`)
and the worker SDK's batches (`worker.runner`) run on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Failed:
    """An item whose work raised one of the tolerated errors."""

    error: BaseException


def group_lanes(items: Sequence[T], key: Callable[[T], Hashable]) -> list[list[int]]:
    """Indexes of `items` grouped by key, lanes in order of first appearance, items in batch order."""
    lanes: dict[Hashable, list[int]] = {}
    for index, item in enumerate(items):
        lanes.setdefault(key(item), []).append(index)
    return list(lanes.values())


async def run_lanes(
    items: Sequence[T],
    *,
    key: Callable[[T], Hashable],
    work: Callable[[T], Awaitable[R]],
    max_concurrent: int,
    item_errors: tuple[type[BaseException], ...] = (),
) -> list[R | Failed]:
    """Run `work` on every item, per-key in order, keys concurrently; results in the order of `items`.

    The one lane runner of the service's paths and of the worker SDK (`worker.runner`). The lanes run in a
    `TaskGroup`: the first untolerated error cancels the other lanes and is raised as itself (not as an
    `ExceptionGroup`), and a cancelled caller cancels every lane before it returns.
    """
    if max_concurrent < 1:
        raise ValueError("max_concurrent must be at least 1")
    unset = object()
    results: list[object] = [unset] * len(items)
    gate = asyncio.Semaphore(max_concurrent)

    async def run_lane(indexes: list[int]) -> None:
        async with gate:
            for index in indexes:
                try:
                    results[index] = await work(items[index])
                except item_errors as exc:
                    results[index] = Failed(exc)

    lanes = group_lanes(items, key)
    if len(lanes) == 1:  # the common single-thread case needs no tasks
        await run_lane(lanes[0])
    elif lanes:
        try:
            async with asyncio.TaskGroup() as group:
                for indexes in lanes:
                    group.create_task(run_lane(indexes))
        except ExceptionGroup as failed:  # the lanes' own errors only: the first one to happen, unwrapped
            raise failed.exceptions[0] from None
    assert all(r is not unset for r in results)  # every lane ran to its end, or an error propagated above
    return cast("list[R | Failed]", results)
