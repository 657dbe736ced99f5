"""Prometheus metrics of the service, in one registry, served at `/metrics`.

Label values are bounded sets (path, topic, stage, dependency, error type, partition): never ids or payloads.

The registry is private (tests and the replay command import this module without touching the global one),
so the standard process, platform and GC collectors that `prometheus_client` puts on its default registry are
registered here explicitly: dashboards expect `process_cpu_seconds_total`, `process_resident_memory_bytes`,
`python_info` and `python_gc_*` next to the service's own series. `message_history_build_info` says which
version runs (constant 1, the facts in labels, as Prometheus' own `*_build_info`).
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from message_history import __version__

REGISTRY = CollectorRegistry(auto_describe=True)

# The collectors the default registry has, as new instances bound to ours.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

BUILD_LIBRARIES = ("aiokafka", "pymongo", "pydantic", "prometheus-client")


def _library_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # a source tree without the dependency installed: say so, do not fail
        return "unknown"


def build_labels() -> dict[str, str]:
    """Labels of `message_history_build_info`: the service's version, Python's, and its main libraries'."""
    labels = {
        "version": __version__,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }
    labels.update({name.replace("-", "_"): _library_version(name) for name in BUILD_LIBRARIES})
    return labels


BUILD_INFO = Info(
    "message_history_build",
    "Version of the running service, of Python and of its main libraries (always 1).",
    registry=REGISTRY,
)
BUILD_INFO.info(build_labels())

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)


def _counter(name: str, documentation: str, *labels: str) -> Counter:
    return Counter(name, documentation, labels, registry=REGISTRY)


def _gauge(name: str, documentation: str, *labels: str) -> Gauge:
    return Gauge(name, documentation, labels, registry=REGISTRY)


def _histogram(name: str, documentation: str, *labels: str, buckets: Sequence[float]) -> Histogram:
    return Histogram(name, documentation, labels, buckets=buckets, registry=REGISTRY)


RECORDS_CONSUMED = _counter("message_history_records_consumed", "Records read from an input topic.", "path")
RECORDS_PRODUCED = _counter(
    "message_history_records_produced", "Records acknowledged by Kafka on an output topic.", "topic"
)
DEAD_LETTERS = _counter(
    "message_history_dead_letters",
    "Records sent to a dead-letter topic, by error type.",
    "path",
    "error_type",
)
UNEXPECTED_ERRORS = _counter(
    "message_history_unexpected_errors",
    "Records dead-lettered for an unexpected exception (a bug, not bad input), by path and exception class.",
    "path",
    "error_type",
)
FORGET_DELETED = _counter(
    "message_history_forget_deleted",
    "Rows deleted by forget (commands path and CLI), by what (messages, threads), as each chunk is deleted.",
    "what",
)
KAFKA_AUTHORIZATION_FAILURES = _counter(
    "message_history_kafka_authorization_failures",
    "Transactions (exactly-once) the broker refused for a missing ACL, by path and error: not fencing; the "
    "path is not ready until a commit succeeds again.",
    "path",
    "error_type",
)
RETRIES = _counter(
    "message_history_retries",
    "Retries after a dependency failed (an outage, not bad input).",
    "path",
    "dependency",
)

PLAN_MISSES = _counter(
    "message_history_plan_misses",
    "Reads a batch's plan did not foresee (a page to extend, an unplanned look-up): a round trip each.",
    "path",
)
UNREADABLE_ROWS = _counter(
    "message_history_unreadable_rows",
    "Stored rows no Mastra would read (or no UTF-8 can carry), skipped by a read (path: recall, persist, "
    "other; collection: mastra_messages, mastra_threads; reason: the class of what is wrong).",
    "path",
    "collection",
    "reason",
)
NATIVE_CODEC_FAILURES = _counter(
    "message_history_native_codec_failures",
    "Batches of recalled rows the native row codec failed (raised or panicked): the Python reference decided "
    "them, so no output differs; any increase is a bug of the native codec to report.",
)
OUTCOMES = _counter(
    "message_history_outcomes",
    "Processed records by outcome (enriched, persisted, skipped-<reason>, dead-letter).",
    "path",
    "outcome",
)
BATCH_SIZE = _histogram(
    "message_history_batch_size", "Records per processed batch.", "path", buckets=_BATCH_BUCKETS
)
STAGE_SECONDS = _histogram(
    "message_history_stage_seconds",
    "Time spent per batch in each stage (decode, recall, barrier, persist, produce, commit).",
    "path",
    "stage",
    buckets=_LATENCY_BUCKETS,
)
CONSUMER_LAG = _gauge(
    "message_history_consumer_lag",
    "Records between the partition's high watermark and the consumer position.",
    "topic",
    "partition",
)
COMMITTED_OFFSET = _gauge(
    "message_history_committed_offset", "Last offset committed for the partition.", "topic", "partition"
)
IN_FLIGHT = _gauge("message_history_in_flight_records", "Records fetched and not yet completed.", "path")
PARKED = _gauge(
    "message_history_parked_requests",
    "Requests waiting in their own thread's lane (barrier or busy thread), not settled yet.",
    "path",
)
PAUSED_PARTITIONS = _gauge(
    "message_history_paused_partitions", "Partitions paused for back-pressure or an outage.", "path"
)
REBALANCES = _counter("message_history_rebalances", "Partition assignments and revocations.", "path", "kind")
READY = _gauge(
    "message_history_ready",
    "1 when the component is ready (dependency reachable, partitions assigned or none due).",
    "component",
)
HTTP_CONNECTIONS_SHED = _counter(
    "message_history_http_connections_shed_total",
    "Connections the /livez /readyz /metrics server cut short: `evicted` (the oldest one still waiting for"
    " its request, closed to make room under the cap), `slow_reader` (the oldest one still being answered"
    " after 1 s, closed to make room), `refused` (at the cap and the probes' reserve with none to evict),"
    " `timeout` (request not received in time: answered 408; or answer not taken in time: dropped),"
    " `accept_failed` (the OS refused the accept, e.g. out of file descriptors).",
    "reason",
)
RECALLED_MESSAGES = _histogram(
    "message_history_recalled_messages",
    "Messages recalled from MongoDB per request.",
    buckets=(0, 1, 5, 10, 20, 40, 100, 250, 1000),
)
TURN_WAITS = _counter(
    "message_history_turn_waits",
    "Requests that waited before recall, by reason (barrier: persist behind; busy-thread).",
    "reason",
)
TURN_WAIT_TIMEOUTS = _counter(
    "message_history_turn_wait_timeouts",
    "Waits that ran out of time: the request went out with history.complete false.",
    "reason",
)
TURN_WAIT_SECONDS = _histogram(
    "message_history_turn_wait_seconds",
    "Time a request waited before recall (requests that waited only).",
    buckets=(*_LATENCY_BUCKETS, 30.0, 60.0),
)
TURN_REFUSALS = _counter(
    "message_history_turn_refusals",
    "Requests refused because their thread was busy (busy-thread policy reject).",
)
