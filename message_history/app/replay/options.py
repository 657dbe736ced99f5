"""What `message-history replay` was asked to do: the command line checked against the settings."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from message_history.app.replay.plan import UsageError, parse_offsets, parse_timestamp
from message_history.app.replay.progress import Mode
from message_history.settings import Settings

ReplayPath = Literal["persist", "recall"]

CLIENT_ID = "message-history-replay"  # the replay's name in Kafka's and MongoDB's logs


@dataclass(frozen=True, slots=True)
class StartAt:
    """Where each partition starts: exactly one of the three."""

    beginning: bool = False
    timestamp: datetime | None = None
    offsets: dict[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """Everything `message-history replay` was asked to do, checked."""

    topic: str
    path: ReplayPath
    start: StartAt
    dead_letter_topic: str
    until: datetime | None = None
    dry_run: bool = False
    emit_persisted: bool = False
    emit_to: str | None = None
    observe: bool = False  # Observational Memory's work sent for replayed threads (persist path)
    observe_wait_s: float = 300.0  # `--observe`: how long one observation may take to be settled
    rate: float | None = None
    concurrency: int = 4
    batch_size: int = 500
    skip_invalid: bool = False
    invalid_report: Path | None = None
    max_retry_s: float = 300.0
    progress: Mode = "log"
    progress_interval_s: float = 5.0

    @property
    def emits(self) -> bool:
        return not self.dry_run and (self.emit_persisted or self.emit_to is not None)

    @property
    def observes(self) -> bool:
        return self.observe and not self.dry_run

    @property
    def dead_letters(self) -> bool:
        return not self.dry_run and not self.skip_invalid


def dead_letter_topic(topic: str, settings: Settings) -> str:
    """The source topic's dead-letter topic: the configured one for the live topics, else `<topic>.dlq`."""
    if topic == settings.responses_topic:
        return settings.responses_dlq
    if topic == settings.requests_topic:
        return settings.requests_dlq
    return f"{topic}.dlq"


def source(args: argparse.Namespace, settings: Settings) -> tuple[ReplayPath, str]:
    """The path (`--emit-to`: recall, else persist) and the source topic; refuses the combinations that
    would do harm (re-enriching into the live enriched topic without `--force`, reading the wrong topic)."""
    emit_to: str | None = args.emit_to
    if emit_to is None:
        topic = args.topic or settings.responses_topic
        if topic == settings.requests_topic:
            raise UsageError(
                f"{topic} is the requests topic: replay it with --emit-to TOPIC (re-enrichment); "
                "the responses topic is what fills MongoDB"
            )
        return "persist", topic
    topic = args.topic or settings.requests_topic
    if args.emit_persisted:
        raise UsageError("--emit-persisted is for the responses topic; --emit-to re-enriches requests")
    if topic == settings.responses_topic:
        raise UsageError(f"--emit-to re-enriches requests, but {topic} is the responses topic")
    if emit_to == topic:
        raise UsageError("--emit-to must not be the topic being replayed")
    if emit_to == settings.enriched_topic and not args.force:
        raise UsageError(
            f"--emit-to {emit_to} is the live enriched topic: agent workers would receive every replayed "
            "request again; pass --force if that is what you want"
        )
    return "recall", topic


def options_from_args(args: argparse.Namespace, settings: Settings, *, tty: bool) -> ReplayOptions:
    """Check the command line against the settings; `UsageError` (exit 2) for anything unusable."""
    path, topic = source(args, settings)
    start = StartAt(
        beginning=bool(args.from_beginning),
        timestamp=parse_timestamp(args.from_timestamp, "--from-timestamp") if args.from_timestamp else None,
        offsets=parse_offsets(args.from_offsets) if args.from_offsets is not None else None,
    )
    if sum((start.beginning, start.timestamp is not None, start.offsets is not None)) != 1:
        raise UsageError("give exactly one of --from-beginning, --from-timestamp, --from-offsets")
    until = parse_timestamp(args.until_timestamp, "--until-timestamp") if args.until_timestamp else None
    if until is not None and start.timestamp is not None and until <= start.timestamp:
        raise UsageError("--until-timestamp must be later than --from-timestamp")
    for name, value, minimum in (
        ("--rate", args.rate, 0.0),
        ("--max-retry-s", args.max_retry_s, 0.0),
        ("--progress-interval", args.progress_interval, 0.0),
        ("--observe-wait-s", getattr(args, "observe_wait_s", None), 0.0),
    ):
        if value is not None and value <= minimum:
            raise UsageError(f"{name} must be positive, got {value}")
    for name, count in (("--concurrency", args.concurrency), ("--batch-size", args.batch_size)):
        if count is not None and count < 1:
            raise UsageError(f"{name} must be at least 1, got {count}")
    observe = bool(getattr(args, "observe", False))
    if observe and path != "persist":
        raise UsageError("--observe is for the responses topic (the persist path), not with --emit-to")
    if observe and args.dry_run:
        raise UsageError("--observe claims threads for observation and sends work: not with --dry-run")
    if observe and not settings.observe_results_topic:
        raise UsageError(
            "--observe needs the observed path's topic (MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC): "
            "no one would apply the observers' answers"
        )
    wait_s = getattr(args, "observe_wait_s", None)
    if wait_s is not None and not observe:
        raise UsageError("--observe-wait-s is for --observe")
    progress: Mode = args.progress if args.progress != "auto" else ("bar" if tty else "log")
    return ReplayOptions(
        topic=topic,
        path=path,
        start=start,
        dead_letter_topic=dead_letter_topic(topic, settings),
        until=until,
        dry_run=bool(args.dry_run),
        emit_persisted=bool(args.emit_persisted),
        emit_to=args.emit_to,
        observe=observe,
        observe_wait_s=wait_s if wait_s is not None else settings.observation_timeout_s,
        rate=args.rate,
        concurrency=args.concurrency,
        batch_size=args.batch_size or settings.max_batch_records,
        skip_invalid=bool(args.skip_invalid),
        invalid_report=Path(args.invalid_report) if args.invalid_report else None,
        max_retry_s=args.max_retry_s,
        progress=progress,
        progress_interval_s=args.progress_interval,
    )
