"""Span parentage across both paths and the SDK worker, with an in-memory exporter, on real Kafka and MongoDB.

request traceparent → recall span → enriched traceparent → worker's turn span → response traceparent → persist
span → persisted traceparent; every output (enriched, response, persisted, dead letter) has one traceparent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from message_history import tracing
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    encoded,
    fresh_settings,
    read_request_ids,
    request_event,
    request_id,
    running_service,
)
from tests.integration.stream_helpers import Record, produce, read_topic
from worker import AgentWorker, Turn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01".encode()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The service's and the worker's spans, in memory (tracing on for this test only)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.use_tracer_provider(provider)
    yield memory
    tracing.use_tracer_provider(None)
    provider.shutdown()


def _traceparents(record: Record) -> list[str]:
    return [v.decode() for k, v in record.headers or () if k.lower() == "traceparent"]


def _span_of(record: Record) -> str:
    """The span id an output's one traceparent names."""
    (value,) = _traceparents(record)
    version, trace_id, span_id, flags = value.split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    return span_id


def _hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def _parent(span: ReadableSpan) -> str | None:
    return f"{span.parent.span_id:016x}" if span.parent is not None else None


def _record_of(records: list[Record], rid: str) -> Record:
    return next(r for r in records if json.loads(r.value)["requestId"] == rid)


async def test_spans_chain_across_both_paths_and_the_worker(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, exporter: InMemorySpanExporter
) -> None:
    """Each hop's span is a child of the traceparent it read, and its output carries that span, once."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    for name in (settings.requests_topic, settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=2, name=name)
    bootstrap = settings.kafka_bootstrap_servers

    async def answer(turn: Turn) -> str:
        return "ok"

    rid = request_id("traced", 1)
    group = f"{settings.group_id}-agent"
    worker = AgentWorker.from_settings(answer, settings, group_id=group, handle_signals=False)
    async with running_service(settings), worker:
        run = asyncio.create_task(worker.run())
        try:
            await produce(
                bootstrap,
                settings.requests_topic,
                [encoded(request_event("traced", "u", 1, "hello"))],
                headers=[("traceparent", TRACEPARENT), ("x-tenant", b"acme")],
            )
            # a client that sent the header twice still gets one traceparent on every output
            await produce(
                bootstrap,
                settings.requests_topic,
                [encoded(request_event("twice", "u", 1, "hi"))],
                headers=[("traceparent", TRACEPARENT), ("traceparent", TRACEPARENT)],
            )
            bad = [(b"bad", b"not json")]
            await produce(bootstrap, settings.requests_topic, bad, headers=[("traceparent", TRACEPARENT)])
            persisted = await read_request_ids(bootstrap, settings.persisted_topic, 2)
            enriched = await read_request_ids(bootstrap, settings.enriched_topic, 2)
            responses = await read_request_ids(bootstrap, settings.responses_topic, 2)
            letters = await read_topic(bootstrap, settings.requests_dlq, until=lambda r: len(r) >= 1)
        finally:
            worker.stop()
            await asyncio.wait_for(run, 30)

    for record in [*persisted, *enriched, *responses, *letters]:
        assert len(_traceparents(record)) == 1, (record.topic, record.headers)
    spans = exporter.get_finished_spans()
    by_id = {_hex(s): s for s in spans}
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)

    def attribute(span: ReadableSpan, key: str) -> Any:
        return (span.attributes or {}).get(key)

    recall = next(s for s in by_name["recall"] if attribute(s, "messaging.message.id") == rid)
    assert _parent(recall) == CLIENT_SPAN
    assert len(recall.links) == 1
    assert by_id[_hex_link(recall.links[0])].name == "recall batch"
    enriched_record = _record_of(enriched, rid)
    assert _span_of(enriched_record) == _hex(recall)
    assert ("x-tenant", b"acme") in list(enriched_record.headers)

    turn = next(s for s in by_name["agent turn"] if attribute(s, "messaging.message.id") == rid)
    assert _parent(turn) == _hex(recall)
    assert _span_of(_record_of(responses, rid)) == _hex(turn)

    persist = next(s for s in by_name["persist"] if attribute(s, "messaging.message.id") == rid)
    assert _parent(persist) == _hex(turn)
    assert _span_of(_record_of(persisted, rid)) == _hex(persist)
    assert len(persist.links) == 1
    assert by_id[_hex_link(persist.links[0])].name == "persist batch"

    # the refused record: a failed recall span, and a dead-letter span whose context the dead letter carries
    (letter,) = letters
    dead = by_id[_span_of(letter)]
    assert dead.name == "dead-letter"
    assert _parent(dead) == CLIENT_SPAN
    failed = [s for s in by_name["recall"] if s.status.status_code.name == "ERROR"]
    assert [attribute(s, "error.type") for s in failed] == ["EventValidationError"]
    assert {s.context.trace_id for s in spans if s.parent is not None} == {int(TRACE_ID, 16)}


def _hex_link(link: Any) -> str:
    return f"{link.context.span_id:016x}"
