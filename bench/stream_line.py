"""A line that moves events through Kafka (the service, B1, naive), measured from outside its process.

1. The line's process starts on fresh topics and is warmed up: one event is sent and its output awaited
   (the group is joined, connections are open, code paths are warm).
2. Throughput: the harness writes the whole input in one Kafka transaction. The line reads committed records
   only, so it sees nothing until the commit and then the whole backlog at once: the window starts at the
   commit and ends when the last output is on the output topic (or at the time budget). Outputs are counted
   from the output topic's end offsets every 50 ms; the process's CPU seconds (and the servers') are read at
   the same instants.
3. Latency: once the backlog is worked off, the same process is sent events at `load_fraction` of the
   throughput just measured (an open loop: the sender does not wait for outputs); each event is timed from
   its send to its output being read. When the budget cut the backlog short, a fresh process on fresh
   topics does this phase instead.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench import processes
from bench.context import MIN_LATENCY_RATE, RunContext
from bench.kafka_io import LatencyProbe, OutputCounter, Record, create_topics, preload, wait_for_group
from bench.procstat import cpu_seconds_fine, minor_faults, peak_rss_bytes
from bench.profile import Sampler
from bench.progress import Progress, log
from bench.stats import LineResult
from bench.traces import read_trace, tail

_POLL_S = 0.05


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    metrics_url: str | None = None
    trace: Path | None = None  # run under `bench.stepwatch`, writing here


@dataclass(frozen=True)
class StreamLine:
    """`launch(in_topic, out_topic, tag)` builds the process; records are by index (`record(i)`)."""

    name: str
    events: int
    record: Callable[[int], Record]
    latency_record: Callable[[int], Record]
    launch: Callable[[str, str, str], Launch]
    writes: bool = False  # it saves messages (the persist path, not B1)
    # run before the process starts, given its launch (e.g. a caught-up responses topic for the barrier)
    prepare: Callable[[RunContext, Launch], Awaitable[None]] | None = None
    # its outputs are transactional: each commit adds markers to the end offsets, so its outputs are counted
    # from the service's own `records_produced` (incremented when a transaction commits)
    transactional: bool = False
    # service instances on the line's one consumer group (`--instances`): their CPU is summed, RSS is the
    # largest one's; the backlog is released once the group is stable with all of them
    instances: int = 1


@dataclass
class _Sample:
    at: float
    outputs: int
    cpu: float
    servers: dict[str, float]


class _Running:
    """A line's process on its topics, warmed up."""

    def __init__(self, ctx: RunContext, line: StreamLine, tag: str) -> None:
        self.ctx, self.line, self.tag = ctx, line, tag
        self.in_topic = ctx.topic(line.name, tag, "in")
        self.out_topic = ctx.topic(line.name, tag, "out")
        self.launches = [line.launch(self.in_topic, self.out_topic, tag) for _ in range(line.instances)]
        self.launch = self.launches[0]
        self.processes: list[asyncio.subprocess.Process] = []
        self.next_latency = 0  # index of the next latency record
        self.output_bytes: float | None = None  # mean size of the outputs timed last
        self.last_probe: LatencyProbe | None = None

    async def start(self) -> asyncio.subprocess.Process:
        ctx = self.ctx
        await create_topics(ctx.settings, [self.in_topic, self.out_topic], ctx.workload.partitions)
        if self.line.prepare is not None:
            await self.line.prepare(ctx, self.launch)
        for k, launch in enumerate(self.launches):
            suffix = f"-{k + 1}" if len(self.launches) > 1 else ""
            self.processes.append(
                await processes.spawn(
                    launch.argv, env=launch.env, log=ctx.log_dir / f"{self.line.name}{suffix}.log"
                )
            )
        warm_up = 1
        if len(self.launches) > 1:  # every member in, no rebalance left to happen inside the window
            group = self.launch.env["MESSAGE_HISTORY_GROUP_ID"]
            await wait_for_group(ctx.settings, group, len(self.launches), ctx.budget.startup_timeout_s)
            warm_up = 4 * ctx.workload.partitions  # spread over the partitions: every member warmed up
        timed = await self.timed(count=warm_up, rate=50.0, timeout_s=ctx.budget.startup_timeout_s)
        if not timed:
            raise RuntimeError(f"{self.line.name}: no output for the warm-up event (see its log)")
        return self.processes[0]

    def cpu(self) -> float:
        """CPU seconds of every instance of the line (a gone one counts 0)."""
        return sum(cpu_seconds_fine(p.pid) or 0.0 for p in self.processes)

    def faults(self) -> int | None:
        counts = [minor_faults(p.pid) for p in self.processes]
        return None if None in counts else sum(c for c in counts if c is not None)

    def peak_rss(self) -> int | None:
        sizes = [s for s in (peak_rss_bytes(p.pid) for p in self.processes) if s is not None]
        return max(sizes) if sizes else None

    def exited(self) -> int | None:
        """The exit code of an instance that has stopped, None while all run."""
        return next((p.returncode for p in self.processes if p.returncode is not None), None)

    async def timed(self, *, count: int, rate: float, timeout_s: float) -> tuple[float, ...]:
        """Send `count` latency records at `rate`; the latencies of those whose output came in time."""
        probe = LatencyProbe(self.ctx.settings, self.in_topic, self.out_topic, self.ctx.workload.partitions)
        first = self.next_latency
        self.next_latency += count
        latencies = await probe.run(
            lambda j: self.line.latency_record(first + j),
            first_seq=self.line.events + first,  # throughput records use 0 .. events-1
            count=count,
            rate=rate,
            timeout_s=timeout_s,
        )
        self.output_bytes = probe.output_bytes / probe.output_count if probe.output_count else None
        self.last_probe = probe
        return tuple(latencies)

    async def stop(self) -> None:
        if self.processes:
            codes = await asyncio.gather(*(processes.stop(p) for p in self.processes))
            for code in codes:
                if code not in (0, None, -15):
                    log(f"{self.line.name}: process exited with {code}")
            await self.ctx.quiet(wrote=self.line.writes)


async def run_stream_line(ctx: RunContext, line: StreamLine) -> LineResult:
    """Throughput, then latency; a failure is recorded in the result, not raised."""
    result = LineResult(line.name, 0, 0.0, None, None, latency_kind="per event, send -> output read")
    running = _Running(ctx, line, "main")
    try:
        process = await running.start()
        await _throughput(ctx, line, running, process, result)
        if result.events:
            if result.details.get("completed"):
                await _latency(ctx, running, result)
            else:
                await running.stop()
                running = _Running(ctx, line, "latency")
                await running.start()
                await _latency(ctx, running, result)
    except Exception as exc:  # noqa: BLE001 -- a broken line must not lose the others' figures
        result.error = f"{type(exc).__name__}: {exc}"
        log(f"{line.name} failed: {result.error}")
    finally:
        await running.stop()
    return result


async def _throughput(
    ctx: RunContext,
    line: StreamLine,
    running: _Running,
    process: asyncio.subprocess.Process,
    result: LineResult,
) -> None:
    sampler = None
    if ctx.profile and running.launch.metrics_url:  # the service's lines only
        sampler = Sampler(process.pid, ctx.log_dir / f"{line.name}.py-spy.txt")
        await sampler.start()  # idle until the backlog is released: py-spy skips idle threads
    counting: OutputCounter | MetricsCounter = (
        MetricsCounter(running.launch.metrics_url, running.out_topic)
        if line.transactional and running.launch.metrics_url
        else OutputCounter(ctx.settings, running.out_topic, ctx.workload.partitions)
    )
    async with counting as counter:
        base = await counter.count()  # the warm-up's output(s)
        written, released = await preload(
            ctx.settings, running.in_topic, line.events, line.record, Progress(f"{line.name} preload")
        )
        first = _Sample(released, base, running.cpu(), ctx.servers.cpu())
        faults = running.faults()
        last = await _watch(ctx, line, running, counter, first)
        faults_after = running.faults()
    if sampler is not None:
        result.details["profile"] = await sampler.stop()
    result.events = last.outputs - first.outputs
    result.wall_s = last.at - first.at
    result.cpu_s = last.cpu - first.cpu
    result.server_cpu_s = {k: last.servers[k] - first.servers[k] for k in first.servers.keys() & last.servers}
    result.peak_rss_bytes = running.peak_rss()
    if line.instances > 1:
        result.details["instances"] = line.instances
    result.details.update(
        input_bytes_per_event=round(written / line.events), completed=result.events >= line.events
    )
    if faults is not None and faults_after is not None and result.events:
        result.details["minor_faults_per_event"] = round((faults_after - faults) / result.events, 1)
    if running.launch.metrics_url:
        result.details["stage_seconds"] = scrape_stages(running.launch.metrics_url)


async def _watch(
    ctx: RunContext,
    line: StreamLine,
    running: _Running,
    counter: OutputCounter | MetricsCounter,
    first: _Sample,
) -> _Sample:
    progress = Progress(f"{line.name} throughput")
    while True:
        code = running.exited()
        if code is not None:
            raise RuntimeError(f"{line.name} exited with {code} (see its log)")
        outputs = await counter.count()
        sample = _Sample(time.perf_counter(), outputs, running.cpu(), ctx.servers.cpu())
        done = outputs - first.outputs
        if done >= line.events or sample.at - first.at >= ctx.budget.line_seconds:
            progress.update(done, line.events, force=True)
            return sample
        progress.update(done, line.events)
        await asyncio.sleep(_POLL_S)


async def _latency(ctx: RunContext, running: _Running, result: LineResult) -> None:
    budget = ctx.budget
    if budget.latency_rate is not None:  # one rate for every line, so their tails compare at equal load
        rate = budget.latency_rate
    else:
        rate = max(MIN_LATENCY_RATE, budget.load_fraction * (result.events_per_s or 1.0))
    count = int(max(3, min(budget.latency_events, rate * budget.latency_seconds)))
    Progress(f"{running.line.name} latency").say(f"{count} events at {rate:,.1f}/s")
    latencies = await running.timed(count=count, rate=rate, timeout_s=max(30.0, 3 * count / rate))
    result.latencies_ms = list(latencies)
    result.details.update(
        latency_rate_per_s=round(rate, 2),
        latency_sent=count,
        latency_received=len(latencies),
        output_bytes_per_event=round(running.output_bytes) if running.output_bytes else None,
    )
    probe, trace = running.last_probe, running.launch.trace
    if probe is not None and trace is not None and len(running.launches) == 1:
        result.details["tail"] = tail(probe.sent_wall, probe.read_wall, read_trace(trace))
        log(f"{running.line.name}: latency split, {json.dumps(result.details['tail'])}")


class MetricsCounter:
    """Outputs committed on `topic`, from the service's `message_history_records_produced_total`."""

    def __init__(self, url: str, topic: str) -> None:
        self._url = url
        self._prefix = f'message_history_records_produced_total{{topic="{topic}"}} '

    async def __aenter__(self) -> MetricsCounter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def count(self) -> int:
        body = await asyncio.to_thread(_fetch, self._url)
        for row in body.splitlines():
            if row.startswith(self._prefix):
                return int(float(row[len(self._prefix) :]))
        return 0


def _fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 -- our own local endpoint
            return str(response.read().decode())
    except OSError:
        return ""


def scrape_stages(url: str) -> Mapping[str, float]:
    """From the service's /metrics: seconds per `path/stage` (`message_history_stage_seconds_sum`), and
    `path/batches` / `path/mean_batch` (`message_history_batch_size`)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 -- our own local endpoint
            body = response.read().decode()
    except OSError:
        return {}
    return parse_metrics(body)


def parse_metrics(body: str) -> dict[str, float]:
    """The stage and batch figures out of a Prometheus text exposition. Pure."""
    out: dict[str, float] = {}
    sizes: dict[str, dict[str, float]] = {}
    for row in body.splitlines():
        name, brace, rest = row.partition("{")
        if not brace or "} " not in rest:
            continue
        labels_text, value = rest.rsplit("} ", 1)
        labels = {k: v.strip('"') for k, v in (item.split("=", 1) for item in labels_text.split(","))}
        if name == "message_history_stage_seconds_sum":
            out[f"{labels['path']}/{labels['stage']}"] = round(float(value), 3)
        elif name in ("message_history_batch_size_sum", "message_history_batch_size_count"):
            sizes.setdefault(labels["path"], {})[name.rsplit("_", 1)[1]] = float(value)
    for path, figures in sizes.items():
        if figures.get("count"):
            out[f"{path}/batches"] = figures["count"]
            out[f"{path}/mean_batch"] = round(figures.get("sum", 0.0) / figures["count"], 1)
    return out
