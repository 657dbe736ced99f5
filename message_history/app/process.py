"""Process set-up of `message-history run`, once at start: the OpenTelemetry SDK when `OTEL_*` asks for it
(`start_tracing`) and the garbage collector's settings (`tune_gc`)."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Mapping

from message_history import __version__, tracing
from message_history.settings import Settings

log = logging.getLogger(__name__)


def start_tracing(env: Mapping[str, str] = os.environ) -> Callable[[], None] | None:
    """The OpenTelemetry SDK as the `OTEL_*` variables configure it; returns its shutdown (flushes spans).

    Only when they ask for traces (`tracing.sdk_configured`), the `[otel]` extra is installed and no provider
    is in place yet (`opentelemetry-instrument` may have set one: it is used as is). The SDK reads the rest
    itself: `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_*`, `OTEL_BSP_*`, `OTEL_RESOURCE_ATTRIBUTES`.
    """
    if not tracing.sdk_configured(env) or tracing.enabled():
        return None
    try:
        from opentelemetry import trace  # noqa: PLC0415 -- the SDK is optional
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("OTEL_* asks for traces but the SDK is missing: pip install 'message-history[otel]'")
        return None
    attributes = {"service.version": __version__}
    if "OTEL_SERVICE_NAME" not in env and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "message-history"
    provider = TracerProvider(resource=Resource.create(attributes))
    listed = env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
    names = [n.strip() for n in listed if n.strip() not in ("", "none")]
    for name in names:
        exporter: SpanExporter
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )

            exporter = OTLPSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER entry ignored", extra={"exporter": name})
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"exporters": names})
    return provider.shutdown


def tune_gc(settings: Settings) -> None:
    """The collector's settings, once start-up's imports are done (see `Settings.gc_freeze`)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(settings.gc_threshold, older, oldest)
    if settings.gc_freeze:
        gc.collect()  # start-up's garbage goes now rather than being frozen with the rest
        gc.freeze()
