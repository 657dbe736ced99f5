"""`message-history` command line: one subcommand per job, each implemented in its own module.

Subcommand modules are imported lazily so `--version` and `--help` stay instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from message_history import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="message-history",
        description="Conversation memory for AI agents as a Kafka stream (Mastra MessageHistory, MongoDB).",
    )
    parser.add_argument("--version", action="version", version=f"message-history {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the service: recall and persist paths")
    run.add_argument(
        "--only",
        choices=["recall", "persist", "commands", "observed"],
        help="run a single path (persist also runs the commands and observed paths)",
    )

    check = sub.add_parser("check", help="check that Kafka and MongoDB answer (a real round trip on each)")
    check.add_argument("--only", choices=["kafka", "mongodb"], help="check a single dependency")
    check.add_argument(
        "--timeout",
        type=float,
        help="seconds per dependency (default: 20 for Kafka, MESSAGE_HISTORY_MONGODB_TIMEOUT_MS for MongoDB)",
    )
    sub.add_parser("config", help="print the effective settings, secrets masked")

    topics = sub.add_parser(
        "topics", help="create the missing topics with one partition count; check the input topics' counts"
    )
    topics.add_argument("--partitions", type=int, help="create missing topics with N partitions")
    topics.add_argument("--replication-factor", type=int, default=1, help="for created topics (%(default)s)")

    schemas = sub.add_parser("schemas", help="write the events' JSON Schemas and the AsyncAPI document")
    schemas.add_argument("--out", default="schemas/generated", help="output folder (default: %(default)s)")
    schemas.add_argument("--check", action="store_true", help="exit 1 if the files on disk are stale")

    demo = sub.add_parser("demo", help="a scripted conversation through the running service, printed")
    demo.add_argument("--threads", type=int, default=2)
    demo.add_argument("--turns", type=int, default=3)
    demo.add_argument(
        "--observational",
        action="store_true",
        help="Observational Memory on, with a stub observer: the observation log grows with the conversation",
    )

    from message_history.app.replay.plan import add_replay_arguments  # noqa: PLC0415 -- stdlib only, cheap

    replay = sub.add_parser("replay", help="backfill or repair MongoDB from a topic (bounded, no group)")
    add_replay_arguments(replay)

    from message_history.app.dlq_plan import add_dlq_arguments  # noqa: PLC0415 -- no Kafka import, cheap

    dlq = sub.add_parser("dlq", help="list dead letters with their reasons, or redrive selected ones")
    add_dlq_arguments(dlq)
    from message_history.app.forget import add_forget_arguments  # noqa: PLC0415 -- stdlib only, cheap
    from message_history.app.prune import add_prune_arguments  # noqa: PLC0415

    forget = sub.add_parser(
        "forget", help="erase a thread or a resource's whole history (GDPR), with a tombstone"
    )
    add_forget_arguments(forget)
    prune = sub.add_parser("prune", help="retention: delete messages older than a cut-off and empty threads")
    add_prune_arguments(prune)
    return parser


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 -- one return per subcommand
    args = _parser().parse_args(argv)
    if args.command == "config":
        from message_history.settings import Settings  # noqa: PLC0415

        print(Settings().model_dump_json(indent=2))
        return 0
    if args.command == "check":
        from message_history.app.check import main as check_main  # noqa: PLC0415

        return check_main(only=args.only, timeout_s=args.timeout)
    if args.command == "topics":
        from message_history.app.topics import main as topics_main  # noqa: PLC0415

        return topics_main(partitions=args.partitions, replication=args.replication_factor)
    if args.command == "schemas":
        from schemas.export import main as schemas_main  # noqa: PLC0415

        return schemas_main(out=args.out, check=args.check)
    if args.command == "run":
        from message_history.app.service import main as run_main  # noqa: PLC0415

        return run_main(only=args.only)
    if args.command == "demo":
        from message_history.app.demo import main as demo_main  # noqa: PLC0415

        return demo_main(threads=args.threads, turns=args.turns, observational=args.observational)
    if args.command == "replay":
        from message_history.app.replay.command import main as replay_main  # noqa: PLC0415

        return replay_main(args)
    if args.command == "dlq":
        from message_history.app.dlq import main as dlq_main  # noqa: PLC0415

        return dlq_main(args)
    if args.command == "forget":
        from message_history.app.forget import main as forget_main  # noqa: PLC0415

        return forget_main(args)
    if args.command == "prune":
        from message_history.app.prune import main as prune_main  # noqa: PLC0415

        return prune_main(args)
    raise AssertionError(args.command)  # argparse guarantees a known command


if __name__ == "__main__":
    sys.exit(main())
