"""`python -m bench.stepwatch TRACE MODULE [ARGS...]`: run `python -m MODULE ARGS...` with its steps recorded.

For `python -m bench steps`: where an idle turn's milliseconds go inside a process, without touching its
code. Before the module runs, this installs, in that process only:

* a PyMongo command listener (`pymongo.monitoring`): every command's name, collection, start and duration;
* wrappers of aiokafka's `AIOKafkaConsumer.getmany` (when a record with a `bench-seq` header came out of a
  fetch), `AIOKafkaProducer.send` (when an output carrying it was handed to the producer) and the send's
  future (when the broker acknowledged it), and `AIOKafkaConsumer.commit` (start and end);
* with `--spans`, an OpenTelemetry SDK provider whose spans (the service's batch and record spans,
  `message_history.tracing`) are written too. Tracing costs the service its own work: off by default.

Each event is one JSON line in TRACE, timed by `time.time()` (the same clock as the harness, on one machine).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

SEQ_HEADER = "bench-seq"


class Trace:
    """Appends JSON lines to a file, from any thread (the listener may be called off the event loop)."""

    def __init__(self, path: str) -> None:
        self._out: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 -- lives as long as the process
        self._lock = threading.Lock()

    def write(self, **event: Any) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._out.write(line + "\n")


def seq_of(headers: Iterable[tuple[str, bytes | None]] | None) -> int | None:
    for key, value in headers or ():
        if key == SEQ_HEADER and value:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _install_mongo(trace: Trace) -> None:
    from pymongo import monitoring  # noqa: PLC0415 -- only in the watched process

    started: dict[int, tuple[float, str, str]] = {}

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            target = event.command.get(event.command_name)
            collection = target if isinstance(target, str) else ""
            started[event.request_id] = (time.time(), event.command_name, collection)

        def _done(self, event: Any, ok: bool) -> None:
            begun = started.pop(event.request_id, None)
            if begun is None:
                return
            t0, name, collection = begun
            trace.write(k="mongo", cmd=name, coll=collection, t0=t0, dt=event.duration_micros / 1e6, ok=ok)

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            self._done(event, True)

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            self._done(event, False)

    monitoring.register(Listener())


def _install_kafka(trace: Trace) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: PLC0415

    getmany, send, commit = AIOKafkaConsumer.getmany, AIOKafkaProducer.send, AIOKafkaConsumer.commit

    async def watched_getmany(self: Any, *partitions: Any, **kwargs: Any) -> Any:
        fetched = await getmany(self, *partitions, **kwargs)
        now = time.time()
        for records in fetched.values():
            for record in records:
                seq = seq_of(record.headers)
                if seq is not None:
                    trace.write(k="in", seq=seq, topic=record.topic, t=now)
        return fetched

    async def watched_send(self: Any, topic: str, *args: Any, **kwargs: Any) -> Any:
        now = time.time()
        future = await send(self, topic, *args, **kwargs)
        headers = kwargs.get("headers")
        if headers is None and len(args) >= 5:
            headers = args[4]
        seq = seq_of(headers)
        if seq is not None:
            trace.write(k="send", seq=seq, topic=topic, t=now, queued=time.time())
            future.add_done_callback(lambda _: trace.write(k="ack", seq=seq, topic=topic, t=time.time()))
        return future

    async def watched_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return await commit(self, *args, **kwargs)
        finally:
            trace.write(k="commit", t0=t0, dt=time.time() - t0)

    AIOKafkaConsumer.getmany = watched_getmany
    AIOKafkaProducer.send = watched_send
    AIOKafkaConsumer.commit = watched_commit


def _install_spans(trace: Trace) -> None:
    from opentelemetry import trace as otel  # noqa: PLC0415
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Exporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                trace.write(
                    k="span",
                    name=span.name,
                    t0=(span.start_time or 0) / 1e9,
                    t1=(span.end_time or 0) / 1e9,
                    offset=(span.attributes or {}).get("messaging.kafka.offset"),
                )
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Exporter()))
    otel.set_tracer_provider(provider)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    spans = "--spans" in args
    if spans:
        args.remove("--spans")
    if len(args) < 2:
        print("usage: python -m bench.stepwatch TRACE [--spans] MODULE [ARGS...]", file=sys.stderr)
        return 2
    trace = Trace(args[0])
    trace.write(k="start", pid=os.getpid(), t=time.time())
    _install_mongo(trace)
    _install_kafka(trace)
    if spans:
        _install_spans(trace)
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
