"""`message-history demo`: a scripted conversation through the real service, printed turn by turn.

It needs the local stack (`KAFKA_BOOTSTRAP_SERVERS`, `MONGODB_URI`) and nothing else: it creates fresh topics,
a fresh consumer group and a fresh database (all suffixed with a short random id, so demos never mix), starts
the service in this process, and plays three parts:

- a **driver** (the client): sends each thread's `AgentRequest`, then waits for that turn's `HistoryPersisted`
  before sending the thread's next turn, as a real client would;
- a **stand-in agent worker** built on the worker SDK (`worker.AgentWorker`): reads
  `agent.requests.enriched`, prints the context it got (the recalled history visibly grows turn by turn),
  "answers from memory" deterministically, and the SDK sends the `AgentResponse`;
- at the end, the threads **as stored in MongoDB** (`mastra_threads` and `mastra_messages` rows).

With `--observational`, Observational Memory is on (a low threshold, `DEMO_OBSERVATION_TOKENS`) and a fourth
part runs: a **stub observer** on the Python SDK (`worker.observer`) that answers each `ObserveRequest` with
one line per observed message; each enriched block then shows the log in the context, `history.observed` and
the log's tokens growing as the conversation does, and the dump prints the `mastra_observational_memory` row.

Every wait is bounded; the exit code is 0 on success and 1 with a message on failure. The service is stopped
with the same stop event SIGTERM sets; the demo's topics and database are removed afterwards.
This module runs the parts against the stack; what they say and print is `demo_script.py` (pure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sys
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from message_history.app.demo_script import (
    DemoThread,
    answer_from_memory,
    build_request,
    observations_of,
    render_enriched,
    render_stored_thread,
    script,
)
from message_history.app.topics import ensure_topics, service_topics
from message_history.logs import configure_logging, register_settings_secrets, scrub
from message_history.settings import Settings
from producers.connection import kafka_options as connection_options
from schemas.codec import decode_persisted, encode
from schemas.events import HistoryPersisted
from schemas.observational import ObserveRequest
from storage.client import mongo_client
from worker import AgentWorker, Reply, Turn
from worker.observer import ObserverWorker, observer_handler

FIRST_TURN_TIMEOUT_S = 90.0  # the first turn also waits for three consumer groups to form
TURN_TIMEOUT_S = 30.0
SETUP_TIMEOUT_S = 30.0
DEMO_PARTITIONS = 2
DEMO_OBSERVATION_TOKENS = 120  # Mastra's default is 30 000: the demo's short turns pass this every few turns


class DemoError(Exception):
    """The demo could not complete; the message says which step and why."""


# --- settings and Kafka plumbing ---------------------------------------------------------------------------


def demo_settings(base: Settings, run_id: str, *, observational: bool = False) -> Settings:
    """The environment's settings with fresh topics, group and database; the HTTP server on a free port;
    with `observational`, Observational Memory on at the demo's low threshold."""
    prefix = f"demo-{run_id}"
    om: dict[str, Any] = (
        {"observational_memory": True, "observation_message_tokens": DEMO_OBSERVATION_TOKENS}
        if observational
        else {}
    )
    return base.model_copy(
        update={
            **om,
            "requests_topic": f"{prefix}.agent.requests",
            "enriched_topic": f"{prefix}.agent.requests.enriched",
            "responses_topic": f"{prefix}.agent.responses",
            "persisted_topic": f"{prefix}.agent.history.persisted",
            "requests_dlq_topic": None,
            "responses_dlq_topic": None,
            # the commands path's topics too: the demo creates and, afterwards, deletes every topic it uses
            "commands_topic": f"{prefix}.agent.history.commands",
            "forgotten_topic": f"{prefix}.agent.history.forgotten",
            "commands_dlq_topic": None,
            "observe_requests_topic": f"{prefix}.agent.memory.observe",
            "observe_results_topic": f"{prefix}.agent.memory.observed",
            "observe_results_dlq_topic": None,
            "group_id": f"message-history-{prefix}",
            "group_instance_id": None,
            "mongodb_database": f"mastra_demo_{run_id}",
            "http_host": "127.0.0.1",
            "http_port": 0,
        }
    )


def kafka_options(settings: Settings, client_id: str) -> dict[str, Any]:
    """aiokafka connection options from the settings (security included), as the service builds them."""
    return connection_options(settings, client_id=client_id)


async def create_topics(settings: Settings) -> None:
    await ensure_topics(settings, partitions=DEMO_PARTITIONS, replication=1)
    await _wait_for_leaders(settings)


async def _wait_for_leaders(settings: Settings) -> None:
    """Read every new partition's end offset once: it succeeds only when the broker leads the partition.

    Without it the parts' first offset lookups race the broker taking leadership and log transient errors.
    """
    fetcher_log = logging.getLogger("aiokafka.consumer.fetcher")
    level = fetcher_log.level
    fetcher_log.setLevel(logging.CRITICAL)  # only this probe runs now; its retries are expected
    probe = AIOKafkaConsumer(
        **kafka_options(settings, "message-history-demo-admin"), enable_auto_commit=False
    )
    await probe.start()
    try:
        partitions = [TopicPartition(t, p) for t in service_topics(settings) for p in range(DEMO_PARTITIONS)]
        await probe.end_offsets(partitions)
    finally:
        await probe.stop()
        fetcher_log.setLevel(level)


async def remove_demo_data(settings: Settings) -> None:
    """Delete the demo's topics and drop its database (best effort: failures only leave litter behind)."""
    with contextlib.suppress(Exception):
        admin = AIOKafkaAdminClient(**kafka_options(settings, "message-history-demo-admin"))
        await admin.start()
        try:
            await admin.delete_topics(service_topics(settings))
        finally:
            await admin.close()
    with contextlib.suppress(Exception):
        client = mongo_client(settings, appname="message-history-demo")
        try:
            await client.drop_database(settings.mongodb_database)
        finally:
            await client.close()


# --- the service -------------------------------------------------------------------------------------------


def start_service(settings: Settings, stop: asyncio.Event) -> Coroutine[Any, Any, int]:
    """The in-process service (both paths), running until `stop` is set: the event SIGTERM sets in
    `message-history run`. Returns its exit code. The one place that knows the service's entry point."""
    from message_history.app.service import run_service  # noqa: PLC0415 -- the service's imports are heavy

    return run_service(settings, stop=stop)


# --- the run -----------------------------------------------------------------------------------------------


@dataclass
class Demo:
    settings: Settings
    run_id: str
    threads: list[DemoThread]
    out: TextIO
    turn_of: dict[str, int] = field(default_factory=dict)  # requestId -> turn number
    persisted: dict[str, asyncio.Future[HistoryPersisted]] = field(default_factory=dict)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    async def observe(self, work: ObserveRequest) -> str:
        """The stub observer, as the observer SDK's handler: prints what it saw, answers its observations."""
        self.say(f"  [observer] {work.threadId}: cycle {work.cycle}, {len(work.messages)} messages observed")
        return observations_of(work)

    def waiter(self, request_id: str) -> asyncio.Future[HistoryPersisted]:
        if request_id not in self.persisted:
            self.persisted[request_id] = asyncio.get_running_loop().create_future()
        return self.persisted[request_id]

    async def answer(self, turn: Turn) -> Reply:
        """The stand-in agent, as the worker SDK's handler: the context printed, answered from memory."""
        answer = answer_from_memory(turn.event)
        self.say(render_enriched(turn.event, self.turn_of.get(turn.request_id), answer))
        return Reply.text(answer)

    async def persisted_reader(self, consumer: AIOKafkaConsumer) -> None:
        """Resolves the driver's waits as `HistoryPersisted` events arrive."""
        async for record in consumer:
            event = decode_persisted(record.value)
            future = self.waiter(event.requestId)
            if not future.done():
                future.set_result(event)

    async def drive(self, producer: AIOKafkaProducer, background: Sequence[asyncio.Task[Any]]) -> None:
        """Turn by turn: send every thread's request, then wait for every thread's HistoryPersisted."""
        turns = len(self.threads[0].lines) if self.threads else 0
        for turn in range(1, turns + 1):
            pending: dict[str, asyncio.Future[HistoryPersisted]] = {}
            for thread in self.threads:
                request_id = f"{thread.thread_id}-turn-{turn}"
                self.turn_of[request_id] = turn
                pending[request_id] = self.waiter(request_id)
                request = build_request(thread, turn, request_id)
                await producer.send_and_wait(
                    self.settings.requests_topic, encode(request), key=thread.thread_id.encode()
                )
            timeout = FIRST_TURN_TIMEOUT_S if turn == 1 else TURN_TIMEOUT_S
            await wait_or_fail(
                asyncio.gather(*pending.values()),
                background,
                timeout,
                f"turn {turn}: HistoryPersisted for {sorted(pending)}",
            )
            for request_id, future in pending.items():
                event = future.result()
                saved = len(event.savedMessageIds)
                note = f"skipped: {event.skipped}" if event.skipped else f"saved {saved} messages"
                self.say(f"  [persisted] {request_id}: {note}")
            self.say("")

    async def dump_mongodb(self) -> None:
        """Print each demo thread as stored: its mastra_threads, mastra_messages and OM rows."""
        client = mongo_client(self.settings, appname="message-history-demo")
        try:
            db = client[self.settings.mongodb_database]
            self.say(f"=== stored in MongoDB (database {self.settings.mongodb_database}) ===")
            for thread in self.threads:
                row = await db["mastra_threads"].find_one({"id": thread.thread_id})
                if row is None:
                    raise DemoError(f"thread {thread.thread_id} is not in mastra_threads")
                cursor = (
                    db["mastra_messages"]
                    .find({"thread_id": thread.thread_id})
                    .sort([("createdAt", 1), ("id", 1)])
                )
                messages = await cursor.to_list(None)
                om = (
                    await db["mastra_observational_memory"].find_one(
                        {"lookupKey": f"thread:{thread.thread_id}"}
                    )
                    if self.settings.observational_memory
                    else None
                )
                for line in render_stored_thread(row, messages, om):
                    self.say(line)
        finally:
            await client.close()


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def wait_or_fail(
    awaitable: Awaitable[Any], background: Sequence[asyncio.Task[Any]], timeout_s: float, what: str
) -> Any:
    """Await `awaitable`; fail clearly on timeout or when a background part (service, worker) stops first."""
    main = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({main, *background}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if main in done:
        return main.result()
    main.add_done_callback(_consume_outcome)  # abandoned: its eventual error is not worth a log line
    main.cancel()
    for task in background:
        if task in done:
            exc = None if task.cancelled() else task.exception()
            reason = f"{type(exc).__name__}: {exc}" if exc else f"it returned {task.result()!r}"
            raise DemoError(f"{task.get_name()} stopped while waiting for {what} ({reason})")
    raise DemoError(f"no answer within {timeout_s:g} s while waiting for {what}")


async def run_demo(
    threads: int, turns: int, out: TextIO = sys.stdout, *, keep: bool = False, observational: bool = False
) -> None:
    """The whole demo; raises DemoError on failure."""
    if threads < 1 or turns < 1:
        raise DemoError("--threads and --turns must be at least 1")
    base = Settings()
    register_settings_secrets(base)
    run_id = secrets.token_hex(3)
    settings = demo_settings(base, run_id, observational=observational)
    demo = Demo(settings, run_id, script(run_id, threads, turns), out)
    demo.say(f"message-history demo {run_id}: {threads} threads x {turns} turns")
    demo.say(f"  client  -> {settings.requests_topic} -> service (recall) -> {settings.enriched_topic}")
    demo.say(f"  agent   -> {settings.responses_topic} -> service (persist) -> {settings.persisted_topic}")
    if observational:
        demo.say(
            f"  observer -> {settings.observe_requests_topic} -> stub observer -> "
            f"{settings.observe_results_topic} (observation at {settings.observation_message_tokens} tokens)"
        )
    demo.say(f"  storage :  MongoDB database {settings.mongodb_database} (group {settings.group_id})\n")

    try:
        await wait_or_fail(create_topics(settings), (), SETUP_TIMEOUT_S, "creating the demo topics")
        await _run_parts(demo)
    finally:
        if not keep:
            await remove_demo_data(settings)


async def _run_parts(demo: Demo) -> None:
    settings = demo.settings
    stop = asyncio.Event()
    service = asyncio.create_task(start_service(settings, stop), name="the service")
    producer = AIOKafkaProducer(**kafka_options(settings, "demo-client"), acks="all", enable_idempotence=True)
    agent = AgentWorker.from_settings(
        demo.answer, settings, group_id=f"demo-{demo.run_id}-agent", handle_signals=False
    )
    reader_consumer = AIOKafkaConsumer(
        settings.persisted_topic,
        **kafka_options(settings, "demo-client"),
        group_id=f"demo-{demo.run_id}-client",
        auto_offset_reset="earliest",
    )
    observer = (
        ObserverWorker.from_settings(
            observer_handler(demo.observe), settings, group_id=f"demo-{demo.run_id}-observer"
        )
        if settings.observational_memory
        else None
    )
    clients: tuple[AIOKafkaProducer | AIOKafkaConsumer | AgentWorker | ObserverWorker, ...] = (
        reader_consumer,
        producer,
        agent,
        *((observer,) if observer is not None else ()),
    )
    tasks: list[asyncio.Task[Any]] = [service]
    try:
        await wait_or_fail(
            _start_all(*clients),
            tasks,
            SETUP_TIMEOUT_S,
            "the demo's Kafka clients to connect",
        )
        tasks.append(asyncio.create_task(agent.run(), name="the agent worker"))
        tasks.append(asyncio.create_task(demo.persisted_reader(reader_consumer), name="the persisted reader"))
        if observer is not None:
            tasks.append(asyncio.create_task(observer.run(), name="the stub observer"))
        await demo.drive(producer, tasks)
        await demo.dump_mongodb()
    except BaseException:
        await _shutdown(stop, service, tasks[1:], clients, settings)
        raise
    # Only a clean run reports a failed shutdown (otherwise the first error is the one worth reading).
    stopped = await _shutdown(stop, service, tasks[1:], clients, settings)
    if stopped is not None:
        raise stopped


async def _shutdown(
    stop: asyncio.Event,
    service: asyncio.Task[Any],
    parts: Sequence[asyncio.Task[Any]],
    clients: Sequence[AIOKafkaProducer | AIOKafkaConsumer | AgentWorker | ObserverWorker],
    settings: Settings,
) -> DemoError | None:
    """Stop the demo's parts, then the service through its stop event; return what went wrong, if anything."""
    stop.set()
    for task in parts:
        task.cancel()
    await asyncio.gather(*parts, return_exceptions=True)
    for client in clients:
        with contextlib.suppress(Exception):
            if isinstance(client, AgentWorker | ObserverWorker):
                await client.__aexit__(None, None, None)
            else:
                await client.stop()
    timeout_s = settings.shutdown_grace_s + 5
    try:
        async with asyncio.timeout(timeout_s):
            code = await service
    except TimeoutError:
        service.cancel()
        return DemoError(f"the service did not stop within {timeout_s:g} s of the stop signal")
    except Exception as exc:  # noqa: BLE001 -- reported to the user as the demo's failure
        return DemoError(f"the service failed: {type(exc).__name__}: {exc}")
    if code != 0:
        return DemoError(f"the service exited with code {code} (its log on stderr says why)")
    return None


async def _start_all(*clients: AIOKafkaProducer | AIOKafkaConsumer | AgentWorker | ObserverWorker) -> None:
    for client in clients:
        if isinstance(client, AgentWorker | ObserverWorker):
            await client.__aenter__()
        else:
            await client.start()


def main(threads: int = 2, turns: int = 3, *, observational: bool = False) -> int:
    """Entry of `message-history demo`: 0 on success, 1 with a message on stderr on failure."""
    configure_logging("WARNING")  # the service's own lines go to stderr as JSON; the demo prints to stdout
    try:
        asyncio.run(run_demo(threads, turns, observational=observational))
    except DemoError as exc:
        print(f"demo failed: {scrub(str(exc))}", file=sys.stderr)
        return 1
    except Exception as exc:  # a CLI answers with one clear line; the log has the details
        logging.getLogger(__name__).exception("demo failed")
        print(f"demo failed: {type(exc).__name__}: {scrub(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted", file=sys.stderr)
        return 1
    print("demo finished: every turn was recalled, answered and persisted")
    return 0
