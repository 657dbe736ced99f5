"""What `deploy/local/stack` installs for the demo and for the tests (issue 26): the demo never waits for the
Rust build or the test tooling; `test` / `install --all` get the Rust server and everything else."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "local_stack_install", ROOT / "deploy" / "local" / "stack.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


stack = _stack()


@pytest.mark.parametrize(
    ("full", "rust_built", "cargo", "env", "kind"),
    [
        (False, False, True, "", "python"),  # the demo: no Rust build, the PyPI server
        (False, True, True, "", "rust"),  # the demo reuses a Rust server already built
        (True, False, True, "", "rust"),  # test / --all: build it
        (True, True, False, "", "rust"),  # built: no cargo needed
        (True, False, False, "", "python"),  # no cargo: the fallback
        (False, False, True, "rust", "rust"),  # STACK_MONGO_SERVER decides
        (True, True, True, "python", "python"),
    ],
)
def test_which_mongo_server(
    monkeypatch: pytest.MonkeyPatch, full: bool, rust_built: bool, cargo: bool, env: str, kind: str
) -> None:
    monkeypatch.setattr(stack, "secantus_rs_built", lambda: rust_built)
    monkeypatch.setattr(
        stack.shutil, "which", lambda name: "/usr/bin/cargo" if cargo and name == "cargo" else None
    )
    monkeypatch.setenv("STACK_MONGO_SERVER", env)
    assert stack.mongo_server_kind(full) == kind


def test_a_bad_server_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACK_MONGO_SERVER", "mongod")
    with pytest.raises(stack.StackError, match="rust` or `python"):
        stack.mongo_server_kind(full=False)


@pytest.mark.parametrize("full", [False, True])
def test_the_demo_installs_only_what_it_needs(monkeypatch: pytest.MonkeyPatch, full: bool) -> None:
    """The steps `install` runs: the demo's three, or those plus the tests' (Rust server, npm, Go tools)."""
    calls: list[str] = []
    monkeypatch.setattr(stack, "install_venv", lambda extras: calls.append(f"venv[{extras}]"))
    monkeypatch.setattr(stack, "install_kafka_libs", lambda: calls.append("kafka"))
    monkeypatch.setattr(stack, "install_secantus_rs", lambda: calls.append("secantus-rs"))
    monkeypatch.setattr(stack, "install_secantus_py", lambda: calls.append("secantus-py"))
    monkeypatch.setattr(stack, "install_npm", lambda: calls.append("npm"))
    monkeypatch.setattr(stack, "install_hooks", lambda: calls.append("hooks"))
    monkeypatch.setattr(stack, "secantus_rs_built", lambda: False)
    monkeypatch.setattr(stack.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("STACK_MONGO_SERVER", raising=False)
    stack.install(full)
    if full:
        assert calls == ["venv[dev]", "kafka", "secantus-rs", "npm", "hooks"]
    else:
        assert calls == ["venv[]", "kafka", "secantus-py"]


def test_the_worker_package_is_installed_before_the_example_that_links_it() -> None:
    folders = [folder.relative_to(ROOT).as_posix() for folder in stack.npm_projects()]
    assert folders[0] == "worker-ts"
    assert "tests/interop/mastra-worker" in folders
    assert all("node_modules" not in folder for folder in folders)


@pytest.mark.parametrize(
    ("engines", "wanted"),
    [
        ({"node": ">=22.13.0"}, True),
        ({"node": ">= 24"}, True),
        ({"node": ">=20"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_node_22_goes_to_the_projects_whose_engines_ask_for_it(
    tmp_path: Path, engines: dict[str, str] | None, wanted: bool
) -> None:
    manifest = tmp_path / "package.json"
    manifest.write_text(json.dumps({"name": "p"} if engines is None else {"name": "p", "engines": engines}))
    assert stack.wants_node22(manifest) is wanted


def test_the_worker_package_and_its_example_run_on_node_22() -> None:
    for folder in ("worker-ts", "tests/interop/mastra-worker"):
        assert stack.wants_node22(ROOT / folder / "package.json"), folder


def test_maven_checks_checksums_strictly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 24: Kafka's jars are resolved with `-C` (--strict-checksums): a mismatch fails the download."""
    commands: list[list[str]] = []

    class StopError(Exception):
        pass

    def run(cmd: list[object], **_: object) -> None:
        commands.append([str(part) for part in cmd])
        raise StopError

    monkeypatch.setattr(stack, "STAMPS", tmp_path / "stamps")
    monkeypatch.setattr(stack, "CACHE", tmp_path)
    monkeypatch.setattr(stack, "KAFKA_LIBS", tmp_path / "kafka-libs")
    monkeypatch.setattr(stack, "require_tool", lambda name, why: name)
    monkeypatch.setattr(stack, "run", run)
    with pytest.raises(StopError):
        stack.install_kafka_libs()
    ((mvn, *args),) = commands
    assert mvn == "mvn"
    assert "-C" in args
