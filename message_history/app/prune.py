"""`message-history prune`: retention. Deletes messages older than a cut-off, then threads left empty.

    message-history prune --older-than 90d            # cut-off = now - 90 days
    message-history prune --before 2026-09-01T00:00:00Z
    message-history prune --older-than 90d --dry-run  # count only

Batched (`--batch-size`, default `MESSAGE_HISTORY_PRUNE_BATCH_SIZE`), with a progress line per batch on stderr
and a summary on stdout. Interrupted (Ctrl-C, SIGTERM, `--max-batches`), it finishes the batch in hand and
prints the command that resumes it with the same cut-off (`--before`); every step is idempotent, so the
resumed run ends where one uninterrupted run would. The order is `@mastra/mongodb`'s (`storage.pruning`).

With `MESSAGE_HISTORY_PRUNE_OLDER_THAN` set, `run` also prunes every `MESSAGE_HISTORY_PRUNE_INTERVAL_S`
(`periodic_prune`); off by default. With several replicas only the holder of the `prune` lease
(`storage.lease`, two intervals long, renewed at each of its rounds and while it prunes) prunes; the others
skip the round (a debug line), and take over once a holder that stopped lets the lease expire.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

from message_history.errors import MessageHistoryError

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase

    from message_history.settings import Settings
    from storage.lease import MongoLease
    from storage.pruning import MongoPruner, PruneProgress

log = logging.getLogger(__name__)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(text: str) -> timedelta:
    """`90d`, `12h`, `30m`, `45s`, `2w` as a timedelta; `ValueError` for anything else (or zero)."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration: a number and one of s, m, h, d, w (e.g. 90d)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be more than zero")
    return timedelta(seconds=seconds)


def parse_instant(text: str) -> datetime:
    """An ISO-8601 instant (`Z` or an offset; naive means UTC)."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 instant (e.g. 2026-09-01T00:00:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def cutoff_from(*, older_than: str | None, before: str | None, now: datetime) -> datetime:
    """The cut-off instant, to the millisecond (what BSON dates hold)."""
    if (older_than is None) == (before is None):
        raise ValueError("give exactly one of --older-than and --before")
    cutoff = parse_instant(before) if before is not None else now - parse_duration(str(older_than))
    return cutoff.astimezone(UTC).replace(microsecond=cutoff.microsecond - cutoff.microsecond % 1000)


def iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def add_prune_arguments(parser: argparse.ArgumentParser) -> None:
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--older-than", metavar="DURATION", help="delete what is older than this: 90d, 12h, 2w")
    when.add_argument("--before", metavar="INSTANT", help="delete what is older than this ISO-8601 instant")
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per delete (default: the setting)")
    parser.add_argument("--max-batches", type=int, default=None, help="stop after this many batches")


# --- the command -------------------------------------------------------------------------------------------


async def run_prune(
    settings: Settings,
    args: argparse.Namespace,
    *,
    out: TextIO,
    err: TextIO,
    stop: asyncio.Event | None = None,
    db: AsyncDatabase[Any] | None = None,
) -> int:
    """The `prune` command on an open database (`db`, else one connected from the settings)."""
    try:
        cutoff = cutoff_from(older_than=args.older_than, before=args.before, now=datetime.now(UTC))
    except ValueError as exc:
        print(f"message-history prune: {exc}", file=err)
        return 2
    if db is None:
        async with _database(settings) as opened:
            return await run_prune(settings, args, out=out, err=err, stop=stop, db=opened)
    from storage.pruning import MongoPruner  # noqa: PLC0415 -- keeps `--help` free of pymongo

    pruner = MongoPruner(
        db, batch_size=args.batch_size or settings.prune_batch_size, turn_timeout_s=settings.turn_timeout_s
    )
    if args.dry_run:
        messages, threads, markers = await pruner.count(cutoff)
        summary = {
            "cutoff": iso(cutoff),
            "dryRun": True,
            "messages": messages,
            "staleThreads": threads,
            "turnMarkers": markers,
        }
        print(json.dumps(summary), file=out)
        return 0
    started = time.monotonic()

    def show(progress: PruneProgress) -> None:
        elapsed = max(time.monotonic() - started, 1e-9)
        rate = (progress.messages + progress.threads) / elapsed
        print(
            f"prune: {progress.messages} messages, {progress.threads} threads, "
            f"{progress.markers} turn markers deleted "
            f"({progress.batches} batches, {rate:.0f} rows/s)",
            file=err,
            flush=True,
        )

    progress = await pruner.prune(cutoff, on_batch=show, stop=stop, max_batches=args.max_batches)
    elapsed = time.monotonic() - started
    summary = {
        "cutoff": iso(cutoff),
        "done": progress.done,
        "deletedMessages": progress.messages,
        "deletedThreads": progress.threads,
        "deletedTurnMarkers": progress.markers,
        "batches": progress.batches,
        "seconds": round(elapsed, 3),
        "rowsPerSecond": round((progress.messages + progress.threads) / max(elapsed, 1e-9)),
    }
    print(json.dumps(summary), file=out)
    log.info("pruned", extra={"audit": "prune", **summary})
    if not progress.done:
        print(f"interrupted; resume with: message-history prune --before {iso(cutoff)}", file=err)
        return 3
    return 0


@contextlib.asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[AsyncDatabase[Any]]:
    from storage.client import mongo_client  # noqa: PLC0415

    # one batch of deletes may take longer than a read
    client = mongo_client(
        settings,
        appname="message-history-prune",
        operation_timeout_ms=max(settings.mongodb_timeout_ms, 60_000),
    )
    try:
        yield client[settings.mongodb_database]
    finally:
        await client.close()


def main(args: argparse.Namespace) -> int:
    from message_history.logs import start_command  # noqa: PLC0415
    from message_history.settings import Settings  # noqa: PLC0415

    settings = Settings()
    start_command(settings)
    return asyncio.run(_main(settings, args))


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_prune(settings, args, out=sys.stdout, err=sys.stderr, stop=stop)
    except MessageHistoryError as exc:
        print(f"message-history prune: {exc}", file=sys.stderr)
        return 1


# --- from the service --------------------------------------------------------------------------------------

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
