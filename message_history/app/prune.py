"""`message-history prune`: retention. Deletes messages older than a cut-off, then threads left empty.

    message-history prune --older-than 90d            # cut-off = now - 90 days
    message-history prune --before 2026-09-01T00:00:00Z
    message-history prune --older-than 90d --dry-run  # count only

Batched (`--batch-size`, default `MESSAGE_HISTORY_PRUNE_BATCH_SIZE`), with a progress line per batch on stderr
and a summary on stdout. Interrupted (Ctrl-C, SIGTERM, `--max-batches`), it finishes the batch in hand and
prints the command that resumes it with the same cut-off (`--before`); every step is idempotent, so the
resumed run ends where one uninterrupted run would. The order is `@mastra/mongodb`'s (`storage.pruning`).

With `MESSAGE_HISTORY_PRUNE_OLDER_THAN` set, `run` also prunes every `MESSAGE_HISTORY_PRUNE_INTERVAL_S`
(`message_history.app.periodic_prune`, one replica at a time); off by default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

from message_history.errors import MessageHistoryError

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase

    from message_history.settings import Settings
    from storage.pruning import PruneProgress

log = logging.getLogger(__name__)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Linear: anchored (`match`), and each run (spaces, digits, the fraction after its `.`) is bounded by a
# character the next run cannot take.
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
    from message_history.logs import scrub  # noqa: PLC0415 -- pydantic: not for `--help`

    try:
        cutoff = cutoff_from(older_than=args.older_than, before=args.before, now=datetime.now(UTC))
    except ValueError as exc:
        print(f"message-history prune: {scrub(str(exc))}", file=err)
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
    from message_history.logs import scrub  # noqa: PLC0415

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_prune(settings, args, out=sys.stdout, err=sys.stderr, stop=stop)
    except MessageHistoryError as exc:
        print(f"message-history prune: {scrub(str(exc))}", file=sys.stderr)
        return 1
