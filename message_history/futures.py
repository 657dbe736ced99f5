"""Futures chained by done-callbacks instead of a task each (issue 33: a task per record was ~5% of a persist
batch's CPU). Ground: the stream's acknowledgements (`consumers.contract.ack_after`) and replay's recorded
outcomes (`message_history.app.replay.sinks`) both chain this way."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

__all__ = ["chained", "follow", "resolved_after"]

T = TypeVar("T")


def chained(first: asyncio.Future[Any], then: asyncio.Future[T]) -> asyncio.Future[T]:
    """What a task awaiting `first` then `then` would give: `then`'s result once both are done, `first`'s
    error (or cancellation) if it fails, else `then`'s; and, as the task would, cancelling it cancels the
    future it still waits for."""
    out: asyncio.Future[T] = first.get_loop().create_future()

    def settle(done: asyncio.Future[Any]) -> None:
        _settle_as(out, done)

    # Not one callback that adds itself to `then`: a function naming itself through its closure is a
    # reference cycle, which kept every chained future (and the Kafka metadata it holds) alive until the
    # collector found it (issue 33: most of the persist path's cyclic garbage).
    def copy(done: asyncio.Future[Any]) -> None:
        if not out.done() and not done.cancelled() and done.exception() is None:
            then.add_done_callback(settle)
        else:
            _settle_as(out, done)

    def cancelled(_: asyncio.Future[T]) -> None:
        if out.cancelled():
            (then if first.done() else first).cancel()

    first.add_done_callback(copy)
    out.add_done_callback(cancelled)
    return out


def resolved_after(first: asyncio.Future[Any], value: T) -> asyncio.Future[T]:
    """A future resolving with `value` once `first` succeeded, failing (or cancelled) as it did."""
    ready: asyncio.Future[T] = first.get_loop().create_future()
    ready.set_result(value)
    return chained(first, ready)


def follow(source: asyncio.Future[T], target: asyncio.Future[T]) -> None:
    """`target` (a future handed out before `source` existed) settles as `source` does; cancelling `target`
    cancels `source`, as cancelling a task cancels what it awaits."""

    def copy(done: asyncio.Future[T]) -> None:
        _settle_as(target, done)

    def cancelled(_: asyncio.Future[T]) -> None:
        if target.cancelled() and not source.done():
            source.cancel()

    source.add_done_callback(copy)
    target.add_done_callback(cancelled)


def _settle_as(target: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    """`target` given `done`'s outcome (its result, error or cancellation), unless it is settled already."""
    if target.done():
        return
    if done.cancelled():
        target.cancel()
    elif (error := done.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(done.result())
