"""Where the test suite gets its Kafka broker and MongoDB server from.

In order: the endpoint in the environment (`KAFKA_BOOTSTRAP_SERVERS`, `MONGODB_URI`; `deploy/local/stack test`
sets both); else a container started by testcontainers when a Docker engine answers; else the test cannot run:
under CI (`CI` truthy) it FAILS with the reason, so a CI run never passes by skipping; elsewhere it is skipped
with the same reason. The decision is a pure function (`choose`) so that it can be tested without any of them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import pytest

# Pinned images for the Docker path. cp-kafka 8.1 is Apache Kafka 4.1 (KRaft only), close to the local 4.3.1.
KAFKA_IMAGE = "confluentinc/cp-kafka:8.1.0"
MONGO_IMAGE = "mongo:7.0.14"
CONTAINER_START_TIMEOUT_S = 180

KAFKA_ENV = "KAFKA_BOOTSTRAP_SERVERS"
MONGO_ENV = "MONGODB_URI"

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class Choice:
    """Where one dependency comes from: `value` is the endpoint for "env", the reason for "fail"/"skip"."""

    kind: Literal["env", "docker", "fail", "skip"]
    value: str = ""


def truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def skip_or_fail(reason: str) -> NoReturn:
    """A missing prerequisite: a failure under CI (`CI` truthy, as `choose` reads it), a skip elsewhere."""
    if truthy(os.environ.get("CI")):
        pytest.fail(reason)
    pytest.skip(reason)


def unavailable_reason(env_var: str, what: str) -> str:
    return (
        f"{what} is unavailable: {env_var} is not set and no Docker engine answers. "
        'Start the local stack (`eval "$(deploy/local/stack up)"`) or run the suite with '
        "`deploy/local/stack test`."
    )


def choose(env_var: str, what: str, environ: Mapping[str, str], docker_ok: Callable[[], bool]) -> Choice:
    """The environment wins; then Docker; then fail under CI, skip elsewhere. `docker_ok` is asked lazily."""
    value = environ.get(env_var, "").strip()
    if value:
        return Choice("env", value)
    if docker_ok():
        return Choice("docker")
    reason = unavailable_reason(env_var, what)
    return Choice("fail", reason) if truthy(environ.get("CI")) else Choice("skip", reason)


@functools.cache
def docker_available() -> bool:
    """A Docker engine answers a ping (asked once per session; docker-py ships with testcontainers)."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        # no engine to ask; docker-py's version probe would leave an unclosed socket behind
        return False
    try:
        import docker  # noqa: PLC0415 -- only needed when no endpoint is configured

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure means "no engine here"
        return False


def _import_container(module: str, name: str) -> Any:
    """testcontainers >= 4.15 has `testcontainers.community.<module>`; older releases only the legacy path."""
    import importlib  # noqa: PLC0415

    try:
        return getattr(importlib.import_module(f"testcontainers.community.{module}"), name)
    except ImportError:
        return getattr(importlib.import_module(f"testcontainers.{module}"), name)


@contextlib.contextmanager
def kafka_container() -> Iterator[str]:
    """A single-node KRaft Kafka in Docker; transactions need their state topic at replication factor 1."""
    container_class = _import_container("kafka", "KafkaContainer")
    container = (
        container_class(KAFKA_IMAGE)
        .with_kraft()
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "1")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true")
    )
    container.start(timeout=CONTAINER_START_TIMEOUT_S)
    try:
        yield str(container.get_bootstrap_server())
    finally:
        container.stop()


@contextlib.contextmanager
def mongo_container() -> Iterator[str]:
    """A real mongod in Docker (root user `test`)."""
    container = _import_container("mongodb", "MongoDbContainer")(MONGO_IMAGE)
    container.start()
    try:
        yield str(container.get_connection_url())
    finally:
        container.stop()


def endpoint(
    env_var: str,
    what: str,
    container: Callable[[], contextlib.AbstractContextManager[str]],
    environ: Mapping[str, str] | None = None,
    docker_ok: Callable[[], bool] = docker_available,
) -> Iterator[str]:
    """Body of a session fixture: yields the endpoint, or fails/skips the requesting test with the reason."""
    choice = choose(env_var, what, os.environ if environ is None else environ, docker_ok)
    if choice.kind == "env":
        yield choice.value
    elif choice.kind == "docker":
        with container() as url:
            yield url
    elif choice.kind == "fail":
        pytest.fail(choice.value, pytrace=False)
    else:
        pytest.skip(choice.value)


def mongo_server_binary(root: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """The MongoDB-wire server binary `deploy/local/stack install` built (Rust first, then the Python one),
    or `$SECANTUSD` when set; None when there is none. For tests that stop and restart a server of their own.
    """
    env = os.environ if environ is None else environ
    candidates = [Path(env["SECANTUSD"])] if env.get("SECANTUSD") else []
    candidates += [
        root / ".cache" / "secantus" / "bin" / "secantusd-rs",
        root / ".cache" / "secantus-py" / "bin" / "secantusd-py",
    ]
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def unique_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"
