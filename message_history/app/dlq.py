"""`message-history dlq inspect | redrive`: list dead letters with their reasons; send selected ones back.

* Reading uses `assign()` with `group_id=None`: no group, no commits, so no live group's offsets move. Each
  partition is read from its first offset in range to the end offset captured when the command starts, so
  the command ends while the service keeps dead-lettering.
* Selection (`message_history.app.dlq_plan`): `--error-type`, `--since`/`--until` (on `failed.at`),
  `--offsets` (ranges of the dead-letter topic), `--source-topic`, `--limit`. `redrive` refuses to run
  without a filter unless `--all` is given.
* Redrive produces the original key and value bytes, untouched, to the dead-letter topic's own input topic
  (or `--to`), with the original headers minus the service's, plus `redrive.of` naming the dead letter. A dead
  letter whose `source.topic` header names another topic is refused: reported, counted, never sent. It is
  bounded (the captured end offsets, `--limit`) and idempotent: dead letters whose `redrive.of` marker is
  already in the target topic (read from the earliest selected failure on) are skipped, so a second run
  produces nothing. A record refused again simply becomes a new dead letter with the new reason (and the
  old marker, for the record).
* Progress lines go to stderr every `--progress-interval` seconds; the listing goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from consumers.consumer import build_reader
from message_history.app.dlq_plan import (
    DeadLetter,
    Refused,
    Selection,
    Tally,
    default_topics,
    describe,
    earliest_failure,
    line,
    marker,
    redrive_headers,
    redrive_target,
    selected,
    selection_from_args,
    summary,
)
from message_history.app.replay.plan import UsageError, to_millis
from message_history.app.replay.progress import format_count
from message_history.app.topics import existing_partitions
from message_history.logs import scrub, start_command
from message_history.settings import Settings
from producers.connection import kafka_options
from schemas.dead_letters import parse_dead_letter_headers
from schemas.messages import format_timestamp

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

CLIENT_ID = "message-history-dlq"
FETCH_TIMEOUT_MS = 500
SEND_CHUNK = 100


@dataclass(frozen=True, slots=True)
class DlqOptions:
    """What `dlq inspect|redrive` was asked to do, checked."""

    command: str
    topics: tuple[str, ...]
    topics_named: bool  # given with --topic: a missing one is an error, not "no dead letters yet"
    selection: Selection
    limit: int | None = None
    progress_interval_s: float = 2.0
    json: bool = False
    show_value: bool = False
    to: str | None = None
    dry_run: bool = False
    force: bool = False
    inputs: Mapping[str, str] = field(default_factory=dict)  # dead-letter topic -> its own input topic


def options_from_args(args: argparse.Namespace, settings: Settings) -> DlqOptions:
    """Check the command line (`UsageError`, exit 2, for anything unusable)."""
    selection = selection_from_args(args)
    command: str = args.dlq_command
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.progress_interval <= 0:
        raise UsageError("--progress-interval must be positive")
    if command == "redrive" and not selection.filters and args.limit is None and not args.all:
        raise UsageError(
            "redrive without a filter would send back every dead letter: "
            "give --error-type/--since/--until/--offsets/--source-topic/--limit, or --all"
        )
    topics = default_topics(args, {"recall": settings.requests_dlq, "persist": settings.responses_dlq})
    return DlqOptions(
        command=command,
        topics=tuple(topics),
        topics_named=bool(args.topic),
        selection=selection,
        limit=args.limit,
        progress_interval_s=args.progress_interval,
        json=bool(getattr(args, "json", False)),
        show_value=bool(getattr(args, "show_value", False)),
        to=getattr(args, "to", None),
        dry_run=bool(getattr(args, "dry_run", False)),
        force=bool(getattr(args, "force", False)),
        inputs=input_topics(settings),
    )


def input_topics(settings: Settings) -> dict[str, str]:
    """The service's dead-letter topics, each with the input topic whose refusals it holds."""
    pairs = {settings.requests_dlq: settings.requests_topic, settings.responses_dlq: settings.responses_topic}
    if settings.commands_topic:
        pairs[settings.commands_dlq] = settings.commands_topic
    if settings.observe_results_topic:  # Observational Memory's observed path
        pairs[settings.observe_results_dlq] = settings.observe_results_topic
    return pairs


# --- reading -----------------------------------------------------------------------------------------------


async def topic_partitions(settings: Settings, topics: Sequence[str]) -> dict[str, list[int]]:
    """Partitions of each topic; `UsageError` for one that does not exist."""
    found = await existing_partitions(settings, topics, client_id=CLIENT_ID)
    missing = [t for t in topics if t not in found]
    if missing:
        raise UsageError(f"topic(s) {', '.join(map(repr, missing))} do not exist")
    return {t: found[t] for t in topics}


def _to_letter(record: Any) -> DeadLetter:
    headers = tuple((k, v or b"") for k, v in (record.headers or ()))
    try:
        info, problem = parse_dead_letter_headers(headers), ""
    except ValueError as exc:
        info, problem = None, str(exc)
    return DeadLetter(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=headers,
        info=info,
        problem=problem,
    )


async def _ranges(
    consumer: AIOKafkaConsumer, partitions: dict[str, list[int]], selection: Selection
) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition worth reading, [start, end): the selection's bounds within what the topic holds now."""
    wanted = selection.partitions()
    tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps if wanted is None or p in wanted]
    if not tps:
        return {}
    beginning = await consumer.beginning_offsets(tps)
    end = await consumer.end_offsets(tps)
    ranges: dict[TopicPartition, tuple[int, int]] = {}
    for tp in tps:
        start, stop = beginning[tp], end[tp]
        bounds = selection.bounds(tp.partition)
        if bounds is not None:
            start, stop = max(start, bounds[0]), min(stop, bounds[1] + 1)
        if start < stop:
            ranges[tp] = (start, stop)
    return ranges


async def read_bounded(
    consumer: AIOKafkaConsumer, ranges: dict[TopicPartition, tuple[int, int]], stop: asyncio.Event
) -> AsyncGenerator[Any, None]:
    """The records of each partition in [start, end), in offset order per partition; ends at the ends."""
    if not ranges:
        return
    consumer.assign(list(ranges))
    for tp, (start, _) in ranges.items():
        consumer.seek(tp, start)
    pending = set(ranges)
    while pending and not stop.is_set():
        batch = await consumer.getmany(*pending, timeout_ms=FETCH_TIMEOUT_MS)
        for tp, records in batch.items():
            end = ranges[tp][1]
            for record in records:
                if record.offset < end:
                    yield record
        for tp in list(pending):
            if await consumer.position(tp) >= ranges[tp][1]:
                pending.discard(tp)


class _Progress:
    """A progress line on stderr at most every `interval_s` seconds (and one at the end)."""

    def __init__(self, command: str, tally: Tally, interval_s: float, out: TextIO) -> None:
        self._command, self._tally, self._interval_s, self.out = command, tally, interval_s, out
        self._last = time.monotonic()

    def tick(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._interval_s:
            return
        self._last = now
        t = self._tally
        text = (
            f"dlq {self._command}: read {format_count(t.read)}/{format_count(t.total)}"
            f", selected {format_count(t.selected)}"
        )
        if self._command == "redrive":
            text += f", redriven {format_count(t.redriven)}"
            text += f", already redriven {format_count(t.already_redriven)}"
        print(text, file=self.out, flush=True)


async def collect(
    settings: Settings,
    options: DlqOptions,
    *,
    tally: Tally,
    progress: _Progress,
    stop: asyncio.Event,
    emit: Callable[[DeadLetter], None] | None = None,
) -> list[DeadLetter]:
    """Read the dead-letter topics within bounds; return the selected dead letters (at most `--limit`)."""
    if options.topics_named:
        partitions = await topic_partitions(settings, options.topics)
    else:
        # The service's dead-letter topics exist once something was refused; a missing one holds nothing.
        partitions = await existing_partitions(settings, options.topics, client_id=CLIENT_ID)
        for topic in options.topics:
            if topic not in partitions:
                print(
                    f"dlq {options.command}: {topic} does not exist (no dead letters yet)", file=progress.out
                )
    consumer = build_reader(settings, client_id=CLIENT_ID)
    await consumer.start()
    chosen: list[DeadLetter] = []
    try:
        ranges = await _ranges(consumer, partitions, options.selection)
        tally.total = sum(end - start for start, end in ranges.values())
        async with contextlib.aclosing(read_bounded(consumer, ranges, stop)) as records:
            async for record in records:
                letter = _to_letter(record)
                is_selected = selected(letter, options.selection)
                tally.count(letter, is_selected=is_selected)
                if is_selected:
                    chosen.append(letter)
                    if emit is not None:
                        emit(letter)
                    if options.limit is not None and len(chosen) >= options.limit:
                        break
                progress.tick()
    finally:
        await consumer.stop()
    return chosen


async def redriven_markers(
    settings: Settings, sends: Sequence[tuple[DeadLetter, str]], *, err: TextIO, stop: asyncio.Event
) -> set[str]:
    """`redrive.of` values already in the target topics, read from the earliest selected failure on (a stop
    leaves the set incomplete: the caller then produces nothing)."""
    targets: dict[str, list[DeadLetter]] = {}
    for letter, target in sends:
        targets.setdefault(target, []).append(letter)
    # a missing target topic holds no copy
    existing = await existing_partitions(settings, list(targets), client_id=CLIENT_ID)
    found: set[str] = set()
    consumer = build_reader(settings, client_id=CLIENT_ID)
    await consumer.start()
    try:
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for topic, group in targets.items():
            tps = [TopicPartition(topic, p) for p in existing.get(topic, [])]
            if not tps:
                continue
            since = earliest_failure(group)
            end = await consumer.end_offsets(tps)
            if since is None:
                start = await consumer.beginning_offsets(tps)
            else:
                at = await consumer.offsets_for_times({tp: to_millis(since) for tp in tps})
                start = {tp: (meta.offset if meta is not None else end[tp]) for tp, meta in at.items()}
            ranges.update({tp: (start[tp], end[tp]) for tp in tps if start[tp] < end[tp]})
        scanned = sum(end - start for start, end in ranges.values())
        print(
            f"dlq redrive: looking for earlier redrives in {scanned:,} record(s) of {', '.join(targets)}",
            file=err,
        )
        async with contextlib.aclosing(read_bounded(consumer, ranges, stop)) as records:
            async for record in records:
                ref = marker(record.headers or ())
                if ref is not None:
                    found.add(ref)
    finally:
        await consumer.stop()
    return found


async def produce(
    settings: Settings,
    sends: Sequence[tuple[DeadLetter, str]],
    options: DlqOptions,
    *,
    tally: Tally,
    progress: _Progress,
    stop: asyncio.Event,
    out: TextIO,
) -> None:
    """Send each dead letter back, in the order read (the idempotent producer keeps one thread's records in
    order), `SEND_CHUNK` at a time: each chunk is acknowledged before the next is sent, so an interruption
    leaves at most one chunk unreported, and a rerun skips whatever did arrive (its markers)."""
    producer = AIOKafkaProducer(
        **kafka_options(settings, client_id=CLIENT_ID),
        acks="all",
        enable_idempotence=True,
        max_request_size=max(1_048_576, settings.max_event_bytes * 2),
    )
    await producer.start()
    try:
        for first in range(0, len(sends), SEND_CHUNK):
            if stop.is_set():
                break
            chunk = sends[first : first + SEND_CHUNK]
            now = format_timestamp(datetime.now(UTC))
            sent = []
            for letter, target in chunk:
                headers = redrive_headers(letter, now=now)
                sent.append(
                    (
                        letter,
                        target,
                        await producer.send(target, letter.value, key=letter.key, headers=headers),
                    )
                )
            for letter, target, future in sent:
                meta = await future
                tally.redriven += 1
                print(
                    f"redrove {letter.ref} -> {target}:{meta.partition}:{meta.offset}", file=out, flush=True
                )
            progress.tick()
    finally:
        await producer.stop()


def _targets(
    letters: Sequence[DeadLetter], options: DlqOptions, *, tally: Tally, out: TextIO
) -> list[tuple[DeadLetter, str]]:
    """Each selected dead letter with its target; the refused ones are reported and counted, not kept."""
    sends: list[tuple[DeadLetter, str]] = []
    for letter in letters:
        target = redrive_target(letter, options.to, options.inputs)
        if isinstance(target, Refused):
            tally.refused += 1
            print(f"refused {letter.ref}: {target.reason}", file=out, flush=True)
        else:
            sends.append((letter, target))
    return sends


async def run_dlq(
    settings: Settings, options: DlqOptions, *, stop: asyncio.Event, out: TextIO, err: TextIO
) -> int:
    """The command; returns its exit code."""
    tally = Tally()
    progress = _Progress(options.command, tally, options.progress_interval_s, err)
    try:
        if options.command == "inspect":

            def emit(letter: DeadLetter) -> None:
                text = (
                    json.dumps(describe(letter), sort_keys=True)
                    if options.json
                    else line(letter, show_value=options.show_value)
                )
                print(text, file=out, flush=True)

            await collect(settings, options, tally=tally, progress=progress, stop=stop, emit=emit)
        else:
            letters = await collect(settings, options, tally=tally, progress=progress, stop=stop)
            sends = _targets(letters, options, tally=tally, out=out)
            if sends and not options.force and not stop.is_set():
                done = await redriven_markers(settings, sends, err=err, stop=stop)
                todo = [(letter, target) for letter, target in sends if letter.ref not in done]
                tally.already_redriven = len(sends) - len(todo)
                sends = todo
            if options.dry_run and not stop.is_set():
                for letter, target in sends:
                    print(f"would redrive {line(letter)} -> {target}", file=out)
                tally.redriven = len(sends)
            elif not stop.is_set():  # interrupted while reading: nothing is sent
                await produce(settings, sends, options, tally=tally, progress=progress, stop=stop, out=out)
    except UsageError as exc:
        print(f"message-history dlq: error: {scrub(str(exc))}", file=err)
        return EXIT_USAGE
    except KafkaError as exc:
        progress.tick(force=True)
        print(f"message-history dlq: Kafka failed: {scrub(repr(exc))}", file=err)
        return EXIT_FAILED
    progress.tick(force=True)
    for text in summary(tally, command=options.command, dry_run=options.dry_run):
        print(text, file=err)
    return EXIT_INTERRUPTED if stop.is_set() else EXIT_DONE


def main(args: argparse.Namespace) -> int:
    """`message-history dlq ...`; returns 0 done, 1 failed, 2 usage error, 130 interrupted."""
    settings = Settings()
    start_command(settings)
    try:
        options = options_from_args(args, settings)
    except UsageError as exc:
        print(f"message-history dlq: error: {scrub(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_main(settings, options))


async def _main(settings: Settings, options: DlqOptions) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_dlq(settings, options, stop=stop, out=sys.stdout, err=sys.stderr)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
