"""The store-side fuzzer through the real MongoDB-wire server and a running service (issue 31, item 3).

Generated `mastra_messages` / `mastra_threads` documents (tests/store_fuzzing.py) are inserted with PyMongo
into the service's database while it runs: odd threads get generated rows (and sometimes a generated thread
document), plus raw BSON no Python value builds (invalid UTF-8, a date in year 20000 or before year 1, a
deep sub-document: `RAW_ODD`), inserted as `RawBSONDocument`; a row the server refuses (a duplicate `id`
under the unique index, a document it will not store) is counted and left out. Calm threads hold
well-formed rows. Then one request and one response per thread go through Kafka.

The property, checked every 0.2 s and at the end: the service keeps running and stays ready (its `Health`);
every calm thread's request is enriched with its rows and its response persisted; every odd thread's
records are enriched / persisted (odd rows skipped and counted in `history.skipped`) or dead-lettered with
a reason naming the row (or an ownership refusal a generated thread document decides); nothing stalls
(every record has its outcome within the timeout).

`STORE_FUZZ_THREADS` (default 8) odd threads per run and `STORE_FUZZ_RUNS` (default 2) runs size it; the
long run is documented in docs/fuzzing.md#stored-rows-the-store-side-fuzzer.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Final

import pytest
from aiokafka import AIOKafkaProducer
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from message_history.app.health import Health
from message_history.errors import InvalidInputError
from schemas.codec import decode_enriched
from schemas.dead_letters import parse_dead_letter_headers
from storage.documents import MESSAGES, THREADS
from tests.integration.service_harness import fresh_settings, running_service
from tests.integration.test_fuzz_stream import Outputs, _create_topics, _delete_topics, _reading
from tests.paths import assistant, request, response, user
from tests.store_fuzzing import RAW_ODD, StoredRow, message_rows, raw_message, thread_rows
from tests.unit.test_fuzz_stored_rows import good_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

THREADS_PER_RUN: Final = int(os.environ.get("STORE_FUZZ_THREADS", "8"))
RUNS: Final = int(os.environ.get("STORE_FUZZ_RUNS", "2"))
CALM_THREADS: Final = 3
OUTCOME_TIMEOUT_S: Final = 120.0


@dataclass
class OddThread:
    thread: str
    owner: str
    rows: list[StoredRow]
    doc: StoredRow | None
    memory: dict[str, Any]


@dataclass
class Run:
    """What one run sent, stored and saw."""

    odd: list[OddThread]
    inserted: int = 0
    refused_by_server: int = 0
    refusals: list[str] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


def _odd_thread(i: int) -> st.SearchStrategy[OddThread]:
    thread, owner = f"t-odd-{i}", f"u-odd-{i}"  # each run has its own database and topics
    return st.builds(
        OddThread,
        st.just(thread),
        st.just(owner),
        st.lists(message_rows(thread, owner), min_size=1, max_size=4),
        st.one_of(st.none(), st.none(), thread_rows(thread, owner)),
        st.sampled_from([{}, {"lastMessages": 2}, {"maxTokens": 20, "atMaxRemoveTokens": 5}]),
    )


# one strategy object for every run, so that Hypothesis explores across runs (its first example is the
# simplest one: the CI variant runs two)
ODD_THREADS: Final = st.tuples(*(_odd_thread(i) for i in range(THREADS_PER_RUN))).map(list)


async def _store(db: Any, run: Run) -> None:
    """Calm and odd threads' documents, one insert each (a refusal is the server's, not the service's)."""
    calm = [(f"t-calm-{i}", f"u-calm-{i}") for i in range(CALM_THREADS)]
    for thread, owner in calm:
        await db[THREADS].insert_one({"id": thread, "resourceId": owner, "title": "", "metadata": {}})
        await db[MESSAGES].insert_many(good_rows(thread, owner))
    for index, odd in enumerate(run.odd):
        thread_doc = odd.doc.doc if odd.doc is not None else None
        await db[THREADS].insert_one(thread_doc or {"id": odd.thread, "resourceId": odd.owner})
        await db[MESSAGES].insert_many(good_rows(odd.thread, odd.owner))
        raw = raw_message(odd.thread, odd.owner, f"{odd.thread}-raw", odd=RAW_ODD[index % len(RAW_ODD)])
        for row in [*odd.rows, raw]:
            try:
                await db[MESSAGES].insert_one(RawBSONDocument(row.bson()))
                run.inserted += 1
            except (PyMongoError, ValueError) as exc:  # a duplicate id, or a document the server refuses
                run.refused_by_server += 1
                run.refusals.append(f"{row.label}: {type(exc).__name__}: {str(exc)[:120]}")


async def _one_run(kafka_bootstrap: str, mongo_uri: str, run: Run) -> None:
    s = fresh_settings(kafka_bootstrap, mongo_uri, turn_timeout_ms=5000)
    inputs = {s.requests_topic: 2, s.responses_topic: 2, s.commands_topic: 1}
    outs = [s.enriched_topic, s.persisted_topic, s.requests_dlq, s.responses_dlq]
    await _create_topics(kafka_bootstrap, {**inputs, **dict.fromkeys(outs, 1)})
    health = Health()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri, tz_aware=True)
    db = client[s.mongodb_database]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        async with running_service(s, health=health) as service, _reading(kafka_bootstrap, outs) as outputs:
            await _until(lambda: health.readiness()[0], service, 60, run, "the service to be ready")
            await _store(db, run)
            threads = [(f"t-calm-{i}", f"u-calm-{i}") for i in range(CALM_THREADS)]
            threads += [(o.thread, o.owner) for o in run.odd]
            options = {o.thread: o.memory for o in run.odd}
            for thread, owner in threads:
                asked = [user(f"{thread}-in", "next", 10**6)]
                event = request(thread, asked, resource=owner, memory=options.get(thread) or None)
                await producer.send_and_wait(
                    s.requests_topic, json.dumps(event).encode(), key=thread.encode()
                )
            want = {f"req-{t}-1000" for t, _ in threads}
            await _until(lambda: want <= _done(outputs, s.enriched_topic, s.requests_dlq), service,
                         OUTCOME_TIMEOUT_S, run, "every request's outcome", health)  # fmt: skip
            for thread, owner in threads:
                said, answer = user(f"{thread}-u", "q", 10**6), assistant(f"{thread}-a", "a", 10**6 + 1)
                turn = response(thread, input=[said], output=[answer], resource=owner)
                await producer.send_and_wait(
                    s.responses_topic, json.dumps(turn).encode(), key=thread.encode()
                )
            want = {f"resp-{t}-1000" for t, _ in threads}
            await _until(lambda: want <= _done(outputs, s.persisted_topic, s.responses_dlq), service,
                         OUTCOME_TIMEOUT_S, run, "every response's outcome", health)  # fmt: skip
            _check(run, outputs, s.enriched_topic, s.persisted_topic, [s.requests_dlq, s.responses_dlq])
            assert not service.done(), "the service stopped"
    finally:
        await producer.stop()
        await client.drop_database(s.mongodb_database)
        await client.close()
        extra = [s.commands_dlq, s.forgotten_topic]  # the service may have created them
        await _delete_topics(kafka_bootstrap, [*inputs, *outs, *extra])


def _done(outputs: Outputs, topic: str, dlq: str) -> set[str]:
    """Request ids with an outcome: an output event or a dead letter (the original record's requestId)."""
    ids = set(outputs.ids(topic))
    for rec in outputs.of(dlq):
        try:
            ids.add(json.loads(rec.value)["requestId"])
        except (ValueError, TypeError, KeyError):
            continue
    return ids


async def _until(
    condition: Any, service: Any, timeout_s: float, run: Run, what: str, health: Health | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if service.done():
            raise AssertionError(f"the service stopped while waiting for {what}")
        if health is not None:
            ready, reasons = health.readiness()
            if not ready:
                run.not_ready.append(f"while waiting for {what}: {reasons}")
            live, details = health.liveness()
            if not live:
                run.not_ready.append(f"not live while waiting for {what}: {details}")
        if time.monotonic() > deadline:
            raise AssertionError(f"stalled: no {what} after {timeout_s}s")
        await asyncio.sleep(0.2)


def _check(run: Run, outputs: Outputs, enriched: str, persisted: str, dlqs: list[str]) -> None:
    for rec in outputs.of(enriched):
        try:
            decode_enriched(rec.value)  # what a worker reads must be what a worker can read
        except InvalidInputError as exc:
            run.violations.append(f"an enriched event no worker decodes: {exc}")
    events = {json.loads(r.value)["eventId"]: json.loads(r.value) for r in outputs.of(enriched)}
    saved = {json.loads(r.value)["eventId"]: json.loads(r.value) for r in outputs.of(persisted)}
    for i in range(CALM_THREADS):
        thread = f"t-calm-{i}"
        event = events.get(f"req-{thread}-1000")
        if event is None:
            run.violations.append(f"calm thread {thread}: no enriched event")
            continue
        recalled = [m["id"] for m in event["messages"] if m["source"] == "memory"]
        if recalled != [f"{thread}-g{j}" for j in range(4)] or event["history"].get("skipped", 0):
            run.violations.append(f"calm thread {thread}: recalled {recalled}, history {event['history']}")
        if saved.get(f"resp-{thread}-1000", {}).get("savedMessageIds") != [f"{thread}-u", f"{thread}-a"]:
            run.violations.append(f"calm thread {thread}: not persisted as sent")
    for odd in run.odd:
        event = events.get(f"req-{odd.thread}-1000")
        if event is not None:
            foreign = [m["id"] for m in event["messages"] if m["threadId"] != odd.thread]
            if foreign:
                run.violations.append(f"{odd.thread}: messages of another thread {foreign}")
    FIGURES["enriched"] = FIGURES.get("enriched", 0) + len(events)
    FIGURES["persisted"] = FIGURES.get("persisted", 0) + len(saved)
    for topic in dlqs:
        for rec in outputs.of(topic):
            info = parse_dead_letter_headers(rec.headers)
            kinds = FIGURES.setdefault("dead_letters", {})
            kinds[info.error_type] = kinds.get(info.error_type, 0) + 1
            value = json.loads(rec.value)
            thread = value.get("threadId", "")
            if thread.startswith("t-calm-"):
                run.violations.append(f"calm thread {thread} dead-lettered: {info.error_type}")
            elif info.error_type not in ("UnreadableRowError", "ThreadOwnershipError", "MessageIdTakenError"):
                run.violations.append(f"{thread}: dead letter {info.error_type}: {info.error_message[:300]}")
            elif info.error_type == "UnreadableRowError" and "stored row " not in info.error_message:
                run.violations.append(
                    f"{thread}: dead letter does not name the row: {info.error_message[:300]}"
                )


async def test_a_thread_whose_metadata_is_not_an_object_takes_a_boundary(mongo_db: Any) -> None:
    """The smallest rows the fuzzer found (before the fix, the boundary write failed with code 28 and stopped
    the path): a thread stored as @mastra/mongodb 0.10 stores it (`metadata` a JSON string) and four
    messages; a budgeted recall that trims still enriches the request."""
    from storage.mongodb import MongoHistoryStorage  # noqa: PLC0415 -- this test only
    from tests.paths import Paths  # noqa: PLC0415 -- this test only

    await mongo_db[THREADS].insert_one({"id": "t", "resourceId": "u", "title": "", "metadata": "{}"})
    await mongo_db[MESSAGES].insert_many(good_rows("t", "u"))
    paths = Paths(storage=MongoHistoryStorage(mongo_db))
    memory = {"maxTokens": 20, "atMaxRemoveTokens": 5}
    batch = await paths.recall(request("t", [user("in", "next", 10**6)], resource="u", memory=memory))
    assert batch.event(0)["history"]["trimmed"]


FIGURES: dict[str, Any] = {"runs": 0, "rows_generated": 0, "rows_inserted": 0, "refused_by_server": 0}


@settings(
    max_examples=RUNS,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # no shrinking: each run names its threads and rows
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_stored_rows_never_stop_the_service(
    kafka_bootstrap: str, mongo_uri: str, data: st.DataObject
) -> None:
    """Generated and raw stored rows on odd threads: the service stays ready, calm threads are unaffected,
    each odd thread's records are enriched / persisted or dead-lettered naming the row."""
    run = Run(data.draw(ODD_THREADS, label="odd threads"))
    started = time.monotonic()
    asyncio.run(_one_run(kafka_bootstrap, mongo_uri, run))
    FIGURES["runs"] += 1
    FIGURES["rows_generated"] += sum(len(o.rows) + 1 for o in run.odd)
    FIGURES["rows_inserted"] += run.inserted
    FIGURES["refused_by_server"] += run.refused_by_server
    FIGURES["not_ready_samples"] = FIGURES.get("not_ready_samples", 0) + len(run.not_ready)
    FIGURES["seconds"] = FIGURES.get("seconds", 0) + round(time.monotonic() - started, 1)
    print(f"store fuzz figures: {FIGURES}")
    if os.environ.get("STORE_FUZZ_VERBOSE"):
        print("refused by the server:\n" + "\n".join(run.refusals))
    problems = run.violations + run.not_ready[:5]
    assert not problems, "\n".join(problems) + "\n" + "\n".join(repr(o) for o in run.odd)
