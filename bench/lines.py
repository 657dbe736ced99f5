"""Every line of a run, built on the shared workload: what goes in, which process does the work.

Recall lines all read turn `turns.recall` of threads `0 .. events-1` (they write nothing). Each persist
line writes a turn of its own (`turns.fresh()`), and so does each latency phase, so that every write is a new
message, as in production; wrapping around the threads moves on to a later turn.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Sequence

from bench import processes
from bench.context import RunContext
from bench.idle import contract_header, contract_trips
from bench.kafka_io import Record, caught_up_topic
from bench.mongo_lines import KINDS
from bench.progress import log
from bench.stats import LineResult
from bench.stream_line import Launch, StreamLine
from bench.workload import Workload, encode_json, enriched_event, request_event, response_event


def _key(w: Workload, i: int) -> bytes:
    return w.thread_id(i).encode()


def requests(w: Workload, turn: int) -> Callable[[int], Record]:
    def record(j: int) -> Record:
        i = j % w.threads
        return _key(w, i), encode_json(request_event(w, i, turn + j // w.threads))

    return record


def responses(w: Workload, turn: int) -> Callable[[int], Record]:
    def record(j: int) -> Record:
        i = j % w.threads
        return _key(w, i), encode_json(response_event(w, i, turn + j // w.threads))

    return record


def enriched(w: Workload, turn: int) -> Callable[[int], Record]:
    cache: dict[int, bytes] = {}

    def record(j: int) -> Record:
        i = j % w.threads
        if i not in cache:
            cache[i] = encode_json(enriched_event(w, i, turn, w.history))
        return _key(w, i), cache.pop(i)

    return record


def contract_named(w: Workload, records: Callable[[int], Record], turn: int) -> Callable[[int], Record]:
    """`records` (`requests`, `responses`, `enriched` of `turn`), each carrying the `bench-contract` header
    of its thread's turn as `requests` / `responses` number them (`turn`, a later one each wrap around the
    threads): what the contract forwarder's trips are built from."""

    def record(j: int) -> Record:
        key, value = records(j)[:2]
        i = j % w.threads
        return key, value, (contract_header(w, i, turn + j // w.threads),)

    return record


def contract_launch(ctx: RunContext, path: str, name: str) -> Callable[[str, str, str], Launch]:
    """B1's forwarder (`bench.passthrough`, the service's linger) making the contract's MongoDB trips for
    `path` per `getmany` batch before its sends: its in-topic is the recall topic or none is."""

    def launch(in_topic: str, out_topic: str, tag: str) -> Launch:
        trips = contract_trips(ctx, in_topic if path == "recall" else "")
        return worker_launch(ctx, "passthrough", name, contract=trips)(in_topic, out_topic, tag)

    return launch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_GUARDS = {
    "all": {},  # the defaults: barrier on, busy-thread enqueue
    "barrier": {"MESSAGE_HISTORY_BUSY_THREAD": "allow"},
    "none": {"MESSAGE_HISTORY_BARRIER": "off", "MESSAGE_HISTORY_BUSY_THREAD": "allow"},
}


def service_launch(
    ctx: RunContext, path: str, name: str, *, guards: str = "all", guarantee: str = "at-least-once"
) -> Callable[[str, str, str], Launch]:
    """`message-history run --only PATH`, configured through its environment as an operator would.

    `guards`: which turn guards run (`all`, the defaults; `barrier` only; `none`); `guarantee`:
    `MESSAGE_HISTORY_PROCESSING_GUARANTEE`. The recall line's
    responses topic is `<in>-responses`; `caught_up_responses` makes it exist, caught up.
    """

    def launch(in_topic: str, out_topic: str, tag: str) -> Launch:
        port = _free_port()
        unused = f"{in_topic}-unused"
        topics = (
            {
                "REQUESTS": in_topic,
                "ENRICHED": out_topic,
                "RESPONSES": f"{in_topic}-responses",
                "PERSISTED": unused + "-out",
            }
            if path == "recall"
            else {
                "REQUESTS": unused,
                "ENRICHED": unused + "-out",
                "RESPONSES": in_topic,
                "PERSISTED": out_topic,
            }
        )
        env = ctx.service_child_env(
            MESSAGE_HISTORY_GROUP_ID=f"bench-{ctx.workload.run_id}-{name}-{tag}",
            MESSAGE_HISTORY_HTTP_HOST="127.0.0.1",
            MESSAGE_HISTORY_HTTP_PORT=str(port),
            **{f"MESSAGE_HISTORY_{k}_TOPIC": v for k, v in topics.items()},
            **_GUARDS[guards],
            MESSAGE_HISTORY_PROCESSING_GUARANTEE=guarantee,
        )
        argv = [ctx.python(), "-m", "message_history", "run", "--only", path]
        trace = None
        if ctx.watch:
            trace = ctx.log_dir / f"{name}-{tag}-{port}.stepwatch.jsonl"
            argv[1:2] = ["-m", "bench.stepwatch", str(trace)]
        return Launch(argv, env, metrics_url=f"http://127.0.0.1:{port}/metrics", trace=trace)

    return launch


async def caught_up_responses(ctx: RunContext, launch: Launch) -> None:
    """The recall line's responses topic, non-empty, with the line's group at its end (see `caught_up_topic`).

    Only the recall path runs, so the barrier reads the committed offsets (one OffsetFetch per batch beside
    the ListOffsets): the cross-instance case, the dearer one.
    """
    await caught_up_topic(
        ctx.settings,
        launch.env["MESSAGE_HISTORY_RESPONSES_TOPIC"],
        ctx.workload.partitions,
        launch.env["MESSAGE_HISTORY_GROUP_ID"],
    )
    ctx.topics.append(launch.env["MESSAGE_HISTORY_RESPONSES_TOPIC"])


def worker_launch(
    ctx: RunContext, kind: str, name: str, **config: object
) -> Callable[[str, str, str], Launch]:
    """`python -m bench.worker KIND CONFIG` for the pass-through and naive lines."""

    def launch(in_topic: str, out_topic: str, tag: str) -> Launch:
        settings = {
            "in_topic": in_topic,
            "out_topic": out_topic,
            "group_id": f"bench-{ctx.workload.run_id}-{name}-{tag}",
            "batch": ctx.workload.batch,
            "db": ctx.db,
            **config,
        }
        argv = [ctx.python(), "-m", "bench.worker", kind, json.dumps(settings)]
        return Launch(argv, ctx.child_env())

    return launch


def stream_lines(ctx: RunContext, path: str, events: int) -> list[StreamLine]:
    """B1, the service, naive and the contract stream (B1's forwarder making the contract's MongoDB trips)
    for one path, each with its turns."""
    w, turns = ctx.workload, ctx.turns
    if path == "recall":
        return [
            StreamLine(
                "b1_recall",
                events,
                enriched(w, turns.recall),
                enriched(w, turns.recall),
                worker_launch(ctx, "passthrough", "b1_recall"),
            ),
            StreamLine(
                "service_recall",
                events,
                requests(w, turns.recall),
                requests(w, turns.recall),
                service_launch(ctx, "recall", "service_recall"),
                prepare=caught_up_responses,
            ),
            StreamLine(
                "service_recall_unguarded",
                events,
                requests(w, turns.recall),
                requests(w, turns.recall),
                service_launch(ctx, "recall", "service_recall_unguarded", guards="none"),
            ),
            StreamLine(
                "service_recall_barrier_only",
                events,
                requests(w, turns.recall),
                requests(w, turns.recall),
                service_launch(ctx, "recall", "service_recall_barrier_only", guards="barrier"),
                prepare=caught_up_responses,
            ),
            StreamLine(
                "service_recall_eos",
                events,
                requests(w, turns.recall),
                requests(w, turns.recall),
                service_launch(ctx, "recall", "service_recall_eos", guarantee="exactly-once"),
                prepare=caught_up_responses,
                transactional=True,
            ),
            StreamLine(
                "naive_recall",
                events,
                requests(w, turns.recall),
                requests(w, turns.recall),
                worker_launch(ctx, "naive", "naive_recall", path="recall"),
            ),
            # last: its busy marks name the recall turn's requests, as the service's own leave them
            StreamLine(
                "contract_recall_stream",
                events,
                contract_named(w, enriched(w, turns.recall), turns.recall),
                contract_named(w, enriched(w, turns.recall), turns.recall),
                contract_launch(ctx, "recall", "contract_recall_stream"),
            ),
        ]
    b1_turn = turns.fresh()  # never written: B1 only moves the bytes
    # the contract stream's writes are new rows, as the service's
    persist_turn, latency_turn = turns.fresh(), turns.fresh()
    return [
        StreamLine(
            "b1_persist",
            events,
            responses(w, b1_turn),
            responses(w, b1_turn),
            worker_launch(ctx, "passthrough", "b1_persist"),
        ),
        StreamLine(
            "service_persist",
            events,
            responses(w, turns.fresh()),
            responses(w, turns.fresh()),
            service_launch(ctx, "persist", "service_persist"),
            writes=True,
        ),
        StreamLine(
            "service_persist_unguarded",
            events,
            responses(w, turns.fresh()),
            responses(w, turns.fresh()),
            service_launch(ctx, "persist", "service_persist_unguarded", guards="none"),
            writes=True,
        ),
        StreamLine(
            "service_persist_eos",
            events,
            responses(w, turns.fresh()),
            responses(w, turns.fresh()),
            service_launch(ctx, "persist", "service_persist_eos", guarantee="exactly-once"),
            writes=True,
            transactional=True,
        ),
        StreamLine(
            "naive_persist",
            events,
            responses(w, turns.fresh()),
            responses(w, turns.fresh()),
            worker_launch(ctx, "naive", "naive_persist", path="persist"),
            writes=True,
        ),
        StreamLine(
            "contract_persist_stream",
            events,
            contract_named(w, responses(w, persist_turn), persist_turn),
            contract_named(w, responses(w, latency_turn), latency_turn),
            contract_launch(ctx, "persist", "contract_persist_stream"),
            writes=True,
        ),
    ]


async def run_mongo_line(ctx: RunContext, kind: str, events: int) -> LineResult:
    """B2 or B3, raw or with our models, or B4 (`bench.mongo_lines.KINDS`), in a worker process."""
    name = KINDS[kind]
    result = LineResult(name, 0, 0.0, None, None, latency_kind="per batch round trip")
    config = {
        "kind": kind,
        "db": ctx.db,
        "events": events,
        "seconds": ctx.budget.line_seconds,
        "workload": ctx.workload.as_dict(),
        # the recall lines read (and B4's busy marks name) the recall turn; the persist ones write a fresh one
        "turn": ctx.turns.recall if kind.startswith("b2") or kind == "b4_recall" else ctx.turns.fresh(),
    }
    try:
        raw, server_cpu = await processes.run_to_end(
            [ctx.python(), "-m", "bench.worker", "mongo", json.dumps(config)],
            env=ctx.child_env(),
            log=ctx.log_dir / f"{name}.log",
            servers=ctx.servers,
            timeout_s=ctx.budget.line_seconds + 600,
        )
    except Exception as exc:  # noqa: BLE001 -- keep the other lines' figures
        result.error = f"{type(exc).__name__}: {exc}"
        log(f"{name} failed: {result.error}")
        return result
    result.events = int(raw["events"])
    result.wall_s = float(raw["wall_s"])
    result.cpu_s = float(raw["cpu_s"])
    result.peak_rss_bytes = raw.get("peak_rss_bytes")
    result.latencies_ms = [float(v) for v in raw["latencies_ms"]]
    result.server_cpu_s = server_cpu
    result.details = dict(raw.get("details", {}))
    result.details["completed"] = result.events >= events
    return result


def coordination_lines(ctx: RunContext, counts: Sequence[int]) -> list[StreamLine]:
    """`--instances`: each path's service line with n instances on its one consumer group, for each n."""
    w, turns = ctx.workload, ctx.turns
    out: list[StreamLine] = []
    for path in ("recall", "persist"):
        for n in counts:
            name = f"service_{path}_x{n}"
            if path == "recall":
                line = StreamLine(
                    name,
                    w.threads,
                    requests(w, turns.recall),
                    requests(w, turns.recall),
                    service_launch(ctx, "recall", name),
                    prepare=caught_up_responses,
                    instances=n,
                )
            else:
                line = StreamLine(
                    name,
                    w.threads,
                    responses(w, turns.fresh()),
                    responses(w, turns.fresh()),
                    service_launch(ctx, "persist", name),
                    writes=True,
                    instances=n,
                )
            out.append(line)
    return out
