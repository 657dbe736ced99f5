"""`message-history run`: the composition root; builds both paths from the settings, runs them until a signal.

Resources are entered in dependency order into one exit stack and unwound in reverse:

    MongoDB (+ turn markers)  ->  producer  ->  HTTP probes  ->  [periodic prune]  ->  turn barrier
        ->  consumers (recall, persist, commands, observed)

so on the way out the consumers finish their batch, commit and leave the group first (all of them at once),
then the probe server stops, then the producer flushes, then MongoDB closes. SIGTERM and SIGINT set one stop
event; everything after it is bounded by `shutdown_grace_s`, a bound per step and a watchdog at the grace
(`message_history.app.shutdown`; an overrun step is abandoned, exit code 1). Process set-up (tracing, the
collector): `message_history.app.process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from consumers.barrier import TurnBarrier, open_barrier
from consumers.commands import CommandsHandler
from consumers.consumer import LoopOptions, build_consumer
from consumers.contract import BatchHandler
from consumers.loop import StreamLoop
from consumers.observe_emit import ObservationEmitter
from consumers.observe_recall import ObservationRecall
from consumers.observe_results import ObserveResultsHandler
from consumers.observe_sweep import observation_sweep
from consumers.persist import PersistHandler
from consumers.recall import RecallHandler
from consumers.timeouts import TimeoutStrikes
from consumers.turn_gate import TurnGate
from message_history import __version__
from message_history.app.capabilities import storage_capabilities
from message_history.app.health import Health
from message_history.app.health_http import serve_http
from message_history.app.periodic_prune import periodic_prune
from message_history.app.process import start_tracing, tune_gc
from message_history.app.shutdown import (
    MIN_STEP_S,
    Bounded,
    LoopGroup,
    ShutdownClock,
    arm_watchdog,
    loop_time,
    stop_on_signals,
)
from message_history.errors import StartupError
from message_history.logs import start_command
from message_history.settings import Settings
from producers.dead_letters import DeadLetterPublisher
from producers.enriched import EnrichedPublisher
from producers.forgotten import ForgottenPublisher
from producers.observe import ObservePublisher
from producers.output import OutputProducer
from producers.persisted import PersistedPublisher
from producers.transactions import PartitionTransactions
from schemas.limits import Limits
from storage.protocol import BatchHistoryStorage

if TYPE_CHECKING:
    from storage.forgetting import MongoForgetting
    from storage.observational import MongoObservationalStore
    from storage.turns import MongoTurnMarkers

log = logging.getLogger(__name__)

Path = Literal["recall", "persist", "commands", "observed"]
PATHS: tuple[Path, ...] = ("recall", "persist", "commands", "observed")
ADVISORY: tuple[Path, ...] = ("commands", "observed")  # their topics may not exist yet: never unready

DRAIN_SHARE = 0.6
"""Share of the grace period given to finishing in-flight batches; the rest is for commit, leave, flush."""

# Share of the grace each step of the exit keeps for the steps after it: the consumers keep time for the
# barrier, the probe server, the producer's flush and MongoDB; the producer for the MongoDB clients.
RESERVE_CONSUMERS = 0.2
RESERVE_SERVICES = 0.12
RESERVE_PRODUCER = 0.04

T = TypeVar("T")


@contextlib.asynccontextmanager
async def open_storage(settings: Settings) -> AsyncIterator[BatchHistoryStorage]:
    """The MongoDB storage, connected (fails fast when MongoDB does not answer), closed on exit."""
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415 -- keeps `--help` free of pymongo
    from storage.row_codec import use_codec  # noqa: PLC0415

    # the recalled rows' codec now: a native one built from other models is logged (or refused) at start-up
    use_codec(settings.row_codec)
    async with MongoHistoryStorage.open(settings) as storage:
        yield storage


@contextlib.asynccontextmanager
async def open_markers(settings: Settings) -> AsyncIterator[MongoTurnMarkers | None]:
    """The busy-thread markers (`message_history_turns`), or None with policy `allow` (nobody reads them)."""
    if settings.busy_thread == "allow":
        yield None
        return
    from storage.turns import MongoTurnMarkers  # noqa: PLC0415 -- keeps `--help` free of pymongo

    async with MongoTurnMarkers.open(settings) as markers:
        yield markers


@contextlib.asynccontextmanager
async def maybe_barrier(settings: Settings, paths: Sequence[Path]) -> AsyncIterator[TurnBarrier | None]:
    """The turn barrier when it is on and the recall path runs; refuses to start on unequal partitions."""
    if settings.barrier == "off" or "recall" not in paths:
        yield None
        return
    async with open_barrier(settings) as barrier:
        yield barrier


@dataclass(frozen=True, slots=True)
class Opened:
    """What `run_service` opened once and every path's loop is built on."""

    settings: Settings
    storage: BatchHistoryStorage
    producer: OutputProducer | None  # the shared producer (at-least-once); None: exactly-once's transactions
    health: Health
    forgetting: MongoForgetting | None  # forget and tombstones; None on a storage that is not MongoDB
    gate: TurnGate | None = None  # the recall path's turn guards (None: both off)
    markers: MongoTurnMarkers | None = None  # the busy-thread markers persist records answers in
    id_keys: tuple[bytes, ...] = ()  # the message-id keys, current first (`storage.message_id_keys`)
    observational: MongoObservationalStore | None = None  # Observational Memory's rows (None: no OM)


def _path_topics(settings: Settings, path: Path) -> tuple[str, str]:
    """The topic a path reads and its dead-letter topic."""
    return {
        "recall": (settings.requests_topic, settings.requests_dlq),
        "persist": (settings.responses_topic, settings.responses_dlq),
        "commands": (settings.commands_topic, settings.commands_dlq),
        "observed": (settings.observe_results_topic, settings.observe_results_dlq),
    }[path]


def build_loop(path: Path, opened: Opened) -> StreamLoop:
    """One path's consumer loop with its handler and dead-letter topic."""
    settings, forgetting = opened.settings, opened.forgetting
    capabilities = storage_capabilities(opened.storage)
    loop_health: Health | _Advisory = opened.health
    topic, dlq = _path_topics(settings, path)
    if path == "observed":
        if opened.observational is None:
            raise ValueError("the observed path needs the MongoDB storage")
        handler: RecallHandler | PersistHandler | CommandsHandler | ObserveResultsHandler = (
            ObserveResultsHandler(rows=opened.observational, limits=Limits.from_settings(settings))
        )
        loop_health = _Advisory(opened.health)
    elif path == "commands":
        if forgetting is None:
            raise ValueError("the commands path needs the MongoDB storage")
        handler = CommandsHandler(
            forgetting=forgetting,
            publisher=ForgottenPublisher(settings.forgotten_topic),
            limits=Limits.from_settings(settings),
        )
        loop_health = _Advisory(opened.health)
    elif path == "recall":
        handler = RecallHandler(
            settings,
            opened.storage,
            EnrichedPublisher(settings.enriched_topic),
            gate=opened.gate,
            raw_rows=capabilities.raw_rows,
            observation=(
                ObservationRecall(settings, opened.observational, opened.storage)
                if opened.observational is not None
                else None
            ),
        )
    else:
        handler = PersistHandler(
            settings,
            opened.storage,
            PersistedPublisher(settings.persisted_topic),
            tombstones=forgetting,
            markers=opened.markers,
            id_keys=opened.id_keys,
            save_reads=capabilities.save_reads,
            homes=capabilities.homes,
            observation=_observation(opened),
        )
    return StreamLoop(
        path=path,
        topic=topic,
        consumer=build_consumer(settings, path=path),
        handler=handler if path in ADVISORY else _timeout_strikes(handler, opened.storage, settings, path),
        dead_letters=DeadLetterPublisher(dlq),
        health=loop_health,
        options=LoopOptions.from_settings(settings),
        output=_output(opened, path),
    )


def _output(opened: Opened, path: Path) -> OutputProducer | PartitionTransactions:
    """Where a path's outputs go: one transaction per input partition (exactly-once), else the shared
    producer; the loop's checkpoint hands each batch its channel (`consumers.runtime.emit`)."""
    if opened.settings.processing_guarantee == "exactly-once":
        return PartitionTransactions(opened.settings, path=path)
    if opened.producer is None:
        raise ValueError("at-least-once needs the shared producer")
    return opened.producer


def _timeout_strikes(
    handler: BatchHandler, storage: BatchHistoryStorage, settings: Settings, path: Path
) -> BatchHandler:
    """`handler`, whose records are dead-lettered once their own operation keeps timing out while MongoDB
    answers a ping (`consumers.timeouts`); as it is on a storage that is not MongoDB (nothing to ping)."""
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415 -- keeps `--help` free of pymongo

    if not isinstance(storage, MongoHistoryStorage):
        return handler
    # half the operation timeout: a server too slow to answer a ping in that is in an outage, not a record
    bound = settings.mongodb_timeout_ms / 2000
    strikes = TimeoutStrikes(
        handler,
        ping=lambda: storage.ping(bound),
        tries=settings.storage_timeout_tries,
        path=path,
    )
    if isinstance(handler, RecallHandler):
        handler.parking.timeouts = strikes  # a parked request is retried alone in its lane: the same rule
    return strikes


def _observation(opened: Opened) -> ObservationEmitter | None:
    """The persist path's Observational Memory hook, when the observed path's topic is set (no one would
    apply the results otherwise) and the storage is MongoDB."""
    settings = opened.settings
    if opened.observational is None or not settings.observe_results_topic:
        return None
    publisher = ObservePublisher(settings.observe_requests_topic)
    return ObservationEmitter(settings, opened.observational, opened.storage, publisher)


async def _observational(
    settings: Settings, forgetting: MongoForgetting | None
) -> MongoObservationalStore | None:
    """`mastra_observational_memory` on the storage's database, its indexes made; None without MongoDB."""
    if forgetting is None:
        return None
    from storage.observational import open_observational  # noqa: PLC0415 -- `--help` without pymongo

    return await open_observational(forgetting.db, settings.observation_timeout_s)


def _forgetting(settings: Settings, storage: BatchHistoryStorage) -> MongoForgetting | None:
    """Forget and tombstones on the storage's database; None for a storage that is not MongoDB. A forget runs
    in chunks, each operation under the CLI's longer timeout (the tombstone reads keep the service's)."""
    from storage.forgetting import (  # noqa: PLC0415 -- keeps `--help` free of pymongo
        FORGET_OPERATION_TIMEOUT_MS,
        MongoForgetting,
    )
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415

    if not isinstance(storage, MongoHistoryStorage):
        return None
    return MongoForgetting(
        storage.db,
        chunk_size=settings.forget_chunk_size,
        operation_timeout_s=max(settings.mongodb_timeout_ms, FORGET_OPERATION_TIMEOUT_MS) / 1000,
    )


async def _message_id_keys(settings: Settings, forgetting: MongoForgetting | None) -> tuple[bytes, ...]:
    """The persist path's message-id keys: configured, else the deployment's own in MongoDB (a key of this
    process on a storage that is not MongoDB, which lives no longer)."""
    from storage.message_id_keys import message_id_keys  # noqa: PLC0415 -- keeps `--help` free of pymongo

    return await message_id_keys(forgetting.db if forgetting is not None else None, settings)


def selected_paths(settings: Settings, only: Path | None) -> tuple[Path, ...]:
    """The paths `run` starts: all, or one; the commands path runs with the persist path (it writes the same
    collections) unless `MESSAGE_HISTORY_COMMANDS_TOPIC` is empty, and so does the observed path (the persist
    path sends its work) unless `MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC` is empty."""
    if only is None:
        paths: tuple[Path, ...] = PATHS
    elif only == "persist":
        paths = ("persist", "commands", "observed")
    else:
        paths = (only,)
    off = {"commands": not settings.commands_topic, "observed": not settings.observe_results_topic}
    return tuple(p for p in paths if not off.get(p, False))


class _Advisory:
    """The health a path reports to when it must not make the service unready (the commands path).

    A missing commands topic is normal (nobody has sent a command yet); the path waits for it and says so in
    the log, while recall and persist keep the service ready. Liveness beats pass through.
    """

    def __init__(self, health: Health) -> None:
        self._health = health

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None:
        return None

    def beat(self, component: str) -> None:
        self._health.beat(component)


async def run_service(
    settings: Settings,
    *,
    stop: asyncio.Event,
    only: Path | None = None,
    health: Health | None = None,
    storage: BatchHistoryStorage | None = None,
) -> int:
    """Run the selected paths until `stop` is set or one fails; 0 after a clean stop, 1 after a failure.

    `storage` replaces MongoDB (embedded use and tests); by default MongoDB is opened from the settings.
    """
    health = health or Health()
    paths: Sequence[Path] = selected_paths(settings, only)
    stack = contextlib.AsyncExitStack()
    clock = ShutdownClock(settings.shutdown_grace_s)
    code = 1

    def step(name: str, inner: AbstractAsyncContextManager[T], reserve: float = 0.0) -> Bounded[T]:
        return Bounded(name, inner, clock, reserve)

    try:
        batch_storage = (
            storage
            if storage is not None
            else await stack.enter_async_context(step("mongodb", open_storage(settings)))
        )
        markers = await stack.enter_async_context(step("turn markers", open_markers(settings)))
        # exactly-once: no shared producer, each loop produces its outputs in its transactions
        producer = (
            None
            if settings.processing_guarantee == "exactly-once"
            else await stack.enter_async_context(step("producer", OutputProducer(settings), RESERVE_PRODUCER))
        )
        await stack.enter_async_context(
            step("probes", serve_http(health, settings.http_host, settings.http_port), RESERVE_SERVICES)
        )
        forgetting = _forgetting(settings, batch_storage)
        if forgetting is None:  # forgetting and OM need MongoDB (embedded use, tests)
            paths = [p for p in paths if p not in ADVISORY]
        else:
            await forgetting.ensure_indexes()
        observational = await _observational(settings, forgetting)
        if observational is not None and "observed" in paths:  # stale OM claims' work sent again
            sweep = observation_sweep(settings, observational, batch_storage, producer)
            await stack.enter_async_context(step("om sweep", sweep, RESERVE_SERVICES))
        if settings.prune_older_than and forgetting is not None:
            await stack.enter_async_context(
                step("prune", periodic_prune(forgetting.db, settings), RESERVE_SERVICES)
            )
        barrier = await stack.enter_async_context(
            step("barrier", maybe_barrier(settings, paths), RESERVE_SERVICES)
        )
        gate = TurnGate(
            barrier=barrier,
            markers=markers,
            policy=settings.busy_thread,
            timeout_s=settings.turn_timeout_s,
            stop=stop,
            abandon_after_s=settings.abandon_turn_after_ms / 1000,
        )
        opened = Opened(
            settings,
            batch_storage,
            producer,
            health,
            forgetting,
            gate=gate if gate.barrier or gate.markers else None,
            markers=markers,
            id_keys=await _message_id_keys(settings, forgetting) if "persist" in paths else (),
            observational=observational,
        )
        loops = [build_loop(path, opened) for path in paths]
        for path, loop in zip(paths, loops, strict=True):
            if path == "persist" and barrier is not None:
                barrier.local = loop.done_offset
        await stack.enter_async_context(LoopGroup(loops, clock, RESERVE_CONSUMERS))
        log.info(
            "message-history started",
            extra={
                "version": __version__,
                "paths": list(paths),
                "group_id": settings.group_id,
                "barrier": settings.barrier,
                "busy_thread": settings.busy_thread,
                "processing_guarantee": settings.processing_guarantee,
            },
        )
        code = await _run_until_stopped(loops, stop, health, settings, clock)
    finally:
        clock.start()  # a start-up that failed is stopped within the same budget
        try:
            # each step bounds itself; this is the backstop for the stack as a whole
            async with asyncio.timeout_at(loop_time(clock.deadline + MIN_STEP_S)):
                await stack.aclose()
        except TimeoutError:
            clock.failed("shutdown")
        if clock.unfinished:
            log.error(
                "shutdown did not finish cleanly within the grace period",
                extra={"grace_s": settings.shutdown_grace_s, "steps": clock.unfinished},
            )
            code = 1
    log.info("message-history stopped", extra={"exit_code": code})
    return code


async def _run_until_stopped(
    loops: Sequence[StreamLoop],
    stop: asyncio.Event,
    health: Health,
    settings: Settings,
    clock: ShutdownClock,
) -> int:
    silence = settings.max_poll_interval_ms / 1000
    for loop in loops:
        health.register_loop(loop.path, max_silence_s=silence)
    tasks = [asyncio.create_task(loop.run(stop), name=f"{loop.path}-loop") for loop in loops]
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stop.set()  # a loop that ended by itself failed: stop the other one too
        clock.start()
        log.info("stopping: finishing in-flight batches")
        _, pending = await asyncio.wait(tasks, timeout=settings.shutdown_grace_s * DRAIN_SHARE)
        for task in pending:
            log.warning("in-flight batch abandoned at shutdown", extra={"loop": task.get_name()})
            task.cancel()
        if pending:
            # a cancelled loop ends at its next await; one that does not is left behind, not waited for
            _, stuck = await asyncio.wait(pending, timeout=MIN_STEP_S * 10)
            for task in stuck:
                clock.failed(task.get_name())
    finally:
        stopper.cancel()
        for loop in loops:
            health.unregister_loop(loop.path)
    code = 0
    for task in tasks:
        if task.cancelled() or not task.done():
            continue
        error = task.exception()
        if error is not None:
            log.error("%s stopped on an error", task.get_name(), exc_info=error)
            code = 1
    return code


def main(only: str | None = None) -> int:
    """Entry point of `message-history run [--only recall|persist]`; returns the process exit code."""
    settings = Settings()
    start_command(settings)
    tune_gc(settings)
    selected: Path | None = None
    if only is not None:
        if only not in PATHS:
            raise ValueError(f"unknown path {only!r}")
        selected = next(p for p in PATHS if p == only)
    stop_tracing = start_tracing()
    try:
        return asyncio.run(_main(settings, selected))
    finally:
        if stop_tracing is not None:
            stop_tracing()  # exports the spans still buffered


async def _main(settings: Settings, only: Path | None) -> int:
    stop = asyncio.Event()
    watchdog = asyncio.create_task(arm_watchdog(stop, settings.shutdown_grace_s), name="shutdown-watchdog")
    try:
        with stop_on_signals(stop):
            return await run_service(settings, stop=stop, only=only)
    except StartupError as exc:
        log.error("cannot start: %s", exc)  # noqa: TRY400 -- the message says it all; no traceback
        return 1
    finally:
        watchdog.cancel()
