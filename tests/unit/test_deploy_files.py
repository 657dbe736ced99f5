"""The image recipe, its dependency lock, the compose file and the plain replay Job agree with the project.

No Docker engine is needed (none exists where they were written): the Dockerfile is checked structurally.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.unit.deploy_support import (
    DEPLOY,
    REPO,
    load_yaml,
    require_tool,
    setting_default,
    settings_env_names,
)

DOCKERFILE = DEPLOY / "Dockerfile"
LOCK = DEPLOY / "requirements.txt"
BUILD_LOCK = DEPLOY / "build-requirements.txt"
CONSTRAINTS = DEPLOY / "constraints.txt"
COMPOSE = DEPLOY / "compose.yaml"
REPLAY_JOB = DEPLOY / "k8s" / "replay-job.yaml"
# A tag naming an exact release: three numeric parts (3.11.14, 4.3.1, 7.0.16), optionally a variant suffix.
PINNED_TAG = re.compile(r"^[\w./-]+:\d+\.\d+\.\d+(-[\w.-]+)?(@sha256:[0-9a-f]{64})?$")
# The image's own base: that, and the digest of what the tag pointed to (a tag can be re-pushed).
PINNED_DIGEST = re.compile(r"^[\w./-]+:\d+\.\d+\.\d+(-[\w.-]+)?@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str


def _instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    out = []
    for line in logical:
        keyword, _, value = line.partition(" ")
        out.append(Instruction(keyword.upper(), value.strip()))
    return out


def _stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _global_args(instructions: list[Instruction]) -> dict[str, str]:
    args: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG" and "=" in instruction.value:
            name, _, default = instruction.value.partition("=")
            args[name] = default
    return args


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return _instructions(DOCKERFILE.read_text(encoding="utf-8"))


# --- Dockerfile -----------------------------------------------------------------------------------


def test_dockerfile_builds_in_stages_from_a_pinned_base(dockerfile: list[Instruction]) -> None:
    """The image has a builder and a runtime stage, each FROM an exact base release (no `latest`), pinned by
    tag and by digest."""
    args = _global_args(dockerfile)
    stages = _stages(dockerfile)
    assert len(stages) >= 2
    names = []
    for stage in stages:
        base, _, name = stage[0].value.partition(" AS ")
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[str(m.group(1))], base.strip())
        assert "latest" not in image
        assert PINNED_DIGEST.match(image), image
        names.append(name.strip())
    assert names[0] == "builder"
    assert names[-1] == "runtime"


def test_runtime_stage_copies_only_the_venv_and_runs_unprivileged(dockerfile: list[Instruction]) -> None:
    """The final stage takes the virtualenv from the builder, sets a numeric non-root USER, and never writes
    bytecode or a home directory outside /tmp."""
    runtime = _stages(dockerfile)[-1]
    copies = [i.value for i in runtime if i.keyword == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    (user,) = [i.value for i in runtime if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert gid.isdigit()
    assert int(uid) > 0
    assert int(gid) > 0
    env = " ".join(i.value for i in runtime if i.keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "HOME=/tmp" in env
    assert not [i for i in runtime if i.keyword == "ADD"]


def test_entrypoint_is_the_console_script_running_the_service(dockerfile: list[Instruction]) -> None:
    """ENTRYPOINT is the project's console script in exec form, CMD is `run`, EXPOSE is the service's port."""
    runtime = _stages(dockerfile)[-1]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    (entrypoint,) = [json.loads(i.value) for i in runtime if i.keyword == "ENTRYPOINT"]
    (cmd,) = [json.loads(i.value) for i in runtime if i.keyword == "CMD"]
    assert entrypoint == ["message-history"]
    assert entrypoint[0] in scripts
    assert cmd == ["run"]
    (expose,) = [i.value for i in runtime if i.keyword == "EXPOSE"]
    assert int(expose) == setting_default("http_port")


def test_dockerignore_lets_in_everything_the_dockerfile_copies(dockerfile: list[Instruction]) -> None:
    """The root .dockerignore is an allowlist admitting every path the Dockerfile copies from the context."""
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    sources = []
    for instruction in dockerfile:
        if instruction.keyword == "COPY" and not instruction.value.startswith("--from"):
            *srcs, _dest = instruction.value.split()
            sources.extend(srcs)
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert any(source == a or source.startswith(f"{a}/") for a in allowed), source


# --- dependency lock ------------------------------------------------------------------------------


def _entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a requirements file, continuation lines joined."""
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            spec, *options = line.split()
            name, _, version = spec.partition("==")
            assert version, f"not pinned: {line}"
            hashes = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
            entries[name.lower().replace("_", "-")] = (version, hashes)
    return entries


def _lock() -> dict[str, str]:
    return {name: version for name, (version, _) in _entries(LOCK).items()}


def test_lock_holds_hashes_the_image_requires() -> None:
    """Every pin of the image's locks carries sha256 hashes, the Dockerfile installs each lock with
    --require-hashes (pip then refuses any file whose hash is not listed), and deploy/constraints.txt, the
    hash-free copy for `pip install -c`, pins exactly the same versions."""
    for path in (LOCK, BUILD_LOCK):
        entries = _entries(path)
        assert entries
        for name, (_, hashes) in entries.items():
            assert hashes, f"{path.name}: {name} has no hash"
            assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    installs = [i.value for i in _instructions(DOCKERFILE.read_text(encoding="utf-8")) if i.keyword == "RUN"]
    requirement_files = re.findall(r"install ([^&]*?)-r (\S+)", " ".join(installs))
    assert sorted(f for _, f in requirement_files) == [
        "deploy/build-requirements.txt",
        "deploy/requirements.txt",
    ]
    assert all("--require-hashes" in options for options, _ in requirement_files)
    constraints = _entries(CONSTRAINTS)
    assert {n: v for n, (v, _) in constraints.items()} == _lock()
    assert not any(hashes for _, hashes in constraints.values())  # pip -c with a hash demands hashes of all


def test_no_binary_artefact_is_committed() -> None:
    """Nothing installable or executable from a third party sits in the repository (a wheel used nowhere
    was once at its root): dependencies come from the index, pinned by hash."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.whl", "*.egg", "*.tar.gz", "*.so", "*.jar", "*.exe"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert tracked == []


def test_lock_pins_every_runtime_dependency_as_pyproject_does() -> None:
    """deploy/requirements.txt pins each [project] dependency at the version pyproject.toml pins."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lock = _lock()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in lock, name
        assert lock[name] in requirement.specifier, f"{name}: lock {lock[name]} vs pyproject {requirement}"


def _closure(names: list[str]) -> set[str]:
    """Runtime dependencies reachable from `names`, read from the installed packages' metadata."""
    seen: set[str] = set()
    todo = [name.lower().replace("_", "-") for name in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in importlib.metadata.requires(name) or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name.lower().replace("_", "-"))
    return seen


def test_lock_is_the_complete_dependency_closure() -> None:
    """The lock holds every package the runtime dependencies pull in, and nothing else (the image installs it
    with --no-deps, so a missing pin would be a missing module at run time)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    direct = [Requirement(spec).name for spec in project["dependencies"]]
    assert set(_lock()) == _closure(direct)


# --- compose --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(COMPOSE)
    return loaded


def test_compose_file_passes_the_compose_specification_loader() -> None:
    """The Compose Specification's own loader (deploy/composecheck, as `docker compose config`) accepts
    the file, resolves the build to deploy/Dockerfile and turns the `$$` escapes into shell variables."""
    composecheck = require_tool("composecheck")
    done = subprocess.run(
        [composecheck, str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert set(services) == {"kafka", "kafka-init", "mongo", "message-history"}
    build = services["message-history"]["build"]
    assert Path(build["context"], build["dockerfile"]).resolve() == DOCKERFILE.resolve()
    assert '--topic "$topic" --partitions "$PARTITIONS"' in services["kafka-init"]["command"][0]
    assert services["kafka-init"]["environment"]["PARTITIONS"] == "3"


def test_compose_service_env_names_are_settings(compose: dict[str, Any]) -> None:
    """Every variable compose gives the service is one the Settings model reads."""
    env = compose["services"]["message-history"]["environment"]
    assert set(env) - set(settings_env_names()) == set()
    assert "MONGODB_URI" in env
    assert "KAFKA_BOOTSTRAP_SERVERS" in env


def test_compose_starts_the_service_after_healthy_dependencies(compose: dict[str, Any]) -> None:
    """The service waits for healthy Kafka and MongoDB and for the topics, and has its own healthcheck."""
    services = compose["services"]
    depends = services["message-history"]["depends_on"]
    assert depends["kafka"]["condition"] == "service_healthy"
    assert depends["mongo"]["condition"] == "service_healthy"
    assert depends["kafka-init"]["condition"] == "service_completed_successfully"
    for name in ("kafka", "mongo", "message-history"):
        assert services[name]["healthcheck"]["test"], name
    assert "/readyz" in " ".join(services["message-history"]["healthcheck"]["test"])


def test_compose_images_are_pinned_and_the_service_is_built_from_the_dockerfile(
    compose: dict[str, Any],
) -> None:
    """Kafka (KRaft) and MongoDB come from exact releases; the service is built from deploy/Dockerfile."""
    services = compose["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["mongo"]["image"].startswith("mongo:7.0.")
    for name in ("kafka", "kafka-init", "mongo"):
        assert PINNED_TAG.match(services[name]["image"]), name
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    build = services["message-history"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE.resolve()


def test_compose_service_is_locked_down_and_drains_before_kill(compose: dict[str, Any]) -> None:
    """The service runs read-only as a non-root user with no capabilities, and compose waits longer than the
    service's drain grace before killing it."""
    service = compose["services"]["message-history"]
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert int(service["user"].split(":")[0]) > 0
    assert any(mount.startswith("/tmp") for mount in service["tmpfs"])
    grace = float(
        service["environment"].get("MESSAGE_HISTORY_SHUTDOWN_GRACE_S", setting_default("shutdown_grace_s"))
    )
    assert service["stop_grace_period"].endswith("s")
    assert float(service["stop_grace_period"][:-1]) > grace


# --- plain replay Job -----------------------------------------------------------------------------


def test_plain_replay_job_runs_replay_locked_down_with_real_settings() -> None:
    """deploy/k8s/replay-job.yaml runs `message-history replay` as non-root on a read-only root, reads
    MONGODB_URI from a Secret, and sets only variables the service reads."""
    job = load_yaml(REPLAY_JOB)
    assert job["kind"] == "Job"
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][0] == "replay"
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    env = {entry["name"]: entry for entry in container["env"]}
    assert set(env) - set(settings_env_names()) == set()
    assert "secretKeyRef" in env["MONGODB_URI"]["valueFrom"]
    assert spec["terminationGracePeriodSeconds"] > setting_default("shutdown_grace_s")


# --- operations guide ------------------------------------------------------------------------------


def test_operations_guide_names_only_real_metrics_and_settings() -> None:
    """Every metric and environment variable docs/operations.md names exists (a renamed one fails here)."""
    from prometheus_client.metrics import MetricWrapperBase  # noqa: PLC0415

    from message_history import metrics  # noqa: PLC0415

    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    names = {value._name for value in vars(metrics).values() if isinstance(value, MetricWrapperBase)}
    series = names | {
        f"{name}{suffix}" for name in names for suffix in ("_total", "_bucket", "_sum", "_count", "_info")
    }
    mentioned_metrics = set(re.findall(r"\bmessage_history_[a-z_]+\b", text)) - {
        "message_history_check",
        "message_history_forgotten",  # the tombstone collection, not a metric
        "message_history_turns",  # the busy-thread markers collection, not a metric
        "message_history_leases",  # the lease collection (periodic prune), not a metric
    }
    assert mentioned_metrics
    assert mentioned_metrics - series == set()
    mentioned_env = set(re.findall(r"\b(?:MESSAGE_HISTORY|KAFKA|MONGODB)_[A-Z_]*[A-Z]\b", text))
    assert len(mentioned_env) > 5
    assert mentioned_env - set(settings_env_names()) == set()
