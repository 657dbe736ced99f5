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

RECORDS_CONSUMED = Counter(
    "message_history_records_consumed",
    "Records read from an input topic.",
    ["path"],
    registry=REGISTRY,
)
RECORDS_PRODUCED = Counter(
    "message_history_records_produced",
    "Records acknowledged by Kafka on an output topic.",
    ["topic"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "message_history_dead_letters",
    "Records sent to a dead-letter topic, by error type.",
    ["path", "error_type"],
    registry=REGISTRY,
)
UNEXPECTED_ERRORS = Counter(
    "message_history_unexpected_errors",
    "Records dead-lettered for an unexpected exception (a bug, not bad input), by path and exception class.",
    ["path", "error_type"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "message_history_retries",
    "Retries after a dependency failed (an outage, not bad input).",
    ["path", "dependency"],
    registry=REGISTRY,
)

PLAN_MISSES = Counter(
    "message_history_plan_misses",
    "Reads a batch's plan did not foresee (a page to extend, an unplanned look-up): a round trip each.",
    ["path"],
    registry=REGISTRY,
)
UNREADABLE_ROWS = Counter(
    "message_history_unreadable_rows",
    "Stored rows no Mastra would read (or no UTF-8 can carry), skipped by a read (path: recall, persist, "
    "other; collection: mastra_messages, mastra_threads; reason: the class of what is wrong).",
    ["path", "collection", "reason"],
    registry=REGISTRY,
)
OUTCOMES = Counter(
    "message_history_outcomes",
    "Processed records by outcome (enriched, persisted, skipped-<reason>, dead-letter).",
    ["path", "outcome"],
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "message_history_batch_size",
    "Records per processed batch.",
    ["path"],
    buckets=_BATCH_BUCKETS,
    registry=REGISTRY,
)
STAGE_SECONDS = Histogram(
    "message_history_stage_seconds",
    "Time spent per batch in each stage (decode, recall, barrier, persist, produce, commit).",
    ["path", "stage"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "message_history_consumer_lag",
    "Records between the partition's high watermark and the consumer position.",
    ["topic", "partition"],
    registry=REGISTRY,
)
COMMITTED_OFFSET = Gauge(
    "message_history_committed_offset",
    "Last offset committed for the partition.",
    ["topic", "partition"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "message_history_in_flight_records",
    "Records fetched and not yet completed.",
    ["path"],
    registry=REGISTRY,
)
PARKED = Gauge(
    "message_history_parked_requests",
    "Requests waiting in their own thread's lane (barrier or busy thread), not settled yet.",
    ["path"],
    registry=REGISTRY,
)
PAUSED_PARTITIONS = Gauge(
    "message_history_paused_partitions",
    "Partitions paused for back-pressure or an outage.",
    ["path"],
    registry=REGISTRY,
)
REBALANCES = Counter(
    "message_history_rebalances",
    "Partition assignments and revocations.",
    ["path", "kind"],
    registry=REGISTRY,
)
READY = Gauge(
    "message_history_ready",
    "1 when the component is ready (dependency reachable, partitions assigned or none due).",
    ["component"],
    registry=REGISTRY,
)
HTTP_CONNECTIONS_SHED = Counter(
    "message_history_http_connections_shed_total",
    "Connections the /livez /readyz /metrics server cut short: `evicted` (the oldest one still waiting for"
    " its request, closed to make room under the cap), `refused` (at the cap with none to evict), `timeout`"
    " (request not received in time: answered 408; or answer not taken in time: dropped), `accept_failed`"
    " (the OS refused the accept, e.g. out of file descriptors).",
    ["reason"],
    registry=REGISTRY,
)
RECALLED_MESSAGES = Histogram(
    "message_history_recalled_messages",
    "Messages recalled from MongoDB per request.",
    buckets=(0, 1, 5, 10, 20, 40, 100, 250, 1000),
    registry=REGISTRY,
)
TURN_WAITS = Counter(
    "message_history_turn_waits",
    "Requests that waited before recall, by reason (barrier: persist behind; busy-thread).",
    ["reason"],
    registry=REGISTRY,
)
TURN_WAIT_TIMEOUTS = Counter(
    "message_history_turn_wait_timeouts",
    "Waits that ran out of time: the request went out with history.complete false.",
    ["reason"],
    registry=REGISTRY,
)
TURN_WAIT_SECONDS = Histogram(
    "message_history_turn_wait_seconds",
    "Time a request waited before recall (requests that waited only).",
    buckets=(*_LATENCY_BUCKETS, 30.0, 60.0),
    registry=REGISTRY,
)
TURN_REFUSALS = Counter(
    "message_history_turn_refusals",
    "Requests refused because their thread was busy (busy-thread policy reject).",
    registry=REGISTRY,
)
