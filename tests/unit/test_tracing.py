"""Tracing on the OpenTelemetry API: when it is on, the propagation headers of an output, and the log ids."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from message_history import tracing
from message_history.logs import JsonFormatter

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
INCOMING = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()


@dataclass
class FakeRecord:
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    topic: str = "agent.requests"
    partition: int = 0
    offset: int = 7


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)


def _traceparents(headers: list[tuple[str, bytes]]) -> list[bytes]:
    return [v for k, v in headers if k.lower() == "traceparent"]


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_sdk_configured_by_the_standard_variables(env: dict[str, str], on: bool) -> None:
    """Traces are exported only when an exporter or an OTLP endpoint is named, and the SDK is not disabled."""
    assert tracing.sdk_configured(env) is on


def test_tracing_is_off_without_an_sdk_provider() -> None:
    """The API alone: no batch span, and an output's headers are the input's, unchanged."""
    assert not tracing.enabled()
    record = FakeRecord([("traceparent", INCOMING), ("x", b"1")])
    batch = tracing.BatchSpans("recall", [record])
    batch.start(0, record)
    assert batch.span(0) is None
    assert batch.headers(0, record) == record.headers


def test_output_carries_exactly_one_traceparent_the_record_spans(spans: InMemorySpanExporter) -> None:
    """Every incoming traceparent/tracestate (any case, repeated) is replaced by one of the record's span."""
    record = FakeRecord(
        [("traceparent", INCOMING), ("x", b"1"), ("TraceParent", INCOMING), ("tracestate", b"vendor=1")]
    )
    batch = tracing.BatchSpans("recall", [record])
    batch.start(0, record)
    span = batch.span(0)
    assert span is not None
    out = batch.headers(0, record)
    ctx = span.get_span_context()
    assert _traceparents(out) == [f"00-{TRACE_ID}-{ctx.span_id:016x}-01".encode()]
    assert ("x", b"1") in out
    # the incoming tracestate is carried by the span context, so it comes out once, from the span
    assert [v for k, v in out if k.lower() == "tracestate"] == [b"vendor=1"]
    batch.end_when_done(0, _Done())
    batch.close()
    finished = {s.name: s for s in spans.get_finished_spans()}
    record_span, batch_span = finished["recall"], finished["recall batch"]
    assert record_span.parent is not None
    assert f"{record_span.parent.span_id:016x}" == PARENT_ID
    assert [link.context.span_id for link in record_span.links] == [batch_span.context.span_id]
    assert record_span.attributes is not None
    assert record_span.attributes["messaging.kafka.offset"] == 7


def test_appending_instead_of_replacing_would_duplicate() -> None:
    """What the replacement guards against: injecting into the copied headers leaves two traceparents."""
    headers = [("traceparent", INCOMING)]
    carrier: dict[str, str] = {}
    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("s")
    from opentelemetry import propagate  # noqa: PLC0415

    propagate.inject(carrier, context=trace.set_span_in_context(span))
    appended = headers + [(k, v.encode()) for k, v in carrier.items()]
    assert len(_traceparents(appended)) == 2
    assert len(_traceparents(tracing.output_headers(headers, span))) == 1


def test_a_failed_batch_fails_its_open_record_spans(spans: InMemorySpanExporter) -> None:
    """Spans of records that got no output when the batch raised (an outage) end in error, not leak."""
    records = [FakeRecord(), FakeRecord(offset=8)]

    def fail_batch() -> None:
        with tracing.batch_spans("persist", records) as batch:
            for index, record in enumerate(records):
                batch.start(index, record)
            raise ConnectionError("mongodb down")

    with pytest.raises(ConnectionError):
        fail_batch()
    statuses = sorted((s.name, s.status.status_code.name) for s in spans.get_finished_spans())
    assert statuses == [("persist", "ERROR"), ("persist", "ERROR"), ("persist batch", "ERROR")]


def test_log_lines_carry_the_current_spans_ids(spans: InMemorySpanExporter) -> None:
    """Inside a record's span a JSON log line has its trace_id and span_id; outside, neither."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test-tracing-ids")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with tracing.output_span("dead-letter", FakeRecord([("traceparent", INCOMING)])) as span:
            logger.info("inside")
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert span is not None
    assert inside["trace_id"] == TRACE_ID
    assert inside["span_id"] == f"{span.get_span_context().span_id:016x}"
    assert "trace_id" not in outside


PROBE = """
import json
from opentelemetry import trace
from message_history.app.process import start_tracing
stop = start_tracing()
print(json.dumps({"started": stop is not None, "provider": type(trace.get_tracer_provider()).__name__}))
if stop:
    stop()
"""


@pytest.mark.parametrize(
    ("env", "started", "provider"),
    [
        ({"OTEL_TRACES_EXPORTER": "console"}, True, "TracerProvider"),
        ({"OTEL_TRACES_EXPORTER": "none"}, False, "ProxyTracerProvider"),
        ({}, False, "ProxyTracerProvider"),
    ],
)
def test_service_sets_up_the_sdk_only_when_configured(
    env: dict[str, str], started: bool, provider: str
) -> None:
    """`start_tracing` installs the SDK provider from OTEL_* (checked in a fresh interpreter)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, **env},
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == {"started": started, "provider": provider}


class _Done:
    """A resolved acknowledgement: calls back at once."""

    def add_done_callback(self, callback: Any) -> None:
        callback(self)

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return None
