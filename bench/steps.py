"""`python -m bench steps`: where an idle turn's milliseconds go, step by step, recall and persist.

The idle line's setting (`bench.idle`: `message-history run`, both paths, the defaults, one event in flight at
a time, interleaved with B1's bare forwarder), with both processes run under `bench.stepwatch`, which records
inside each process when a record came out of a fetch, each MongoDB command (start, duration), when the output
was handed to the producer and when the broker acknowledged it, and the commits (`--spans`: the service's
OpenTelemetry batch and record spans too, at tracing's own cost). The harness notes when it sent each record
and when it read its output. Per timed step, on one clock:

    kafka in     harness send -> the record out of the process's fetch
    before db    fetch -> the first MongoDB command (decode, barrier, planning)
    db wall      the MongoDB commands before the output, as wall time (overlapping ones counted once);
                 `db trips` is how many of them ran one after another (a group of overlapping ones is one)
    other        the first MongoDB command -> output handed to the producer, minus db wall (our Python
                 between and after the commands); kafka in + before db + db wall + other + kafka out = total
    ack          output handed to the producer -> the broker's acknowledgement
    kafka out    output handed to the producer -> the harness read it
    total        harness send -> output read (the idle line's latency)

and the commands themselves: the commonest sequence before the output with each command's median, and those
after it (off the latency path: busy marks, commits). Means over the timed turns (medians beside them).
The harness's send and read times go to `steps-timeline.json` beside the traces, so a run can be analysed
again (`bench.traces.analyse`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaProducer

from bench import processes
from bench.context import RunContext
from bench.idle import _clear_busy_markers, _free_port, _Outputs, _service_env
from bench.kafka_io import SEQ_HEADER, create_topics
from bench.progress import Progress
from bench.stream_line import scrape_stages
from bench.traces import analyse, read_trace
from bench.workload import encode_json, enriched_event, request_event, response_event
from producers.connection import kafka_options

_WARMUP_TURNS: Final = 3
_STEP_TIMEOUT_S: Final = 30.0


async def run_steps(ctx: RunContext, turns: int, *, spans: bool = False) -> dict[str, Any]:
    """`turns` timed idle turns under `bench.stepwatch`; the per-step summary (also in the log dir)."""
    w = ctx.workload
    names = ("REQUESTS", "ENRICHED", "RESPONSES", "PERSISTED", "COMMANDS", "FORGOTTEN")
    topics = {k: ctx.topic("steps", k.lower()) for k in names}
    fwd_in, fwd_out = ctx.topic("steps", "forward-in"), ctx.topic("steps", "forward-out")
    topics["FWD_IN"] = fwd_in
    traces = {
        "service": ctx.log_dir / "steps-service.jsonl",
        "forwarder": ctx.log_dir / "steps-forwarder.jsonl",
    }
    ctx.log_dir.mkdir(parents=True, exist_ok=True)
    watch = [ctx.python(), "-m", "bench.stepwatch"]
    started: list[asyncio.subprocess.Process] = []
    outputs = _Outputs(
        ctx,
        [topics["ENRICHED"], topics["PERSISTED"], fwd_out],
        client_id="bench-steps",
        clock=time.time,  # wall time: compared with the services' trace timestamps
    )
    producer = AIOKafkaProducer(
        **kafka_options(ctx.settings, client_id="bench-steps"),
        acks="all",
        linger_ms=0,
        max_request_size=16 << 20,
    )
    try:
        await _clear_busy_markers(ctx)
        await create_topics(ctx.settings, [*topics.values(), fwd_out], w.partitions)
        port = _free_port()
        service_topics = {k: v for k, v in topics.items() if k != "FWD_IN"}
        started.append(
            await processes.spawn(
                [*watch, str(traces["service"]), *(["--spans"] if spans else []), "message_history", "run"],
                env=_service_env(ctx, service_topics, port),
                log=ctx.log_dir / "steps_service.log",
            )
        )
        config: dict[str, object] = {
            "in_topic": fwd_in,
            "out_topic": fwd_out,
            "linger_ms": 0,
            "batch": w.batch,
        }
        config["group_id"] = f"bench-{w.run_id}-steps-fwd"
        started.append(
            await processes.spawn(
                [*watch, str(traces["forwarder"]), "bench.worker", "passthrough", json.dumps(config)],
                env=ctx.child_env(),
                log=ctx.log_dir / "steps_forwarder.log",
            )
        )
        await outputs.start()
        await producer.start()
        timeline, stages = await _drive(ctx, turns, topics, producer, outputs, started, port)
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        await outputs.stop()
        for process in started:
            await processes.stop(process)
        await ctx.quiet(wrote=True)
    (ctx.log_dir / "steps-timeline.json").write_text(json.dumps(timeline) + "\n")
    summary = analyse(timeline, {who: read_trace(path) for who, path in traces.items()})
    summary.update(
        turns=turns, spans=spans, stage_ms_per_turn=stages, traces={k: str(v) for k, v in traces.items()}
    )
    (ctx.log_dir / "steps.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


async def _drive(
    ctx: RunContext,
    turns: int,
    topics: Mapping[str, str],
    producer: AIOKafkaProducer,
    outputs: _Outputs,
    started: Sequence[asyncio.subprocess.Process],
    port: int,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The warm-up turns, then `turns` timed ones (request, forwarder, response, forwarder, one at a time):
    each timed step's send and read times, and the service's stage sums per timed turn."""
    w = ctx.workload
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    timeline: list[dict[str, Any]] = []
    seq = 2 * 10**9
    turn, progress = ctx.turns.fresh(), Progress("steps")
    warm: Mapping[str, float] = {}
    for n in range(_WARMUP_TURNS + turns):
        if n and n % w.threads == 0:
            turn = ctx.turns.fresh()
        if n == _WARMUP_TURNS:
            warm = await asyncio.to_thread(scrape_stages, metrics_url)
        i = n % w.threads
        key = w.thread_id(i).encode()
        response = encode_json(response_event(w, i, turn))
        plan = (
            ("service_recall", topics["REQUESTS"], encode_json(request_event(w, i, turn))),
            (
                "forwarder_recall",
                topics["FWD_IN"],
                encode_json(enriched_event(w, i, ctx.turns.recall, w.history)),
            ),
            ("service_persist", topics["RESPONSES"], response),
            ("forwarder_persist", topics["FWD_IN"], response),
        )
        for name, topic, value in plan:
            if any(p.returncode is not None for p in started):
                raise RuntimeError("a process of the steps run exited (see its log)")
            seq += 1
            done = outputs.expect(seq)
            sent = time.time()
            await producer.send(topic, value=value, key=key, headers=[(SEQ_HEADER, str(seq).encode())])
            timeout = _STEP_TIMEOUT_S if n >= _WARMUP_TURNS else ctx.budget.startup_timeout_s
            read = await asyncio.wait_for(done, timeout)
            if n >= _WARMUP_TURNS:
                timeline.append({"name": name, "seq": seq, "sent": sent, "read": read})
        progress.update(n + 1, _WARMUP_TURNS + turns)
    await asyncio.sleep(1.0)  # the last step's after-output work (commit, busy marks) into the trace
    after = await asyncio.to_thread(scrape_stages, metrics_url)
    stages = {
        k: round((after[k] - warm.get(k, 0.0)) * 1000 / max(1, turns), 2)
        for k in sorted(after)
        if "/" in k and not k.endswith(("/batches", "/mean_batch"))
    }
    return timeline, stages
