"""The metrics registry: the standard collectors are on it, build info says what runs, and the names the
dashboard and alert rules query can be listed from it (`exposed_names`)."""

from __future__ import annotations

import platform
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Metric

from message_history import __version__, metrics


def exposed_names(registry: CollectorRegistry = metrics.REGISTRY) -> set[str]:
    """Every series name the registry can expose, with the suffixes Prometheus adds: counters `_total`
    (and `_created`), histograms `_bucket`/`_sum`/`_count`, info `_info`. Labelled metrics with no child
    yet expose nothing, so names come from the families' types, not from today's samples."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
        "info": ("_info",),
        "gauge": ("",),
        "unknown": ("",),
    }
    families: list[Metric] = list(registry.collect())
    return {family.name + suffix for family in families for suffix in suffixes.get(family.type, ("",))}


def test_build_info_labels_name_the_running_versions() -> None:
    """`message_history_build_info` is 1 with the service's, Python's and the main libraries' versions."""
    labels = metrics.build_labels()
    assert labels["version"] == __version__
    assert labels["python"] == platform.python_version()
    assert labels["aiokafka"] == version("aiokafka")
    assert labels["pymongo"] == version("pymongo")
    assert metrics.REGISTRY.get_sample_value("message_history_build_info", labels) == 1.0


def test_registry_has_the_standard_collectors() -> None:
    """Process, platform and GC series are on the private registry (and the service's own next to them)."""
    names = exposed_names()
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "python_info",
        "python_gc_collections_total",
        "message_history_build_info",
        "message_history_dead_letters_total",
        "message_history_stage_seconds_bucket",
        "message_history_consumer_lag",
    ):
        assert name in names, name


def test_exposed_names_follow_prometheus_suffixes() -> None:
    """A counter is exposed as `_total`, a histogram as `_bucket`/`_sum`/`_count`, never under its bare name
    (so a dashboard querying `message_history_dead_letters` would be caught)."""
    names = exposed_names()
    assert "message_history_dead_letters" not in names
    assert "message_history_stage_seconds" not in names
    assert {"message_history_stage_seconds_count", "message_history_stage_seconds_sum"} <= names
