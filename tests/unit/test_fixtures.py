"""Where the suite's Kafka and MongoDB come from, and that CI can never pass by skipping them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests import infra

ROOT = Path(__file__).resolve().parents[2]


def _no_docker() -> bool:
    return False


def _docker() -> bool:
    return True


def _docker_must_not_be_asked() -> bool:
    raise AssertionError("Docker was probed although the endpoint is configured")


@pytest.mark.parametrize(
    ("environ", "docker_ok", "kind"),
    [
        pytest.param({"KAFKA_BOOTSTRAP_SERVERS": "h:1"}, _docker_must_not_be_asked, "env", id="env-wins"),
        pytest.param(
            {"KAFKA_BOOTSTRAP_SERVERS": "h:1", "CI": "true"},
            _docker_must_not_be_asked,
            "env",
            id="env-wins-under-ci",
        ),
        pytest.param({}, _docker, "docker", id="docker-when-no-env"),
        pytest.param({"KAFKA_BOOTSTRAP_SERVERS": "  "}, _docker, "docker", id="blank-env-is-unset"),
        pytest.param({"CI": "true"}, _no_docker, "fail", id="ci-true-fails"),
        pytest.param({"CI": "1"}, _no_docker, "fail", id="ci-1-fails"),
        pytest.param({"CI": "TRUE"}, _no_docker, "fail", id="ci-upper-fails"),
        pytest.param({"CI": "false"}, _no_docker, "skip", id="ci-false-skips"),
        pytest.param({"CI": ""}, _no_docker, "skip", id="ci-empty-skips"),
        pytest.param({}, _no_docker, "skip", id="no-ci-skips"),
    ],
)
def test_choose(environ: dict[str, str], docker_ok: Any, kind: str) -> None:
    """The endpoint comes from the environment, else Docker, else the test fails under CI, skips elsewhere."""
    choice = infra.choose("KAFKA_BOOTSTRAP_SERVERS", "Kafka", environ, docker_ok)
    assert choice.kind == kind
    if kind == "env":
        assert choice.value == environ["KAFKA_BOOTSTRAP_SERVERS"]
    if kind in ("fail", "skip"):
        assert choice.value == infra.unavailable_reason("KAFKA_BOOTSTRAP_SERVERS", "Kafka")
        assert "deploy/local/stack" in choice.value


CHILD_TEST = """
def test_needs_kafka(kafka_bootstrap):
    assert kafka_bootstrap


def test_needs_mongodb(mongo_uri):
    assert mongo_uri
"""


def _run_child_suite(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """Run two tests that need the endpoints in a fresh pytest, with no endpoint and no reachable Docker."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import kafka_bootstrap, mongo_uri\n")
    (tmp_path / "test_child.py").write_text(textwrap.dedent(CHILD_TEST))
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("KAFKA_BOOTSTRAP_SERVERS", "MONGODB_URI", "CI") and not name.startswith("DOCKER_")
    }
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"  # no engine, even on a machine that has one
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", "test_child.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(150)
def test_fixtures_fail_loudly_under_ci_without_endpoints(tmp_path: Path) -> None:
    """Under CI=true, with no endpoint and no Docker, tests needing Kafka or MongoDB error with the reason."""
    done = _run_child_suite(tmp_path, ci="true")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "2 errors" in output
    assert infra.unavailable_reason("KAFKA_BOOTSTRAP_SERVERS", "Kafka") in output
    assert infra.unavailable_reason("MONGODB_URI", "MongoDB") in output
    assert "skipped" not in output


@pytest.mark.timeout(150)
def test_fixtures_skip_outside_ci_without_endpoints(tmp_path: Path) -> None:
    """Outside CI, with no endpoint and no Docker, tests needing Kafka or MongoDB skip with the reason."""
    done = _run_child_suite(tmp_path, ci=None)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "2 skipped" in output
    assert "KAFKA_BOOTSTRAP_SERVERS is not set and no Docker engine answers" in output
    assert "error" not in output.lower()


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [
        ("true", pytest.fail.Exception),
        ("1", pytest.fail.Exception),
        ("false", pytest.skip.Exception),
        ("", pytest.skip.Exception),
        (None, pytest.skip.Exception),
    ],
)
def test_a_missing_prerequisite_fails_under_ci_and_skips_elsewhere(
    ci: str | None, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`skip_or_fail` reads `CI` as `choose` does: every test that lacks a tool behaves the same way."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome):
        infra.skip_or_fail("no tool")
