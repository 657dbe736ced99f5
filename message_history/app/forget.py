"""`message-history forget`: erase one thread or everything of one resource (user, tenant) from MongoDB.

    message-history forget --thread THREAD_ID [--dry-run]
    message-history forget --resource RESOURCE_ID [--dry-run]

Prints the `HistoryForgotten` answer (counts and ids) as JSON on stdout and writes the audit line to the log;
a long forget shows its progress on stderr (deleted so far, every second: it runs in chunks of
`MESSAGE_HISTORY_FORGET_CHUNK_SIZE` rows, each operation under a 60 s bound).
The same as a `ForgetThread` / `ForgetResource` command on the commands topic, without Kafka: it needs only
MongoDB. A tombstone keeps the persist path (live, or `replay`) from writing the forgotten turns back. Running
it twice is harmless; the second run counts zero.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from message_history.settings import Settings


def add_forget_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--thread", metavar="ID", help="forget this thread: its messages and the thread")
    what.add_argument("--resource", metavar="ID", help="forget every thread and message of this resource")
    parser.add_argument(
        "--owner",
        metavar="RESOURCE_ID",
        help=(
            "with --thread: forget only this resource's history; refused when another resource owns the "
            "thread, or when it has no owner recorded and holds history that is not this resource's"
        ),
    )
    parser.add_argument("--dry-run", action="store_true", help="count and list only; delete nothing")
    parser.add_argument("--request-id", default=None, help="id for the audit line (default: a new UUID)")


async def run_forget(settings: Settings, args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    """The `forget` command, on the database of `settings`."""
    # imported here so that `--help` stays instant (no driver, no Kafka client)

    from consumers.commands import ForgetProgress, audit  # noqa: PLC0415
    from message_history.errors import MessageHistoryError, ThreadOwnershipError  # noqa: PLC0415
    from message_history.logs import scrub  # noqa: PLC0415
    from schemas.commands import encode_answer, forgotten_event  # noqa: PLC0415
    from storage.client import mongo_client  # noqa: PLC0415
    from storage.forgetting import FORGET_OPERATION_TIMEOUT_MS, MongoForgetting  # noqa: PLC0415

    client = mongo_client(
        settings,
        appname="message-history-forget",
        operation_timeout_ms=max(settings.mongodb_timeout_ms, FORGET_OPERATION_TIMEOUT_MS),
    )
    request_id = args.request_id or str(uuid.uuid4())
    # progress on stderr (stdout is the JSON answer), at most every second
    progress = ForgetProgress(
        request_id=request_id, via="cli", every_s=1.0, show=lambda line: print(line, file=err)
    )
    try:
        forgetting = MongoForgetting(client[settings.mongodb_database], chunk_size=settings.forget_chunk_size)
        if args.thread is not None:
            outcome = await forgetting.forget_thread(
                args.thread, resource_id=args.owner, dry_run=args.dry_run, progress=progress
            )
        else:
            outcome = await forgetting.forget_resource(args.resource, dry_run=args.dry_run, progress=progress)
    except ThreadOwnershipError as exc:
        print(f"message-history forget: refused: {scrub(str(exc))}", file=err)
        return 1
    except MessageHistoryError as exc:
        print(f"message-history forget: {scrub(str(exc))}", file=err)
        return 1
    finally:
        await client.close()
    audit(outcome, request_id=request_id, via="cli")
    out.write(encode_answer(forgotten_event(outcome, None, request_id=request_id)).decode() + "\n")
    return 0


def main(args: argparse.Namespace) -> int:
    from message_history.logs import start_command  # noqa: PLC0415
    from message_history.settings import Settings  # noqa: PLC0415

    settings = Settings()
    start_command(settings)
    return asyncio.run(run_forget(settings, args, out=sys.stdout, err=sys.stderr))
