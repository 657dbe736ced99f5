"""`--soak N`: memory flatness. The service runs one path for N events; its RSS is sampled every second.

The harness keeps a bounded backlog in front of the service (it produces more only as outputs appear), so
the run measures the service's memory, not a topic's. Reported: RSS once 10% of the events are done, RSS at
the end, their ratio (the issue's target: within 10% for 1,000,000 events), the peak, and a downsampled
series. The topics roll small segments with a size-bounded retention, so a long soak does not fill the disk.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench import processes
from bench.context import RunContext
from bench.kafka_io import OutputCounter, record_parts
from bench.lines import requests, responses, service_launch
from bench.procstat import cpu_seconds, peak_rss_bytes, rss_bytes
from bench.progress import Progress
from producers.connection import kafka_options

_TOPIC_CONFIG = {"segment.bytes": str(32 * 2**20), "retention.bytes": str(128 * 2**20)}
_MAX_SERIES = 200


async def _create(ctx: RunContext, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(ctx.settings, client_id="bench-admin"))
    await admin.start()
    try:
        topics = [NewTopic(n, ctx.workload.partitions, 1, topic_configs=_TOPIC_CONFIG) for n in names]
        await admin.create_topics(topics, timeout_ms=30_000)
    finally:
        await admin.close()
    await asyncio.sleep(1.0)  # leaders settle


async def run_soak(ctx: RunContext, path: str, events: int) -> dict[str, Any]:
    w = ctx.workload
    in_topic, out_topic = ctx.topic("soak", "in"), ctx.topic("soak", "out")
    await _create(ctx, [in_topic, out_topic])
    record = requests(w, ctx.turns.recall) if path == "recall" else responses(w, ctx.turns.fresh())
    # recall alone: a thread stays busy until its response is persisted, which a one-path soak never sends, so
    # with the turn guards on every request after a thread's first would wait; persist keeps the defaults
    guards = "none" if path == "recall" else "all"
    launch = service_launch(ctx, path, f"soak_{path}", guards=guards)(in_topic, out_topic, "soak")
    process = await processes.spawn(launch.argv, env=launch.env, log=ctx.log_dir / f"soak_{path}.log")
    producer = AIOKafkaProducer(
        **kafka_options(ctx.settings, client_id="bench-soak"), acks="all", linger_ms=20, max_batch_size=2**20
    )
    await producer.start()
    backlog = max(10 * w.batch, 2000)
    series: list[tuple[int, float, int]] = []  # outputs, seconds since start, rss bytes
    produced = 0
    progress = Progress(f"soak {path}", every_s=30)
    started = time.perf_counter()
    cpu0 = cpu_seconds(process.pid) or 0.0
    next_sample = started
    try:
        async with OutputCounter(ctx.settings, out_topic, w.partitions) as counter:
            outputs = 0
            while outputs < events:
                if process.returncode is not None:
                    raise RuntimeError(f"the service exited with {process.returncode} during the soak")
                target = min(events, outputs + backlog)
                acks = []
                while produced < target:
                    key, value, headers = record_parts(record(produced), produced)
                    acks.append(await producer.send(in_topic, value=value, key=key, headers=headers))
                    produced += 1
                if acks:
                    await asyncio.gather(*acks)
                outputs = await counter.count()
                now = time.perf_counter()
                if now >= next_sample:
                    series.append((outputs, now - started, rss_bytes(process.pid) or 0))
                    next_sample = now + 1.0
                    progress.update(outputs, events)
                await asyncio.sleep(0.05)
            series.append((outputs, time.perf_counter() - started, rss_bytes(process.pid) or 0))
        wall = time.perf_counter() - started
        cpu = (cpu_seconds(process.pid) or 0.0) - cpu0
        peak = peak_rss_bytes(process.pid)
    finally:
        await producer.stop()
        await processes.stop(process)
    return summarize(path, events, series, wall=wall, cpu=cpu, peak=peak) | {"guards": guards}


def summarize(
    path: str, events: int, series: list[tuple[int, float, int]], *, wall: float, cpu: float, peak: int | None
) -> dict[str, Any]:
    """The soak's figures from its (outputs, seconds, rss) samples. Pure."""
    at_10 = next((rss for done, _, rss in series if done >= events / 10), None)
    end = series[-1][2] if series else None
    step = max(1, len(series) // _MAX_SERIES)
    return {
        "path": path,
        "events": series[-1][0] if series else 0,
        "wall_s": round(wall, 1),
        "events_per_s": round(series[-1][0] / wall, 1) if series and wall else None,
        "cpu_s_per_1k_events": round(1000 * cpu / series[-1][0], 4) if series and series[-1][0] else None,
        "rss_mb_after_10pct": round(at_10 / 2**20, 1) if at_10 else None,
        "rss_mb_at_end": round(end / 2**20, 1) if end else None,
        "rss_end_over_10pct": round(end / at_10, 4) if end and at_10 else None,
        "peak_rss_mb": round(peak / 2**20, 1) if peak else None,
        "series": [
            {"events": done, "s": round(t, 1), "rss_mb": round(rss / 2**20, 1)}
            for done, t, rss in series[::step]
        ],
    }
