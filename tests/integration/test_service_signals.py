"""Transient signals through the running service, on real Kafka and a real MongoDB-wire server.

As Mastra 1.71 (docs/rules.md#r7): a transient signal in a turn's input or response is never saved, and
`agent.history.persisted` lists exactly what was written (or says `nothing-to-save` when that was all); the
model still sees a request's own transient signals, and token-budgeted recall skips stored ones (rows an
earlier version of this service saved), while count-capped recall returns them as Mastra's does.
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import AsyncMongoClient

from storage.mongodb import MongoHistoryStorage
from tests.conftest import MakeTopic
from tests.integration import service_harness as harness
from tests.integration.stream_helpers import produce, read_topic
from tests.rule_cases import RESOURCE, THREAD, msg, signal_msg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TRANSIENT = {"signal": {"type": "reactive", "tagName": "system-reminder", "transient": True}}
KEPT = {"signal": {"type": "notification", "tagName": "notification"}}


def _signal(id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    return {**harness.text_message("signal", f"<{id}/>", id=id), "content": {
        "format": 2, "parts": [{"type": "text", "text": f"<{id}/>"}], "metadata": metadata}}  # fmt: skip


async def test_a_transient_signal_is_not_saved_and_the_persisted_event_says_so(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Rows and `savedMessageIds` leave the transient signals out; a response of only one saves nothing."""
    settings = harness.fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.responses_topic)
    mixed = harness.response_event("t1", "u1", 1, [harness.text_message("user", "hi", id="u1")], "hello")
    mixed["input"].append(_signal("in-transient", TRANSIENT))
    mixed["response"] = [
        _signal("out-transient", TRANSIENT),
        harness.text_message("assistant", "hello", id="a1"),
        _signal("out-kept", KEPT),
    ]
    only = harness.response_event("t2", "u1", 1, [], "unused")
    only["response"] = [_signal("only-transient", TRANSIENT)]
    try:
        async with harness.running_service(settings):
            await produce(
                kafka_bootstrap, settings.responses_topic, [harness.encoded(mixed), harness.encoded(only)]
            )
            persisted = await read_topic(
                kafka_bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 2
            )
        rows = await harness.stored_messages(settings)
        threads = await harness.stored_threads(settings)
    finally:
        await harness.drop_database(settings)
    by_thread = {v["threadId"]: v for v in harness.values(persisted)}
    assert by_thread["t1"]["savedMessageIds"] == ["u1", "a1", "out-kept"]
    assert by_thread["t1"]["skipped"] is None
    assert by_thread["t2"]["savedMessageIds"] == []
    assert by_thread["t2"]["skipped"] == "nothing-to-save"
    assert by_thread["t2"]["threadUpdatedAt"] is None
    assert sorted(r["id"] for r in rows) == ["a1", "out-kept", "u1"]
    assert [t["id"] for t in threads] == ["t1"]


async def test_recall_keeps_the_turns_transient_signal_and_skips_stored_ones_under_a_budget(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The request's own transient signal is in the context; a stored one only without a token budget."""
    # two turns of one thread in one go, none answered: not what this test is about, so no waiting
    settings = harness.fresh_settings(kafka_bootstrap, mongo_uri, busy_thread="allow")
    await make_topic(partitions=1, name=settings.requests_topic)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri)
    storage = MongoHistoryStorage(client[settings.mongodb_database])
    # as an earlier version of this service saved them (Mastra 1.71 never does)
    stored = [msg("u0", t=1), signal_msg("s0", t=2), msg("a0", "assistant", t=3)]
    counted = harness.request_event(THREAD, RESOURCE, 1, "count-capped")
    counted["messages"].append(_signal("now-1", TRANSIENT))
    budgeted = harness.request_event(THREAD, RESOURCE, 2, "budgeted", memory={"maxTokens": 100_000})
    budgeted["messages"].append(_signal("now-2", TRANSIENT))
    try:
        await storage.ensure_indexes()
        await storage.save_messages(thread_id=THREAD, resource_id=RESOURCE, messages=stored)
        async with harness.running_service(settings):
            await produce(
                kafka_bootstrap,
                settings.requests_topic,
                [harness.encoded(counted), harness.encoded(budgeted)],
            )
            enriched = await read_topic(
                kafka_bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 2
            )
    finally:
        await client.close()
        await harness.drop_database(settings)
    contexts = {
        v["requestId"]: [(m["id"], m["source"]) for m in v["messages"]] for v in harness.values(enriched)
    }
    memory = [("u0", "memory"), ("s0", "memory"), ("a0", "memory")]
    assert contexts[counted["requestId"]] == [
        *memory,
        (harness.message_id(THREAD, RESOURCE, 1), "input"),
        ("now-1", "input"),
    ]
    assert contexts[budgeted["requestId"]] == [
        ("u0", "memory"),
        ("a0", "memory"),
        (harness.message_id(THREAD, RESOURCE, 2), "input"),
        ("now-2", "input"),
    ]
