"""A fast agent worker and a fast user against the running service: does each request see the turn before?

`run_conversations` drives `threads` conversations of `turns` turns. The worker reads each enriched request
and writes its response at once; the user writes the next request either right after that response
(`after-answer`: the barrier's case) or right after reading the enriched request, while the worker is still
answering (`while-answering`: the busy-thread policy's case). It returns every enriched request the worker saw
(first copy of each), so a test can count the requests that lack an earlier turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from message_history.settings import Settings
from tests.integration.service_harness import (
    encoded,
    message_id,
    request_event,
    request_id,
    response_event,
)

UserMode = Literal["after-answer", "while-answering"]

THINK_S = 0.02  # the worker's "model call" in while-answering mode: the user's next request goes first


@dataclass
class Conversations:
    """What the worker saw: the first copy of every enriched request, by request id."""

    enriched: dict[str, dict[str, Any]] = field(default_factory=dict)

    def misses(self, threads: Sequence[str], turns: int) -> list[str]:
        """Request ids whose enriched context lacks a message of an earlier turn of their thread."""
        missing: list[str] = []
        for thread in threads:
            for turn in range(2, turns + 1):
                event = self.enriched[request_id(thread, turn)]
                ids = {m["id"] for m in event["messages"] if m.get("source") == "memory"}
                for earlier in range(1, turn):
                    wanted = {message_id(thread, "u", earlier, kind) for kind in ("input", "response")}
                    if not wanted <= ids:
                        missing.append(request_id(thread, turn))
                        break
        return missing

    def incomplete(self) -> list[str]:
        return [rid for rid, e in self.enriched.items() if not e["history"]["complete"]]

    def waited_ms(self) -> list[int]:
        return sorted(int(e["history"]["waitedMs"]) for e in self.enriched.values())


async def run_conversations(
    settings: Settings,
    threads: Sequence[str],
    turns: int,
    mode: UserMode,
    *,
    timeout_s: float = 120.0,
) -> Conversations:
    """Drive the conversations to their last turn; fails after `timeout_s` with what is missing."""
    bootstrap = settings.kafka_bootstrap_servers
    seen = Conversations()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await producer.start()
    await consumer.start()
    tasks: set[asyncio.Task[None]] = set()
    try:
        await _assign_all(consumer, settings.enriched_topic)
        requests = [request_event(t, "u", 1, "q1") for t in threads]
        await asyncio.gather(*[await _send(producer, settings.requests_topic, r) for r in requests])
        deadline = time.monotonic() + timeout_s
        want = len(threads) * turns
        while len(seen.enriched) < want:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(seen.enriched)} of {want} enriched requests after {timeout_s}s")
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for record in records:
                    event = json.loads(record.value)
                    if event["requestId"] in seen.enriched:
                        continue  # a redelivered copy: a worker drops it by eventId
                    seen.enriched[event["requestId"]] = event
                    task = asyncio.create_task(_answer(producer, settings, event, turns, mode))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            for task in [t for t in tasks if t.done()]:
                task.result()  # a failed send fails the test
        await asyncio.gather(*tasks)
        return seen
    finally:
        for task in tasks:
            task.cancel()
        await consumer.stop()
        await producer.stop()


async def _answer(
    producer: AIOKafkaProducer, settings: Settings, event: dict[str, Any], turns: int, mode: UserMode
) -> None:
    thread, turn = event["threadId"], int(event["requestId"].rsplit("turn", 1)[1])
    response = response_event(thread, "u", turn, event["messages"], f"a{turn}")
    following = request_event(thread, "u", turn + 1, f"q{turn + 1}") if turn < turns else None
    if mode == "after-answer":
        await (await _send(producer, settings.responses_topic, response))
        if following is not None:
            await (await _send(producer, settings.requests_topic, following))
        return
    if following is not None:
        await (await _send(producer, settings.requests_topic, following))
    await asyncio.sleep(THINK_S)
    await (await _send(producer, settings.responses_topic, response))


async def _send(producer: AIOKafkaProducer, topic: str, event: dict[str, Any]) -> asyncio.Future[Any]:
    key, value = encoded(event)
    future: asyncio.Future[Any] = await producer.send(topic, key=key, value=value)
    return future


async def _assign_all(consumer: AIOKafkaConsumer, topic: str) -> None:
    deadline = time.monotonic() + 30
    while not consumer.partitions_for_topic(topic):
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {topic} never appeared")
        consumer._client.add_topic(topic)
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)
