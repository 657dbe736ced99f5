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
`idle_forwarder_persist`; and, with `contract` (issue 33's contract floor), two more from a third process
interleaved after each forwarder step: the same forwarder making, per record, the MongoDB trips the service's
contract asks of that turn (`bench.contract`, `bench.passthrough`; the turn named in a header), on topics of
its own: `idle_contract_recall`, `idle_contract_persist`.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pymongo import AsyncMongoClient

from bench import processes
from bench.context import RunContext
from bench.contract import CONTRACT_HEADER, Turn, turn_header
from bench.kafka_io import SEQ_HEADER, create_topics, seq_of
from bench.procstat import cpu_seconds_fine, peak_rss_bytes
from bench.profile import Sampler
from bench.progress import Progress, log
from bench.stats import LineResult
from bench.stream_line import scrape_stages
from bench.workload import Workload, encode_json, enriched_event, request_event, response_event
from producers.connection import kafka_options
from storage.turns import TURNS

IDLE_LINES: Final = (
    "idle_service_recall",
    "idle_forwarder_recall",
    "idle_service_persist",
    "idle_forwarder_persist",
)
CONTRACT_LINES: Final = ("idle_contract_recall", "idle_contract_persist")
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
        self,
        topic: str,
        record: tuple[bytes, bytes],
        pid: int,
        result: LineResult | None,
        timeout_s: float,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        self._seq += 1
        seq = self._seq
        done = self._outputs.expect(seq)
        key, value = record
        sent_headers = [(SEQ_HEADER, str(seq).encode()), *headers]
        cpu_before = cpu_seconds_fine(pid)
        sent = time.perf_counter()
        await self._producer.send(topic, value=value, key=key, headers=sent_headers)
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


async def run_idle(ctx: RunContext, turns: int, *, contract: bool = False) -> list[LineResult]:
    """`turns` timed turns (after a short warm-up), alternating the service and the forwarder (and, with
    `contract`, the forwarder with the contract's trips)."""
    w = ctx.workload
    names_of = (*IDLE_LINES, *CONTRACT_LINES) if contract else IDLE_LINES
    results = {name: LineResult(name, 0, 0.0, None, None, latency_kind=_KIND) for name in names_of}
    # every topic of the service fresh (commands too: the broker's default one may carry others' events)
    names = ("REQUESTS", "ENRICHED", "RESPONSES", "PERSISTED", "COMMANDS", "FORGOTTEN")
    topics = {k: ctx.topic("idle", k.lower()) for k in names}
    # the forwarders' topics: `in`, `out`; with the contract's, `contract-recall`, `-persist`, `-out`
    fwd = {k: ctx.topic("idle", f"forward-{k}") for k in ("in", "out")}
    if contract:
        fwd |= {f"contract-{k}": ctx.topic("idle", f"contract-{k}") for k in ("recall", "persist", "out")}
    service: asyncio.subprocess.Process | None = None
    forwarders: tuple[asyncio.subprocess.Process, asyncio.subprocess.Process | None] | None = None
    outs = [topics["ENRICHED"], topics["PERSISTED"], *(t for k, t in fwd.items() if k.endswith("out"))]
    outputs = _Outputs(ctx, outs)
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
        await create_topics(ctx.settings, [*topics.values(), *fwd.values()], w.partitions)
        port = _free_port()
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        service = await processes.spawn(
            [ctx.python(), "-m", "message_history", "run"],
            env=_service_env(ctx, topics, port),
            log=ctx.log_dir / "idle_service.log",
        )
        forwarders = await _spawn_forwarders(ctx, fwd)
        await outputs.start()
        await producer.start()
        warm: dict[str, Mapping[str, float]] = {}
        # `--profile`: py-spy on the service over the timed turns (both paths: one process; the forwarders'
        # steps between them leave it idle, which py-spy does not sample)
        sampler = Sampler(service.pid, ctx.log_dir / "idle_service.py-spy.txt") if ctx.profile else None

        async def warmed() -> None:  # the stage sums once the warm-up turns are done
            warm["stages"] = await asyncio.to_thread(scrape_stages, metrics_url)
            if sampler is not None:
                await sampler.start()

        await _alternate(
            ctx, _Step(producer, outputs), (service, *forwarders), topics, fwd, results, turns, warmed
        )
        if sampler is not None:
            results["idle_service_recall"].details["profile"] = await sampler.stop()
        stages = stage_ms_per_turn(
            warm.get("stages", {}), await asyncio.to_thread(scrape_stages, metrics_url), turns
        )
        _note(results, stages, (service, *forwarders))
    except Exception as exc:  # noqa: BLE001 -- keep the other lines' figures
        error = f"{type(exc).__name__}: {exc}"
        log(f"idle latency failed: {error}")
        for result in results.values():
            result.error = error
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        await outputs.stop()
        for process in (service, *(forwarders or ())):
            if process is not None:
                await processes.stop(process)
        await ctx.quiet(wrote=True)
    return list(results.values())


def _note(
    results: Mapping[str, LineResult],
    stages: Mapping[str, float],
    procs: Sequence[asyncio.subprocess.Process | None],
) -> None:
    """The service's stage times per path, and each process's peak RSS, in the results."""
    for path in ("recall", "persist"):
        own = {k: v for k, v in stages.items() if k.startswith(f"{path}/")}
        results[f"idle_service_{path}"].details["stage_ms_per_turn"] = own
    log(f"idle latency: the service's stages, ms per timed turn: {stages}")
    for name, process in zip(("service", "forwarder", "contract"), procs, strict=True):
        if process is None:
            continue
        rss = peak_rss_bytes(process.pid)
        for path in ("recall", "persist"):
            results[f"idle_{name}_{path}"].peak_rss_bytes = rss


async def _spawn_forwarders(
    ctx: RunContext, fwd: Mapping[str, str]
) -> tuple[asyncio.subprocess.Process, asyncio.subprocess.Process | None]:
    """The bare forwarder, and the one with the contract's trips when `fwd` names its topics."""
    w = ctx.workload
    config: dict[str, object] = {
        "in_topic": fwd["in"],
        "out_topic": fwd["out"],
        "group_id": f"bench-{w.run_id}-idle-forwarder",
        "linger_ms": 0,  # the floor of one record's consume -> produce: a linger would be the service's
        "batch": w.batch,
    }
    forwarder = await processes.spawn(
        [ctx.python(), "-m", "bench.worker", "passthrough", json.dumps(config)],
        env=ctx.child_env(),
        log=ctx.log_dir / "idle_forwarder.log",
    )
    if "contract-out" not in fwd:
        return forwarder, None
    trips = await processes.spawn(
        [ctx.python(), "-m", "bench.worker", "passthrough", json.dumps(_contract_config(ctx, fwd))],
        env=ctx.child_env(),
        log=ctx.log_dir / "idle_contract.log",
    )
    return forwarder, trips


def _contract_config(ctx: RunContext, fwd: Mapping[str, str]) -> dict[str, object]:
    """The contract forwarder's settings: its two in-topics, no linger, its trips' (`bench.passthrough`)."""
    w = ctx.workload
    return {
        "in_topics": [fwd["contract-recall"], fwd["contract-persist"]],
        "out_topic": fwd["contract-out"],
        "group_id": f"bench-{w.run_id}-idle-contract",
        "linger_ms": 0,
        "batch": w.batch,
        "contract": contract_trips(ctx, fwd["contract-recall"]),
    }


def contract_trips(ctx: RunContext, recall_topic: str) -> dict[str, object]:
    """The contract forwarder's `contract` settings (`bench.passthrough`): records on `recall_topic` are
    recalls, any other a persist; the service's page size, the workload's message size and threads. Shared
    by the idle line's contract forwarder and the contract stream lines (`bench.lines`)."""
    w = ctx.workload
    return {
        "db": ctx.db,
        "recall_topic": recall_topic,
        # the service's page: the request names no limit, its `lastMessages` is the history (`child_env`)
        "limit": w.history,
        "message_bytes": w.message_bytes,
        "workload": w.as_dict(),  # its threads: their stored `_id`s are read at start
    }


def contract_header(w: Workload, i: int, turn: int) -> tuple[str, bytes]:
    """The header naming thread `i`'s turn `turn` for the contract forwarder (its request's ids). Pure."""
    event = request_event(w, i, turn)
    created = datetime.fromisoformat(event["createdAt"]).astimezone(UTC)
    named = Turn(event["threadId"], event["resourceId"], event["requestId"], created)
    return CONTRACT_HEADER, turn_header(named)


async def _alternate(
    ctx: RunContext,
    step: _Step,
    procs: tuple[asyncio.subprocess.Process, asyncio.subprocess.Process, asyncio.subprocess.Process | None],
    topics: dict[str, str],
    fwd: Mapping[str, str],
    results: dict[str, LineResult],
    turns: int,
    warmed: Callable[[], Awaitable[None]],
) -> None:
    """The warm-up turns, then `turns` timed ones: request, forwarder, response, forwarder, one at a time
    (with the contract forwarder, each forwarder step is followed by its); `warmed` is awaited between the
    two."""
    w, (service, forwarder, trips) = ctx.workload, procs
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
        steps = [
            (topics["REQUESTS"], encode_json(request_event(w, i, turn)), service.pid, "service_recall"),
            (fwd["in"], enriched_cache[i], forwarder.pid, "forwarder_recall"),
            (topics["RESPONSES"], response, service.pid, "service_persist"),
            (fwd["in"], response, forwarder.pid, "forwarder_persist"),
        ]
        if trips is not None:  # the same records, through the forwarder making the contract's trips
            steps.insert(2, (fwd["contract-recall"], enriched_cache[i], trips.pid, "contract_recall"))
            steps.append((fwd["contract-persist"], response, trips.pid, "contract_persist"))
        named = [contract_header(w, i, turn)]
        alive = [p for p in (service, forwarder, trips) if p is not None]
        for topic, value, pid, name in steps:
            _check_alive(*alive)
            result = results[f"idle_{name}"] if timed else None
            timeout = _STEP_TIMEOUT_S if timed else ctx.budget.startup_timeout_s
            headers = named if name.startswith("contract") else ()
            await step(topic, (key, value), pid, result, timeout, headers)
        progress.update(n + 1, total)
    progress.update(total, total, force=True)


def _check_alive(*procs: asyncio.subprocess.Process) -> None:
    for process in procs:
        if process.returncode is not None:
            raise RuntimeError(f"a process of the idle line exited with {process.returncode} (see its log)")
