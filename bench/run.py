"""One benchmark run: seed, every line in turn on the same workload, the record, the cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from bench import coordination, report, targets
from bench.anchor import run_anchor
from bench.context import Budget, RunContext
from bench.idle import CONTRACT_LINES, IDLE_LINES, run_idle
from bench.kafka_io import delete_topics
from bench.lines import coordination_lines, run_mongo_line, stream_lines
from bench.mongo_lines import KINDS
from bench.procstat import cpu_seconds, find_servers, server_name
from bench.progress import log
from bench.seed import seed
from bench.soak import run_soak
from bench.stats import LINES, LineResult, median_round
from bench.steps import run_steps
from bench.stream_line import run_stream_line
from bench.workload import Turns, Workload, history_time
from message_history.settings import Settings
from storage.documents import MESSAGES

ALL_LINES: tuple[str, ...] = tuple(LINES)
_QUIET_MAX_S = 60.0
_QUIET_CORES = 0.8
_LOAD_EVERY_S = 10.0


async def _sample_load(samples: list[float]) -> None:
    """The machine's 1-minute load average every `_LOAD_EVERY_S` (the first one now), until cancelled."""
    while True:
        samples.append(os.getloadavg()[0])
        await asyncio.sleep(_LOAD_EVERY_S)


@dataclass(frozen=True)
class Options:
    workload: Workload
    budget: Budget
    lines: Sequence[str]
    out_dir: Path
    command: str
    soak_events: int | None = None
    soak_path: str = "recall"
    keep: bool = False
    profile: bool = False
    watch: bool = False
    repeat: int = 1
    service_env: Mapping[str, str] | None = None  # None: the image's (`bench.context.SERVICE_RUNTIME_ENV`)
    instances: tuple[int, ...] = ()  # `--instances`: the coordination lines instead of `lines`
    steps: bool = False  # `python -m bench steps`: the idle turn's steps instead of `lines`
    steps_spans: bool = False  # ... with the service's OpenTelemetry spans recorded


def _mongo_port(uri: str) -> int | None:
    try:
        return urlsplit(uri).port
    except ValueError:
        return None


async def run(options: Options) -> tuple[dict[str, Any], Path, dict[str, LineResult]]:
    """Run everything `options` selects; returns the record, where it was written, and the lines."""
    task = asyncio.current_task()
    if task is not None:  # SIGTERM (and Ctrl-C, as asyncio does) unwinds through the cleanup below
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    settings = Settings()
    w = options.workload
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    uri = settings.mongodb_uri.get_secret_value()
    ctx = RunContext(
        settings=settings,
        workload=w,
        db=f"bench_{w.run_id}",
        servers=find_servers(_mongo_port(uri)),
        budget=options.budget,
        log_dir=options.out_dir / f"{stamp}-logs",
        turns=Turns(w),
        profile=options.profile,
        watch=options.watch,
    )
    if options.service_env is not None:
        ctx.service_env = dict(options.service_env)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    ctx.settle = _settler(client[ctx.db], ctx)
    ctx.restore = _restorer(client[ctx.db], w)
    lines: dict[str, LineResult] = {}
    soak: dict[str, Any] | None = None
    environment: dict[str, Any] = {"database": ctx.db, "service_env": dict(ctx.service_env)}
    load: list[float] = []
    sampling = asyncio.create_task(_sample_load(load))
    try:
        environment.update(await _servers_info(client, ctx))
        environment["seeded"] = await seed(client[ctx.db], w)
        if options.soak_events:
            soak = await run_soak(ctx, options.soak_path, options.soak_events)
        elif options.steps:
            environment["steps"] = await run_steps(ctx, ctx.budget.idle_turns, spans=options.steps_spans)
        elif options.instances:
            await _run_coordination(ctx, options, lines)
        else:
            await _run_lines(ctx, options, lines)
    except asyncio.CancelledError:
        environment["interrupted"] = True  # the record keeps the lines finished so far
        log("interrupted: cleaning up, then writing what was measured")
    finally:
        sampling.cancel()
        load.append(os.getloadavg()[0])
        environment["load_average"] = targets.load_record(load, os.cpu_count())
        if not options.keep:
            log("cleaning up: topics and the benchmark database")
            await delete_topics(settings, ctx.topics)
            with contextlib.suppress(Exception):
                await client.drop_database(ctx.db)
        await client.close()
    record = report.build(
        command=options.command,
        started_at=stamp,
        workload=w.as_dict() | {"budget": vars(options.budget)},
        environment=environment,
        lines=lines,
        soak=soak,
    )
    if options.instances:
        record["coordination"] = coordination.summarize(lines, options.instances)
    path = options.out_dir / f"{stamp}.json"
    report.write(record, path)
    return record, path, lines


async def _run_lines(ctx: RunContext, options: Options, lines: dict[str, LineResult]) -> None:
    """Every selected line, `options.repeat` rounds; each line keeps its median round (by events/s)."""
    rounds: dict[str, list[LineResult]] = {}
    for number in range(options.repeat):
        if options.repeat > 1:
            log(f"=== round {number + 1}/{options.repeat}")
        async for result in _one_round(ctx, set(options.lines)):
            rounds.setdefault(result.name, []).append(result)
            lines[result.name] = median_round(rounds[result.name])  # kept current: an interrupt keeps it


async def _run_coordination(ctx: RunContext, options: Options, lines: dict[str, LineResult]) -> None:
    """`--instances`: each path's service line at each instance count, `options.repeat` rounds (medians)."""
    rounds: dict[str, list[LineResult]] = {}
    for number in range(options.repeat):
        if options.repeat > 1:
            log(f"=== round {number + 1}/{options.repeat}")
        for line in coordination_lines(ctx, options.instances):
            log(f"--- {line.name} ({line.instances} instances, one group)")
            result = await run_stream_line(ctx, line)
            rounds.setdefault(result.name, []).append(result)
            lines[result.name] = median_round(rounds[result.name])


async def _one_round(ctx: RunContext, selected: set[str]) -> AsyncIterator[LineResult]:
    events = ctx.workload.threads
    for path in ("recall", "persist"):
        for line in stream_lines(ctx, path, events):
            if line.name in selected:
                log(f"--- {line.name}")
                yield await run_stream_line(ctx, line)
        kinds = ("b2", "b2_models", "b4_recall") if path == "recall" else ("b3", "b3_models", "b4_persist")
        for kind in kinds:
            if KINDS[kind] in selected:
                log(f"--- {KINDS[kind]}")
                yield await run_mongo_line(ctx, kind, events)
                await ctx.quiet(wrote=path == "persist")
        name = f"mastra_{path}"
        if name in selected:
            log(f"--- {name}")
            turn = ctx.turns.recall if path == "recall" else ctx.turns.fresh()
            yield await run_anchor(ctx, path, events=events, turn=turn)
            await ctx.quiet(wrote=path == "persist")
    if "mastra_memory" in selected:  # no database: the turns are fresh ones, on Node's own store
        log("--- mastra_memory")
        turn = ctx.turns.fresh()
        yield await run_anchor(ctx, "memory", events=events, turn=turn)
    if selected & {*IDLE_LINES, *CONTRACT_LINES}:  # one run gives all: service and forwarder(s) interleaved
        log("--- idle latency (one turn at a time, service and forwarder interleaved)")
        contract = bool(selected & set(CONTRACT_LINES))  # the forwarder with the contract's trips too
        for result in await run_idle(ctx, ctx.budget.idle_turns, contract=contract):
            yield result


def _settler(db: AsyncDatabase[Any], ctx: RunContext) -> Callable[[], Awaitable[float]]:
    async def settle() -> float:
        """Seconds waited until the last line's leftovers are done on the MongoDB-wire server.

        A stopped line's last bulk write or scan goes on inside the server after the client is gone. A write
        to the benchmark database queues behind any write still running there; then the server's CPU is
        watched until it drops below most of a core (its in-flight reads are done), for at most `_QUIET_MAX_S`
        (other clients may keep it busy).
        """
        started = time.perf_counter()
        await db["bench_settle"].insert_one({"at": datetime.now(UTC)})
        pid = ctx.servers.mongo
        while pid is not None and time.perf_counter() - started < _QUIET_MAX_S:
            before = cpu_seconds(pid)
            await asyncio.sleep(1.0)
            after = cpu_seconds(pid)
            if before is None or after is None or after - before < _QUIET_CORES:
                break
        return time.perf_counter() - started

    return settle


def _restorer(db: AsyncDatabase[Any], w: Workload) -> Callable[[], Awaitable[int]]:
    async def restore() -> int:
        """Delete every message newer than the seeded history (turns sort after it): the messages a line
        wrote. Threads keep their rows (a later `updatedAt` costs nothing)."""
        result = await db[MESSAGES].delete_many({"createdAt": {"$gte": history_time(w.history)}})
        return int(result.deleted_count)

    return restore


async def _servers_info(client: AsyncMongoClient[dict[str, Any]], ctx: RunContext) -> dict[str, Any]:
    info = await client.admin.command("buildInfo")
    server = server_name(ctx.servers.mongo, info)
    return {
        "mongo_server": server,
        "mongo_server_pid_found": ctx.servers.mongo is not None,
        "kafka_broker_pid_found": ctx.servers.kafka is not None,
        "kafka_bootstrap": ctx.settings.kafka_bootstrap_servers,
    }
