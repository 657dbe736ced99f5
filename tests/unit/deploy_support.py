"""Shared by the deploy tests: where the deploy files are, how helm is found and run, and which
environment variables the service really reads (from the Settings model, so a misspelt name fails a test)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices

from message_history.settings import Settings
from tests.infra import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "message-history"
VALUES_ALL_ON = DEPLOY / "helm" / "values-all-on.yaml"
HELM_INSTALLER = "deploy/helm/install-helm.sh"

# Names the chart sets for Kubernetes' own use (downward API), not read by the service.
KUBERNETES_ENV = frozenset({"POD_NAME", "POD_NAMESPACE"})
SERVICE_ENV_PREFIXES = ("MESSAGE_HISTORY_", "KAFKA_", "MONGODB_")

Doc = dict[str, Any]


@functools.cache
def settings_env_names() -> dict[str, str]:
    """Every environment variable the Settings model reads, mapped to its field name."""
    names: dict[str, str] = {}
    prefix = str(Settings.model_config.get("env_prefix", ""))
    for field_name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            for choice in alias.choices:
                if isinstance(choice, str):
                    names[choice.upper()] = field_name
        elif isinstance(alias, str):
            names[alias.upper()] = field_name
        else:
            names[f"{prefix}{field_name}".upper()] = field_name
    return names


def setting_default(field_name: str) -> Any:
    """The default of one Settings field (SecretStr unwrapped)."""
    return Settings.model_fields[field_name].default


def find_tool(name: str) -> str | None:
    """A tool the project builds (`.cache/bin/<name>`, see deploy/helm/install-helm.sh), else one on PATH."""
    local = REPO / ".cache" / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def require_tool(name: str) -> str:
    """The tool, or a skip saying how to install it; under CI (CI=true) a missing tool is a failure."""
    found = find_tool(name)
    if found is None:
        message = f"{name} not found in .cache/bin or on PATH; install it with {HELM_INSTALLER}"
        skip_or_fail(message)
    return found


def require_helm() -> str:
    """helm (see `require_tool`)."""
    return require_tool("helm")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with a timeout; the caller checks the exit code."""
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


@functools.cache
def render_text(helm: str, *args: str) -> str:
    """`helm template` of the chart with extra arguments; fails the test with helm's error."""
    result = run_helm(helm, "template", "mh", str(CHART), "--namespace", "agents", *args)
    if result.returncode != 0:
        pytest.fail(f"helm template {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def render(helm: str, *args: str) -> tuple[Doc, ...]:
    """`helm template` of the chart with extra arguments, parsed."""
    return tuple(doc for doc in yaml.safe_load_all(render_text(helm, *args)) if doc)


def of_kind(docs: tuple[Doc, ...], *kinds: str) -> list[Doc]:
    return [doc for doc in docs if doc.get("kind") in kinds]


def pod_spec(doc: Doc) -> Doc:
    """The pod spec of a Pod, a Job or a workload."""
    if doc["kind"] == "Pod":
        spec: Doc = doc["spec"]
        return spec
    template_spec: Doc = doc["spec"]["template"]["spec"]
    return template_spec


def pod_docs(docs: tuple[Doc, ...]) -> Iterator[Doc]:
    """Every object that runs a pod: workloads, the replay Job, the helm test Pod."""
    yield from of_kind(docs, "Deployment", "StatefulSet", "Job", "Pod")


def config_map(docs: tuple[Doc, ...]) -> dict[str, str]:
    """The service's settings ConfigMap (not the Grafana dashboard's)."""
    (found,) = [d for d in of_kind(docs, "ConfigMap") if not d["metadata"]["name"].endswith("-dashboard")]
    data: dict[str, str] = found["data"]
    return data


def env_names(container: Doc) -> list[str]:
    return [entry["name"] for entry in container.get("env", [])]


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)
