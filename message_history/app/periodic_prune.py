"""The periodic prune of `run`: every `MESSAGE_HISTORY_PRUNE_INTERVAL_S`, by one replica at a time.

With `MESSAGE_HISTORY_PRUNE_OLDER_THAN` set, each replica runs a round per interval: it takes the `prune`
lease (`storage.lease`: one conditional upsert; two intervals long) and prunes, or skips the round while
another replica holds it (a debug line naming the holder). The holder renews the lease while it prunes and
after, so it keeps the job while it lives; when it stops, the lease expires and the next replica's round
takes over.
The info line `periodic prune` is written only by the replica that pruned (`"pruned": true`, `replica`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from message_history.app.prune import iso, parse_duration
from message_history.errors import MessageHistoryError

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase

    from message_history.settings import Settings
    from storage.lease import MongoLease
    from storage.pruning import MongoPruner

log = logging.getLogger(__name__)

PRUNE_LEASE = "prune"


def replica_id() -> str:
    """This replica's name for the lease: the host (the pod's name on Kubernetes) and the process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


@contextlib.asynccontextmanager
async def periodic_prune(
    db: AsyncDatabase[Any], settings: Settings, *, holder: str | None = None
) -> AsyncIterator[None]:
    """While the block runs, prune every `prune_interval_s` with `prune_older_than` when this replica holds
    the prune lease (`holder`, default `replica_id()`); a failure is logged."""
    assert settings.prune_older_than is not None
    older_than = parse_duration(settings.prune_older_than)  # a bad value refuses to start
    async with _in_background(
        _prune_forever(db, settings, older_than, holder or replica_id()), "periodic-prune"
    ):
        yield


async def _prune_forever(
    db: AsyncDatabase[Any], settings: Settings, older_than: timedelta, holder: str
) -> None:
    from storage.lease import MongoLease  # noqa: PLC0415
    from storage.pruning import MongoPruner  # noqa: PLC0415

    pruner = MongoPruner(db, batch_size=settings.prune_batch_size, turn_timeout_s=settings.turn_timeout_s)
    # two intervals: the holder renews it at every round, so it keeps it while it lives
    lease = MongoLease(db, PRUNE_LEASE, holder=holder, ttl=timedelta(seconds=2 * settings.prune_interval_s))
    while True:
        await prune_round(pruner, lease, older_than)
        await asyncio.sleep(settings.prune_interval_s)


async def prune_round(pruner: MongoPruner, lease: MongoLease, older_than: timedelta) -> bool:
    """One round of the periodic prune: prune when this replica takes (or keeps) the lease; True if it did."""
    try:
        if not await lease.acquire():
            await _skipped(lease)
            return False
        cutoff = datetime.now(UTC) - older_than
        started = time.monotonic()
        async with _renewing(lease):
            progress = await pruner.prune(cutoff)
        await lease.acquire()  # the next round starts an interval from now, well within the lease
    except MessageHistoryError as exc:  # an outage or a refusal: the next run tries again
        log.warning("periodic prune failed", extra={"error": str(exc), "retriable": exc.retriable})
        return False
    log.info(
        "periodic prune",
        extra={
            "audit": "prune",
            "pruned": True,
            "replica": lease.holder,
            "cutoff": iso(cutoff),
            "deleted_messages": progress.messages,
            "deleted_threads": progress.threads,
            "deleted_turn_markers": progress.markers,
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return True


async def _skipped(lease: MongoLease) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return  # reading who holds it is only for this line
    current = await lease.current()
    log.debug(
        "periodic prune skipped: another replica holds the prune lease",
        extra={
            "pruned": False,
            "replica": lease.holder,
            "lease_holder": current.holder if current else None,
            "lease_expires_at": iso(current.expires_at) if current else None,
        },
    )


@contextlib.asynccontextmanager
async def _renewing(lease: MongoLease) -> AsyncIterator[None]:
    """Renew the lease every quarter of its length while the block runs (a prune longer than the lease)."""

    async def renew() -> None:
        while True:
            await asyncio.sleep(lease.ttl.total_seconds() / 4)
            try:
                kept = await lease.acquire()
            except MessageHistoryError:
                continue  # the prune meets the same outage and reports it
            if not kept:  # a clock skew or a stall let another take it: both prune once, harmless
                log.warning("periodic prune: the prune lease was taken over", extra={"replica": lease.holder})
                return

    async with _in_background(renew(), "prune-lease-renewal"):
        yield


@contextlib.asynccontextmanager
async def _in_background(job: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """Run `job` as a task while the block runs; cancelled (and awaited) when the block ends."""
    task = asyncio.create_task(job, name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
