"""`message-history run`: the composition root; builds both paths from the settings, runs them until a signal.

Resources are entered in dependency order into one exit stack and unwound in reverse:

    MongoDB (+ turn markers)  ->  producer  ->  HTTP probes  ->  [periodic prune]  ->  turn barrier
        ->  consumers (recall, persist, commands)

so on the way out the consumers finish their batch, commit and leave the group first, then the probe server
stops, then the producer flushes, then MongoDB closes. SIGTERM and SIGINT set one stop event; everything
after it is bounded by `shutdown_grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from consumers.barrier import TurnBarrier, open_barrier
from consumers.commands import CommandsHandler
from consumers.consumer import LoopOptions, build_consumer
from consumers.loop import StreamLoop
from consumers.persist import PersistHandler
from consumers.recall import RecallHandler
from consumers.turn_gate import TurnGate
from message_history import __version__, tracing
from message_history.app.health import Health, serve_http
from message_history.app.periodic_prune import periodic_prune
from message_history.errors import StartupError
from message_history.logs import start_command
from message_history.settings import Settings
from producers.dead_letters import DeadLetterPublisher
from producers.enriched import EnrichedPublisher
from producers.forgotten import ForgottenPublisher
from producers.output import OutputProducer
from producers.persisted import PersistedPublisher
from schemas.limits import Limits
from storage.protocol import BatchHistoryStorage, HistoryStorage
from storage.sequential import as_batch_storage

if TYPE_CHECKING:
    from storage.forgetting import MongoForgetting
    from storage.turns import MongoTurnMarkers

log = logging.getLogger(__name__)

Path = Literal["recall", "persist", "commands"]
PATHS: tuple[Path, ...] = ("recall", "persist", "commands")

DRAIN_SHARE = 0.6
"""Share of the grace period given to finishing in-flight batches; the rest is for commit, leave, flush."""


@contextlib.asynccontextmanager
async def open_storage(settings: Settings) -> AsyncIterator[BatchHistoryStorage]:
    """The MongoDB storage, connected (fails fast when MongoDB does not answer), closed on exit."""
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415 -- keeps `--help` free of pymongo

    async with MongoHistoryStorage.open(settings) as storage:
        yield as_batch_storage(storage)


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
    producer: OutputProducer
    health: Health
    forgetting: MongoForgetting | None  # forget and tombstones; None on a storage that is not MongoDB
    gate: TurnGate | None = None  # the recall path's turn guards (None: both off)
    markers: MongoTurnMarkers | None = None  # the busy-thread markers persist records answers in


def build_loop(path: Path, opened: Opened) -> StreamLoop:
    """One path's consumer loop with its handler and dead-letter topic."""
    settings, producer, forgetting = opened.settings, opened.producer, opened.forgetting
    loop_health: Health | _Advisory = opened.health
    if path == "commands":
        if forgetting is None:
            raise ValueError("the commands path needs the MongoDB storage")
        topic, dlq = settings.commands_topic, settings.commands_dlq
        handler: RecallHandler | PersistHandler | CommandsHandler = CommandsHandler(
            forgetting=forgetting,
            publisher=ForgottenPublisher(producer, settings.forgotten_topic),
            limits=Limits.from_settings(settings),
        )
        loop_health = _Advisory(opened.health)
    elif path == "recall":
        topic, dlq = settings.requests_topic, settings.requests_dlq
        publisher = EnrichedPublisher(producer, settings.enriched_topic)
        handler = RecallHandler(settings, opened.storage, publisher, gate=opened.gate)
    else:
        topic, dlq = settings.responses_topic, settings.responses_dlq
        persisted = PersistedPublisher(producer, settings.persisted_topic)
        handler = PersistHandler(
            settings, opened.storage, persisted, tombstones=forgetting, markers=opened.markers
        )
    return StreamLoop(
        path=path,
        topic=topic,
        consumer=build_consumer(settings, path=path),
        handler=handler,
        dead_letters=DeadLetterPublisher(producer, dlq),
        health=loop_health,
        options=LoopOptions.from_settings(settings),
    )


def _forgetting(storage: BatchHistoryStorage) -> MongoForgetting | None:
    """Forget and tombstones on the storage's database; None for a storage that is not MongoDB."""
    from storage.forgetting import MongoForgetting  # noqa: PLC0415 -- keeps `--help` free of pymongo
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415

    return MongoForgetting(storage.db) if isinstance(storage, MongoHistoryStorage) else None


def selected_paths(settings: Settings, only: Path | None) -> tuple[Path, ...]:
    """The paths `run` starts: all, or one; the commands path runs with the persist path (it writes the same
    collections) unless `MESSAGE_HISTORY_COMMANDS_TOPIC` is empty."""
    if only is None:
        paths: tuple[Path, ...] = PATHS
    elif only == "persist":
        paths = ("persist", "commands")
    else:
        paths = (only,)
    return tuple(p for p in paths if p != "commands" or settings.commands_topic)


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
    storage: HistoryStorage | None = None,
) -> int:
    """Run the selected paths until `stop` is set or one fails; 0 after a clean stop, 1 after a failure.

    `storage` replaces MongoDB (embedded use and tests); by default MongoDB is opened from the settings.
    """
    health = health or Health()
    paths: Sequence[Path] = selected_paths(settings, only)
    stack = contextlib.AsyncExitStack()
    stopped_at: list[float] = []
    code = 1
    try:
        batch_storage = (
            as_batch_storage(storage)
            if storage is not None
            else await stack.enter_async_context(open_storage(settings))
        )
        markers = await stack.enter_async_context(open_markers(settings))
        producer = await stack.enter_async_context(OutputProducer(settings))
        await stack.enter_async_context(serve_http(health, settings.http_host, settings.http_port))
        forgetting = _forgetting(batch_storage)
        if forgetting is None:
            paths = [p for p in paths if p != "commands"]  # forgetting needs MongoDB (embedded use, tests)
        else:
            await forgetting.ensure_indexes()
        if settings.prune_older_than and forgetting is not None:
            await stack.enter_async_context(periodic_prune(forgetting.db, settings))
        barrier = await stack.enter_async_context(maybe_barrier(settings, paths))
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
        )
        loops: list[StreamLoop] = []
        for path in paths:
            loop = build_loop(path, opened)
            loops.append(await stack.enter_async_context(loop))
            if path == "persist" and barrier is not None:
                barrier.local = loop.done_offset
        log.info(
            "message-history started",
            extra={
                "version": __version__,
                "paths": list(paths),
                "group_id": settings.group_id,
                "barrier": settings.barrier,
                "busy_thread": settings.busy_thread,
            },
        )
        code = await _run_until_stopped(loops, stop, health, settings, stopped_at)
    finally:
        budget = settings.shutdown_grace_s - (time.monotonic() - stopped_at[0] if stopped_at else 0.0)
        try:
            async with asyncio.timeout(max(1.0, budget)):
                await stack.aclose()
        except TimeoutError:
            log.exception(
                "shutdown did not finish within the grace period",
                extra={"grace_s": settings.shutdown_grace_s},
            )
            code = 1
    log.info("message-history stopped", extra={"exit_code": code})
    return code


async def _run_until_stopped(
    loops: Sequence[StreamLoop],
    stop: asyncio.Event,
    health: Health,
    settings: Settings,
    stopped_at: list[float],
) -> int:
    silence = settings.max_poll_interval_ms / 1000
    for loop in loops:
        health.register_loop(loop.path, max_silence_s=silence)
    tasks = [asyncio.create_task(loop.run(stop), name=f"{loop.path}-loop") for loop in loops]
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stop.set()  # a loop that ended by itself failed: stop the other one too
        stopped_at.append(time.monotonic())
        log.info("stopping: finishing in-flight batches")
        _, pending = await asyncio.wait(tasks, timeout=settings.shutdown_grace_s * DRAIN_SHARE)
        for task in pending:
            log.warning("in-flight batch abandoned at shutdown", extra={"loop": task.get_name()})
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        stopper.cancel()
        for loop in loops:
            health.unregister_loop(loop.path)
    code = 0
    for task in tasks:
        if task.cancelled():
            continue
        error = task.exception()
        if error is not None:
            log.error("%s stopped on an error", task.get_name(), exc_info=error)
            code = 1
    return code


def start_tracing(env: Mapping[str, str] = os.environ) -> Callable[[], None] | None:
    """The OpenTelemetry SDK as the `OTEL_*` variables configure it; returns its shutdown (flushes spans).

    Only when they ask for traces (`tracing.sdk_configured`), the `[otel]` extra is installed and no provider
    is in place yet (`opentelemetry-instrument` may have set one: it is used as is). The SDK reads the rest
    itself: `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_*`, `OTEL_BSP_*`, `OTEL_RESOURCE_ATTRIBUTES`.
    """
    if not tracing.sdk_configured(env) or tracing.enabled():
        return None
    try:
        from opentelemetry import trace  # noqa: PLC0415 -- the SDK is optional
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("OTEL_* asks for traces but the SDK is missing: pip install 'message-history[otel]'")
        return None
    attributes = {"service.version": __version__}
    if "OTEL_SERVICE_NAME" not in env and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "message-history"
    provider = TracerProvider(resource=Resource.create(attributes))
    listed = env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
    names = [n.strip() for n in listed if n.strip() not in ("", "none")]
    for name in names:
        exporter: SpanExporter
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )

            exporter = OTLPSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER entry ignored", extra={"exporter": name})
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"exporters": names})
    return provider.shutdown


def main(only: str | None = None) -> int:
    """Entry point of `message-history run [--only recall|persist]`; returns the process exit code."""
    settings = Settings()
    start_command(settings)
    selected: Path | None = None
    if only is not None:
        if only not in PATHS:
            raise ValueError(f"unknown path {only!r}")
        selected = "recall" if only == "recall" else "commands" if only == "commands" else "persist"
    stop_tracing = start_tracing()
    try:
        return asyncio.run(_main(settings, selected))
    finally:
        if stop_tracing is not None:
            stop_tracing()  # exports the spans still buffered


async def _main(settings: Settings, only: Path | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, stop, sig)
    try:
        return await run_service(settings, stop=stop, only=only)
    except StartupError as exc:
        log.error("cannot start: %s", exc)  # noqa: TRY400 -- the message says it all; no traceback
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("signal received: stopping", extra={"signal": sig.name})
    stop.set()
