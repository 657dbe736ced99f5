"""The Mastra worker example under Node: a `@mastra/core` 1.71 `Agent` without memory, a stub model, and the
TypeScript worker package (`worker-ts/`, linked as `@message-history/worker`).

The service runs in-process; the example (tests/interop/mastra-worker, TypeScript compiled with its pinned
`tsc`) answers the enriched requests of a three-turn conversation on each of two threads. Each turn's
enriched context must be every earlier turn, the agent's model must have been given exactly that context, and
the stored history must be the dialogue, each message once. The Node packages come from
`deploy/local/stack install --all` (`npm ci`); without Node or them the test is skipped with the reason (it
fails under CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from message_history.settings import Settings
from schemas.ids import Kind
from schemas.messages import format_timestamp
from tests.conftest import MakeTopic
from tests.infra import skip_or_fail
from tests.integration.service_harness import (
    encoded,
    fresh_settings,
    message_id,
    request_event,
    request_id,
    running_service,
    stored_messages,
    values,
)
from tests.integration.stream_helpers import produce, read_all, read_topic
from tests.interop.node22 import build_package, node22

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

HERE = Path(__file__).parent / "mastra-worker"
THREADS = ("ada", "bob")
ROLES: tuple[tuple[str, Kind], ...] = (("user", "input"), ("assistant", "response"))
TURNS = 3
WAIT_S = 90.0


def _node() -> str:
    """Node 22, once the example's packages are installed; skip (fail under CI) otherwise."""
    node = node22()
    reason = None
    if node:
        for package in ("@mastra/core", "@message-history/worker/dist", "typescript"):
            if not (HERE / "node_modules" / package).is_dir():
                where = f"tests/interop/mastra-worker/node_modules/{package}"
                reason = f"{where} is missing (run `deploy/local/stack install --all`)"
                break
    if reason is not None:
        skip_or_fail(reason)
    assert node is not None
    return node


@pytest.fixture(scope="module")
def built() -> str:
    """The example built by its pinned TypeScript (type-checked against Mastra's and the package's types)."""
    node = _node()
    # The package first (the example links worker-ts/): its dist/ then matches its sources.
    build_package(node)
    result = subprocess.run(
        [node, "node_modules/typescript/bin/tsc", "-p", "."],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return node


def _spawn(node: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [node, "dist/worker.js"], cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT
        )


@contextlib.asynccontextmanager
async def node_worker(node: str, settings: Settings, log: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    """The example as a child process on the test's topics; SIGTERM on exit (it must leave cleanly)."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "MESSAGE_HISTORY_ENRICHED_TOPIC": settings.enriched_topic,
        "MESSAGE_HISTORY_RESPONSES_TOPIC": settings.responses_topic,
        "WORKER_GROUP_ID": f"{settings.group_id}-mastra",
    }
    process = _spawn(node, env, log)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
                raise AssertionError(
                    f"the worker did not stop on SIGTERM:\n{log.read_text()[-4000:]}"
                ) from None


def _lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return [line for line in out if isinstance(line, dict)]


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        content = json.loads(content)
    return " ".join(p.get("text", "") for p in content["parts"] if p["type"] == "text")


async def test_mastra_agent_worker_holds_a_conversation(
    built: str, kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Three turns on two threads: contexts grow, the agent sees them, the history is the dialogue, once."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    for name in (settings.requests_topic, settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=2, name=name)
    bootstrap = settings.kafka_bootstrap_servers
    log = tmp_path / "worker.log"
    async with running_service(settings), node_worker(built, settings, log) as process:
        for turn in range(1, TURNS + 1):
            sent = [
                request_event(
                    t, f"user-{t}", turn, f"{t} says {turn}", createdAt=format_timestamp(datetime.now(UTC))
                )
                for t in THREADS
            ]
            await produce(bootstrap, settings.requests_topic, [encoded(r) for r in sent])
            wanted = {request_id(t, turn) for t in THREADS}

            def done(records: list[Any], wanted: set[str] = wanted) -> bool:
                return wanted <= {v["requestId"] for v in values(records)}

            try:
                await read_topic(bootstrap, settings.persisted_topic, until=done, timeout_s=WAIT_S)
            except AssertionError:
                raise AssertionError(
                    f"turn {turn} not persisted; worker log:\n{log.read_text()[-4000:]}"
                ) from None
        assert process.poll() is None, log.read_text()[-4000:]

    lines = _lines(log)
    assert lines[-1]["event"] == "stopped", lines[-3:]  # SIGTERM: finished and left the group
    answered = {line["requestId"]: line for line in lines if line.get("event") == "answered"}
    enriched = {
        v["requestId"]: v for v in values(await read_all(bootstrap, settings.enriched_topic, settle_s=0.5))
    }
    responses = values(await read_all(bootstrap, settings.responses_topic, settle_s=0.5))
    stored = await stored_messages(settings)
    for thread in THREADS:
        for turn in range(1, TURNS + 1):
            rid = request_id(thread, turn)
            context = enriched[rid]["messages"]
            assert [m["source"] for m in context] == ["memory"] * (2 * (turn - 1)) + ["input"]
            assert [m["id"] for m in context] == [
                message_id(thread, f"user-{thread}", k, kind)
                for k in range(1, turn)
                for kind in ("input", "response")
            ] + [message_id(thread, f"user-{thread}", turn, "input")]
            # the Agent gave its model the system instructions plus exactly that context
            assert answered[rid]["promptMessages"] == 1 + len(context)
            assert answered[rid]["finishReason"] == "stop"
        rows = sorted(
            (m for m in stored if m["thread_id"] == thread), key=lambda m: (m["createdAt"], m["id"])
        )
        assert [(m["role"], m["id"]) for m in rows] == [
            (role, message_id(thread, f"user-{thread}", k, kind))
            for k in range(1, TURNS + 1)
            for role, kind in ROLES
        ]
        assert [_text(m) for m in rows if m["role"] == "assistant"] == [
            f"I remember {2 * (k - 1)} earlier messages. You said: {thread} says {k}"
            for k in range(1, TURNS + 1)
        ]
    # the responses echo the context with its source tags and carry the Agent's message in Mastra's shape
    last = next(r for r in responses if r["requestId"] == request_id("ada", TURNS))
    assert [m["source"] for m in last["input"]] == ["memory"] * 4 + ["input"]
    assert [(m["role"], m["content"]["format"]) for m in last["response"]] == [("assistant", 2)]
