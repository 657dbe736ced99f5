"""`message-history run`: the composition root; builds both paths from the settings, runs them until a signal.

Resources are entered in dependency order into one exit stack and unwound in reverse:

    MongoDB  ->  producer  ->  HTTP probes  ->  consumers (recall, persist)

so on the way out the consumers finish their batch, commit and leave the group first, then the probe server
stops, then the producer flushes, then MongoDB closes. SIGTERM and SIGINT set one stop event; everything
after it is bounded by `shutdown_grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Sequence
from typing import Literal

from consumers.loop import LoopOptions, StreamLoop, build_consumer
from consumers.requests import MemoryDefaults, RecallHandler
from consumers.responses import PersistHandler
from message_history import __version__
from message_history.batch_storage import BatchHistoryStorage, as_batch_storage
from message_history.health import Health, serve_http
from message_history.logs import configure_logging, register_secret
from message_history.settings import Settings
from producers.dead_letters import DeadLetterPublisher
from producers.enriched import EnrichedPublisher
from producers.output import OutputProducer
from producers.persisted import PersistedPublisher
from schemas.limits import Limits
from storage.protocol import HistoryStorage

log = logging.getLogger(__name__)

Path = Literal["recall", "persist"]
PATHS: tuple[Path, ...] = ("recall", "persist")

DRAIN_SHARE = 0.6
"""Share of the grace period given to finishing in-flight batches; the rest is for commit, leave, flush."""


@contextlib.asynccontextmanager
async def open_storage(settings: Settings) -> AsyncIterator[BatchHistoryStorage]:
    """The MongoDB storage, connected (fails fast when MongoDB does not answer), closed on exit."""
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415 -- keeps `--help` free of pymongo

    async with MongoHistoryStorage.open(settings) as storage:
        yield as_batch_storage(storage)


def memory_defaults(settings: Settings) -> MemoryDefaults:
    """The recall path's service-wide memory options, from the settings."""
    return MemoryDefaults(
        last_messages=settings.last_messages,
        max_tokens=settings.max_tokens,
        at_max_remove_tokens=settings.at_max_remove_tokens,
        retain_full_input=settings.retain_full_input,
    )


def build_loop(
    path: Path,
    *,
    settings: Settings,
    storage: BatchHistoryStorage,
    producer: OutputProducer,
    health: Health,
) -> StreamLoop:
    """One path's consumer loop with its handler and dead-letter topic."""
    limits = Limits.from_settings(settings)
    if path == "recall":
        topic, dlq = settings.requests_topic, settings.requests_dlq
        handler: RecallHandler | PersistHandler = RecallHandler(
            storage=storage,
            publisher=EnrichedPublisher(producer, settings.enriched_topic),
            limits=limits,
            last_messages=settings.last_messages,
            max_in_flight_threads=settings.max_in_flight_threads,
            memory_defaults=memory_defaults(settings),
        )
    else:
        topic, dlq = settings.responses_topic, settings.responses_dlq
        handler = PersistHandler(
            storage=storage,
            publisher=PersistedPublisher(producer, settings.persisted_topic),
            limits=limits,
            max_in_flight_threads=settings.max_in_flight_threads,
        )
    return StreamLoop(
        path=path,
        topic=topic,
        consumer=build_consumer(settings, topic=topic, path=path),
        handler=handler,
        dead_letters=DeadLetterPublisher(producer, dlq),
        health=health,
        options=LoopOptions.from_settings(settings),
    )


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
    paths: Sequence[Path] = (only,) if only else PATHS
    stack = contextlib.AsyncExitStack()
    stopped_at: list[float] = []
    code = 1
    try:
        batch_storage = (
            as_batch_storage(storage)
            if storage is not None
            else await stack.enter_async_context(open_storage(settings))
        )
        producer = await stack.enter_async_context(OutputProducer(settings))
        await stack.enter_async_context(serve_http(health, settings.http_host, settings.http_port))
        loops = [
            await stack.enter_async_context(
                build_loop(path, settings=settings, storage=batch_storage, producer=producer, health=health)
            )
            for path in paths
        ]
        log.info(
            "message-history started",
            extra={"version": __version__, "paths": list(paths), "group_id": settings.group_id},
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


def main(only: str | None = None) -> int:
    """Entry point of `message-history run [--only recall|persist]`; returns the process exit code."""
    settings = Settings()
    configure_logging(settings.log_level)
    register_secret(settings.mongodb_uri)
    register_secret(settings.kafka_sasl_password)
    selected: Path | None = None
    if only is not None:
        if only not in PATHS:
            raise ValueError(f"unknown path {only!r}")
        selected = "recall" if only == "recall" else "persist"
    return asyncio.run(_main(settings, selected))


async def _main(settings: Settings, only: Path | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, stop, sig)
    try:
        return await run_service(settings, stop=stop, only=only)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("signal received: stopping", extra={"signal": sig.name})
    stop.set()
