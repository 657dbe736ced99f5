"""Spans on the OpenTelemetry API: one per record on each path, linked to its batch, and the outputs' headers.

Only `opentelemetry-api` is imported here. Without an SDK (the `[otel]` extra, set up by `service.main` from
the standard `OTEL_*` variables, or by `opentelemetry-instrument`) tracing is off: `enabled()` is one
isinstance check per batch, no span is started and the outputs carry the input record's headers unchanged.

When it is on, each record gets a span that is a child of the `traceparent` it arrived with and links to its
batch's span; the record's outputs (enriched, persisted, dead letter, the worker's response) carry that span's
context: the propagator's headers (`traceparent`, `tracestate` unless empty) replace the input's of the same
name, so an output has exactly one `traceparent`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
)

from message_history import __version__
from message_history.errors import error_type

Headers = list[tuple[str, bytes]]

TRACE_HEADERS: Final = frozenset({"traceparent", "tracestate"})
"""Always replaced on an output when tracing is on, even if the propagator writes no `tracestate`."""

INSTRUMENTATION: Final = "message-history"

_override: trace.TracerProvider | None = None


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Trace with `provider` instead of the global one (tests; `None` goes back to the global)."""
    global _override  # noqa: PLW0603 -- the one test seam, like the global provider it stands in for
    _override = provider


def enabled() -> bool:
    """True when spans are recorded somewhere: a provider other than the API's no-op ones is in place."""
    if _override is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def sdk_configured(env: Mapping[str, str]) -> bool:
    """Whether the standard `OTEL_*` variables ask for exported traces (the service then sets up the SDK).

    `OTEL_SDK_DISABLED=true` turns it off; `OTEL_TRACES_EXPORTER` (other than `none`) or an OTLP endpoint
    (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns it on. Nothing set: off, so a
    service without a collector does not try to export to the default endpoint.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return any(name.strip() not in ("", "none") for name in exporters.split(","))
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


_cached: tuple[trace.TracerProvider, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """This package's tracer from the current provider (cached: the SDK builds a new one per call)."""
    global _cached  # noqa: PLW0603 -- a cache of one, renewed when the provider changes
    provider = _override or trace.get_tracer_provider()
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(INSTRUMENTATION, __version__))
    return cached[1]


class _HeaderGetter(Getter[Sequence[tuple[str, bytes | None]]]):
    """Reads Kafka headers (a list of pairs); the first of repeated names wins, names compared lowercase."""

    def get(self, carrier: Sequence[tuple[str, bytes | None]], key: str) -> list[str] | None:
        values = [(v or b"").decode("latin-1") for k, v in carrier if k.lower() == key]
        return values or None

    def keys(self, carrier: Sequence[tuple[str, bytes | None]]) -> list[str]:
        return [k for k, _ in carrier]


_GETTER: Final = _HeaderGetter()


def parent_context(headers: Sequence[tuple[str, bytes | None]] | None) -> Context:
    """The context the headers propagate (the global propagator: W3C trace context and baggage by default)."""
    return propagate.extract(list(headers or ()), getter=_GETTER)


def output_headers(headers: Sequence[tuple[str, bytes]], span: Span | None) -> Headers:
    """`headers` with the propagation headers replaced by `span`'s context (`span` None: unchanged)."""
    if span is None:
        return list(headers)
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    replaced = TRACE_HEADERS | {k.lower() for k in carrier}
    kept = [(k, v) for k, v in headers if k.lower() not in replaced]
    return kept + [(k, v.encode("latin-1")) for k, v in carrier.items()]


def kafka_attributes(record: Any) -> dict[str, Any]:
    """The messaging attributes of a consumed aiokafka record (semantic conventions' names)."""
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
    }


def fail(span: Span | None, error: BaseException) -> None:
    """Mark `span` failed with `error`'s type (our errors' `error_type`) and message, and end it."""
    if span is None:
        return
    span.set_attribute("error.type", error_type(error))
    span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
    span.end()


def end_when_done(span: Span | None, ack: Any) -> None:
    """End `span` when `ack` (an asyncio future: Kafka's acknowledgement) resolves; failed if it failed."""
    if span is None:
        return

    def finish(future: Any) -> None:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            fail(span, error)
        else:
            span.end()

    ack.add_done_callback(finish)


class BatchSpans:
    """A batch's span and one span per record, by index; every method is a no-op when tracing is off."""

    __slots__ = ("_batch", "_closed", "_path", "_spans", "_tracer")

    def __init__(self, path: str, records: Sequence[Any]) -> None:
        self._path = path
        self._batch: Span | None = None
        self._spans: list[Span | None] = []
        self._closed: set[int] = set()  # records whose span is ended, or will be when their ack resolves
        self._tracer: trace.Tracer | None = None
        if enabled():
            self._tracer = tracer()
            self._batch = self._tracer.start_span(
                f"{path} batch",
                kind=SpanKind.INTERNAL,
                attributes={"messaging.batch.message_count": len(records), "message_history.path": path},
            )
            self._spans = [None] * len(records)

    def start(self, index: int, record: Any) -> None:
        """Start record `index`'s span: a child of its `traceparent`, linked to the batch span."""
        if self._batch is None or self._tracer is None:
            return
        self._spans[index] = self._tracer.start_span(
            self._path,
            context=parent_context(record.headers),
            kind=SpanKind.CONSUMER,
            links=[Link(self._batch.get_span_context())],
            attributes={**kafka_attributes(record), "message_history.path": self._path},
        )

    def span(self, index: int) -> Span | None:
        return self._spans[index] if self._batch is not None else None

    def identify(self, index: int, request_id: str) -> None:
        """Name the record's turn on its span, once decoded."""
        span = self.span(index)
        if span is not None:
            span.set_attribute("messaging.message.id", request_id)

    def headers(self, index: int, record: Any) -> Headers:
        """The record's headers for its output, carrying the record span's context."""
        return output_headers([(k, v or b"") for k, v in record.headers or ()], self.span(index))

    def fail(self, index: int, error: BaseException) -> None:
        """The record was refused (a dead letter) or its work failed: its span ends in error."""
        span = self.span(index)
        if span is not None and index not in self._closed:
            self._closed.add(index)
            fail(span, error)

    def end_when_done(self, index: int, ack: Any) -> None:
        span = self.span(index)
        if span is not None and index not in self._closed:
            self._closed.add(index)
            end_when_done(span, ack)

    @contextlib.contextmanager
    def current(self, index: int | None = None) -> Iterator[None]:
        """Make the record's span (or the batch's) current, so log lines carry its trace and span ids."""
        span = self._batch if index is None else self.span(index)
        if span is None:
            yield
            return
        with trace.use_span(span, end_on_exit=False):
            yield

    def close(self, error: BaseException | None = None) -> None:
        """End the batch span and any record span still open (failed, when the batch raised `error`)."""
        if self._batch is None:
            return
        for index, span in enumerate(self._spans):
            if span is None or index in self._closed:
                continue
            if error is not None:
                fail(span, error)
            else:
                span.end()
        if error is not None:
            self._batch.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._batch.end()


@contextlib.contextmanager
def batch_spans(path: str, records: Sequence[Any]) -> Iterator[BatchSpans]:
    """`BatchSpans` for a batch, closed on exit (open record spans failed if the batch raised)."""
    spans = BatchSpans(path, records)
    try:
        with spans.current():
            yield spans
    except BaseException as exc:
        spans.close(exc)
        raise
    spans.close()


@contextlib.contextmanager
def output_span(name: str, record: Any, **attributes: Any) -> Iterator[Span | None]:
    """A span for one output written for `record` (a dead letter, a worker's turn), current inside the block.

    A child of the record's `traceparent`; None when tracing is off. An exception marks it failed.
    """
    if not enabled():
        yield None
        return
    span = tracer().start_span(
        name,
        context=parent_context(record.headers),
        kind=SpanKind.CONSUMER,
        attributes={**kafka_attributes(record), **attributes},
    )
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield span
    except BaseException as exc:
        fail(span, exc)
        raise
    span.end()
