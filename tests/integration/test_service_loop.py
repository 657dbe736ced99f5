"""The batch consumer loop on real Kafka with a stub path: commits, dead letters, outages, per-key order."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from consumers.consumer import LoopOptions, build_consumer
from consumers.contract import Ack, Done, Emit, Refused, Result
from consumers.lanes import Failed, run_lanes
from consumers.loop import StreamLoop
from message_history.errors import EventValidationError, InvalidInputError, StorageUnavailableError
from message_history.settings import Settings
from producers.dead_letters import DeadLetterPublisher
from producers.output import OutputProducer
from schemas.dead_letters import parse_dead_letter_headers
from tests import infra
from tests.conftest import MakeTopic
from tests.integration.stream_helpers import produce, read_all, read_topic, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class _Health:
    def __init__(self) -> None:
        self.ready: list[tuple[str, bool, str]] = []
        self.not_ready = asyncio.Event()

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None:
        self.ready.append((component, ready, reason))
        if not ready:
            self.not_ready.set()

    def beat(self, component: str) -> None:
        pass


class _EchoHandler:
    """Copies `{"k": key, "n": n}` values to an output topic, per key in order; `bad` values are refused.

    `outages` makes the first N calls raise `StorageUnavailableError`, as a MongoDB outage would.
    """

    def __init__(self, out_topic: str, *, outages: int = 0) -> None:
        self._out = out_topic
        self.outages = outages
        self.calls = 0

    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]:
        self.calls += 1
        if self.outages > 0:
            self.outages -= 1
            raise StorageUnavailableError("simulated outage")

        async def one(record: Any) -> Ack:
            body = json.loads(record.value)
            if body.get("bad"):
                raise EventValidationError("bad record", "bad")
            return await emit(record, self._out, key=record.key, value=record.value)

        results = await run_lanes(
            records, key=lambda r: r.key, work=one, max_concurrent=4, item_errors=(InvalidInputError,)
        )
        out: list[Result] = []
        for result in results:
            if isinstance(result, Failed):
                assert isinstance(result.error, InvalidInputError)
                out.append(Refused(result.error))
            else:
                out.append(Done(result))
        return out


def _settings(kafka_bootstrap: str, group_id: str, topic: str) -> Settings:
    return Settings(
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        group_id=group_id,
        requests_topic=topic,
        session_timeout_ms=6000,
        poll_timeout_ms=100,
        commit_interval_ms=100,
        retry_initial_backoff_s=0.1,
        retry_max_backoff_s=0.5,
        max_batch_records=50,
    )


@contextlib.asynccontextmanager
async def _run_loop(
    settings: Settings, handler: _EchoHandler, producer: OutputProducer, health: _Health
) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    loop = StreamLoop(
        path="recall",
        topic=settings.requests_topic,
        consumer=build_consumer(settings, path="recall"),
        handler=handler,
        dead_letters=DeadLetterPublisher(settings.requests_dlq),
        health=health,
        options=LoopOptions.from_settings(settings),
        output=producer,
    )
    async with loop:
        task = asyncio.create_task(loop.run(stop))
        try:
            yield stop
        finally:
            stop.set()
            await task


def _values(records: Sequence[Any]) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in records]


async def test_loop_outputs_in_key_order_dead_letters_and_commits(
    kafka_bootstrap: str, group_id: str, make_topic: MakeTopic
) -> None:
    """Good records are copied per key in order, a bad one is dead-lettered with headers, offsets pass all."""
    topic = await make_topic(partitions=2)
    out = await make_topic(partitions=2)
    settings = _settings(kafka_bootstrap, group_id, topic)
    items: list[tuple[bytes | None, bytes]] = []
    for n in range(30):
        key = f"k{n % 4}".encode()
        body: dict[str, Any] = {"k": key.decode(), "n": n}
        if n == 13:
            body["bad"] = True
        items.append((key, json.dumps(body).encode()))
    await produce(kafka_bootstrap, topic, items, headers=[("traceparent", b"00-abc-def-01")])

    health = _Health()
    async with OutputProducer(settings) as producer:
        handler = _EchoHandler(out)
        async with _run_loop(settings, handler, producer, health):
            outputs = await read_topic(kafka_bootstrap, out, until=lambda rs: len(rs) >= 29)
            letters = await read_topic(kafka_bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1)
            end = {p: o for p, o in (await _end_offsets(kafka_bootstrap, topic)).items() if o > 0}
            committed = await wait_committed(kafka_bootstrap, group_id, topic, end)

    assert sorted(v["n"] for v in _values(outputs)) == [n for n in range(30) if n != 13]
    for name in ("k0", "k1", "k2", "k3"):
        seen = [v["n"] for v in _values(outputs) if v["k"] == name]
        assert seen == sorted(seen)
    assert len(letters) == 1
    assert letters[0].value == items[13][1]
    assert letters[0].key == items[13][0]
    info = parse_dead_letter_headers(letters[0].headers)
    assert info.error_type == "EventValidationError"
    assert info.source_topic == topic
    bad_input = await _inputs(kafka_bootstrap, topic, 13)
    assert [(info.source_partition, info.source_offset)] == [(r.partition, r.offset) for r in bad_input]
    assert ("traceparent", b"00-abc-def-01") in info.headers
    assert committed == end


async def test_loop_retries_an_outage_without_dead_letters(
    kafka_bootstrap: str, group_id: str, make_topic: MakeTopic
) -> None:
    """A storage outage is retried with intake paused and readiness down; nothing is dead-lettered."""
    topic = await make_topic(partitions=1)
    out = await make_topic(partitions=1)
    settings = _settings(kafka_bootstrap, group_id, topic)
    items = [(b"k", json.dumps({"k": "k", "n": n}).encode()) for n in range(10)]
    await produce(kafka_bootstrap, topic, items)

    health = _Health()
    async with OutputProducer(settings) as producer:
        handler = _EchoHandler(out, outages=3)
        async with _run_loop(settings, handler, producer, health):
            outputs = await read_topic(kafka_bootstrap, out, until=lambda rs: len(rs) >= 10)
            await wait_committed(kafka_bootstrap, group_id, topic, {0: 10})
    letters = await read_all(kafka_bootstrap, settings.requests_dlq, settle_s=0.5)

    assert [v["n"] for v in _values(outputs)] == list(range(10))
    assert letters == []
    assert handler.calls >= 4
    states = [(ready, reason) for component, ready, reason in health.ready if component == "recall"]
    assert any(not ready and "mongodb" in reason for ready, reason in states)
    assert states[-2][0] is True  # ready again before stopping


async def test_loop_waits_for_a_missing_input_topic_then_consumes_it(
    kafka_bootstrap: str, group_id: str, make_topic: MakeTopic
) -> None:
    """Started before its input topic exists, the loop reports not-ready saying why, and once the topic is
    created it joins and reads it (a plain subscribe would sit on an empty assignment for minutes)."""
    topic = infra.unique_name("t-")
    out = await make_topic(partitions=1)
    settings = _settings(kafka_bootstrap, group_id, topic)
    health = _Health()
    async with OutputProducer(settings) as producer:
        handler = _EchoHandler(out)
        async with _run_loop(settings, handler, producer, health):
            await asyncio.wait_for(health.not_ready.wait(), 30)
            await make_topic(partitions=1, name=topic)
            await produce(
                kafka_bootstrap, topic, [(b"k", json.dumps({"k": "k", "n": n}).encode()) for n in range(5)]
            )
            outputs = await read_topic(kafka_bootstrap, out, until=lambda rs: len(rs) >= 5)

    assert [v["n"] for v in _values(outputs)] == list(range(5))
    states = [(ready, reason) for component, ready, reason in health.ready if component == "recall"]
    assert states[0] == (False, f"input topic {topic!r} does not exist")
    assert (True, "") in states[1:]


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: off for tp, off in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def _inputs(bootstrap: str, topic: str, n: int) -> list[Any]:
    records = await read_topic(bootstrap, topic, until=lambda rs: len(rs) >= 30)
    return [r for r in records if json.loads(r.value)["n"] == n]
