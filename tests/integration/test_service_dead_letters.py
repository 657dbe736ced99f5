"""Bad input on both paths goes to the dead-letter topics, untouched and explained; the stream goes on."""

from __future__ import annotations

import json

import pytest

from schemas.dead_letters import parse_dead_letter_headers
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    message_id,
    request_event,
    response_event,
    running_service,
    stored_messages,
    values,
)
from tests.integration.stream_helpers import produce, read_topic, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_poison_records_are_dead_lettered_and_the_rest_processed(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Not JSON, invalid, empty, oversized and foreign-owner records are dead-lettered; offsets pass all."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, max_event_bytes=2048)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)

    owned = request_event("owned", "alice", 1, "mine")
    oversized = request_event("big", "u", 1, "x" * 3000)
    requests: list[tuple[bytes | None, bytes | None]] = [
        encoded(request_event("a", "u", 1, "first")),
        (b"a", b"{not json"),
        encoded(request_event("b", "u", 1, "second")),
        (b"c", json.dumps({"schemaVersion": 1, "requestId": "r"}).encode()),
        encoded(oversized),
        encoded(request_event("a", "u", 2, "third")),
        encoded(request_event("owned", "mallory", 2, "not yours")),
        encoded(request_event("b", "u", 2, "fourth")),
    ]
    bad_requests = {1: "EventValidationError", 3: "EventValidationError", 4: "EventValidationError"}
    bad_requests[6] = "ThreadOwnershipError"
    responses: list[tuple[bytes | None, bytes | None]] = [
        encoded(response_event("owned", "alice", 1, owned["messages"], "ok")),
        encoded(response_event("owned", "mallory", 2, [], "stolen")),
        (b"x", b"[]"),
        (b"tombstone", None),
        encoded(response_event("d", "u", 1, [], "fine")),
    ]
    bad_responses = {1: "ThreadOwnershipError", 2: "EventValidationError", 3: "EventValidationError"}

    try:
        async with running_service(settings):
            # the owner's turn is stored before the foreign requests arrive
            await produce(bootstrap, settings.responses_topic, responses[:1])
            await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 1)
            await produce(bootstrap, settings.responses_topic, responses[1:])
            await produce(bootstrap, settings.requests_topic, requests)
            enriched = await read_topic(bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 4)
            persisted = await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 2)
            request_letters = await read_topic(
                bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= len(bad_requests)
            )
            response_letters = await read_topic(
                bootstrap, settings.responses_dlq, until=lambda rs: len(rs) >= len(bad_responses)
            )
            await wait_committed(bootstrap, settings.group_id, settings.requests_topic, {0: len(requests)})
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: len(responses)})
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)

    enriched_ids = [v["requestId"] for v in values(enriched)]
    assert sorted(enriched_ids) == ["a-turn1", "a-turn2", "b-turn1", "b-turn2"]
    for thread in ("a", "b"):  # per-thread order; threads may interleave either way
        mine = [i for i in enriched_ids if i.startswith(f"{thread}-")]
        assert mine == [f"{thread}-turn1", f"{thread}-turn2"]
    assert [v["requestId"] for v in values(persisted)] == ["owned-turn1", "d-turn1"]
    for letters, sent, bad, topic in (
        (request_letters, requests, bad_requests, settings.requests_topic),
        (response_letters, responses, bad_responses, settings.responses_topic),
    ):
        assert len(letters) == len(bad)
        for letter, (offset, error_type) in zip(letters, sorted(bad.items()), strict=True):
            info = parse_dead_letter_headers(letter.headers)
            assert (info.source_topic, info.source_partition, info.source_offset) == (topic, 0, offset)
            assert info.error_type == error_type
            assert info.error_message
            assert info.service_version
            assert (letter.key, letter.value) == sent[offset]
    # the refused turn wrote nothing: only the owner's messages are stored for "owned"
    assert sorted(r["id"] for r in rows if r["thread_id"] == "owned") == sorted(
        message_id("owned", "alice", 1, kind) for kind in ("input", "response")
    )


async def test_the_dead_letter_log_line_names_the_error_type(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning for a dead-lettered record carries the error's type name, as its metric label does."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    caplog.set_level("WARNING", logger="consumers.loop")
    try:
        async with running_service(settings, only="recall"):
            bootstrap = settings.kafka_bootstrap_servers
            await produce(bootstrap, settings.requests_topic, [(b"a", b"{not json")])
            await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1)
    finally:
        await drop_database(settings)
    [line] = [r for r in caplog.records if r.getMessage() == "dead-lettered a record"]
    assert line.__dict__["error_type"] == "EventValidationError"
