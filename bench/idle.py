"""The idle-latency line: one turn at a time on a quiet service, beside a bare forwarder on the same broker.

A user's view of the service when nothing else is going on: `message-history run` (both paths, one process,
the defaults: barrier on, busy-thread `enqueue`) on fresh topics, and B1's consume -> produce forwarder
(`bench/passthrough.py`, without linger: the floor; a linger is the service's choice, and a floor that
lingered as long would hide it) on topics of its own, both warm. The harness then alternates, one event in
flight at a time: a request -> its `EnrichedRequest` read; an enriched-size record through the forwarder; the
turn's response -> its `HistoryPersisted` read; a response-size record through the forwarder. Interleaving
them puts the same broker, machine load and moment behind both figures, so their ratio is measured side by
side. Each step's latency is from the send to the output being read by the harness (as the other lines'
latency), and each process's CPU over the step is attributed to its path.

Four results: `idle_service_recall`, `idle_forwarder_recall`, `idle_service_persist`,
`idle_forwarder_persist`.

The line starts from no turn in flight: earlier lines (the recall lines with the default `enqueue` policy)
leave every thread marked busy, which would make each request here wait `MESSAGE_HISTORY_TURN_TIMEOUT_MS`, so
the benchmark database's busy-thread markers are removed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pymongo import AsyncMongoClient

from bench import processes
from bench.context import RunContext
from bench.kafka_io import SEQ_HEADER, Record, create_topics, seq_of
from bench.procstat import cpu_seconds_fine, peak_rss_bytes
from bench.progress import Progress, log
from bench.stats import LineResult
from bench.stream_line import scrape_stages
from bench.workload import encode_json, enriched_event, request_event, response_event
from producers.connection import kafka_options
from storage.turns import TURNS

IDLE_LINES: Final = (
    "idle_service_recall",
    "idle_forwarder_recall",
    "idle_service_persist",
    "idle_forwarder_persist",
)
_WARMUP_TURNS: Final = 3  # untimed: group joins, connections, first-call paths
_STEP_TIMEOUT_S: Final = 30.0
_KIND: Final = "one at a time on a quiet service, send -> output read"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Outputs:
    """One consumer on every output topic: each output resolves the waiter of its `bench-seq` with the time
    `clock` read when its batch came (`time.perf_counter` here; `bench.steps` passes wall time)."""

    def __init__(
        self,
        ctx: RunContext,
        topics: list[str],
        *,
        client_id: str = "bench-idle",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._consumer = AIOKafkaConsumer(**kafka_options(ctx.settings, client_id=client_id), group_id=None)
        self._clock = clock
        self._tps = [TopicPartition(t, p) for t in topics for p in range(ctx.workload.partitions)]
        self._waiting: dict[int, asyncio.Future[float]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_end(*self._tps)
        for tp in self._tps:
            await self._consumer.position(tp)  # resolve the ends now, before anything is sent
        self._task = asyncio.create_task(self._read())

    def expect(self, seq: int) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting[seq] = future
        return future

    async def _read(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=100)
            now = self._clock()
            for records in batch.values():
                for rec in records:
                    future = self._waiting.pop(seq_of(rec.headers) or -1, None)
                    if future is not None and not future.done():
                        future.set_result(now)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


class _Step:
    """Sends one record, waits for its output, and books the latency and the process's CPU to a result."""

    def __init__(self, producer: AIOKafkaProducer, outputs: _Outputs) -> None:
        self._producer, self._outputs = producer, outputs
        self._seq = 10**9  # far from the throughput lines' seqs; unique within the run

    async def __call__(
        self, topic: str, record: Record, pid: int, result: LineResult | None, timeout_s: float
    ) -> None:
        self._seq += 1
        seq = self._seq
        done = self._outputs.expect(seq)
        key, value = record
        cpu_before = cpu_seconds_fine(pid)
        sent = time.perf_counter()
        await self._producer.send(topic, value=value, key=key, headers=[(SEQ_HEADER, str(seq).encode())])
        read = await asyncio.wait_for(done, timeout_s)
        cpu_after = cpu_seconds_fine(pid)
        if result is None:
            return
        result.events += 1
        result.wall_s += read - sent
        result.latencies_ms.append((read - sent) * 1000)
        if cpu_before is not None and cpu_after is not None:
            result.cpu_s = (result.cpu_s or 0.0) + cpu_after - cpu_before


async def _clear_busy_markers(ctx: RunContext) -> int:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(
        ctx.settings.mongodb_uri.get_secret_value()
    )
    try:
        return int((await client[ctx.db][TURNS].delete_many({})).deleted_count)
    finally:
        await client.close()


def _service_env(ctx: RunContext, topics: dict[str, str], port: int) -> dict[str, str]:
    return ctx.service_child_env(
        MESSAGE_HISTORY_GROUP_ID=f"bench-{ctx.workload.run_id}-idle-service",
        MESSAGE_HISTORY_HTTP_HOST="127.0.0.1",
        MESSAGE_HISTORY_HTTP_PORT=str(port),
        **{f"MESSAGE_HISTORY_{k}_TOPIC": v for k, v in topics.items()},
    )


def stage_ms_per_turn(
    before: Mapping[str, float], after: Mapping[str, float], turns: int
) -> dict[str, float]:
    """Milliseconds per timed turn in each `path/stage` of the service (its stage histograms' sums, the
    warm-up's subtracted): where a quiet turn's time goes inside the service. Pure."""
    if turns <= 0:
        return {}
    return {
        name: round((after[name] - before.get(name, 0.0)) * 1000 / turns, 2)
        for name in sorted(after)
        if "/" in name and not name.endswith(("/batches", "/mean_batch"))
    }


async def run_idle(ctx: RunContext, turns: int) -> list[LineResult]:
    """`turns` timed turns (after a short warm-up), alternating the service and the forwarder."""
    w = ctx.workload
    results = {name: LineResult(name, 0, 0.0, None, None, latency_kind=_KIND) for name in IDLE_LINES}
    # every topic of the service fresh (commands too: the broker's default one may carry others' events)
    names = ("REQUESTS", "ENRICHED", "RESPONSES", "PERSISTED", "COMMANDS", "FORGOTTEN")
    topics = {k: ctx.topic("idle", k.lower()) for k in names}
    fwd_in, fwd_out = ctx.topic("idle", "forward-in"), ctx.topic("idle", "forward-out")
    service: asyncio.subprocess.Process | None = None
    forwarder: asyncio.subprocess.Process | None = None
    outputs = _Outputs(ctx, [topics["ENRICHED"], topics["PERSISTED"], fwd_out])
    producer = AIOKafkaProducer(
        **kafka_options(ctx.settings, client_id="bench-idle"),
        acks="all",
        linger_ms=0,
        max_request_size=16 << 20,
    )
    try:
        cleared = await _clear_busy_markers(ctx)
        if cleared:
            log(f"idle latency: removed {cleared:,} busy-thread markers left by the earlier lines")
        await create_topics(ctx.settings, [*topics.values(), fwd_in, fwd_out], w.partitions)
        port = _free_port()
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        service = await processes.spawn(
            [ctx.python(), "-m", "message_history", "run"],
            env=_service_env(ctx, topics, port),
            log=ctx.log_dir / "idle_service.log",
        )
        config = {
            "in_topic": fwd_in,
            "out_topic": fwd_out,
            "group_id": f"bench-{w.run_id}-idle-forwarder",
            "linger_ms": 0,  # the floor of one record's consume -> produce: a linger would be the service's
        }
        forwarder = await processes.spawn(
            [ctx.python(), "-m", "bench.worker", "passthrough", json.dumps(config | {"batch": w.batch})],
            env=ctx.child_env(),
            log=ctx.log_dir / "idle_forwarder.log",
        )
        await outputs.start()
        await producer.start()
        warm: dict[str, Mapping[str, float]] = {}

        async def warmed() -> None:  # the stage sums once the warm-up turns are done
            warm["stages"] = await asyncio.to_thread(scrape_stages, metrics_url)

        await _alternate(
            ctx, _Step(producer, outputs), (service, forwarder), topics, fwd_in, results, turns, warmed
        )
        stages = stage_ms_per_turn(
            warm.get("stages", {}), await asyncio.to_thread(scrape_stages, metrics_url), turns
        )
        for path in ("recall", "persist"):
            own = {k: v for k, v in stages.items() if k.startswith(f"{path}/")}
            results[f"idle_service_{path}"].details["stage_ms_per_turn"] = own
        log(f"idle latency: the service's stages, ms per timed turn: {stages}")
        for name, pid in (("service", service.pid), ("forwarder", forwarder.pid)):
            rss = peak_rss_bytes(pid)
            for path in ("recall", "persist"):
                results[f"idle_{name}_{path}"].peak_rss_bytes = rss
    except Exception as exc:  # noqa: BLE001 -- keep the other lines' figures
        error = f"{type(exc).__name__}: {exc}"
        log(f"idle latency failed: {error}")
        for result in results.values():
            result.error = error
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        await outputs.stop()
        for process in (service, forwarder):
            if process is not None:
                await processes.stop(process)
        await ctx.quiet(wrote=True)
    return list(results.values())


async def _alternate(
    ctx: RunContext,
    step: _Step,
    procs: tuple[asyncio.subprocess.Process, asyncio.subprocess.Process],
    topics: dict[str, str],
    fwd_in: str,
    results: dict[str, LineResult],
    turns: int,
    warmed: Callable[[], Awaitable[None]],
) -> None:
    """The warm-up turns, then `turns` timed ones: request, forwarder, response, forwarder, one at a time;
    `warmed` is awaited between the two."""
    w, (service, forwarder) = ctx.workload, procs
    turn, progress = ctx.turns.fresh(), Progress("idle latency")
    enriched_cache: dict[int, bytes] = {}
    total = _WARMUP_TURNS + turns
    for n in range(total):
        if n and n % w.threads == 0:
            turn = ctx.turns.fresh()  # wrapping around the threads moves on to a fresh turn: ids stay new
        i = n % w.threads
        timed = n >= _WARMUP_TURNS
        if n == _WARMUP_TURNS:
            await warmed()
        key = w.thread_id(i).encode()
        if i not in enriched_cache:
            enriched_cache[i] = encode_json(enriched_event(w, i, ctx.turns.recall, w.history))
        response = encode_json(response_event(w, i, turn))
        steps = (
            (topics["REQUESTS"], encode_json(request_event(w, i, turn)), service.pid, "service_recall"),
            (fwd_in, enriched_cache[i], forwarder.pid, "forwarder_recall"),
            (topics["RESPONSES"], response, service.pid, "service_persist"),
            (fwd_in, response, forwarder.pid, "forwarder_persist"),
        )
        for topic, value, pid, name in steps:
            _check_alive(service, forwarder)
            result = results[f"idle_{name}"] if timed else None
            timeout = _STEP_TIMEOUT_S if timed else ctx.budget.startup_timeout_s
            await step(topic, (key, value), pid, result, timeout)
        progress.update(n + 1, total)
    progress.update(total, total, force=True)


def _check_alive(*procs: asyncio.subprocess.Process) -> None:
    for process in procs:
        if process.returncode is not None:
            raise RuntimeError(f"a process of the idle line exited with {process.returncode} (see its log)")
