"""Observational Memory with resource scope end to end, on the real broker and MongoDB-wire server, with
the Python SDK's stub observer (docs/observational-memory.md, "Resource scope").

Two threads of one resource pass the threshold together: the persist path claims the resource's row
(`resource:<id>`) and sends one `ObserveRequest` keyed by the resource, with both threads' messages (each
carrying its `threadId`) and none of another resource's; the SDK answers per thread; the observed path
merges each thread's observations into its `<thread id=...>` section of the log and moves each thread's
cursor (`metadata.mastra.om.lastObservedAt`); a third thread of the resource is recalled with the log and the
other threads' unobserved messages (Mastra's `<other-conversation>` blocks).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from message_history.core.om_tokens import count_observations
from message_history.settings import Settings
from schemas.messages import format_timestamp
from schemas.observational import ObserveRequest, ReflectRequest, decode_work
from storage.observational import OBSERVATIONAL
from tests.conftest import MakeTopic
from tests.integration.om_service import WORDS, observe_work, om_rows, om_service_settings
from tests.integration.service_harness import (
    drop_database,
    encoded,
    request_event,
    response_event,
    running_service,
    text_message,
    values,
)
from tests.integration.stream_helpers import produce, read_topic, wait_committed
from worker.observer import Observation, observer_handler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

OWNER = "om-res-user"
OTHER = "om-res-other"
RESOURCE_OM = {"observationalMemory": {"scope": "resource"}}


async def _settings(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str, **extra: Any
) -> Settings:
    """OM's settings and topics, OM off by default: every event here turns it on with resource scope."""
    return await om_service_settings(
        kafka_bootstrap,
        mongo_uri,
        make_topic,
        processing_guarantee=guarantee,
        observational_memory=False,
        observation_message_tokens=800,
        **extra,
    )


def _turn(thread: str, owner: str, turn: int) -> tuple[bytes, bytes]:
    """A saved turn of about 175 OM tokens, with resource-scoped OM."""
    question = text_message("user", f"turn {turn}: {WORDS * 4}", id=f"{thread}-q{turn}")
    event = response_event(
        thread, owner, turn, [{**question, "source": "input"}], f"answer {turn}: {WORDS * 4}"
    )
    return encoded({**event, "memory": RESOURCE_OM})


async def _docs(settings: Settings, collection: str) -> list[dict[str, Any]]:
    if collection == OBSERVATIONAL:
        return await om_rows(settings)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        return await client[settings.mongodb_database][collection].find({}, {"_id": 0}).to_list()
    finally:
        await client.close()


async def _pin(settings: Settings, thread: str, title: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        await client[settings.mongodb_database]["mastra_threads"].update_one(
            {"id": thread}, {"$set": {"title": title, "metadata.titlePinned": True}}
        )
    finally:
        await client.close()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_two_threads_observed_into_one_log_recalled_by_a_third(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str
) -> None:
    """Exactly once, the resource's ObserveRequest goes out in the persist record's transaction (read
    `read_committed`)."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, guarantee)
    bootstrap = settings.kafka_bootstrap_servers

    async def observe(work: ObserveRequest) -> Observation:
        [thread] = {m.threadId for m in work.messages}  # the SDK calls it once per thread
        return Observation(
            f"Date: Mar 1, 2025\n* OBS {thread}: {len(work.messages)} messages",
            current_task=f"T {thread}",
            thread_title=f"Title {thread}",
        )

    handler = observer_handler(observe)
    try:
        async with running_service(settings):
            # another resource's thread, with many unobserved tokens: never in this resource's work
            other = [_turn("om-res-x", OTHER, t) for t in range(1, 4)]
            # thread a alone stays under the threshold (about 520 tokens): no work yet
            await produce(
                bootstrap,
                settings.responses_topic,
                [*other, *(_turn("om-res-a", OWNER, t) for t in range(1, 4))],
            )
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 6})
            # thread b's turns take the resource past it: one ObserveRequest for both threads
            await produce(
                bootstrap, settings.responses_topic, [_turn("om-res-b", OWNER, t) for t in range(4, 6)]
            )
            records = await read_topic(
                bootstrap,
                settings.observe_requests_topic,
                until=lambda r: len(observe_work(r)) >= 1,
                isolation_level="read_committed",
            )
            [request] = observe_work(records)
            assert records[0].key == OWNER.encode()  # keyed by the resource
            assert (request.scope, request.threadId, request.resourceId) == ("resource", None, OWNER)
            assert request.pendingTokens >= request.messageTokens == 800
            threads = [m.threadId or "" for m in request.messages]
            assert threads == sorted(threads)  # the oldest thread (a) first, then b
            assert set(threads) == {"om-res-a", "om-res-b"}  # not the other resource's om-res-x
            assert {m.resourceId for m in request.messages} == {OWNER}

            answer = await handler(request)
            await _pin(
                settings, "om-res-b", "Mine"
            )  # the user renamed b (Mastra's `session.thread.rename()`)
            await produce(bootstrap, settings.observe_results_topic, [(OWNER.encode(), _json(answer))] * 2)
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 2})

            rows = {r["lookupKey"]: r for r in await _docs(settings, OBSERVATIONAL)}
            assert rows[f"resource:{OTHER}"]["activeObservations"] == ""  # the other resource: its own row
            row = rows[f"resource:{OWNER}"]
            assert (row["lookupKey"], row["scope"], row["threadId"]) == (
                f"resource:{OWNER}",
                "resource",
                None,
            )
            log = row["activeObservations"]
            assert log.count('<thread id="om-res-a">') == 1  # applied once though answered twice
            assert '<thread id="om-res-b">' in log
            assert log.index("om-res-a") < log.index("om-res-b")
            assert row["isObserving"] is False
            assert set(row["observedMessageIds"]) == {m.id for m in request.messages}
            threads_rows = {t["id"]: t for t in await _docs(settings, "mastra_threads")}
            for thread in ("om-res-a", "om-res-b"):
                om = threads_rows[thread]["metadata"]["mastra"]["om"]
                newest = max(m.createdAt for m in request.messages if m.threadId == thread and m.createdAt)
                assert om["lastObservedAt"] == format_timestamp(newest)
                assert om["currentTask"] == f"T {thread}"
                assert om["threadTitle"] == f"Title {thread}"
                assert (om["suggestedResponse"], om["extracted"]) == (None, {})  # Mastra's undefined; `{}`
                # each thread's own newest observed message (Mastra's cursor: the first on a tie)
                mine = [m for m in request.messages if m.threadId == thread and m.createdAt]
                last = next(m for m in mine if m.createdAt == newest)
                cursor = {"createdAt": format_timestamp(newest), "id": last.id}
                assert om["lastObservedMessageCursor"] == cursor
            assert "mastra" not in (threads_rows["om-res-x"].get("metadata") or {})
            # the title as Mastra's `patchThread`: a's from the answer, b's pinned one kept
            assert threads_rows["om-res-a"]["title"] == "Title om-res-a"
            assert threads_rows["om-res-b"]["title"] == "Mine"

            # b speaks again (under the threshold: no work): past b's cursor, so unobserved
            await produce(bootstrap, settings.responses_topic, [_turn("om-res-b", OWNER, 6)])
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 9})

            # a third thread of the resource: recalled with the resource's log (both threads' sections) and
            # b's unobserved turn as Mastra's <other-conversation> block; a's observed turns not shown
            ask = request_event("om-res-c", OWNER, 9, "so which day is cheapest?", memory=RESOURCE_OM)
            await produce(bootstrap, settings.requests_topic, [encoded(ask)])
            [event] = values(
                await read_topic(bootstrap, settings.enriched_topic, until=lambda r: len(r) >= 1)
            )
            texts = [
                p["text"] for m in event["messages"] for p in m["content"]["parts"] if p["type"] == "text"
            ]
            assert any("OBS om-res-a" in t for t in texts)
            assert any("OBS om-res-b" in t for t in texts)
            [others] = [t for t in texts if "START_OTHER_CONVERSATIONS_BLOCK" in t]
            assert '<other-conversation id="om-res-b">' in others
            assert "turn 6:" in others
            assert "om-res-a" not in others
            sent = await read_topic(bootstrap, settings.observe_requests_topic, until=bool)
            assert len(observe_work(sent)) == 1
            assert event["history"]["observationTokens"] > 0
            assert event["messages"][-1]["content"]["parts"][0]["text"] == "so which day is cheapest?"
    finally:
        await drop_database(settings)


async def test_a_stale_resource_claim_is_sent_again_by_the_sweep(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """No answer comes and the resource's threads say nothing more: past the timeout the sweep takes the
    resource's claim again and sends the same threads' work (a new cycle, keyed by the resource); the late
    answer to the old cycle is dropped, the new one applies, each thread's section once."""
    settings = await _settings(
        kafka_bootstrap, mongo_uri, make_topic, "at-least-once", observation_timeout_s=4.0
    )
    bootstrap = settings.kafka_bootstrap_servers

    async def work_until(ready: Any) -> list[ObserveRequest]:
        records = await read_topic(
            bootstrap, settings.observe_requests_topic, until=lambda r: ready(observe_work(r))
        )
        assert {r.key for r in records} == {OWNER.encode()}
        return observe_work(records)

    try:
        async with running_service(settings):
            turns = [_turn("om-res-a", OWNER, t) for t in range(1, 4)]
            await produce(
                bootstrap, settings.responses_topic, [*turns, *(_turn("om-res-b", OWNER, t) for t in (4, 5))]
            )
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 5})
            [old] = await work_until(lambda work: len(work) >= 1)
            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
                settings.mongodb_uri.get_secret_value()
            )
            past = datetime.now(UTC) - timedelta(seconds=settings.observation_timeout_s + 60)
            try:
                await client[settings.mongodb_database][OBSERVATIONAL].update_many(
                    {}, {"$set": {"_mh_claimed_at": past, "updatedAt": past}}
                )
            finally:
                await client.close()
            work = await work_until(lambda work: any(w.cycle > old.cycle for w in work))
            new = next(w for w in work if w.cycle == old.cycle + 1)
            assert (new.scope, new.threadId, new.recordId) == ("resource", None, old.recordId)
            assert [m.id for m in new.messages] == [m.id for m in old.messages]  # both threads, again

            handler = observer_handler(lambda w: _text(f"cycle {w.cycle} of {w.messages[0].threadId}"))
            answers = [(OWNER.encode(), _json(await handler(w))) for w in (old, new)]  # the late one first
            await produce(bootstrap, settings.observe_results_topic, answers)
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 2})
            rows = {r["lookupKey"]: r for r in await _docs(settings, OBSERVATIONAL)}
            log = rows[f"resource:{OWNER}"]["activeObservations"]
            assert f"cycle {new.cycle} of om-res-a" in log
            assert f"cycle {new.cycle} of om-res-b" in log
            assert f"cycle {old.cycle} of" not in log  # the late answer dropped
    finally:
        await drop_database(settings)


async def _text(value: str) -> str:
    return value


def _json(event: Any) -> bytes:
    from schemas.codec import encode  # noqa: PLC0415

    return encode(event)


REFLECTING_OM = {"observationalMemory": {"scope": "resource", "reflection": {"observationTokens": 20}}}


def _reflecting_turn(thread: str, turn: int) -> tuple[bytes, bytes]:
    """`_turn` with a reflection threshold the first observation's log passes."""
    _, value = _turn(thread, OWNER, turn)
    return encoded({**json.loads(value), "memory": REFLECTING_OM})


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_a_resource_log_is_reflected_into_its_next_generation(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str
) -> None:
    """Resource scope's reflection, as Mastra's: once the resource's log passes the threshold the next
    saved turn (of either thread) claims the resource's row and sends one ReflectRequest keyed by the
    resource, the whole log with its `<thread>` sections as text; the Reflector's answer becomes generation
    1 of `resource:<id>` as written (its tokens, generation 0's `lastObservedAt`), the threads' cursors
    untouched; the next observation merges into the reflected log from each thread's own cursor."""
    settings = await _settings(kafka_bootstrap, mongo_uri, make_topic, guarantee)
    bootstrap = settings.kafka_bootstrap_servers
    committed = "read_committed" if guarantee == "exactly-once" else "read_uncommitted"
    reflection = '* trip\n<thread id="om-res-b">\n* spring\n</thread>'  # under the threshold

    async def observe(work: ObserveRequest) -> Observation:
        [thread] = {m.threadId for m in work.messages}
        return Observation(f"Date: Mar 1, 2025\n* OBS {thread} g{work.generation}: {len(work.messages)}")

    async def reflect(work: ReflectRequest) -> str:
        return reflection

    handler = observer_handler(observe, reflect)

    async def work_until(count: int) -> list[ObserveRequest | ReflectRequest]:
        records = await read_topic(
            bootstrap,
            settings.observe_requests_topic,
            until=lambda r: len(r) >= count,
            isolation_level=committed,
        )
        assert {r.key for r in records} == {OWNER.encode()}  # all keyed by the resource
        return [decode_work(r.value) for r in records]

    async def answer(work: ObserveRequest | ReflectRequest, results: int) -> None:
        await produce(
            bootstrap, settings.observe_results_topic, [(OWNER.encode(), _json(await handler(work)))]
        )
        await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: results})

    try:
        async with running_service(settings):
            turns = [_reflecting_turn("om-res-a", t) for t in range(1, 4)]
            more = [_reflecting_turn("om-res-b", t) for t in (4, 5)]
            await produce(bootstrap, settings.responses_topic, [*turns, *more])
            [observe_0] = await work_until(1)
            assert isinstance(observe_0, ObserveRequest)
            await answer(observe_0, 1)
            gen0 = {r["lookupKey"]: r for r in await _docs(settings, OBSERVATIONAL)}[f"resource:{OWNER}"]
            assert gen0["observationTokenCount"] >= 20
            before = {t["id"]: t["metadata"] for t in await _docs(settings, "mastra_threads")}

            # a's next turn: the log is past the reflection threshold, so the resource's row is reflected
            await produce(bootstrap, settings.responses_topic, [_reflecting_turn("om-res-a", 6)])
            reflect_0 = (await work_until(2))[1]
            assert isinstance(reflect_0, ReflectRequest)
            assert (reflect_0.scope, reflect_0.threadId, reflect_0.resourceId) == ("resource", None, OWNER)
            assert (reflect_0.recordId, reflect_0.generation) == (gen0["id"], 0)
            assert reflect_0.activeObservations == gen0["activeObservations"]
            assert '<thread id="om-res-a">' in reflect_0.activeObservations
            assert '<thread id="om-res-b">' in reflect_0.activeObservations
            assert reflect_0.observationTokens == 20
            await answer(reflect_0, 2)

            rows = [r for r in await _docs(settings, OBSERVATIONAL) if r["lookupKey"] == f"resource:{OWNER}"]
            gen1 = max(rows, key=lambda r: r["generationCount"])
            assert (gen1["generationCount"], gen1["originType"], gen1["threadId"]) == (1, "reflection", None)
            assert gen1["activeObservations"] == reflection  # as the Reflector wrote it
            assert gen1["observationTokenCount"] == count_observations(reflection)
            assert gen1["lastObservedAt"] == gen0["lastObservedAt"]
            assert gen1["totalTokensObserved"] == gen0["totalTokensObserved"]
            assert not gen1.get("observedMessageIds")
            after = {t["id"]: t["metadata"] for t in await _docs(settings, "mastra_threads")}
            assert after == before  # no thread's cursor or hints moved

            # b speaks on: its unobserved turns (past its own cursor) observed into the reflected log
            await produce(
                bootstrap, settings.responses_topic, [_reflecting_turn("om-res-b", t) for t in range(7, 12)]
            )
            observe_1 = (await work_until(3))[2]
            assert isinstance(observe_1, ObserveRequest)
            assert (observe_1.generation, observe_1.activeObservations) == (1, reflection)
            assert {m.threadId for m in observe_1.messages} >= {"om-res-b"}
            assert all(m.id != q.id for m in observe_1.messages for q in observe_0.messages)  # none again
            await answer(observe_1, 3)
            gen1 = next(
                r
                for r in await _docs(settings, OBSERVATIONAL)
                if r["lookupKey"] == f"resource:{OWNER}" and r["generationCount"] == 1
            )
            assert gen1["activeObservations"].startswith(reflection)
            assert "OBS om-res-b g1:" in gen1["activeObservations"]
    finally:
        await drop_database(settings)
