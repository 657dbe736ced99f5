"""End-to-end throughput of one service instance, per path, on real Kafka and MongoDB.

    eval "$(deploy/local/stack up)"
    .venv/bin/python bench/bench_e2e.py [--threads 100] [--turns 10] [--requests 10] [--partitions 4]

What it does, with fresh topics, group and database (all removed afterwards):

1. persist path: produces `threads x turns` `AgentResponse`s (one user + one assistant message each,
   turn-major so threads interleave), starts `message-history run --only persist` as a child process, and
   waits until a `HistoryPersisted` per response is readable;
2. recall path: produces `requests` `AgentRequest`s per thread (turns after the stored ones, so each recalls
   `2 x turns` stored messages, capped by lastMessages 40), starts `message-history run --only recall`, and
   waits until an `EnrichedRequest` per request is readable.

Figures per path: events/s over the processing window (from the service's "partitions assigned" log line to
the last output record's timestamp, which leaves out process start and the group join), events/s over the
whole run from process start, and the service process's CPU milliseconds per event (start-up included).
The input is produced before the service starts, so the service reads a backlog: this measures capacity,
not latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
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

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the agent recalls what the user said before and answers with the whole context " * 4  # ~320 B


@dataclass(frozen=True)
class PathResult:
    path: str
    events: int
    window_s: float
    wall_s: float
    cpu_s: float | None

    def line(self) -> str:
        cpu = f"{self.cpu_s * 1000 / self.events:6.2f} CPU-ms/event" if self.cpu_s is not None else ""
        return (
            f"{self.path:<8} {self.events:>6} events  {self.events / self.window_s:>8.0f} ev/s processing"
            f"  ({self.window_s:.2f} s)  {self.events / self.wall_s:>7.0f} ev/s incl. start"
            f" ({self.wall_s:.2f} s)  {cpu}"
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


def request(thread: str, turn: int) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 1,
            "requestId": f"{thread}-t{turn}",
            "threadId": thread,
            "resourceId": f"user-{thread}",
            "createdAt": _at(turn, 0),
            "messages": [_message("user", f"question {turn}: {TEXT}")],
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


async def wait_outputs(bootstrap: str, topic: str, count: int, timeout_s: float) -> tuple[int, int]:
    """Read `topic` until `count` records; returns the first and last record timestamps (ms)."""
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
        seen, first, last = 0, None, 0
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {seen} of {count} outputs after {timeout_s} s")
            for records in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                seen += len(records)
                stamps = [r.timestamp for r in records]
                first = min(stamps) if first is None else min(first, *stamps)
                last = max(last, *stamps)
        assert first is not None
        return first, last
    finally:
        await consumer.stop()


def cpu_seconds(pid: int) -> float | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_path(
    path: str, env: dict[str, str], bootstrap: str, topic: str, count: int, timeout_s: float
) -> PathResult:
    """Start `run --only <path>`, wait for `count` outputs on `topic`, stop it with SIGTERM."""
    with tempfile.TemporaryFile() as sink:  # the service's log, shown if it fails
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "message_history", "run", "--only", path, cwd=ROOT, env=env, stderr=sink
        )
        try:
            _, last = await wait_outputs(bootstrap, topic, count, timeout_s=timeout_s)
            wall = time.monotonic() - started
            cpu = cpu_seconds(proc.pid)
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 60)
            sink.seek(0)
            log = sink.read().decode(errors="replace")
            _check_exit(code, log)
        except BaseException:
            sink.seek(0)
            print(sink.read()[-4000:].decode(errors="replace"), file=sys.stderr)
            raise
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return PathResult(path, count, max(0.001, last / 1000 - assigned_at(log)), wall, cpu)


def _check_exit(code: int, log: str) -> None:
    if code != 0:
        raise RuntimeError(f"service exited {code}: {log[-2000:]}")


def assigned_at(log: str) -> float:
    """Epoch seconds of the first "partitions assigned" line with partitions, in the service's JSON log."""
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("msg") == "partitions assigned" and entry.get("partitions"):
            return datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp()
    raise RuntimeError("no 'partitions assigned' line in the service log")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--turns", type=int, default=10, help="stored turns per thread (persist path)")
    parser.add_argument("--requests", type=int, default=10, help="requests per thread (recall path)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="MESSAGE_HISTORY_MAX_BATCH_RECORDS")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for a path's outputs")
    parser.add_argument(
        "--mongodb-timeout-ms",
        type=int,
        default=None,
        help="MESSAGE_HISTORY_MONGODB_TIMEOUT_MS for the service",
    )
    args = parser.parse_args()

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    mongo_uri = os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017")
    run = uuid.uuid4().hex[:8]
    topics = {name: f"bench-{name}-{run}" for name in ("requests", "enriched", "responses", "persisted")}
    database = f"bench_{run}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        MONGODB_URI=mongo_uri,
        MONGODB_DATABASE=database,
        MESSAGE_HISTORY_GROUP_ID=f"bench-{run}",
        MESSAGE_HISTORY_HTTP_HOST="127.0.0.1",
        MESSAGE_HISTORY_HTTP_PORT="0",
        MESSAGE_HISTORY_LOG_LEVEL="INFO",
        MESSAGE_HISTORY_MAX_BATCH_RECORDS=str(args.batch),
        **{f"MESSAGE_HISTORY_{name.upper()}_TOPIC": topic for name, topic in topics.items()},
    )

    if args.mongodb_timeout_ms is not None:
        env["MESSAGE_HISTORY_MONGODB_TIMEOUT_MS"] = str(args.mongodb_timeout_ms)

    threads = [f"th{i:05d}" for i in range(args.threads)]
    count = args.threads * args.turns
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topics[n], args.partitions, 1) for n in ("requests", "responses")], timeout_ms=30_000
        )
        print(
            f"workload: {args.threads} threads; persist {args.turns} turns each ({count} responses), then "
            f"recall {args.requests} requests each ({args.threads * args.requests}); "
            f"{args.partitions} partitions, batch {args.batch}"
        )
        responses = [(t.encode(), response(t, k)) for k in range(args.turns) for t in threads]
        await produce(bootstrap, topics["responses"], responses)
        persist = await run_path("persist", env, bootstrap, topics["persisted"], count, args.timeout)
        print(persist.line(), flush=True)

        requests = [(t.encode(), request(t, args.turns + k)) for k in range(args.requests) for t in threads]
        await produce(bootstrap, topics["requests"], requests)
        recall = await run_path("recall", env, bootstrap, topics["enriched"], len(requests), args.timeout)
        print(recall.line(), flush=True)
    finally:
        await admin.delete_topics(
            [*topics.values(), f"{topics['requests']}.dlq", f"{topics['responses']}.dlq"], timeout_ms=30_000
        )
        await admin.close()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
        await client.drop_database(database)
        await client.close()


if __name__ == "__main__":
    asyncio.run(main())
