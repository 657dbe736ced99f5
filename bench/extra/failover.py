"""`python -m bench failover`: one of three service instances SIGKILLed under fast turns; who waits, how long.

    eval "$(deploy/local/stack up)"
    .venv/bin/python -m bench failover [--threads 24] [--partitions 6] [--before-s 20] [--after-s 60]

With fresh topics (requests, responses and commands of `--partitions` partitions), a fresh group and a fresh
database (all removed afterwards):

1. starts `--instances` `message-history run` processes (the service's defaults, unless `--session-timeout-ms`
   or `--env NAME=VALUE` say otherwise) and waits until the group is stable with all their consumers;
2. drives `--threads` conversations of fast turns: a user sends a request, a simulated worker answers the
   enriched request at once, the user sends the next request `--think-ms` after the answer (the barrier's
   case: each request must see the turn before it);
3. after `--before-s`, SIGKILLs one instance, and goes on for `--after-s`; then SIGTERMs the others (their
   exit codes and stop times are reported too).

Figures: send-to-answer (request sent -> its EnrichedRequest read), p50/p95/p99/longest, for the threads of
the dead instance's partitions (it owned their recall or their persist side) and for the others, before the
kill (answered before it) and after (everything else, including a request in flight at the kill); the number
of enriched requests with `history.complete: false` and of requests never answered. Targets (issue 23): the
others' longest after the kill within their p99 before; the dead instance's threads answered within the
session timeout + 5 s; none incomplete.

`--service-root DIR` runs the service from another checkout (e.g. `git worktree add /tmp/base <commit>`), to
measure the code before a change with the same command. `--quick`: a short run for smoke tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from pymongo import AsyncMongoClient

from bench.stats import percentile

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS_PER_INSTANCE = 3  # recall, persist, commands
DEFAULT_SESSION_MS = 30_000  # the service's default before issue 23; only used when the env does not say


@dataclass
class Turn:
    thread: str
    partition: int
    sent: float
    answered: float | None = None
    complete: bool | None = None
    waited_ms: int | None = None

    @property
    def latency_ms(self) -> float | None:
        return None if self.answered is None else (self.answered - self.sent) * 1000


@dataclass
class Run:
    turns: dict[str, Turn] = field(default_factory=dict)
    killed_at: float | None = None
    dead_partitions: set[int] = field(default_factory=set)


def summarize(run: Run, *, session_s: float) -> dict[str, Any]:
    """Latency per (dead|others, before|after) group, incomplete and unanswered counts, the targets."""
    groups: dict[str, list[float]] = {
        "dead/before": [],
        "dead/after": [],
        "others/before": [],
        "others/after": [],
    }
    killed = run.killed_at if run.killed_at is not None else float("inf")
    unanswered = 0
    for turn in run.turns.values():
        latency = turn.latency_ms
        if latency is None or turn.answered is None:
            unanswered += 1
            continue
        side = "dead" if turn.partition in run.dead_partitions else "others"
        phase = "before" if turn.answered < killed else "after"
        groups[f"{side}/{phase}"].append(latency)
    figures = {
        name: {
            "n": len(values),
            "p50": percentile(values, 50),
            "p95": percentile(values, 95),
            "p99": percentile(values, 99),
            "max": max(values) if values else None,
        }
        for name, values in groups.items()
    }
    incomplete = sum(1 for t in run.turns.values() if t.complete is False)
    normal_p99 = figures["others/before"]["p99"]
    others_max = figures["others/after"]["max"]
    dead_max = figures["dead/after"]["max"]
    targets = {
        "others_not_slowed": None if normal_p99 is None or others_max is None else others_max <= normal_p99,
        "dead_within_session_plus_5s": None if dead_max is None else dead_max <= (session_s + 5) * 1000,
        "none_incomplete": incomplete == 0,
    }
    return {
        "latency_ms": figures,
        "incomplete": incomplete,
        "unanswered": unanswered,
        "dead_partitions": sorted(run.dead_partitions),
        "targets": targets,
    }


def render(summary: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    lines = [f"{'send-to-answer ms':<16} {'n':>6} {'p50':>8} {'p95':>8} {'p99':>8} {'longest':>8}"]
    for name, f in summary["latency_ms"].items():
        lines.append(
            f"{name:<16} {f['n']:>6} {ms(f['p50']):>8} {ms(f['p95']):>8} {ms(f['p99']):>8} {ms(f['max']):>8}"
        )
    lines.append(f"dead instance's partitions: {summary['dead_partitions']}")
    lines.append(f"complete: false: {summary['incomplete']}   never answered: {summary['unanswered']}")
    lines.append("targets: " + ", ".join(f"{k}={v}" for k, v in summary["targets"].items()))
    return "\n".join(lines)


# --- events -------------------------------------------------------------------------------------------------


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def _request(thread: str, turn: int) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": f"{thread}-turn{turn}",
        "threadId": thread,
        "resourceId": "bench-user",
        "createdAt": _now_iso(),
        "messages": [_text("user", f"question {turn} on {thread}")],
    }


def _response(enriched: dict[str, Any]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": enriched["requestId"],
        "threadId": enriched["threadId"],
        "resourceId": enriched["resourceId"],
        "createdAt": _now_iso(),
        "input": [m for m in enriched["messages"] if m.get("source") == "input"],
        "response": [_text("assistant", f"answer to {enriched['requestId']}")],
        "finishReason": "stop",
    }


# --- the instances ------------------------------------------------------------------------------------------


@dataclass
class Instance:
    name: str
    log: Path
    process: asyncio.subprocess.Process

    def owned(self) -> dict[str, set[int]]:
        """Partitions each path's consumer holds, from its last "partitions assigned" log line (eager: every
        rebalance revokes everything, then assigns)."""
        owned: dict[str, set[int]] = {}
        for raw in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if line.get("msg") == "partitions assigned":
                    owned[line["path"]] = set(line["partitions"])
                elif line.get("msg") == "partitions revoked":
                    owned[line["path"]] = set()
        return owned


async def _start(name: str, env: dict[str, str], root: Path, logs: Path) -> Instance:
    log = logs / f"{name}.log"
    with log.open("ab") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "message_history", "run",
            cwd=root, env=env, stdout=sink, stderr=sink, stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
    return Instance(name, log, process)


async def _stable(admin: AIOKafkaAdminClient, group: str, members: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(KafkaError, IndexError):
            [response] = await admin.describe_consumer_groups([group])
            state, found = response.groups[0][2], len(response.groups[0][5])
            if state == "Stable" and found == members:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"group {group} not stable with {members} members after {timeout_s}s")
        await asyncio.sleep(0.5)


# --- the conversations --------------------------------------------------------------------------------------


async def _converse(
    thread: str,
    producer: AIOKafkaProducer,
    topics: dict[str, str],
    waiting: dict[str, asyncio.Future[dict[str, Any]]],
    run: Run,
    end: float,
    think_s: float,
) -> None:
    turn = 1
    while time.monotonic() < end:
        request = _request(thread, turn)
        rid = request["requestId"]
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiting[rid] = answer
        sent = time.monotonic()
        meta = await producer.send_and_wait(
            topics["requests"], json.dumps(request).encode(), key=thread.encode()
        )
        record = Turn(thread, meta.partition, sent)
        run.turns[rid] = record
        try:
            enriched = await asyncio.wait_for(answer, max(1.0, end - time.monotonic() + 30))
        except TimeoutError:
            return  # never answered: counted as such
        record.answered = time.monotonic() if record.answered is None else record.answered
        history = enriched.get("history") or {}
        record.complete = bool(history.get("complete", True))
        record.waited_ms = history.get("waitedMs")
        await producer.send_and_wait(
            topics["responses"], json.dumps(_response(enriched)).encode(), key=thread.encode()
        )
        await asyncio.sleep(think_s)
        turn += 1


async def _worker(
    consumer: AIOKafkaConsumer, waiting: dict[str, asyncio.Future[dict[str, Any]]], run: Run
) -> None:
    """Reads every enriched request; the first copy of each answers its user's wait."""
    while True:
        batch = await consumer.getmany(timeout_ms=100)
        now = time.monotonic()
        for records in batch.values():
            for record in records:
                event = json.loads(record.value)
                rid = event["requestId"]
                future = waiting.pop(rid, None)
                if future is not None and not future.done():
                    turn = run.turns.get(rid)
                    if turn is not None:
                        turn.answered = now
                    future.set_result(event)


# --- the run ------------------------------------------------------------------------------------------------


def _service_env(
    args: argparse.Namespace,
    root: Path,
    bootstrap: str,
    mongo_uri: str,
    database: str,
    group: str,
    topics: dict[str, str],
) -> dict[str, str]:
    """The instances' environment: the service's defaults but for the run's endpoints, names and flags."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(
        PYTHONPATH=str(root),
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        MONGODB_URI=mongo_uri,
        MONGODB_DATABASE=database,
        MESSAGE_HISTORY_GROUP_ID=group,
        MESSAGE_HISTORY_HTTP_HOST="127.0.0.1",
        MESSAGE_HISTORY_HTTP_PORT="0",
        MESSAGE_HISTORY_LOG_LEVEL="INFO",
    )
    for name, topic in topics.items():
        env[f"MESSAGE_HISTORY_{name.upper()}_TOPIC"] = topic
    if args.session_timeout_ms:
        env["MESSAGE_HISTORY_SESSION_TIMEOUT_MS"] = str(args.session_timeout_ms)
    for item in args.env:
        name, _, value = item.partition("=")
        env[name] = value
    return env


async def _drive(
    args: argparse.Namespace, bootstrap: str, topics: dict[str, str], instances: list[Instance], run: Run
) -> None:
    """The conversations for `before_s`, the kill, the conversations for `after_s`."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await producer.start()
    await consumer.start()
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
    try:
        consumer.assign([TopicPartition(topics["enriched"], p) for p in range(args.partitions)])
        await consumer.seek_to_end()
        worker = asyncio.create_task(_worker(consumer, waiting, run))
        end = time.monotonic() + args.before_s + args.after_s
        threads = _spread_threads(topics["requests"], args.threads, args.partitions)
        users = [
            asyncio.create_task(_converse(t, producer, topics, waiting, run, end, args.think_ms / 1000))
            for t in threads
        ]
        await asyncio.sleep(args.before_s)
        victim = instances[args.instances // 2]
        owned = victim.owned()
        run.dead_partitions = owned.get("recall", set()) | owned.get("persist", set())
        victim.process.send_signal(signal.SIGKILL)
        run.killed_at = time.monotonic()
        print(f"[failover] SIGKILLed {victim.name} (owned {owned})", file=sys.stderr, flush=True)
        await asyncio.gather(*users)
        worker.cancel()
    finally:
        await consumer.stop()
        await producer.stop()


async def _stop_all(instances: list[Instance]) -> dict[str, Any]:
    """SIGTERM every instance still running; each one's exit code and how long it took to exit."""
    for instance in instances:
        if instance.process.returncode is None:
            instance.process.send_signal(signal.SIGTERM)
    started, stops = time.monotonic(), {}
    for instance in instances:
        try:
            code: int | None = await asyncio.wait_for(instance.process.wait(), 120)
        except TimeoutError:
            code = None
        stops[instance.name] = {"exit": code, "stop_s": round(time.monotonic() - started, 1)}
    return stops


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    mongo_uri = os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017")
    run_id = uuid.uuid4().hex[:8]
    topics = {
        name: f"bench-failover-{run_id}-{name}"
        for name in ("requests", "enriched", "responses", "persisted", "commands", "forgotten")
    }
    database, group = f"bench_failover_{run_id}", f"bench-failover-{run_id}"
    root = Path(args.service_root).resolve()
    env = _service_env(args, root, bootstrap, mongo_uri, database, group, topics)
    session_s = int(env.get("MESSAGE_HISTORY_SESSION_TIMEOUT_MS") or _default_session_ms(root)) / 1000

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    logs = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    instances: list[Instance] = []
    run = Run()
    stops: dict[str, Any] = {}
    try:
        await admin.create_topics([NewTopic(name, args.partitions, 1) for name in topics.values()])
        for i in range(args.instances):
            instances.append(await _start(f"instance-{i}", env, root, logs))
        await _stable(admin, group, args.instances * CONSUMERS_PER_INSTANCE, timeout_s=120)
        print(f"[failover] {args.instances} instances stable; logs in {logs}", file=sys.stderr, flush=True)

        await _drive(args, bootstrap, topics, instances, run)
        stops = await _stop_all(instances)
    finally:
        for instance in instances:
            if instance.process.returncode is None:
                instance.process.kill()
                await instance.process.wait()
        with contextlib.suppress(KafkaError):
            await admin.delete_topics(list(topics.values()))
        await admin.close()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
        await client.drop_database(database)
        await client.close()
    summary = summarize(run, session_s=session_s)
    summary["session_timeout_s"] = session_s
    summary["service_root"] = str(root)
    summary["stops"] = stops
    summary["command"] = "python -m bench failover " + " ".join(args.argv)
    return summary


def _default_session_ms(root: Path) -> int:
    """The session timeout the service at `root` defaults to (it may be another checkout)."""
    text = (root / "message_history" / "settings.py").read_text()
    marker = "session_timeout_ms: int = Field("
    if marker in text:
        number = text.split(marker, 1)[1].split(",", 1)[0].replace("_", "")
        with contextlib.suppress(ValueError):
            return int(number)
    return DEFAULT_SESSION_MS


def _spread_threads(prefix: str, count: int, partitions: int) -> list[str]:
    """`count` thread ids spread evenly over the partitions by the producer's own partitioner (murmur2 of the
    key): ids made from the run's random topic name could all land on the dead instance's partitions, leaving
    no "others" to compare with (seen in a quick run: 4 threads, all on 2 of 3 partitions)."""
    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    per = -(-count // partitions)  # ceil
    taken: dict[int, int] = dict.fromkeys(every, 0)
    threads: list[str] = []
    i = 0
    while len(threads) < count:
        thread = f"{prefix}-t{i:03d}"
        i += 1
        partition = partitioner(thread.encode(), every, every)
        if taken[partition] < per:
            taken[partition] += 1
            threads.append(thread)
    return threads


QUICK = {"threads": 6, "partitions": 3, "before_s": 6.0, "after_s": 14.0, "session_timeout_ms": 6000}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench failover", description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=3, help="service processes (%(default)s)")
    p.add_argument("--threads", type=int, default=24, help="conversations (%(default)s)")
    p.add_argument("--partitions", type=int, default=6, help="partitions per input topic (%(default)s)")
    p.add_argument("--before-s", type=float, default=20.0, help="turns before the kill (%(default)s)")
    p.add_argument("--after-s", type=float, default=60.0, help="turns after the kill (%(default)s)")
    p.add_argument("--think-ms", type=float, default=200.0, help="user pause after an answer (%(default)s)")
    p.add_argument("--session-timeout-ms", type=int, help="override the service's default")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="more service settings")
    p.add_argument("--service-root", default=str(ROOT), help="checkout the service runs from (this one)")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--quick", action="store_true", help="a short run for smoke tests")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        quick = parser()
        quick.set_defaults(**QUICK)
        args = quick.parse_args(argv)
    args.argv = list(argv)
    summary = asyncio.run(measure(args))
    print(render(summary))
    print(
        "stops: " + ", ".join(f"{k} exit {v['exit']} in {v['stop_s']} s" for k, v in summary["stops"].items())
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if summary["unanswered"] == 0 else 1
