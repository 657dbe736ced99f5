"""`python -m bench replay`: replay throughput against the live persist path, on one responses topic.

    eval "$(deploy/local/stack up)"
    .venv/bin/python -m bench replay [--threads 100] [--turns 10] [--partitions 4] [--batch 500]

With a fresh topic, group and databases (all removed afterwards):

1. produces `threads x turns` `AgentResponse`s (one user + one assistant message each, ~320 B of text each,
   turn-major so threads interleave) to one responses topic;
2. then, `--rounds` times, consumes that topic with each of three consumers, each into its own empty database
   (checked to hold every message, then dropped), the order rotated every round so that a shared machine's
   load drifts over all three alike:
   - live: `message-history run --only persist` (a fresh group), until a `HistoryPersisted` per response is
     readable; its window runs from the "partitions assigned" log line to the last output record;
   - replay: `message-history replay --from-beginning`; its window is the `read_s` of its "replay done" log
     line (from its partitions' start to the last one's end: connecting and planning left out, as the live
     window leaves out the group join);
   - replay --emit-persisted: the same, also sending a HistoryPersisted per response (the live outputs).

Figures: messages/s over each window (two messages per response), the same over the whole process lifetime
(start-up included), the child process's CPU milliseconds per message, and per consumer the median over the
rounds of its throughput and of its CPU per message, each with its ratio to the live path (the median of the
rounds' ratios: on a shared machine the ratio within a round is the steadier figure). All read a backlog: this
measures capacity, not latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pymongo import AsyncMongoClient

from bench.procstat import cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
TEXT = "the agent recalls what the user said before and answers with the whole context " * 4  # ~320 B


@dataclass(frozen=True)
class Result:
    name: str
    messages: int
    window_s: float
    wall_s: float
    cpu_s: float | None

    def line(self) -> str:
        cpu = f"{self.cpu_s * 1000 / self.messages:6.2f} CPU-ms/msg" if self.cpu_s is not None else ""
        return (
            f"{self.name:<24} {self.messages:>7} msgs  {self.messages / self.window_s:>8.0f} msg/s processing"
            f" ({self.window_s:6.2f} s)  {self.messages / self.wall_s:>7.0f} msg/s incl. start"
            f" ({self.wall_s:6.2f} s)  {cpu}"
        )


def _at(turn: int, ms: int) -> str:
    minutes, seconds = divmod(turn, 60)
    return f"2025-01-01T{10 + minutes // 60:02d}:{minutes % 60:02d}:{seconds:02d}.{ms:03d}Z"


def _message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def response(thread: str, turn: int) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 1,
            "requestId": f"{thread}-t{turn}",
            "threadId": thread,
            "resourceId": f"user-{thread}",
            "createdAt": _at(turn, 0),
            "input": [_message("user", f"question {turn}: {TEXT}")],
            "response": [_message("assistant", f"answer {turn}: {TEXT}")],
            "finishReason": "stop",
        }
    ).encode()


async def produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in items]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def last_output_at(bootstrap: str, topic: str, count: int, timeout_s: float) -> float:
    """Read `topic` until `count` records; the last record's timestamp in epoch seconds."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not consumer.partitions_for_topic(topic):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} never appeared")
            await consumer._client.force_metadata_update()  # the service creates it on first send
            await asyncio.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen, last = 0, 0
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {seen} of {count} outputs after {timeout_s} s")
            for records in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                seen += len(records)
                last = max(last, *(r.timestamp for r in records))
        return last / 1000
    finally:
        await consumer.stop()


def log_time(log: str, msg: str, *, with_field: str | None = None) -> float:
    """Epoch seconds of the first JSON log line with message `msg` (and a truthy `with_field`)."""
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("msg") == msg and (with_field is None or entry.get(with_field)):
            return datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp()
    raise RuntimeError(f"no {msg!r} line in the log:\n{log[-2000:]}")


def log_field(log: str, msg: str, name: str) -> float:
    """A numeric field of the first JSON log line with message `msg`."""
    for line in log.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("msg") == msg:
                return float(entry[name])
    raise RuntimeError(f"no {msg!r} line in the log:\n{log[-2000:]}")


async def live_persist(env: dict[str, str], bootstrap: str, persisted: str, responses: int) -> Result:
    """`run --only persist` until every response has its HistoryPersisted; stopped with SIGTERM."""
    with tempfile.TemporaryFile() as sink:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "message_history",
            "run",
            "--only",
            "persist",
            cwd=ROOT,
            env=env,
            stderr=sink,
        )
        try:
            last = await last_output_at(bootstrap, persisted, responses, timeout_s=1800)
            wall = time.monotonic() - started
            cpu = cpu_seconds(proc.pid)
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 60)
            sink.seek(0)
            log = sink.read().decode(errors="replace")
            if code != 0:
                raise RuntimeError(f"service exited {code}: {log[-2000:]}")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    window = last - log_time(log, "partitions assigned", with_field="partitions")
    return Result("live persist path", responses * 2, max(0.001, window), wall, cpu)


async def replay(name: str, env: dict[str, str], messages: int, *extra: str) -> Result:
    """`message-history replay --from-beginning` to the end; its window from its start to its done line."""
    with tempfile.TemporaryFile() as sink, tempfile.TemporaryFile() as out:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "message_history", "replay", "--from-beginning", "--progress", "none", *extra),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=sink,
        )
        cpu: float | None = None
        while proc.returncode is None:  # sample CPU just before it exits (the /proc entry goes with it)
            cpu = cpu_seconds(proc.pid) or cpu
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.05)
        wall = time.monotonic() - started
        sink.seek(0)
        out.seek(0)
        log = sink.read().decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"replay exited {proc.returncode}: {out.read().decode()}\n{log[-2000:]}")
    window = log_field(log, "replay done", "read_s")
    return Result(name, messages, max(0.001, window), wall, cpu)


async def stored(mongo_uri: str, database: str) -> int:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    try:
        return await client[database]["mastra_messages"].count_documents({})
    finally:
        await client.close()


CONSUMERS = ("live", "replay", "emit")


async def consume(name: str, env: dict[str, str], bootstrap: str, persisted: str, responses: int) -> Result:
    """One consumer of the topic: the live persist path, or a replay (with or without emitted events)."""
    if name == "live":
        return await live_persist(env, bootstrap, persisted, responses)
    if name == "replay":
        return await replay("replay (default)", env, responses * 2)
    return await replay("replay --emit-persisted", env, responses * 2, "--emit-persisted")


async def measure(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench replay", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="MESSAGE_HISTORY_MAX_BATCH_RECORDS")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds, each consumer once per round, order rotated (default 3)",
    )
    args = parser.parse_args(argv)

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    mongo_uri = os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017")
    run = uuid.uuid4().hex[:8]
    source = f"bench-responses-{run}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    base.update(
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        MONGODB_URI=mongo_uri,
        MESSAGE_HISTORY_HTTP_HOST="127.0.0.1",
        MESSAGE_HISTORY_HTTP_PORT="0",
        MESSAGE_HISTORY_LOG_LEVEL="INFO",
        MESSAGE_HISTORY_MAX_BATCH_RECORDS=str(args.batch),
        MESSAGE_HISTORY_MONGODB_TIMEOUT_MS="60000",
        MESSAGE_HISTORY_RESPONSES_TOPIC=source,
        MESSAGE_HISTORY_REQUESTS_TOPIC=f"bench-requests-{run}",
    )
    responses = args.threads * args.turns
    messages = responses * 2
    results: dict[str, list[Result]] = {name: [] for name in CONSUMERS}
    created = [source, f"{source}.dlq"]
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(source, args.partitions, 1)], timeout_ms=30_000)
        print(
            f"workload: {args.threads} threads x {args.turns} turns = {responses} responses"
            f" ({messages} messages) on {args.partitions} partitions, batch {args.batch};"
            f" one topic, {len(CONSUMERS)} consumers x {args.rounds} rounds, each into an empty database",
            flush=True,
        )
        threads = [f"th{i:05d}" for i in range(args.threads)]
        await produce(
            bootstrap, source, [(t.encode(), response(t, k)) for k in range(args.turns) for t in threads]
        )
        for round_no in range(args.rounds):
            order = CONSUMERS[round_no % len(CONSUMERS) :] + CONSUMERS[: round_no % len(CONSUMERS)]
            for name in order:
                tag = f"{run}_{round_no}_{name}"
                persisted = f"bench-persisted-{tag}"
                created.append(persisted)
                env = {
                    **base,
                    "MONGODB_DATABASE": f"bench_{tag}",
                    "MESSAGE_HISTORY_GROUP_ID": f"bench-{tag}",
                    "MESSAGE_HISTORY_PERSISTED_TOPIC": persisted,
                }
                result = await consume(name, env, bootstrap, persisted, responses)
                count = await client[f"bench_{tag}"]["mastra_messages"].count_documents({})
                await client.drop_database(f"bench_{tag}")
                if count != messages:
                    raise SystemExit(f"{result.name} stored {count} messages, not {messages}")
                results[name].append(result)
                print(f"round {round_no + 1}  {result.line()}", flush=True)
        print("median over rounds:")
        medians = {
            name: statistics.median(r.messages / r.window_s for r in rs) for name, rs in results.items()
        }
        for name, rs in results.items():
            rates = sorted(r.messages / r.window_s for r in rs)
            # the ratio within a round cancels most of a shared machine's drift between rounds
            ratios = [
                (r.messages / r.window_s) / (live.messages / live.window_s)
                for r, live in zip(rs, results["live"], strict=True)
            ]
            print(
                f"  {rs[0].name:<24} {medians[name]:>7.0f} msg/s  (min {rates[0]:.0f}, max {rates[-1]:.0f})"
                f"  {statistics.median(ratios):.2f}x the live persist path (median of the rounds' ratios:"
                f" {', '.join(f'{x:.2f}' for x in ratios)}){_cpu_summary(rs, results['live'])}"
            )
    finally:
        await admin.delete_topics(created, timeout_ms=30_000)
        await admin.close()
        await client.close()


def _cpu_summary(rs: list[Result], live: list[Result]) -> str:
    """`; CPU m ms/msg, r x the live path's` (medians over the rounds, the ratio within each round), or ""."""
    pairs = [(r, lv) for r, lv in zip(rs, live, strict=True) if r.cpu_s and lv.cpu_s]
    if not pairs:
        return ""
    per_message = statistics.median(r.cpu_s * 1000 / r.messages for r, _ in pairs if r.cpu_s)
    ratios = [(r.cpu_s / r.messages) / (lv.cpu_s / lv.messages) for r, lv in pairs if r.cpu_s and lv.cpu_s]
    return f"; CPU {per_message:.2f} ms/msg, {statistics.median(ratios):.2f}x the live path's"


def main(argv: list[str]) -> int:
    asyncio.run(measure(argv))
    return 0
