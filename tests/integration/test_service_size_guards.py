"""Writes MongoDB or Kafka would refuse for their size are dead letters naming the limit; the rest goes on."""

from __future__ import annotations

import pytest

from schemas.dead_letters import parse_dead_letter_headers
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    read_request_ids,
    request_event,
    response_event,
    running_service,
    stored_messages,
    text_message,
    values,
)
from tests.integration.stream_helpers import produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MIB = 1024 * 1024


async def test_a_message_over_mongodbs_document_limit_is_dead_lettered_and_the_rest_stored(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """A 17 MiB message (`max_event_bytes` allows it) is a dead letter naming MongoDB's 16 MiB limit.

    The responses before and after it in the same batch are stored. Without the check, PyMongo refuses the
    whole bulk write (`DocumentTooLarge`) and the persist loop stops. The dead letter goes without its value:
    17 MiB is over Kafka's record limit too (it says so, and where the record is).
    """
    settings = fresh_settings(kafka_bootstrap, mongo_uri, max_event_bytes=20 * MIB)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.responses_topic)
    huge = response_event("big", "u", 1, [text_message("user", "x" * (17 * MIB), id="huge")], "ok")
    items = [
        encoded(response_event("a", "u", 1, [text_message("user", "q", id="a-q")], "a1")),
        encoded(huge),
        encoded(response_event("b", "u", 1, [text_message("user", "q", id="b-q")], "b1")),
    ]
    # gzip keeps the 17 MiB of "x" a small batch, under the broker's default record limit
    await produce(
        bootstrap, settings.responses_topic, items, compression_type="gzip", max_request_size=40 * MIB
    )
    try:
        async with running_service(settings, only="persist"):
            letters = await read_topic(bootstrap, settings.responses_dlq, until=lambda rs: len(rs) >= 1)
            persisted = await read_request_ids(bootstrap, settings.persisted_topic, 2)
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)
    info = parse_dead_letter_headers(letters[0].headers)
    assert (info.source_offset, info.error_type) == (1, "DocumentTooLargeError")
    assert "MongoDB's limit is 16777216 bytes (16 MiB)" in info.error_message
    assert letters[0].value == b""
    assert "is omitted from this dead letter" in info.error_message
    assert sorted(v["requestId"] for v in values(persisted)) == ["a-turn1", "b-turn1"]
    assert {r["thread_id"] for r in rows} == {"a", "b"}


async def test_a_recall_over_kafkas_record_limit_says_to_lower_last_messages(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """An EnrichedRequest over 1 MiB (history + input) is a dead letter saying what to lower; others go on."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    history = [text_message("user", "h" * 200_000, id=f"h{i}") for i in range(3)]
    try:
        async with running_service(settings):
            await produce(
                bootstrap, settings.responses_topic, [encoded(response_event("t", "u", 1, history, "ok"))]
            )
            await read_request_ids(bootstrap, settings.persisted_topic, 1)
            requests = [
                encoded(request_event("t", "u", 2, "y" * 600_000)),  # 600 kB + 600 kB of history
                encoded(request_event("other", "u", 1, "small")),
            ]
            await produce(bootstrap, settings.requests_topic, requests)
            letters = await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1)
            enriched = await read_request_ids(bootstrap, settings.enriched_topic, 1)
    finally:
        await drop_database(settings)
    info = parse_dead_letter_headers(letters[0].headers)
    assert info.error_type == "MessageSizeTooLargeError"
    assert "lower lastMessages" in info.error_message
    assert [v["requestId"] for v in values(enriched)] == ["other-turn1"]
