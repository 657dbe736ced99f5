"""`message-history replay`: backfill or repair MongoDB from a topic, bounded, idempotent, beside the service.

How it stays out of the live service's way and still gives the live result:

* It reads with `assign()` and `group_id=None`: no group, no commits, so the live group's committed offsets
  never move. Each partition of the range gets its own consumer and task (at most `--concurrency` at once).
* Records go through the live paths' own batch handlers (`consumers.persist.PersistHandler`; for
  `--emit-to`, `consumers.recall.RecallHandler`): decode, `MessageHistory.persist_turn` through the
  collecting storage, one `save_many` per batch. Writes are upserts by message id with `createdAt` only on
  insert, so the documents are the ones the live service writes, and replaying twice changes nothing.
* The handlers "publish" into a recorder: by default nothing leaves (`--emit-persisted` / `--emit-to` send the
  events on); either way the outcome of every record is counted for the progress display and the summary.
* The storage is wrapped to count, per batch, which message ids were already stored (one `$in` query) and, for
  `--dry-run`, to answer the writes without writing (threads that would be created are remembered, so later
  batches see them as the live service would).
* Bad records: counted, logged with partition and offset, dead-lettered with the live service's headers
  (`producers.dead_letters`), or with `--skip-invalid` only reported (`--invalid-report FILE`, JSONL).
* Outages: the live loop's policy (`consumers.loop.is_outage`, `backoff_delay`, the retry settings); after
  `--max-retry-s` without success it stops with exit 1 and the offsets to resume from.
* SIGINT / SIGTERM: every partition finishes the batch in hand, then the `--from-offsets ...` flag that
  resumes the work is printed (exit 130). A second signal abandons the batches in hand (the printed offsets
  are still a correct resume point).

The end of every partition is fixed when the replay starts (its end offset then, or the first offset at
`--until-timestamp`), so a replay finishes while producers keep writing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, TextIO, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from consumers.loop import Ack, BatchHandler, backoff_delay, is_outage
from consumers.persist import PersistHandler
from consumers.recall import RecallHandler
from consumers.unreadable import SkippingUnreadable, is_unreadable, read_carefully
from message_history.app.service import memory_defaults
from message_history.app.topics import existing_partitions
from message_history.errors import InvalidInputError, MessageHistoryError, ThreadOwnershipError, error_type
from message_history.logs import configure_logging, register_secret
from message_history.progress import Mode, ProgressDisplay, Status, Summary, summary_lines
from message_history.replay_plan import (
    Counts,
    PartitionRange,
    Plan,
    TokenBucket,
    UsageError,
    distinct,
    parse_offsets,
    parse_timestamp,
    plan_ranges,
    resume_flag,
    to_millis,
)
from message_history.settings import Settings
from producers.connection import kafka_options
from producers.dead_letters import DeadLetterPublisher
from producers.enriched import EnrichedPublisher
from producers.output import OUTPUT_TOO_LARGE, Headers, OutputProducer
from producers.persisted import PersistedPublisher
from schemas.dead_letters import error_message
from schemas.events import EnrichedRequest, HistoryPersisted
from schemas.limits import Limits
from schemas.messages import Message
from storage.errors import storage_errors
from storage.forgetting import MongoForgetting
from storage.mongodb import MongoHistoryStorage
from storage.protocol import Page, PageQuery, RecallQuery, SaveTurn, Thread

log = logging.getLogger(__name__)

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

ReplayPath = Literal["persist", "recall"]
T = TypeVar("T")

CLIENT_ID = "message-history-replay"
FETCH_TIMEOUT_MS = 500
_MONGO_MAX_BATCH = 100_000


class ReplayAbortedError(MessageHistoryError):
    """A dependency stayed unavailable longer than `--max-retry-s`: the replay stops where it is."""


class _StoppedError(Exception):
    """A signal came while waiting to retry a connection: not a failure, an interruption."""


# --- options -----------------------------------------------------------------------------------------------


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
    ):
        if value is not None and value <= minimum:
            raise UsageError(f"{name} must be positive, got {value}")
    for name, count in (("--concurrency", args.concurrency), ("--batch-size", args.batch_size)):
        if count is not None and count < 1:
            raise UsageError(f"{name} must be at least 1, got {count}")
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
        rate=args.rate,
        concurrency=args.concurrency,
        batch_size=args.batch_size or settings.max_batch_records,
        skip_invalid=bool(args.skip_invalid),
        invalid_report=Path(args.invalid_report) if args.invalid_report else None,
        max_retry_s=args.max_retry_s,
        progress=progress,
        progress_interval_s=args.progress_interval,
    )


# --- publishers that record what the handlers did ----------------------------------------------------------


def _resolved(value: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _then(inner: asyncio.Future[Any], value: T) -> asyncio.Future[T]:
    """A future resolving with `value` once `inner` succeeded (or failing as it failed)."""
    out: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def settle(done: asyncio.Future[Any]) -> None:
        if out.done():
            return
        if done.cancelled():
            out.cancel()
        elif (error := done.exception()) is not None:
            out.set_exception(error)
        else:
            out.set_result(value)

    inner.add_done_callback(settle)
    return out


class PersistedOutcomes(PersistedPublisher):
    """The persist handler's publisher: the acknowledgement resolves with the `HistoryPersisted` event.

    It is sent to the persisted topic only with `emit`; otherwise the producer is never used.
    """

    def __init__(self, producer: OutputProducer, topic: str, *, emit: bool) -> None:
        super().__init__(producer, topic)
        self.emit = emit

    async def publish(self, event: HistoryPersisted, *, headers: Headers) -> asyncio.Future[Any]:
        if not self.emit:
            return _resolved(event)
        return _then(await super().publish(event, headers=headers), event)


class EnrichedOutcomes(EnrichedPublisher):
    """The recall handler's publisher: the acknowledgement resolves with the `EnrichedRequest`."""

    def __init__(self, producer: OutputProducer, topic: str, *, emit: bool) -> None:
        super().__init__(producer, topic)
        self.emit = emit

    async def publish(self, event: EnrichedRequest, *, headers: Headers) -> asyncio.Future[Any]:
        if not self.emit:
            return _resolved(event)
        return _then(await super().publish(event, headers=headers), event)


# --- the storage, counted (and, for a dry run, not written) ------------------------------------------------


class ReplayStorage:
    """The MongoDB storage with the batch forms, counting what each `save_many` inserts or finds present.

    With `dry_run`, `save_many` plans the writes (ownership, the threads it would create) and writes nothing;
    those threads and message ids are remembered so that later batches see them, as the live service would.
    """

    def __init__(self, mongo: MongoHistoryStorage, counts: Counts, *, dry_run: bool) -> None:
        self._mongo = mongo
        self.tombstones = MongoForgetting(mongo.db)  # forgotten history is not replayed back
        self._counts = counts
        self.dry_run = dry_run
        self._virtual: dict[str, Thread] = {}  # dry run: threads it would have created
        self._planned: set[str] = set()  # dry run: message ids it would have inserted
        self._threads_seen: set[str] = set()

    async def get_thread(self, thread_id: str) -> Thread | None:
        return (await self.get_threads([thread_id])).get(thread_id)

    async def get_threads(self, thread_ids: Sequence[str]) -> dict[str, Thread]:
        found = await self._mongo.get_threads(thread_ids)
        if self.dry_run:
            for thread_id in thread_ids:
                if thread_id not in found and thread_id in self._virtual:
                    found[thread_id] = self._virtual[thread_id]
        return found

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        return await self._mongo.list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def list_messages_many(self, queries: Sequence[RecallQuery]) -> dict[str, list[Message]]:
        return await self._mongo.list_messages_many(queries)

    async def get_messages(self, message_ids: Sequence[str]) -> list[Message]:
        return await self._mongo.get_messages(message_ids)

    async def list_page(self, query: PageQuery) -> Page:
        return await self._mongo.list_page(query)

    async def list_pages_many(self, queries: Sequence[PageQuery]) -> list[Page]:
        return await self._mongo.list_pages_many(queries)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        if not self.dry_run:  # a dry run changes nothing, boundaries included
            await self._mongo.save_thread_metadata(thread_id, update)

    async def save_thread_metadata_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        if not self.dry_run:
            await self._mongo.save_thread_metadata_many(updates)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        [result] = await self.save_many([SaveTurn(thread_id, resource_id, messages)])
        if isinstance(result, ThreadOwnershipError):
            raise result
        return result

    async def save_many(self, turns: Sequence[SaveTurn]) -> list[Thread | ThreadOwnershipError]:
        ids = distinct(m.id for turn in turns for m in turn.messages if m.id)
        present = await self.existing_ids(ids)
        stored: dict[str, Thread] = {}
        if self.dry_run:
            stored = await self._mongo.get_threads([t.thread_id for t in turns])
            present |= self._planned.intersection(ids)
            results = self._plan(turns, stored)
        else:
            results = await self._mongo.save_many(turns)
        accepted: set[str] = set()
        for turn, result in zip(turns, results, strict=True):
            if isinstance(result, ThreadOwnershipError):
                continue
            accepted.update(m.id for m in turn.messages if m.id)
            if turn.messages and turn.thread_id not in self._threads_seen:
                self._threads_seen.add(turn.thread_id)
                self._counts.threads += 1
                if self.dry_run and turn.thread_id not in stored:
                    self._counts.threads_new += 1
        self._counts.messages_inserted += len(accepted - present)
        self._counts.messages_present += len(accepted & present)
        if self.dry_run:
            self._planned |= accepted
        return results

    async def existing_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` `mastra_messages` holds: one `$in` query (none for no ids)."""
        if not ids:
            return set()
        with storage_errors("find stored message ids"):
            docs = await self._mongo.messages.find(
                {"id": {"$in": list(ids)}},
                {"id": 1, "_id": 0},
                batch_size=min(len(ids) + 1, _MONGO_MAX_BATCH),
            ).to_list()
        return {doc["id"] for doc in docs if "id" in doc}

    def _plan(
        self, turns: Sequence[SaveTurn], stored: dict[str, Thread]
    ) -> list[Thread | ThreadOwnershipError]:
        """What `save_many` would return, without writing (as `storage.mongodb._SavePlan` decides)."""
        state = {**{k: v for k, v in self._virtual.items() if k not in stored}, **stored}
        results: list[Thread | ThreadOwnershipError] = []
        for turn in turns:
            current = state.get(turn.thread_id)
            if current is not None and current.resourceId and current.resourceId != turn.resource_id:
                results.append(ThreadOwnershipError(turn.thread_id, turn.resource_id, current.resourceId))
                continue
            if not turn.messages:
                if current is None:
                    raise InvalidInputError(
                        f"nothing to save into thread {turn.thread_id!r}: it does not exist"
                    )
                results.append(current)
                continue
            stamps = [m.createdAt for m in turn.messages if m.createdAt is not None] or [datetime.now(UTC)]
            if current is None:
                current = Thread(turn.thread_id, turn.resource_id, "", {}, min(stamps), max(stamps))
            elif current.updatedAt is None or current.updatedAt < max(stamps):
                current = replace(current, updatedAt=max(stamps))
            state[turn.thread_id] = current
            if turn.thread_id not in stored:
                self._virtual[turn.thread_id] = current
            results.append(current)
        return results


@contextlib.asynccontextmanager
async def open_mongo(settings: Settings, *, dry_run: bool) -> AsyncIterator[MongoHistoryStorage]:
    """The live service's MongoDB storage; a dry run connects the same way but creates no index."""
    if not dry_run:
        async with MongoHistoryStorage.open(settings) as storage:
            yield storage
        return
    from storage.client import mongo_client  # noqa: PLC0415

    client = mongo_client(settings, appname=CLIENT_ID)
    try:
        storage = MongoHistoryStorage(client[settings.mongodb_database])
        await storage.ping()
        yield storage
    finally:
        await client.close()


# --- bad records -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Invalid:
    """A bad record's outcome: reported, and dead-lettered unless `--skip-invalid`."""

    error: BaseException
    dead_lettered: bool


class InvalidReport:
    """The JSONL report of bad records (`--invalid-report`), one object per record; appended to."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def __enter__(self) -> InvalidReport:
        if self.path is not None:
            self._file = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, record: Any, error: BaseException, *, dead_letter_topic: str | None) -> None:
        if self._file is None:
            return
        key = record.key
        entry = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "key": key.decode("utf-8", errors="replace") if key is not None else None,
            "error_type": error_type(error),
            "error_message": error_message(error).decode("utf-8", errors="replace"),
            "error_path": getattr(error, "path", None) or None,
            "dead_letter_topic": dead_letter_topic,
        }
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._file.flush()


# --- one batch, with the live loop's retry policy ----------------------------------------------------------


@dataclass(slots=True)
class PartitionState:
    """One partition's range and how far it got: every offset below `next` is done."""

    partition: int
    start: int
    end: int
    next: int

    @property
    def finished(self) -> bool:
        return self.next >= self.end

    @property
    def done(self) -> int:
        return max(0, min(self.next, self.end) - self.start)


Sleep = Callable[[float, asyncio.Event], Awaitable[bool]]


async def sleep_or_stop(seconds: float, stop: asyncio.Event) -> bool:
    """Wait `seconds`; True when `stop` was set meanwhile (returns at once then)."""
    if stop.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


@dataclass
class BatchRunner:
    """Runs one partition's batch through the handler to the end: every record settled, or an outage too long.

    Mirrors `consumers.loop.StreamLoop._attempt`: the handler's result per record is an acknowledgement or an
    `InvalidInputError` (reported / dead-lettered); records whose outputs failed for an outage are retried
    with the live backoff; a record whose output Kafka refuses for size is treated as bad input.
    """

    handler: BatchHandler
    counts: Counts
    report: InvalidReport
    dead_letters: DeadLetterPublisher | None
    max_retry_s: float
    retry_initial_s: float
    retry_max_s: float
    path: str = "persist"
    clock: Callable[[], float] = time.monotonic
    sleep: Sleep = sleep_or_stop
    rand: Callable[[], float] = field(default_factory=lambda: random.Random().random)  # noqa: S311 -- jitter

    async def run(
        self, records: Sequence[ConsumerRecord], state: PartitionState, stop: asyncio.Event
    ) -> None:
        """Process `records` (one partition, ascending); moves `state.next` past what is done.

        Raises `ReplayAbortedError` when an outage outlasts `max_retry_s` (`state.next` is then the first
        record not done), and re-raises anything that is not an outage (`state.next` stays before the batch).
        """
        pending = list(records)
        attempt = 0
        failing_since: float | None = None
        while pending:
            error: BaseException | None = None
            try:
                failed = await self._attempt(pending)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                failed, error = pending, exc
            if not failed:
                break
            attempt += 1
            now = self.clock()
            failing_since = now if failing_since is None else failing_since
            reason = f"{type(error).__name__}: {error}" if error is not None else "outputs not acknowledged"
            if now - failing_since >= self.max_retry_s:
                state.next = failed[0].offset
                raise ReplayAbortedError(
                    f"partition {state.partition}: dependency unavailable for {now - failing_since:.0f} s "
                    f"(--max-retry-s {self.max_retry_s:g}); last error {reason}"
                )
            delay = backoff_delay(
                attempt, initial=self.retry_initial_s, maximum=self.retry_max_s, rand=self.rand
            )
            log.warning(
                "outage: retrying batch",
                extra={
                    "partition": state.partition,
                    "attempt": attempt,
                    "records": len(failed),
                    "delay_s": round(delay, 2),
                    "reason": reason,
                },
            )
            if await self.sleep(delay, stop):
                state.next = failed[0].offset
                return
            pending = failed
        if records:
            state.next = max(state.next, records[-1].offset + 1)

    async def _attempt(self, records: list[ConsumerRecord]) -> list[ConsumerRecord]:
        """One try; returns the records whose outputs failed for an outage (to retry), in order."""
        results = await self.handler.handle(records)
        acks: list[Ack] = [
            self._invalid(rec, result) if isinstance(result, InvalidInputError) else result
            for rec, result in zip(records, results, strict=True)
        ]
        outcomes = await asyncio.gather(*acks, return_exceptions=True)
        failed: list[ConsumerRecord] = []
        too_large: list[tuple[ConsumerRecord, BaseException]] = []
        for rec, outcome in zip(records, outcomes, strict=True):
            if isinstance(outcome, OUTPUT_TOO_LARGE):
                too_large.append((rec, outcome))
            elif isinstance(outcome, BaseException):
                if not is_outage(outcome):
                    raise outcome
                failed.append(rec)
            else:
                self._settle(rec, outcome)
        if too_large:
            retried = await asyncio.gather(
                *(self._invalid(r, e) for r, e in too_large), return_exceptions=True
            )
            for (rec, _), outcome in zip(too_large, retried, strict=True):
                if isinstance(outcome, BaseException):
                    if not is_outage(outcome):
                        raise outcome
                    failed.append(rec)
                else:
                    self._settle(rec, outcome)
        return sorted(failed, key=lambda r: r.offset)

    async def _invalid(self, record: ConsumerRecord, error: BaseException) -> _Invalid:
        if self.dead_letters is None:
            return _Invalid(error, dead_lettered=False)
        await (await self.dead_letters.publish(record, error))
        return _Invalid(error, dead_lettered=True)

    def _settle(self, record: ConsumerRecord, outcome: object) -> None:
        if isinstance(outcome, HistoryPersisted):
            self.counts.add_persisted(outcome.skipped)
        elif isinstance(outcome, EnrichedRequest):
            self.counts.add_enriched(outcome.history.recalled)
        elif isinstance(outcome, _Invalid):
            dlq = self.dead_letters.topic if outcome.dead_lettered and self.dead_letters else None
            self.counts.add_invalid(
                partition=record.partition,
                offset=record.offset,
                error=f"{error_type(outcome.error)}: {outcome.error}",
                dead_lettered=outcome.dead_lettered,
            )
            self.report.write(record, outcome.error, dead_letter_topic=dlq)
            log.warning(
                "invalid record: %s",
                "dead-lettered" if dlq else "skipped and reported",
                extra={
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "error_type": error_type(outcome.error),
                    "error": str(outcome.error)[:1024],
                    "dead_letter_topic": dlq,
                },
            )
        else:  # pragma: no cover -- the recorders above resolve with one of these
            raise TypeError(f"unexpected outcome {type(outcome).__name__}")


# --- the replay --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ReplayResult:
    """How the replay ended."""

    status: Status
    exit_code: int
    counts: Counts
    partitions: list[PartitionState]
    summary: Summary | None = None

    @property
    def resume_offsets(self) -> dict[int, int]:
        """Where to go on from: the partitions with work left, at their first offset not done."""
        return {p.partition: p.next for p in self.partitions if not p.finished}

    @property
    def ranges(self) -> list[PartitionRange]:
        return [PartitionRange(p.partition, p.start, p.end) for p in self.partitions]


def _consumer(settings: Settings, *, max_records: int, reset: str = "none") -> AIOKafkaConsumer:
    """A group-less consumer (no commits, ever); committed reads only, as the live service reads."""
    return AIOKafkaConsumer(
        **kafka_options(settings, client_id=CLIENT_ID),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset=reset,
        isolation_level="read_committed",
        max_poll_records=max_records,
    )


async def plan_replay(settings: Settings, options: ReplayOptions) -> Plan:
    """The partitions' ranges: the topic's partitions, start and end offsets now, the start/until lookups."""
    found = await existing_partitions(settings, [options.topic], client_id=CLIENT_ID)
    if options.topic not in found:
        raise UsageError(f"topic {options.topic!r} does not exist")
    partitions = found[options.topic]
    tps = [TopicPartition(options.topic, p) for p in partitions]
    consumer = _consumer(settings, max_records=1, reset="earliest")
    await consumer.start()
    try:
        consumer.assign(tps)
        beginning = {tp.partition: o for tp, o in (await consumer.beginning_offsets(tps)).items()}
        end = {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
        start: dict[int, int | None]
        if options.start.offsets is not None:
            start = dict(options.start.offsets)
        elif options.start.timestamp is not None:
            start = await _offsets_at(consumer, tps, options.start.timestamp)
        else:
            start = dict(beginning)
        until = await _offsets_at(consumer, tps, options.until) if options.until is not None else None
    finally:
        await consumer.stop()
    return plan_ranges(beginning=beginning, end=end, start=start, until=until)


async def _offsets_at(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], at: datetime
) -> dict[int, int | None]:
    """Per partition, the first offset whose timestamp is at or after `at` (None: no such record yet)."""
    found = await consumer.offsets_for_times({tp: to_millis(at) for tp in tps})
    return {tp.partition: (meta.offset if meta is not None else None) for tp, meta in found.items()}


class Replay:
    """One run: the partitions' workers, the progress display, the tallies."""

    def __init__(
        self,
        settings: Settings,
        options: ReplayOptions,
        *,
        stop: asyncio.Event,
        err: TextIO,
    ) -> None:
        self.settings = settings
        self.options = options
        self.stop = stop
        self.err = err
        self.counts = Counts()
        self.partitions: list[PartitionState] = []
        self.notes: list[str] = []
        self.read_s = 0.0  # time spent reading and processing (setup and summary left out)
        self._bucket = TokenBucket(options.rate, now=time.monotonic()) if options.rate else None
        self._batch_limit = min(
            options.batch_size, self._bucket.batch_limit() if self._bucket else options.batch_size
        )
        self._slots = asyncio.Semaphore(options.concurrency)

    # --- setup ---

    async def retrying(self, what: str, step: Callable[[], Awaitable[T]]) -> T:
        """`step()` with the live backoff while it fails for an outage, for at most `--max-retry-s`."""
        attempt = 0
        started = time.monotonic()
        rand = random.Random().random  # noqa: S311 -- jitter
        while True:
            try:
                return await step()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                attempt += 1
                waited = time.monotonic() - started
                if waited >= self.options.max_retry_s:
                    raise ReplayAbortedError(
                        f"{what}: unavailable for {waited:.0f} s "
                        f"(--max-retry-s {self.options.max_retry_s:g}): {type(exc).__name__}: {exc}"
                    ) from exc
                delay = backoff_delay(
                    attempt,
                    initial=self.settings.retry_initial_backoff_s,
                    maximum=self.settings.retry_max_backoff_s,
                    rand=rand,
                )
                log.warning(
                    "%s failed, retrying", what, extra={"attempt": attempt, "error": type(exc).__name__}
                )
                if await sleep_or_stop(delay, self.stop):
                    raise _StoppedError from exc

    def progress(self) -> tuple[int, int]:
        """(offsets done, offsets in the plan)."""
        return sum(p.done for p in self.partitions), sum(p.end - p.start for p in self.partitions)

    # --- workers ---

    async def run_partitions(self, runner: BatchRunner, abandon: asyncio.Event) -> BaseException | None:
        """Run every partition (at most `--concurrency` at once); the first failure stops the others."""
        started = time.monotonic()
        try:
            return await self._run_partitions(runner, abandon)
        finally:
            self.read_s = time.monotonic() - started

    async def _run_partitions(self, runner: BatchRunner, abandon: asyncio.Event) -> BaseException | None:
        workers = [
            asyncio.create_task(self._partition(state, runner), name=f"replay-p{state.partition}")
            for state in self.partitions
            if not state.finished
        ]
        abandoned = asyncio.create_task(abandon.wait(), name="replay-abandon")
        failure: BaseException | None = None
        try:
            pending: set[asyncio.Task[Any]] = set(workers)
            while pending:
                done, pending = await asyncio.wait(pending | {abandoned}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(abandoned)
                for task in done:
                    if task is abandoned or task.cancelled():
                        continue
                    error = task.exception()
                    if error is not None and failure is None:
                        failure = error
                        self.stop.set()  # the others finish their batch and stop
                if abandoned.done():
                    for task in pending:
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    log.warning("second signal: in-flight batches abandoned")
                    break
        finally:
            abandoned.cancel()
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, abandoned, return_exceptions=True)
        return failure

    async def _partition(self, state: PartitionState, runner: BatchRunner) -> None:
        async with self._slots:
            if self.stop.is_set():
                return
            tp = TopicPartition(self.options.topic, state.partition)
            consumer = _consumer(self.settings, max_records=self._batch_limit)
            try:
                try:
                    await self.retrying(f"partition {state.partition}: connect to Kafka", consumer.start)
                except _StoppedError:
                    return
                consumer.assign([tp])
                consumer.seek(tp, state.next)
                await self._consume(consumer, tp, state, runner)
            finally:
                await consumer.stop()

    async def _consume(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, state: PartitionState, runner: BatchRunner
    ) -> None:
        quiet_since: float | None = None  # no record and no error since then, while work is left
        while not state.finished and not self.stop.is_set():
            try:
                fetched = await consumer.getmany(
                    tp, timeout_ms=FETCH_TIMEOUT_MS, max_records=self._batch_limit
                )
            except OffsetOutOfRangeError:
                await self._skip_deleted(consumer, tp, state)
                continue
            except Exception as exc:
                if not is_outage(exc):
                    if not is_unreadable(exc):
                        raise
                    # a batch that cannot be decompressed or parsed: its offsets become invalid records
                    consumer.seek(tp, state.next)
                    found, _ = await read_carefully(
                        consumer, [tp], max_records=self._batch_limit, timeout_ms=FETCH_TIMEOUT_MS
                    )
                    fetched = {tp: found}
                else:
                    fetched = {}
                    log.warning(
                        "fetch failed, retrying",
                        extra={"partition": state.partition, "error": type(exc).__name__},
                    )
                    await sleep_or_stop(self.settings.retry_initial_backoff_s, self.stop)
            records = [r for r in fetched.get(tp, []) if state.next <= r.offset < state.end]
            if not records:
                if fetched.get(tp):  # only records past the end: this partition is finished
                    state.next = state.end
                    break
                position = await consumer.position(tp)
                if position > state.next:  # transaction markers or aborted records: nothing to do there
                    state.next = min(position, state.end)
                    continue
                now = time.monotonic()
                quiet_since = quiet_since if quiet_since is not None else now
                if now - quiet_since >= self.options.max_retry_s:
                    raise ReplayAbortedError(
                        f"partition {state.partition}: no record at offset {state.next} (end {state.end}) "
                        f"for {now - quiet_since:.0f} s (--max-retry-s {self.options.max_retry_s:g}); "
                        "is Kafka reachable?"
                    )
                continue
            quiet_since = None
            if self._bucket is not None:
                delay = self._bucket.take(len(records), time.monotonic())
                if delay > 0 and await sleep_or_stop(delay, self.stop):
                    return  # stopped before this batch started: it is not done, `next` stays before it
            await runner.run(records, state, self.stop)

    async def _skip_deleted(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, state: PartitionState
    ) -> None:
        """Retention deleted the next offsets while we ran: say how many, go on from the first one kept."""
        first = (await consumer.beginning_offsets([tp]))[tp]
        if first <= state.next:  # not a retention gap: a real error
            raise ReplayAbortedError(f"partition {state.partition}: offset {state.next} is out of range")
        lost = min(first, state.end) - state.next
        self.counts.lost_to_retention += lost
        log.warning(
            "offsets deleted by retention before they were read",
            extra={"partition": state.partition, "from": state.next, "to": first - 1, "count": lost},
        )
        state.next = min(first, state.end)
        consumer.seek(tp, state.next)

    async def tick(self, display: ProgressDisplay) -> None:
        """Redraw the progress until cancelled."""
        every = 0.2 if display.mode == "bar" else min(1.0, self.options.progress_interval_s)
        while True:
            display.update(*self.progress(), self.counts)
            await asyncio.sleep(every)


def _handler(
    options: ReplayOptions, settings: Settings, storage: ReplayStorage, producer: OutputProducer
) -> BatchHandler:
    """The live path's handler, publishing into a recorder (sending on only when asked to)."""
    limits = Limits.from_settings(settings)
    if options.path == "recall":
        assert options.emit_to is not None
        return SkippingUnreadable(
            RecallHandler(
                storage=storage,
                publisher=EnrichedOutcomes(producer, options.emit_to, emit=not options.dry_run),
                limits=limits,
                last_messages=settings.last_messages,
                max_in_flight_threads=settings.max_in_flight_threads,
                memory_defaults=memory_defaults(settings),
                write_boundaries=not options.dry_run,
            )
        )
    return SkippingUnreadable(
        PersistHandler(
            storage=storage,
            publisher=PersistedOutcomes(producer, settings.persisted_topic, emit=options.emits),
            limits=limits,
            max_in_flight_threads=settings.max_in_flight_threads,
            tombstones=storage.tombstones,
        )
    )


async def run_replay(
    settings: Settings,
    options: ReplayOptions,
    *,
    stop: asyncio.Event | None = None,
    abandon: asyncio.Event | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> ReplayResult:
    """Replay as `options` say; prints the summary (and the resume flag) to `out`, progress to `err`.

    `stop` is the clean stop (finish the batches in hand), `abandon` the hard one; both are the signals' in
    `main`. Never raises for a failure of the replay itself: the result's `exit_code` says how it ended.
    """
    stop = stop or asyncio.Event()
    abandon = abandon or asyncio.Event()
    out = out or sys.stdout
    err = err or sys.stderr
    replay = Replay(settings, options, stop=stop, err=err)
    started = time.monotonic()
    display = ProgressDisplay(
        err,
        mode=options.progress,
        interval_s=options.progress_interval_s,
        log=_log_progress,
        width=_width(err),
    )
    failure: BaseException | None = None
    planned = False
    clear_bar = _ClearBar(display)
    for handler in logging.getLogger().handlers:
        handler.addFilter(clear_bar)
    try:
        async with contextlib.AsyncExitStack() as stack:
            plan = await replay.retrying("read the topic's offsets", lambda: plan_replay(settings, options))
            replay.partitions = [PartitionState(r.partition, r.start, r.end, r.start) for r in plan.ranges]
            replay.notes = plan.notes
            planned = True
            for note in plan.notes:
                log.warning(note)
            log.info(
                "replay starting",
                extra={
                    "topic": options.topic,
                    "path": options.path,
                    "dry_run": options.dry_run,
                    "ranges": {str(r.partition): [r.start, r.end] for r in plan.ranges},
                    "total": plan.total,
                },
            )
            report = stack.enter_context(InvalidReport(options.invalid_report))
            mongo = await replay.retrying(
                "connect to MongoDB",
                lambda: stack.enter_async_context(open_mongo(settings, dry_run=options.dry_run)),
            )
            producer = OutputProducer(settings, client_id=CLIENT_ID)
            if options.emits or options.dead_letters:
                await replay.retrying(
                    "connect the Kafka producer", lambda: stack.enter_async_context(producer)
                )
            storage = ReplayStorage(mongo, replay.counts, dry_run=options.dry_run)
            runner = BatchRunner(
                handler=_handler(options, settings, storage, producer),
                counts=replay.counts,
                report=report,
                dead_letters=DeadLetterPublisher(producer, options.dead_letter_topic)
                if options.dead_letters
                else None,
                max_retry_s=options.max_retry_s,
                retry_initial_s=settings.retry_initial_backoff_s,
                retry_max_s=settings.retry_max_backoff_s,
                path=options.path,
            )
            ticker = asyncio.create_task(replay.tick(display), name="replay-progress")
            try:
                failure = await replay.run_partitions(runner, abandon)
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
    except UsageError as exc:
        print(f"message-history replay: error: {exc}", file=err)
        return ReplayResult("failed", EXIT_USAGE, replay.counts, replay.partitions)
    except _StoppedError:
        pass  # a signal during setup: reported as interrupted
    except Exception as exc:  # noqa: BLE001 -- reported below with the resume offsets
        failure = failure or exc
    finally:
        for handler in logging.getLogger().handlers:
            handler.removeFilter(clear_bar)
    display.close(*replay.progress(), replay.counts)
    return _finish(replay, failure, planned=planned, started=started, out=out)


def _finish(
    replay: Replay, failure: BaseException | None, *, planned: bool, started: float, out: TextIO
) -> ReplayResult:
    options = replay.options
    result = ReplayResult("done", EXIT_DONE, replay.counts, replay.partitions)
    if failure is not None:
        result.status, result.exit_code = "failed", EXIT_FAILED
        log.error("replay failed", exc_info=failure if not isinstance(failure, ReplayAbortedError) else None)
    elif result.resume_offsets or not planned:
        result.status, result.exit_code = "interrupted", EXIT_INTERRUPTED
    resume = resume_flag(result.resume_offsets)
    notes = list(replay.notes)
    if not planned:
        notes.append("nothing was replayed: run the same command again")
    summary = Summary(
        topic=options.topic,
        status=result.status,
        elapsed_s=time.monotonic() - started,
        counts=replay.counts,
        dry_run=options.dry_run,
        path=options.path,
        dead_letter_topic=options.dead_letter_topic if options.dead_letters else None,
        emitted_to=(options.emit_to if options.path == "recall" else replay.settings.persisted_topic)
        if options.emits
        else None,
        resume=resume,
        error=f"{type(failure).__name__}: {failure}" if failure is not None else None,
        notes=notes,
    )
    result.summary = summary
    for line in summary_lines(summary):
        print(line, file=out)
    out.flush()
    counts = replay.counts
    log.info(
        "replay %s",
        result.status,
        extra={
            "topic": options.topic,
            "exit_code": result.exit_code,
            "events": counts.events,
            "persisted": counts.persisted,
            "skipped": dict(counts.skipped),
            "enriched": counts.enriched,
            "invalid": counts.invalid,
            "dead_lettered": counts.dead_lettered,
            "messages_inserted": counts.messages_inserted,
            "messages_present": counts.messages_present,
            "threads": counts.threads,
            "elapsed_s": round(summary.elapsed_s, 2),
            "read_s": round(replay.read_s, 3),
            "resume": resume,
        },
    )
    return result


class _ClearBar(logging.Filter):
    """Erases the progress bar before a log line goes to the same terminal."""

    def __init__(self, display: ProgressDisplay) -> None:
        super().__init__()
        self._display = display

    def filter(self, record: logging.LogRecord) -> bool:
        self._display.clear()
        return True


def _log_progress(fields: dict[str, Any]) -> None:
    log.info("replay progress", extra=fields)


def _width(stream: TextIO) -> int:
    import shutil  # noqa: PLC0415

    return shutil.get_terminal_size((120, 24)).columns if stream.isatty() else 120


# --- entry point -------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    """`message-history replay ...`; returns 0 done, 1 failed, 2 usage error, 130 interrupted."""
    settings = Settings()
    configure_logging(settings.log_level)
    register_secret(settings.mongodb_uri)
    register_secret(settings.kafka_sasl_password)
    try:
        options = options_from_args(args, settings, tty=sys.stderr.isatty())
    except UsageError as exc:
        print(f"message-history replay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_main(settings, options))


async def _main(settings: Settings, options: ReplayOptions) -> int:
    stop, abandon = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            log.warning(
                "signal received: finishing the batches in hand (again to abandon them)",
                extra={"signal": sig.name},
            )
            stop.set()
        else:
            abandon.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        result = await run_replay(settings, options, stop=stop, abandon=abandon)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return result.exit_code
