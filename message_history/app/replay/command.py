"""`message-history replay ...`: the entry point, the run with its progress, the summary, the signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

from consumers.contract import BatchHandler
from consumers.observe_emit import ObservationEmitter
from consumers.observe_recall import ObservationRecall
from consumers.persist import PersistHandler
from consumers.recall import RecallHandler
from consumers.runtime.containment import Contained
from consumers.runtime.emit import FileUnderOffset, SendNow
from consumers.unreadable import SkippingUnreadable
from message_history.app.capabilities import storage_capabilities
from message_history.app.replay.observe_wait import ObservationWaitError, ObservationWaits
from message_history.app.replay.offsets import plan_replay
from message_history.app.replay.options import CLIENT_ID, ReplayOptions, options_from_args
from message_history.app.replay.plan import Counts, PartitionRange, Plan, UsageError, resume_flag
from message_history.app.replay.progress import ProgressDisplay, Status, Summary, summary_lines
from message_history.app.replay.runner import (
    BatchRunner,
    PartitionState,
    Replay,
    ReplayAbortedError,
    StoppedError,
    sleep_or_stop,
)
from message_history.app.replay.sinks import (
    EnrichedOutcomes,
    InvalidReport,
    PersistedOutcomes,
    ReplayStorage,
    open_mongo,
)
from message_history.logs import scrub, start_command
from message_history.settings import Settings
from producers.dead_letters import DeadLetterPublisher
from producers.observe import ObservePublisher
from producers.output import OutputProducer
from producers.transactions import PartitionTransactions, producer_options
from storage.message_id_keys import message_id_keys
from storage.mongodb import MongoHistoryStorage
from storage.observational import MongoObservationalStore, open_observational

log = logging.getLogger(__name__)

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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


def _transactions(settings: Settings, stack: contextlib.AsyncExitStack) -> PartitionTransactions:
    """Exactly-once: each batch's outputs (emitted events, dead letters) in one transaction per source
    partition, on the live service's transaction code (a commit in doubt settled on the same producer,
    never sent twice). The ids are `transactional_id(group, topic, partition, replay=True)`: a second replay
    of the same partition fences the first. No offset joins the transaction (a replay has no group): its
    resume point (`--from-offsets`) moves only past batches whose transaction committed. Closed with
    `stack`."""
    options = producer_options(settings, client_id=CLIENT_ID)
    transactions = PartitionTransactions.for_client(
        options, group_id=settings.group_id, path="replay", replay=True
    )
    stack.push_async_callback(transactions.close)
    return transactions


def _handler(
    options: ReplayOptions,
    settings: Settings,
    storage: ReplayStorage,
    id_keys: tuple[bytes, ...] = (),
    observation: ObservationEmitter | None = None,
    recalled_observations: ObservationRecall | None = None,
) -> BatchHandler:
    """The live path's handler, publishing into a recorder (sending on only when asked to)."""
    path: BatchHandler
    capabilities = storage_capabilities(storage)
    if options.path == "recall":
        assert options.emit_to is not None
        path = RecallHandler(
            settings,
            storage,
            EnrichedOutcomes(options.emit_to, emit=not options.dry_run),
            write_boundaries=not options.dry_run,
            raw_rows=capabilities.raw_rows,
            # a request with OM is recalled with the thread's log, as the live recall does
            observation=recalled_observations,
        )
    else:
        path = PersistHandler(
            settings,
            storage,
            PersistedOutcomes(settings.persisted_topic, emit=options.emits),
            tombstones=storage.tombstones,
            id_keys=id_keys,  # the service's: a turn that yielded to alternates replays onto them
            save_reads=capabilities.save_reads,
            homes=capabilities.homes,
            observation=observation,  # `--observe`: OM's work, as the live persist path sends it
        )
    # as the live loop: an unreadable record is refused first; a batch the path raises for is split
    return Contained(SkippingUnreadable(path), options.path)


async def _observation(
    settings: Settings,
    options: ReplayOptions,
    mongo: MongoHistoryStorage,
    storage: ReplayStorage,
    counts: Counts,
) -> tuple[ObservationEmitter | None, ObservationWaits | None]:
    """`--observe`: the live persist path's Observational Memory hook on the replay's storage (its claims in
    `mastra_observational_memory`, its work through the replay's channel: in the batch's transaction under
    exactly-once), telling the wait for each claim's answer (`replay.observe_wait`) what it sent."""
    if not options.observes:
        return None, None
    rows = await open_observational(mongo.db, settings.observation_timeout_s)
    waits = ObservationWaits(
        rows,
        counts,
        wait_s=options.observe_wait_s,
        sleep=sleep_or_stop,
        claim_timeout_s=settings.observation_timeout_s,
    )
    publisher = ObservePublisher(settings.observe_requests_topic)
    return ObservationEmitter(settings, rows, storage, publisher, on_work=waits.noted), waits


def _recalled_observations(
    settings: Settings, mongo: MongoHistoryStorage, storage: ReplayStorage
) -> ObservationRecall:
    """Re-enrichment's Observational Memory: the rows read as the live recall reads them (reads only: no
    index is made, so a dry run changes nothing either)."""
    rows = MongoObservationalStore(mongo.db, claim_timeout=timedelta(seconds=settings.observation_timeout_s))
    return ObservationRecall(settings, rows, storage)


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
    replay = Replay(settings, options, stop=stop)
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
            _log_start(options, plan)
            report = stack.enter_context(InvalidReport(options.invalid_report))
            mongo = await replay.retrying(
                "connect to MongoDB",
                lambda: stack.enter_async_context(open_mongo(settings, dry_run=options.dry_run)),
            )
            sends = options.emits or options.dead_letters or options.observes
            exactly_once = sends and settings.processing_guarantee == "exactly-once"
            # exactly-once: the handlers' outputs are filed under their records' offsets, each batch's go out
            # in one transaction; else they are sent at once on the producer (`consumers.runtime.emit`)
            producer = OutputProducer(settings, client_id=CLIENT_ID)
            transactions = _transactions(settings, stack) if exactly_once else None
            if sends and not exactly_once:
                await replay.retrying(
                    "connect the Kafka producer", lambda: stack.enter_async_context(producer)
                )
            storage = ReplayStorage(mongo, replay.counts, dry_run=options.dry_run)
            id_keys = (
                await replay.retrying(
                    "read the message-id key",
                    lambda: message_id_keys(mongo.db, settings, create=not options.dry_run),
                )
                if options.path == "persist"
                else ()
            )
            emitter, waits = await _observation(settings, options, mongo, storage, replay.counts)
            runner = BatchRunner(
                handler=_handler(
                    options,
                    settings,
                    storage,
                    id_keys,
                    emitter,
                    _recalled_observations(settings, mongo, storage),
                ),
                observations=waits,
                counts=replay.counts,
                report=report,
                dead_letters=DeadLetterPublisher(options.dead_letter_topic) if options.dead_letters else None,
                emit=FileUnderOffset() if exactly_once else SendNow(producer),
                max_retry_s=options.max_retry_s,
                retry_initial_s=settings.retry_initial_backoff_s,
                retry_max_s=settings.retry_max_backoff_s,
                transactions=transactions,
            )
            ticker = asyncio.create_task(replay.tick(display), name="replay-progress")
            try:
                failure = await replay.run_partitions(runner, abandon)
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
    except UsageError as exc:
        print(f"message-history replay: error: {scrub(str(exc))}", file=err)
        return ReplayResult("failed", EXIT_USAGE, replay.counts, replay.partitions)
    except StoppedError:
        pass  # a signal during setup: reported as interrupted
    except Exception as exc:  # noqa: BLE001 -- reported below with the resume offsets
        failure = failure or exc
    finally:
        for handler in logging.getLogger().handlers:
            handler.removeFilter(clear_bar)
    display.close(*replay.progress(), replay.counts)
    return _finish(replay, failure, planned=planned, started=started, out=out)


def _log_start(options: ReplayOptions, plan: Plan) -> None:
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


def _finish(
    replay: Replay, failure: BaseException | None, *, planned: bool, started: float, out: TextIO
) -> ReplayResult:
    options = replay.options
    result = ReplayResult("done", EXIT_DONE, replay.counts, replay.partitions)
    if failure is not None:
        result.status, result.exit_code = "failed", EXIT_FAILED
        log.error(
            "replay failed",
            exc_info=failure if not isinstance(failure, ReplayAbortedError | ObservationWaitError) else None,
        )
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
        error=f"{type(failure).__name__}: {scrub(str(failure))}" if failure is not None else None,
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


def main(args: argparse.Namespace) -> int:
    """`message-history replay ...`; returns 0 done, 1 failed, 2 usage error, 130 interrupted."""
    settings = Settings()
    start_command(settings)
    try:
        options = options_from_args(args, settings, tty=sys.stderr.isatty())
    except UsageError as exc:
        print(f"message-history replay: error: {scrub(str(exc))}", file=sys.stderr)
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
