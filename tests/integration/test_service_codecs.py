"""Every Kafka codec on both inputs, and record batches the service cannot read: dead letters, never a stop.

Producers are often configured with `compression.type` snappy, lz4 or zstd; aiokafka reads those only with
`cramjam` installed, and without it `getmany` raised for the whole partition and stopped the service.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import aiokafka.codec
import pytest
from aiokafka import AIOKafkaProducer

from schemas.dead_letters import parse_dead_letter_headers
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    read_request_ids,
    request_event,
    running_service,
    stored_messages,
    values,
    wave,
)
from tests.integration.stream_helpers import produce, read_all, read_topic, wait_committed
from tests.integration.test_replay import replay, simple_events

Item = tuple[bytes | None, bytes | None]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CODECS = ("gzip", "snappy", "lz4", "zstd")


@pytest.mark.parametrize("codec", CODECS)
async def test_inputs_in_every_codec_are_processed_and_outputs_use_the_setting(
    codec: str, kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Requests and responses compressed with `codec` are all processed; the outputs are written with it."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, output_compression=codec)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=2, name=settings.requests_topic)
    await make_topic(partitions=2, name=settings.responses_topic)
    threads = ["t1", "t2", "t3"]
    requests, responses = wave(threads, range(1, 4))
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, requests, compression_type=codec)
            await produce(bootstrap, settings.responses_topic, responses, compression_type=codec)
            enriched = await read_request_ids(bootstrap, settings.enriched_topic, len(requests))
            persisted = await read_request_ids(bootstrap, settings.persisted_topic, len(responses))
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)
    assert {v["requestId"] for v in values(enriched)} == {json.loads(v)["requestId"] for _, v in requests}
    assert all(v["skipped"] is None for v in values(persisted))
    assert len({r["id"] for r in rows}) == 2 * len(responses)  # the user and the assistant message per turn


async def _produce_to(
    bootstrap: str, topic: str, partition: int, items: Sequence[Item], codec: str | None
) -> None:
    """`items` to one partition as one record batch (linger), compressed with `codec`."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=100)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v, partition=partition) for k, v in items]
        for future in futures:
            await future
    finally:
        await producer.stop()


async def test_a_batch_the_service_cannot_decompress_is_dead_lettered_and_the_stream_goes_on(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snappy batch the service cannot read, a Schema Registry value and garbage are dead letters.

    The records around them, on the same partition and on another one, are enriched; the offsets pass them.
    Without `consumers.unreadable`, `getmany` raises `UnsupportedCodecError` and the recall loop stops.
    """
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    topic = settings.requests_topic
    await make_topic(partitions=2, name=topic)

    def good(thread: str, turn: int) -> tuple[bytes, bytes]:
        return encoded(request_event(thread, "u", turn, f"q{turn}"))

    registry_framed = b"\x00\x00\x00\x00\x2a" + json.dumps(request_event("sr", "u", 1, "x")).encode()
    await _produce_to(bootstrap, topic, 0, [good("a", 1), good("a", 2)], None)
    await _produce_to(bootstrap, topic, 0, [good("z", 1), good("z", 2), good("z", 3)], "snappy")  # 2..4
    bad = [(b"g", b"\xff\xfe garbage"), (b"sr", registry_framed)]
    await _produce_to(bootstrap, topic, 0, [good("a", 3), *bad], None)  # 5..7
    await _produce_to(bootstrap, topic, 1, [good("b", 1), good("b", 2), good("b", 3)], None)
    await _produce_to(bootstrap, topic, 0, [good("a", 4)], None)  # offset 8

    # The service (in this process) cannot read snappy, as it could not before cramjam was a dependency.
    monkeypatch.setattr(aiokafka.codec, "has_snappy", lambda: False)
    try:
        async with running_service(settings):
            letters = await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 5)
            enriched = await read_request_ids(bootstrap, settings.enriched_topic, 7)
            await wait_committed(bootstrap, settings.group_id, topic, {0: 9, 1: 3})
    finally:
        await drop_database(settings)

    assert sorted({v["requestId"] for v in values(enriched)}) == [
        "a-turn1",
        "a-turn2",
        "a-turn3",
        "a-turn4",
        "b-turn1",
        "b-turn2",
        "b-turn3",
    ]
    infos = {
        parse_dead_letter_headers(r.headers).source_offset: (r, parse_dead_letter_headers(r.headers))
        for r in letters
    }
    assert sorted(infos) == [2, 3, 4, 6, 7]
    for offset in (2, 3, 4):
        record, info = infos[offset]
        assert info.error_type == "UnreadableRecordError"
        assert "snappy" in info.error_message
        assert "cramjam" in info.error_message
        assert record.value == b""
    assert infos[6][1].error_type == "EventValidationError"
    assert "Schema Registry" in infos[7][1].error_message
    assert "schema id 42" in infos[7][1].error_message
    assert infos[7][0].value == registry_framed  # the original bytes, untouched


async def test_replay_reads_every_codec_and_dead_letters_a_batch_it_cannot_decompress(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`replay` saves responses written in each codec; a batch it cannot read is dead-lettered, not a stop."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    topic = settings.responses_topic
    await make_topic(partitions=1, name=topic)
    events = simple_events(len(CODECS) + 1)
    for item, codec in zip(events, CODECS, strict=False):
        await _produce_to(kafka_bootstrap, topic, 0, [item], codec)  # offsets 0..3
    try:
        result, printed = await replay(settings, "--from-beginning")
        assert result.exit_code == 0, printed
        assert result.counts.persisted == len(CODECS)

        await _produce_to(kafka_bootstrap, topic, 0, [events[0], events[1]], "snappy")  # 4, 5: unreadable
        await _produce_to(kafka_bootstrap, topic, 0, [events[-1]], None)  # 6
        monkeypatch.setattr(aiokafka.codec, "has_snappy", lambda: False)
        result, printed = await replay(settings, "--from-offsets", "0:4")
        assert result.exit_code == 0, printed
        assert (result.counts.invalid, result.counts.dead_lettered, result.counts.persisted) == (2, 2, 1)
        letters = await read_all(kafka_bootstrap, settings.responses_dlq)
        infos = [parse_dead_letter_headers(r.headers) for r in letters]
        assert [(i.source_offset, i.error_type) for i in infos] == [
            (4, "UnreadableRecordError"),
            (5, "UnreadableRecordError"),
        ]
        assert len({r["id"] for r in await stored_messages(settings)}) == 2 * len(events)
    finally:
        await drop_database(settings)
