"""Run the service for a test (in-process task or `message-history run` subprocess) and build its events.

Every test gets its own topics, group and database (`fresh_settings`), short timeouts, and the HTTP port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from pymongo import AsyncMongoClient

from message_history.app.health import Health
from message_history.app.service import Path as Path_
from message_history.app.service import run_service
from message_history.settings import Settings
from schemas.ids import Kind, derived_message_id
from storage.protocol import BatchHistoryStorage
from tests import infra
from tests.integration.stream_helpers import Record, read_all, read_topic

ROOT = Path(__file__).resolve().parents[2]
T0 = "2025-03-01T10:00:00.000Z"


def fresh_settings(kafka_bootstrap: str, mongo_uri: str, **overrides: Any) -> Settings:
    """Settings with unique topics, group and database, and timeouts short enough for tests."""
    run = infra.unique_name("")
    values: dict[str, Any] = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "MONGODB_URI": mongo_uri,
        "MONGODB_DATABASE": f"t_{run}",
        "requests_topic": f"rq-{run}",
        "enriched_topic": f"en-{run}",
        "responses_topic": f"rs-{run}",
        "persisted_topic": f"pe-{run}",
        "commands_topic": f"cm-{run}",
        "forgotten_topic": f"fg-{run}",
        "observe_requests_topic": f"ob-{run}",
        "observe_results_topic": f"od-{run}",
        "group_id": f"g-{run}",
        "session_timeout_ms": 6000,
        "max_poll_interval_ms": 30_000,
        "poll_timeout_ms": 100,
        "commit_interval_ms": 100,
        "retry_initial_backoff_s": 0.2,
        "retry_max_backoff_s": 2.0,
        # FerretDB on a shared 2-core box can take seconds for a bulk upsert: slow is not down
        "mongodb_timeout_ms": 20_000,
        "shutdown_grace_s": 15.0,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "log_level": "INFO",
    }
    values.update(overrides)
    return Settings(**values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes `Settings()` in a child process equal to `settings`."""
    aliases = {
        "kafka_bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS",
        "mongodb_uri": "MONGODB_URI",
        "mongodb_database": "MONGODB_DATABASE",
    }
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[aliases.get(name, f"MESSAGE_HISTORY_{name.upper()}")] = str(value)
    return env


@contextlib.asynccontextmanager
async def running_service(
    settings: Settings,
    *,
    only: Path_ | None = None,
    health: Health | None = None,
    storage: BatchHistoryStorage | None = None,
) -> AsyncIterator[asyncio.Task[int]]:
    """The service as a task of this event loop; stopped (and its exit code checked) on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(settings, stop=stop, only=only, health=health, storage=storage))
    try:
        yield task
    finally:
        stop.set()
        code = await asyncio.wait_for(task, settings.shutdown_grace_s + 10)
    assert code == 0, f"the service exited with {code}"


@dataclass
class ServiceProcess:
    """`message-history run` in a child process, its log in a file."""

    settings: Settings
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
        env.update(settings_env(self.settings))
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "message_history", "run"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    async def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the service did not exit within {timeout_s}s")
            await asyncio.sleep(0.1)
        return self.process.returncode

    def stop_now(self) -> None:
        """Kill the child if it still runs (test cleanup)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def service() -> Iterator[list[ServiceProcess]]:
    """Service processes started by a test (`start_service`); any still running at the end is killed."""
    started: list[ServiceProcess] = []
    yield started
    for proc in started:
        proc.stop_now()


def start_service(
    settings: Settings, tmp_path: Path, started: list[ServiceProcess], name: str
) -> ServiceProcess:
    """A started service process logging to `tmp_path/<name>.log`, kept in `started` (the `service` fixture's
    list, so that the test's end kills it)."""
    proc = ServiceProcess(settings, tmp_path / f"{name}.log")
    proc.start()
    started.append(proc)
    return proc


# --- events ------------------------------------------------------------------------------------------------


def _at(turn: int, offset_ms: int = 0) -> str:
    return f"2025-03-01T10:{turn:02d}:00.{offset_ms:03d}Z"


def text_message(role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}, **extra}


def request_id(thread: str, turn: int) -> str:
    return f"{thread}-turn{turn}"


def message_id(thread: str, resource: str, turn: int, kind: Kind = "input", position: int = 0) -> str:
    """The id the service gives the message at `position` of `kind` of `turn`'s events when it has none."""
    return derived_message_id(resource, thread, request_id(thread, turn), kind, position)


def request_event(thread: str, resource: str, turn: int, text: str, **extra: Any) -> dict[str, Any]:
    """An `AgentRequest` for `turn` of `thread`: one user message, ids and createdAt left to the service."""
    return {
        "schemaVersion": 1,
        "requestId": request_id(thread, turn),
        "threadId": thread,
        "resourceId": resource,
        "createdAt": _at(turn),
        "messages": [text_message("user", text)],
        **extra,
    }


def response_event(
    thread: str,
    resource: str,
    turn: int,
    input_messages: Sequence[dict[str, Any]],
    answer: str,
) -> dict[str, Any]:
    """An `AgentResponse` for `turn`: the input as the worker saw it and one assistant message."""
    return {
        "schemaVersion": 1,
        "requestId": request_id(thread, turn),
        "threadId": thread,
        "resourceId": resource,
        "createdAt": _at(turn, 500),
        "input": list(input_messages),
        "response": [text_message("assistant", answer)],
        "finishReason": "stop",
    }


def encoded(event: dict[str, Any]) -> tuple[bytes, bytes]:
    """(key, value) for an event: keyed by its thread."""
    return event["threadId"].encode(), json.dumps(event).encode()


def wave(threads: Sequence[str], turns: range) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """Encoded requests and matching responses for `turns` of every thread (resource "u"), turn by turn."""
    requests, responses = [], []
    for turn in turns:
        for thread in threads:
            request = request_event(thread, "u", turn, f"q{turn}")
            requests.append(encoded(request))
            responses.append(encoded(response_event(thread, "u", turn, request["messages"], f"a{turn}")))
    return requests, responses


def owned_turns(
    threads: Sequence[str], turns: int
) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """Requests and responses for `turns` turns of every thread (each its own owner, `owner-<thread>`),
    turn-major (threads interleave)."""
    requests, responses = [], []
    for turn in range(1, turns + 1):
        for thread in threads:
            request = request_event(thread, f"owner-{thread}", turn, f"question {turn}")
            requests.append(encoded(request))
            responses.append(
                encoded(
                    response_event(thread, f"owner-{thread}", turn, request["messages"], f"answer {turn}")
                )
            )
    return requests, responses


async def read_request_ids(bootstrap: str, topic: str, want: int, timeout_s: float = 120) -> list[Record]:
    """`topic`'s records once they hold `want` distinct request ids (redelivered copies count once)."""

    def enough(records: Sequence[Record]) -> bool:
        return len({v["requestId"] for v in values(records)}) >= want

    return await read_topic(bootstrap, topic, until=enough, timeout_s=timeout_s)


async def dead_letters(settings: Settings) -> list[Record]:
    """Every record of both dead-letter topics."""
    bootstrap = settings.kafka_bootstrap_servers
    letters = await read_all(bootstrap, settings.requests_dlq, settle_s=0.5)
    return letters + await read_all(bootstrap, settings.responses_dlq, settle_s=0.5)


def values(records: Iterable[Record]) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in records]


def first_occurrences(ids: Iterable[str]) -> list[str]:
    """`ids` without repeats, in the order each first appeared (what a worker deduplicating by id sees)."""
    return list(dict.fromkeys(ids))


# --- MongoDB -----------------------------------------------------------------------------------------------


async def stored_messages(settings: Settings) -> list[dict[str, Any]]:
    """Every row of `mastra_messages` in the test database."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        return await client[settings.mongodb_database]["mastra_messages"].find({}, {"_id": 0}).to_list()
    finally:
        await client.close()


async def stored_threads(settings: Settings) -> list[dict[str, Any]]:
    """Every row of `mastra_threads` in the test database."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        return await client[settings.mongodb_database]["mastra_threads"].find({}, {"_id": 0}).to_list()
    finally:
        await client.close()


async def drop_database(settings: Settings) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        await client.drop_database(settings.mongodb_database)
    finally:
        await client.close()
