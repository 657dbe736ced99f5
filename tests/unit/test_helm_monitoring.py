"""The chart's operations bundle: the values schema refuses typos; the Grafana dashboard and the
PrometheusRule render when enabled, parse, and query only metrics the service exposes.

Needs helm and rulecheck (`deploy/helm/install-helm.sh` builds both into .cache/bin); no cluster. rulecheck
runs Prometheus' own rule-file and PromQL parsers, the code behind `promtool check rules`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy_support import (
    CHART,
    VALUES_ALL_ON,
    Doc,
    load_yaml,
    of_kind,
    render,
    require_helm,
    require_tool,
    run_helm,
)
from tests.unit.test_metrics import exposed_names

DASHBOARD = CHART / "dashboards" / "message-history.json"
SCHEMA = CHART / "values.schema.json"
ALERTS = {
    "MessageHistoryConsumerLagGrowing",
    "MessageHistoryDeadLetters",
    "MessageHistoryUnexpectedErrors",
    "MessageHistoryUnreadableRows",
    "MessageHistoryNotReady",
    "MessageHistoryOutageRetries",
}
# What the dashboard must show (issue 17, item 3), by the metric behind each.
DASHBOARD_METRICS = {
    "message_history_consumer_lag",
    "message_history_records_consumed_total",
    "message_history_dead_letters_total",
    "message_history_retries_total",
    "message_history_stage_seconds_bucket",
    "message_history_ready",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
}
# Grafana's variables, replaced by plain values so that an expression is PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$namespace": "agents", "$job": "message-history"}
METRIC_NAME = re.compile(r"\b((?:message_history|process|python)_[a-z_]+)\b")
ON = ("--set", "grafanaDashboard.enabled=true,prometheusRule.enabled=true")


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def _dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for panel in _dashboard()["panels"] for t in panel["targets"]]
    for name, value in GRAFANA_VARIABLES.items():
        exprs = [e.replace(name, value) for e in exprs]
    return exprs


def _rulecheck(mode: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("rulecheck"), mode], input=text, capture_output=True, text=True, timeout=60, check=False
    )


# --- values schema --------------------------------------------------------------------------------


TYPOS = [
    pytest.param(("--set", "serviceMonitor.enabeld=true"), "'enabeld' not allowed", id="nested-key"),
    pytest.param(("--set", "replicaCount=3"), "'replicaCount' not allowed", id="top-level-key"),
    pytest.param(("--set", "prometheusRule.lagGrowing.treshold=5"), "'treshold' not allowed", id="alert-key"),
    pytest.param(("--set", "workload.replicas=two"), "/workload/replicas", id="wrong-type"),
    pytest.param(("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy", id="not-an-option"),
    pytest.param(
        ("--set", "prometheusRule.notReady.for=5 minutes"), "/prometheusRule/notReady/for", id="duration"
    ),
]


@pytest.mark.parametrize(("args", "message"), TYPOS)
@pytest.mark.parametrize("command", ["lint", "template"])
def test_schema_refuses_a_misspelt_or_mistyped_value(
    helm: str, command: str, args: tuple[str, ...], message: str
) -> None:
    """`helm lint` and `helm template` (what `helm install` renders) fail, naming the value, when a key is
    misspelt or a value has the wrong type."""
    result = run_helm(helm, command, *(["mh"] if command == "template" else []), str(CHART), *args)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_without_the_schema_a_typo_passes_silently(helm: str, tmp_path: Path) -> None:
    """The guard is the schema: the same chart without values.schema.json lints a misspelt key as fine."""
    copy = tmp_path / "message-history"
    shutil.copytree(CHART, copy)
    (copy / "values.schema.json").unlink()
    result = run_helm(helm, "lint", str(copy), "--set", "serviceMonitor.enabeld=true")
    assert result.returncode == 0, result.stdout + result.stderr


def _schema_gaps(values: Any, schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of `values` the schema does not describe, and closed schema properties `values` lacks."""
    if not isinstance(values, dict) or "properties" not in schema:
        return []
    properties: dict[str, Any] = schema["properties"]
    gaps = [f"{prefix}{key} (not in the schema)" for key in values if key not in properties]
    if schema.get("additionalProperties") is False:
        gaps += [f"{prefix}{key} (not in values.yaml)" for key in properties if key not in values]
    for key, value in values.items():
        if key in properties:
            gaps += _schema_gaps(value, properties[key], f"{prefix}{key}.")
    return gaps


def test_schema_describes_exactly_the_values() -> None:
    """Every key of values.yaml is in the schema and every closed schema object's keys are in values.yaml,
    so the schema cannot drift from the defaults it guards."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema.get("additionalProperties") is False
    assert _schema_gaps(load_yaml(CHART / "values.yaml"), schema) == []


# --- Grafana dashboard ----------------------------------------------------------------------------


def test_dashboard_queries_only_metrics_the_service_exposes() -> None:
    """Every metric name in the dashboard's queries is one the registry exposes (with `_total`, `_bucket`
    suffixes); the dashboard covers lag, throughput, dead letters, retries, latency, ready, CPU and RSS."""
    names = {name for expr in _dashboard_exprs() for name in METRIC_NAME.findall(expr)}
    assert names - exposed_names() == set()
    assert names >= DASHBOARD_METRICS


def test_dashboard_queries_parse_as_promql() -> None:
    """Prometheus' parser accepts every query, and the metrics it finds in them exist."""
    done = _rulecheck("exprs", json.dumps(_dashboard_exprs()))
    assert done.returncode == 0, done.stderr
    selected = {name for names in json.loads(done.stdout) for name in names}
    assert selected - exposed_names() == set()
    assert selected >= DASHBOARD_METRICS


def test_dashboard_panels_select_by_namespace_and_job() -> None:
    """Each query is scoped by the `$namespace` and `$job` variables, so two releases do not mix."""
    dashboard = _dashboard()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= variables
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert 'namespace="$namespace"' in target["expr"], panel["title"]
            assert 'job=~"$job"' in target["expr"], panel["title"]


def _dashboard_config_map(docs: tuple[Doc, ...]) -> Doc:
    (found,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    return found


def test_dashboard_config_map_carries_the_file_and_the_sidecar_label(helm: str) -> None:
    """Enabled, the chart renders one ConfigMap labelled `grafana_dashboard: "1"` holding the JSON file."""
    config_map = _dashboard_config_map(render(helm, *ON))
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["message-history.json"]) == _dashboard()


def test_dashboard_and_rules_are_off_by_default(helm: str) -> None:
    """Neither the dashboard ConfigMap nor the PrometheusRule exists unless enabled."""
    docs = render(helm)
    assert [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")] == []
    assert of_kind(docs, "PrometheusRule") == []


# --- alert rules ----------------------------------------------------------------------------------


def _rules(docs: tuple[Doc, ...]) -> list[Doc]:
    (rule,) = of_kind(docs, "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


@pytest.mark.parametrize(
    "args", [pytest.param(ON, id="defaults"), pytest.param(("-f", str(VALUES_ALL_ON)), id="all-on")]
)
def test_alert_rules_pass_prometheus_rule_validation(helm: str, args: tuple[str, ...]) -> None:
    """The rendered PrometheusRule is a valid rule file for Prometheus (fields, durations, PromQL, alert
    templates), has the four alerts, and its expressions select only metrics the service exposes."""
    result = run_helm(helm, "template", "mh", str(CHART), *args)
    assert result.returncode == 0, result.stderr
    done = _rulecheck("rules", result.stdout)
    assert done.returncode == 0, done.stderr
    checked = json.loads(done.stdout)
    assert {rule["alert"] for rule in checked} >= ALERTS
    selected = {name for rule in checked for name in rule["metrics"]}
    assert selected - exposed_names() == set()


def test_rule_validation_catches_a_broken_expression(helm: str, tmp_path: Path) -> None:
    """rulecheck fails on an alert whose PromQL does not parse (so a passing check means something)."""
    extra = tmp_path / "broken.yaml"
    broken = {"alert": "Broken", "expr": "sum(rate(x[5m])) by"}
    extra.write_text(yaml.safe_dump({"prometheusRule": {"extraRules": [broken]}}), encoding="utf-8")
    result = run_helm(helm, "template", "mh", str(CHART), *ON, "-f", str(extra))
    assert result.returncode == 0, result.stderr
    done = _rulecheck("rules", result.stdout)
    assert done.returncode != 0
    assert "parse error" in done.stderr


def test_alert_thresholds_come_from_values(helm: str) -> None:
    """Thresholds, windows and durations are values: setting them changes the rendered rules."""
    docs = render(
        helm,
        *ON,
        "--set",
        "prometheusRule.lagGrowing.threshold=1234,prometheusRule.lagGrowing.window=20m,"
        "prometheusRule.notReady.for=7m,prometheusRule.outageRetries.ratePerSecond=0.25,"
        "prometheusRule.deadLetters.enabled=false,prometheusRule.unexpectedErrors.window=42m",
    )
    rules = {r["alert"]: r for r in _rules(docs)}
    assert "MessageHistoryDeadLetters" not in rules
    assert "[42m]" in rules["MessageHistoryUnexpectedErrors"]["expr"]
    assert "> 1234" in rules["MessageHistoryConsumerLagGrowing"]["expr"]
    assert "[20m]" in rules["MessageHistoryConsumerLagGrowing"]["expr"]
    assert rules["MessageHistoryNotReady"]["for"] == "7m"
    assert "> 0.25" in rules["MessageHistoryOutageRetries"]["expr"]


def test_alerts_select_this_release(helm: str) -> None:
    """By default every alert expression selects the release's namespace and its Service's job."""
    for rule in _rules(render(helm, *ON)):
        assert 'namespace="agents"' in rule["expr"], rule["alert"]
        assert 'job="mh-message-history"' in rule["expr"], rule["alert"]
