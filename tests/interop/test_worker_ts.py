"""The TypeScript worker package (`worker-ts/`, `@message-history/worker`) under Node, on the local stack.

Its unit tests run under node's test runner; then its test worker (`worker-ts/test/fixtures/mastra-worker.ts`:
the package around a `@mastra/core` Agent without memory and a stub model) answers beside the service in this
process: a three-turn conversation on two threads with the worker killed (SIGKILL) in the middle of a turn and
restarted, and a failed turn; and a restart that finds a turn already answered on the responses topic but not
committed. The Node packages come from `deploy/local/stack install --all` (`npm ci`); without Node or them the
tests are skipped with the reason (they fail under CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from message_history.settings import Settings
from schemas.ids import Kind
from schemas.messages import format_timestamp
from tests.conftest import MakeTopic
from tests.infra import skip_or_fail, unique_name
from tests.integration.private_kafka import PrivateKafka, private_kafka  # noqa: F401 -- the fixture
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
from tests.integration.stream_helpers import committed_offsets, produce, read_all, read_topic
from tests.integration.test_service_kafka_outage import _make_topics
from tests.interop.node22 import node22

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

PACKAGE = Path(__file__).resolve().parents[2] / "worker-ts"
FIXTURE = "build/test/fixtures/mastra-worker.js"
WAIT_S = 90.0


@pytest.fixture(scope="module")
def node() -> str:
    """Node 22, once the package's npm packages are installed and its tests compiled by its TypeScript."""
    node = node22()
    for package in ("@platformatic/kafka", "kafkajs", "@mastra/core", "typescript"):
        if not (PACKAGE / "node_modules" / package).is_dir():
            skip_or_fail(
                f"worker-ts/node_modules/{package} is missing (run `deploy/local/stack install --all`)"
            )
    built = subprocess.run(
        [node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return node


def test_unit_tests_pass_under_node(node: str) -> None:
    """The package's pure half and its Mastra adapter (node --test)."""
    done = subprocess.run(
        [node, "--test", "build/test/unit.test.js"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "# fail 0" in output, output[-2000:]
    assert "# pass 0" not in output, output[-2000:]


class NodeWorker:
    """The test worker as a child process; its stdout lines are JSON events."""

    def __init__(self, node: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [node, FIXTURE], cwd=PACKAGE, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return [line for line in out if isinstance(line, dict)]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == name]

    async def wait_for(self, what: str, found: Callable[[], bool]) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not found():
            if self.process.poll() is not None:
                raise AssertionError(f"the worker exited waiting for {what}:\n{self.tail()}")
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no {what} after {WAIT_S:.0f} s:\n{self.tail()}")
            await asyncio.sleep(0.1)

    async def terminate(self) -> int:
        """SIGTERM, and the exit code once it left (it must, within the shutdown grace)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.process.wait, 40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"the worker did not stop on SIGTERM:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextlib.asynccontextmanager
async def node_worker(node: str, settings: Settings, log: Path, **env: str) -> AsyncIterator[NodeWorker]:
    worker = NodeWorker(
        node,
        {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
            "MESSAGE_HISTORY_ENRICHED_TOPIC": settings.enriched_topic,
            "MESSAGE_HISTORY_RESPONSES_TOPIC": settings.responses_topic,
            "WORKER_GROUP_ID": f"{settings.group_id}-ts",
            **env,
        },
        log,
    )
    try:
        yield worker
    finally:
        worker.kill()


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        content = json.loads(content)
    return " ".join(p.get("text", "") for p in content["parts"] if p["type"] == "text")


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once", "kafkajs", "kafkajs-exactly-once"])
async def test_mastra_agent_conversation_survives_a_killed_worker_and_fails_a_turn(
    node: str, kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path, guarantee: str
) -> None:
    """Three turns on two threads through the service. The worker is SIGKILLed while answering ada's second
    turn and restarted: that turn is answered once, by the new worker. Bob's third turn fails in the model:
    a failed turn, nothing of it saved. Every turn is answered exactly once; SIGTERM stops the worker.
    Under exactly-once (the service and the worker) every response went out in a transaction with its offset
    (the responses topic holds a commit marker after each). On the default client (@platformatic/kafka);
    "kafkajs": at-least-once on the package's KafkaJS adapter (`kafkajsClient`), "kafkajs-exactly-once":
    exactly-once on it."""
    modes = {"kafkajs": "at-least-once", "kafkajs-exactly-once": "exactly-once"}
    processing = modes.get(guarantee, guarantee)
    settings = fresh_settings(kafka_bootstrap, mongo_uri, processing_guarantee=processing)
    mode = {"MESSAGE_HISTORY_PROCESSING_GUARANTEE": processing}
    if guarantee.startswith("kafkajs"):
        mode["KAFKA_CLIENT"] = "kafkajs"
    for name in (settings.requests_topic, settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=2, name=name)
    bootstrap = settings.kafka_bootstrap_servers
    texts = {
        ("ada", 1): "Hi, I'm Ada.",
        ("ada", 2): "My favourite number is 1843.",
        ("ada", 3): "What do you remember?",
        ("bob", 1): "Bob here.",
        ("bob", 2): "I go to Lisbon.",
        ("bob", 3): "FAIL this turn, please.",
    }

    async def send_and_wait(turns: list[tuple[str, int]], worker: NodeWorker) -> None:
        sent = [
            request_event(t, f"{t}@test", k, texts[t, k], createdAt=format_timestamp(datetime.now(UTC)))
            for t, k in turns
        ]
        await produce(bootstrap, settings.requests_topic, [encoded(r) for r in sent])
        wanted = {request_id(t, k) for t, k in turns}
        try:
            await read_topic(
                bootstrap,
                settings.persisted_topic,
                until=lambda records: wanted <= {v["requestId"] for v in values(records)},
                timeout_s=WAIT_S,
            )
        except AssertionError:
            raise AssertionError(f"{sorted(wanted)} not persisted; worker log:\n{worker.tail()}") from None

    hanging = request_id("ada", 2)
    async with running_service(settings):
        async with node_worker(node, settings, tmp_path / "first.log", HANG_ON=hanging, **mode) as first:
            await send_and_wait([("ada", 1), ("bob", 1)], first)
            await produce(
                bootstrap,
                settings.requests_topic,
                [
                    encoded(
                        request_event(
                            "ada",
                            "ada@test",
                            2,
                            texts["ada", 2],
                            createdAt=format_timestamp(datetime.now(UTC)),
                        )
                    )
                ],
            )
            await first.wait_for("hanging turn", lambda: bool(first.events("hanging")))
            first.kill()  # SIGKILL in the middle of the turn: nothing sent, nothing committed
        async with node_worker(node, settings, tmp_path / "second.log", **mode) as second:
            await send_and_wait([("bob", 2)], second)
            await read_topic(
                bootstrap,
                settings.persisted_topic,
                until=lambda records: hanging in {v["requestId"] for v in values(records)},
                timeout_s=WAIT_S,
            )
            await send_and_wait([("ada", 3), ("bob", 3)], second)
            assert await second.terminate() == 0, second.tail()
            assert second.lines()[-1]["event"] == "stopped", second.tail()

    first_answered = {line["requestId"] for line in first.events("answered")}
    assert hanging not in first_answered
    assert {line["requestId"] for line in second.events("answered")} >= {hanging}
    records = await read_all(bootstrap, settings.responses_topic, settle_s=0.5)
    responses = values(records)
    assert Counter(r["requestId"] for r in responses) == Counter(request_id(t, k) for t, k in texts)
    # the offsets each partition's records sit at: under exactly-once a commit marker follows each record
    offsets: dict[int, list[int]] = {}
    for record in records:
        offsets.setdefault(record.partition, []).append(record.offset)
    step = 2 if processing == "exactly-once" else 1
    assert all(found == list(range(0, step * len(found), step)) for found in offsets.values()), offsets
    failed = next(r for r in responses if r["requestId"] == request_id("bob", 3))
    assert (failed["finishReason"], failed["response"]) == ("error", [])
    assert [line["requestId"] for line in second.events("failed")] == [request_id("bob", 3)]
    assert "the model failed" in second.events("failed")[0]["failure"]  # the typed event says why
    persisted = {v["requestId"]: v for v in values(await read_all(bootstrap, settings.persisted_topic))}
    assert persisted[request_id("bob", 3)]["skipped"] == "failed-turn"

    stored = await stored_messages(settings)
    for thread, turns in (("ada", 3), ("bob", 2)):
        rows = sorted(
            (m for m in stored if m["thread_id"] == thread), key=lambda m: (m["createdAt"], m["id"])
        )
        assert [(m["role"], m["id"]) for m in rows] == [
            (role, message_id(thread, f"{thread}@test", k, kind))
            for k in range(1, turns + 1)
            for role, kind in _ROLE_KINDS
        ]
        # the Agent was given the whole recalled context each turn
        assert [_text(m) for m in rows if m["role"] == "assistant"] == [
            f"I remember {2 * (k - 1)} earlier messages. You said: {texts[thread, k]}"
            for k in range(1, turns + 1)
        ]


_ROLE_KINDS: tuple[tuple[str, Kind], ...] = (("user", "input"), ("assistant", "response"))


def _enriched(thread: str, rid: str, text: str) -> dict[str, Any]:
    now = format_timestamp(datetime.now(UTC))
    return {
        "schemaVersion": 1,
        "requestId": rid,
        "eventId": rid,
        "threadId": thread,
        "resourceId": "r",
        "createdAt": now,
        "history": {"recalled": 0, "limit": 40},
        "messages": [
            {
                "id": f"{rid}:input:0",
                "role": "user",
                "createdAt": now,
                "threadId": thread,
                "resourceId": "r",
                "type": "v2",
                "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
                "source": "input",
            }
        ],
    }


@pytest.mark.parametrize(
    ("read_back", "answers_of_the_first", "client"),
    [("1000", 1, "platformatic"), ("0", 2, "platformatic"), ("1000", 1, "kafkajs")],
)
async def test_a_restart_does_not_answer_again_what_the_responses_topic_holds(
    node: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    read_back: str,
    answers_of_the_first: int,
    client: str,
) -> None:
    """A previous owner answered turn 1 (its response is on the responses topic) but crashed before
    committing: the new worker reads the responses topic back on assignment and drops turn 1 as a duplicate.
    With the read-back off (`readBackPerPartition: 0`) it answers it again: the read-back prevents it. On
    both client adapters (the read-back reads through each one's own consumer)."""
    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    for name in (settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=1, name=name)
    bootstrap = settings.kafka_bootstrap_servers
    first, second = _enriched("t", "t:1", "one"), _enriched("t", "t:2", "two")
    await produce(bootstrap, settings.enriched_topic, [encoded(first), encoded(second)])
    earlier = {
        "schemaVersion": 1,
        "requestId": "t:1",
        "threadId": "t",
        "resourceId": "r",
        "createdAt": format_timestamp(datetime.now(UTC)),
        "input": first["messages"],
        "response": [
            {"role": "assistant", "content": {"format": 2, "parts": [{"type": "text", "text": "1"}]}}
        ],
        "finishReason": "stop",
    }
    await produce(bootstrap, settings.responses_topic, [encoded(earlier)])

    async with node_worker(
        node, settings, tmp_path / "worker.log", READ_BACK=read_back, KAFKA_CLIENT=client
    ) as worker:
        await worker.wait_for(
            "both turns handled",
            lambda: {"t:1", "t:2"}
            <= {
                line.get("requestId") for line in worker.lines() if line["event"] in ("answered", "duplicate")
            },
        )
        assert await worker.terminate() == 0, worker.tail()

    responses = values(await read_all(bootstrap, settings.responses_topic, settle_s=0.5))
    counts = Counter(r["requestId"] for r in responses)
    assert counts == {"t:1": answers_of_the_first, "t:2": 1}, worker.tail()
    stopped = worker.lines()[-1]
    assert stopped["event"] == "stopped", worker.tail()
    assert (stopped["answered"], stopped["duplicates"]) == (answers_of_the_first, 2 - answers_of_the_first)


@pytest.mark.parametrize("client", ["kafkajs", "platformatic"])
async def test_a_hanging_turn_holds_its_thread_and_the_commit_not_the_other_threads(
    node: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, client: str
) -> None:
    """Turns of different threads on one partition run at the same time (as the Python SDK's, up to 32 per
    partition): a turn that never returns holds its own thread's next turn and the partition's commit (the
    offset stays before it), not the other threads' answers. Restarted without the hang, the worker answers
    the hung turn and the one behind it, and drops the other threads' (read back): each answered once."""
    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    for name in (settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=1, name=name)
    bootstrap = settings.kafka_bootstrap_servers
    turns = [("a", "a:1"), ("b", "b:1"), ("a", "a:2"), ("c", "c:1")]
    await produce(bootstrap, settings.enriched_topic, [encoded(_enriched(t, rid, rid)) for t, rid in turns])
    group = f"{settings.group_id}-ts"

    def ids(worker: NodeWorker, event: str) -> set[str]:
        return {line.get("requestId", "") for line in worker.events(event)}

    async with node_worker(
        node, settings, tmp_path / "first.log", HANG_ON="a:1", KAFKA_CLIENT=client
    ) as first:
        await first.wait_for("b:1 and c:1 answered", lambda: {"b:1", "c:1"} <= ids(first, "answered"))
        assert "a:1" in ids(first, "hanging"), first.tail()
        assert "a:2" not in ids(first, "turn"), "a thread's turns in order: a:2 waits for a:1"
        # answered is emitted once its commit is done: a commit past the hung turn (offset 0) would be there
        assert (await committed_offsets(bootstrap, group, settings.enriched_topic)).get(0, 0) == 0
        first.kill()

    async with node_worker(node, settings, tmp_path / "second.log", KAFKA_CLIENT=client) as second:
        await second.wait_for(
            "every turn handled",
            lambda: {"a:1", "a:2", "b:1", "c:1"} <= ids(second, "answered") | ids(second, "duplicate"),
        )
        assert await second.terminate() == 0, second.tail()
    assert ids(second, "answered") == {"a:1", "a:2"}, second.tail()
    responses = values(await read_all(bootstrap, settings.responses_topic, settle_s=0.5))
    assert Counter(r["requestId"] for r in responses) == {"a:1": 1, "a:2": 1, "b:1": 1, "c:1": 1}


OFF_WARNING = "read-back of answered requestIds is OFF"


async def test_a_read_back_that_cannot_read_says_loudly_that_it_is_off(
    node: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A worker that may not read the responses topic (docs/security.md's worker ACLs do not grant it; here:
    a responses topic name Kafka refuses) logs a WARNING that the read-back is off, naming the partitions and
    the rights it needs, and emits 'read-back-off'; it does not turn it off silently."""
    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic="no such topic!"
    )
    await make_topic(partitions=1, name=settings.enriched_topic)
    async with node_worker(node, settings, tmp_path / "worker.log") as worker:

        def warned() -> list[dict[str, Any]]:
            return [
                line
                for line in worker.events("log")
                if line.get("level") == "warn" and OFF_WARNING in line["message"]
            ]

        await worker.wait_for("the read-back warning", lambda: bool(warned()))
        assert warned()[0]["message"].startswith("WARNING"), worker.tail()
        assert warned()[0]["partitions"] == [0]
        assert "Read on the responses topic" in warned()[0]["message"]
        await worker.wait_for("read-back-off", lambda: bool(worker.events("read-back-off")))
        assert await worker.terminate() == 0, worker.tail()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_an_oversized_reply_is_a_failed_turn_once_never_a_loop(
    node: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, guarantee: str
) -> None:
    """The responses topic takes records up to 2,000 bytes. A reply too large for it is answered as a failed
    turn (its input only, which fits); a turn whose input alone is too large is dropped (committed, not
    answered). The handler runs once per turn either way, and the turns behind them are answered."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415

    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    await make_topic(partitions=1, name=settings.enriched_topic)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(settings.responses_topic, 1, 1, topic_configs={"max.message.bytes": "2000"})]
        )
    finally:
        await admin.close()
    turns = [
        _enriched("t", "t:small", "hello"),
        _enriched("t", "t:reply-too-large", "x" * 900),  # the stub repeats it: input + reply > 2,000
        _enriched("t", "t:input-too-large", "y" * 2500),  # even the failed turn (the input) > 2,000
        _enriched("t", "t:after", "still there?"),
    ]
    await produce(kafka_bootstrap, settings.enriched_topic, [encoded(t) for t in turns])
    mode = {"MESSAGE_HISTORY_PROCESSING_GUARANTEE": guarantee}
    async with node_worker(node, settings, tmp_path / "worker.log", **mode) as worker:

        def answered() -> set[str]:
            return {line["requestId"] for line in worker.events("answered")}

        await worker.wait_for("the turn after them", lambda: "t:after" in answered())
        assert await worker.terminate() == 0, worker.tail()
    assert Counter(line["requestId"] for line in worker.events("turn")) == {t["requestId"]: 1 for t in turns}
    isolation = "read_committed" if guarantee == "exactly-once" else "read_uncommitted"
    responses = values(await read_all(kafka_bootstrap, settings.responses_topic, isolation_level=isolation))
    assert [(r["requestId"], r["finishReason"]) for r in responses] == [
        ("t:small", "stop"),
        ("t:reply-too-large", "error"),
        ("t:after", "stop"),
    ]
    [failed] = worker.events("failed")
    assert failed["requestId"] == "t:reply-too-large"
    assert failed["failure"] == "the response is too large for Kafka"
    assert [line["requestId"] for line in worker.events("dropped")] == ["t:input-too-large"]
    stopped = worker.lines()[-1]
    assert (stopped["answered"], stopped["failed"]) == (2, 2), worker.tail()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_a_rate_limited_turn_is_retried_not_failed(
    node: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, guarantee: str
) -> None:
    """The handler throws RetryLater (a provider's 429) on a turn's first attempt: the worker backs off and
    calls it again for the same turn, which is then answered (not a failed turn, which would erase the
    user's message from the saved turn); the turn behind it on the partition waits and is answered after."""
    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    for name in (settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=1, name=name)
    turns = [_enriched("t", "t:limited", "RATELIMIT me"), _enriched("t", "t:next", "and then")]
    await produce(kafka_bootstrap, settings.enriched_topic, [encoded(t) for t in turns])
    mode = {"MESSAGE_HISTORY_PROCESSING_GUARANTEE": guarantee}
    async with node_worker(node, settings, tmp_path / "worker.log", **mode) as worker:
        await worker.wait_for("t:next answered", lambda: len(worker.events("answered")) == 2)
        assert await worker.terminate() == 0, worker.tail()
    assert [line["requestId"] for line in worker.events("turn")] == ["t:limited", "t:limited", "t:next"]
    [retrying] = worker.events("retrying")
    assert (retrying["requestId"], retrying["attempt"]) == ("t:limited", 1)
    assert retrying["delayMs"] >= 200  # the error's afterMs is the floor
    isolation = "read_committed" if guarantee == "exactly-once" else "read_uncommitted"
    responses = values(await read_all(kafka_bootstrap, settings.responses_topic, isolation_level=isolation))
    answers = [(r["requestId"], r["finishReason"]) for r in responses]
    assert answers == [("t:limited", "stop"), ("t:next", "stop")]
    stopped = worker.lines()[-1]
    assert (stopped["answered"], stopped["failed"], stopped["retried"]) == (2, 0, 1), worker.tail()


@pytest.mark.parametrize("client", ["kafkajs", "platformatic"])
async def test_a_zombie_worker_cannot_publish_under_exactly_once(
    node: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path, client: str
) -> None:
    """Worker A is frozen (SIGSTOP) in the middle of a turn; its partition moves to worker B, which opens the
    partition's transactional id (fencing A) and answers the turn. A thawed (SIGCONT) finishes its handler and
    tries to commit: fenced, nothing of it visible. read_committed readers see the turn answered once."""
    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    for name in (settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=1, name=name)
    mode = {"MESSAGE_HISTORY_PROCESSING_GUARANTEE": "exactly-once", "READ_BACK": "0", "KAFKA_CLIENT": client}
    await produce(kafka_bootstrap, settings.enriched_topic, [encoded(_enriched("t", "t:z", "zombie?"))])
    async with node_worker(node, settings, tmp_path / "a.log", SLOW_ON="t:z", **mode) as zombie:
        await zombie.wait_for("the turn started", lambda: bool(zombie.events("turn")))
        zombie.process.send_signal(signal.SIGSTOP)  # frozen mid-turn: no heartbeats, no commit
        try:
            async with node_worker(node, settings, tmp_path / "b.log", **mode) as owner:
                await owner.wait_for("the turn answered by B", lambda: bool(owner.events("answered")))
                zombie.process.send_signal(signal.SIGCONT)

                def fenced() -> bool:
                    return any("transaction fenced" in line.get("message", "") for line in zombie.lines())

                await zombie.wait_for("the zombie fenced", fenced)
                assert await owner.terminate() == 0, owner.tail()
        finally:
            zombie.process.send_signal(signal.SIGCONT)
    assert [line["requestId"] for line in owner.events("answered")] == ["t:z"]
    assert zombie.events("answered") == []
    topic = settings.responses_topic
    committed = values(await read_all(kafka_bootstrap, topic, isolation_level="read_committed", settle_s=0.5))
    assert [r["requestId"] for r in committed] == ["t:z"]


async def _through_a_frozen_and_a_stopped_broker(
    node: str, kafka: PrivateKafka, tmp_path: Path, client: str, guarantee: str
) -> tuple[list[str], Counter[str], NodeWorker]:
    """480 turns on 2 partitions answered by the Node worker on `client` under `guarantee`, on a test-owned
    broker frozen 3 s four times (longer than the worker's 1 s request timeout: a request asked then goes
    unanswered), then stopped 6 s and started again; the worker waits the outage out and stops on SIGTERM.
    Returns the requests, the responses a read_committed reader sees (per request) and the worker."""
    bootstrap = kafka.bootstrap
    run = unique_name("")
    settings = fresh_settings(
        bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    await _make_topics(bootstrap, [settings.enriched_topic, settings.responses_topic])
    rids = [f"t{t}:{n}" for n in range(80) for t in range(6)]
    await produce(
        bootstrap, settings.enriched_topic, [encoded(_enriched(r.split(":")[0], r, "hi")) for r in rids]
    )
    mode = {
        "MESSAGE_HISTORY_PROCESSING_GUARANTEE": guarantee,
        "READ_BACK": "0",  # nothing masks a duplicate (exactly-once: the transactions alone keep it out)
        "TURN_MS": "5",
        "REQUEST_TIMEOUT_MS": "1000",
        "KAFKA_CLIENT": client,
    }
    async with node_worker(node, settings, tmp_path / "worker.log", **mode) as worker:
        await worker.wait_for("a first answer", lambda: bool(worker.events("answered")))
        for _ in range(4):  # frozen while commits are due: some EndTxn goes unanswered
            kafka.freeze()
            await asyncio.sleep(3)
            kafka.thaw()
            await asyncio.sleep(1.5)
        await asyncio.to_thread(kafka.stop)
        await asyncio.sleep(6)
        await asyncio.to_thread(kafka.start)
        # not met in time: the assertions on what was read say which requests are missing
        with contextlib.suppress(AssertionError):
            await read_topic(
                bootstrap,
                settings.responses_topic,
                until=lambda rs: len({v["requestId"] for v in values(rs)}) >= len(rids),
                timeout_s=180,
                isolation_level="read_committed",
            )
        assert await worker.terminate() == 0, worker.tail()
    committed = values(
        await read_all(bootstrap, settings.responses_topic, isolation_level="read_committed", settle_s=1.0)
    )
    return rids, Counter(r["requestId"] for r in committed), worker


@pytest.mark.parametrize("client", ["kafkajs", "platformatic"])
async def test_exactly_once_through_a_frozen_and_a_stopped_broker_answers_every_turn_once(
    node: str,
    private_kafka: PrivateKafka,  # noqa: F811 -- the fixture
    tmp_path: Path,
    client: str,
) -> None:
    """Exactly-once through the outage above. A commit in doubt is settled (a new producer on the
    partition's transactional id, then the group's committed offset), never sent again on a guess: a
    read_committed reader sees one response per request, none lost. On @platformatic/kafka this stalled
    (200 of 480 answered) before its adapter closed a failed stream at once, bounded its transactional
    retries and replaced a producer out of sequence (src/platformatic.ts)."""
    rids, ids, worker = await _through_a_frozen_and_a_stopped_broker(
        node, private_kafka, tmp_path, client, "exactly-once"
    )
    assert set(rids) - set(ids) == set()
    assert set(ids.values()) == {1}, {rid: n for rid, n in ids.items() if n > 1}
    doubts = [line for line in worker.lines() if "commit in doubt" in line.get("message", "")]
    print(f"commits in doubt settled: {len(doubts)}")


# KafkaJS 2.2.4 loses acknowledged answers here (runs and figures: worker-ts/README.md, "The Kafka client"):
# a produce request timed out in the frozen broker is counted as not written (its sequence number
# rolled back) while the broker writes it after the thaw; the next send reuses that sequence number with
# another turn's answer, which the broker takes for a duplicate and acknowledges without writing it.
KAFKAJS_LOSES_ANSWERS = pytest.mark.xfail(
    strict=False,  # the loss needs a send to time out while answers are in flight: a run may not meet it
    reason="KafkaJS 2.2.4: a timed-out idempotent send rolls its sequence back; the next send's answer is "
    "acknowledged as a duplicate and lost (tulios/kafkajs, no release since 2023)",
)


@pytest.mark.parametrize("client", [pytest.param("kafkajs", marks=KAFKAJS_LOSES_ANSWERS), "platformatic"])
async def test_at_least_once_through_a_frozen_and_a_stopped_broker_answers_every_turn(
    node: str,
    private_kafka: PrivateKafka,  # noqa: F811 -- the fixture
    tmp_path: Path,
    client: str,
) -> None:
    """At-least-once through the same outage: every request answered (a turn redelivered from the committed
    offset may be answered twice, as documented: the read-back is off here), and the worker stops on
    SIGTERM."""
    rids, ids, _worker = await _through_a_frozen_and_a_stopped_broker(
        node, private_kafka, tmp_path, client, "at-least-once"
    )
    assert set(rids) - set(ids) == set()
    print(f"answered twice or more: {sum(1 for n in ids.values() if n > 1)}")
