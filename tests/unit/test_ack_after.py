"""`consumers.contract.ack_after` on two futures chains them by callbacks (`message_history.futures`, which
replay's recorded outcomes share) instead of a task per record (issue 33); the outcome is the task's
(`_after`) in every case: both succeed, either fails or is cancelled, in either order, and cancelling the
chained future cancels what it still waits for."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from consumers.contract import _after, ack_after
from message_history.futures import chained, resolved_after

Step = Callable[[asyncio.Future[Any]], None]


def _ok(value: object) -> Step:
    return lambda f: f.set_result(value)


def _fail(error: Exception) -> Step:
    return lambda f: f.set_exception(error)


def _cancel(f: asyncio.Future[Any]) -> None:
    f.cancel()


OUTCOMES: list[tuple[str, Step]] = [
    ("ok", _ok("x")),
    ("error", _fail(ValueError("boom"))),
    ("cancelled", _cancel),
]


async def _run(chained: bool, first_step: Step, ack_step: Step, ack_first: bool) -> tuple[str, object]:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[Any] = loop.create_future()
    ack: asyncio.Future[Any] = loop.create_future()
    out = asyncio.ensure_future(ack_after(first, ack) if chained else _after(first, ack))
    for step, future in (
        ((ack_step, ack), (first_step, first)) if ack_first else ((first_step, first), (ack_step, ack))
    ):
        step(future)
        await asyncio.sleep(0)
    for _ in range(3):
        await asyncio.sleep(0)
    ack.exception() if ack.done() and not ack.cancelled() else None  # retrieved: no warning either way
    if not out.done():
        return "pending", None
    if out.cancelled():
        return "cancelled", None
    error = out.exception()
    return ("error", repr(error)) if error is not None else ("ok", out.result())


@pytest.mark.parametrize("ack_first", [False, True])
@pytest.mark.parametrize(("first_name", "first_step"), OUTCOMES)
@pytest.mark.parametrize(("ack_name", "ack_step"), OUTCOMES)
def test_the_chain_ends_as_the_task_does(
    first_name: str, first_step: Step, ack_name: str, ack_step: Step, ack_first: bool
) -> None:
    async def both() -> tuple[tuple[str, object], tuple[str, object]]:
        return (
            await _run(True, first_step, ack_step, ack_first),
            await _run(False, first_step, ack_step, ack_first),
        )

    ours, task = asyncio.run(both())
    assert ours == task, (first_name, ack_name)


@pytest.mark.parametrize("first_done", [False, True])
def test_cancelling_the_chain_cancels_what_it_waits_for(first_done: bool) -> None:
    async def run(chained: bool) -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Any] = loop.create_future()
        ack: asyncio.Future[Any] = loop.create_future()
        out = asyncio.ensure_future(ack_after(first, ack) if chained else _after(first, ack))
        await asyncio.sleep(0)
        if first_done:
            first.set_result(None)
            for _ in range(3):
                await asyncio.sleep(0)
        out.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        assert out.cancelled()
        return first.cancelled(), ack.cancelled()

    async def both() -> tuple[tuple[bool, bool], tuple[bool, bool]]:
        return await run(True), await run(False)

    ours, task = asyncio.run(both())
    assert ours == task


def test_awaitables_that_are_not_futures_still_go_through_a_task() -> None:
    async def value() -> str:
        return "v"

    async def run() -> object:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Any] = loop.create_future()
        first.set_result(None)
        return await ack_after(first, value())

    assert asyncio.run(run()) == "v"


# --- replay's recorded outcomes: the same chain, to a value (message_history.futures.resolved_after) ------


@pytest.mark.parametrize(("first_name", "first_step"), OUTCOMES)
def test_resolved_after_ends_as_a_task_awaiting_first_then_returning_the_value(
    first_name: str, first_step: Step
) -> None:
    """Replay's acknowledgement (`sinks._Recording`): the event once the send succeeded, else the send's
    error or cancellation; as `async def: await first; return value`."""

    async def run(shared: bool) -> tuple[str, object]:
        first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def task() -> object:
            await first
            return "event"

        out = resolved_after(first, "event") if shared else asyncio.ensure_future(task())
        await asyncio.sleep(0)
        first_step(first)
        for _ in range(3):
            await asyncio.sleep(0)
        if out.cancelled():
            return "cancelled", None
        error = out.exception()
        return ("error", repr(error)) if error is not None else ("ok", out.result())

    async def both() -> tuple[tuple[str, object], tuple[str, object]]:
        return await run(True), await run(False)

    ours, task = asyncio.run(both())
    assert ours == task, first_name
    assert ours[0] == first_name


@pytest.mark.parametrize("first_fails", [False, True])
def test_settled_chains_are_freed_without_the_collector(first_fails: bool) -> None:
    """Once settled, the chain and both futures it followed go with their last reference, without a garbage
    collection: no reference cycle holds them (a callback naming itself through its closure did, and kept
    each record's futures and Kafka metadata alive until the collector found them)."""

    async def run() -> list[weakref.ref[asyncio.Future[Any]]]:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Any] = loop.create_future()
        then: asyncio.Future[Any] = loop.create_future()
        out = chained(first, then)
        refs = [weakref.ref(f) for f in (first, then, out)]
        if first_fails:
            first.set_exception(ValueError("boom"))
        else:
            first.set_result(None)
        await asyncio.sleep(0)
        then.set_result("x")
        for _ in range(3):
            await asyncio.sleep(0)
        assert out.done()
        out.exception()  # retrieved: no "never retrieved" warning
        first.exception()
        del first, then, out
        return refs

    gc.collect()
    gc.disable()
    try:
        refs = asyncio.run(run())
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()
