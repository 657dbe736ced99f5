"""Observational Memory end to end on the real broker and the MongoDB-wire server, with a stub observer.

A long conversation's saved turns pass the observation threshold: the persist path claims the thread's
`mastra_observational_memory` row and sends one `ObserveRequest`; the observer answers (the Python SDK's
`observer_handler`, and its `ObserverWorker`); the observed path applies the answer once; the next recall
carries the log. Answering twice applies once; an answer that comes after its claim timed out (and the work
was sent again) is dropped, and the new answer applies; a bad answer is a dead letter.

"After the timeout" is the claim's time moved back in MongoDB, never a wait.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from message_history.core.om_tokens import count_observations
from message_history.settings import Settings
from schemas.messages import format_timestamp
from schemas.observational import ObserveRequest, ReflectRequest, decode_work
from storage.observational import OBSERVATIONAL
from tests.conftest import MakeTopic
from tests.integration.om_service import (
    age_claim,
    answer_text,
    observe_work,
    om_service_settings,
    om_turn,
    sent_work,
    the_row,
)
from tests.integration.service_harness import (
    drop_database,
    encoded,
    request_event,
    running_service,
    values,
)
from tests.integration.stream_helpers import produce, read_all, read_topic, wait_committed
from worker.observer import Observation, ObserverWorker, observer_handler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

THREAD = "om-thread"
OWNER = "om-user"


def _turn(turn: int) -> tuple[bytes, bytes]:
    return om_turn(THREAD, OWNER, turn)


async def _thread_row(settings: Settings) -> dict[str, Any]:
    """The thread row as stored."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        row = await client[settings.mongodb_database]["mastra_threads"].find_one({"id": THREAD})
    finally:
        await client.close()
    assert row is not None
    return row


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_observed_once_and_recalled(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str
) -> None:
    """Six long turns → one ObserveRequest (the others wait for it); the stub's answer, sent twice, is applied
    once; a bad answer is a dead letter; the next request is recalled with the log and the unobserved turn.
    Exactly once, the ObserveRequest goes out in the persist record's transaction (read `read_committed`)."""
    settings = await om_service_settings(
        kafka_bootstrap, mongo_uri, make_topic, processing_guarantee=guarantee
    )
    bootstrap = settings.kafka_bootstrap_servers

    async def observe(work: ObserveRequest) -> Observation:
        text = f"OBS: {len(work.messages)} messages about trains"
        return Observation(
            text,
            current_task="find the cheapest spring day",
            thread_title=" Cheap spring trains ",
            extracted={"budget": {"max": 40, "currency": "EUR"}, "ignored": ""},
        )

    handler = observer_handler(observe)
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            work = await sent_work(settings, 1, committed=True)
            request = work[0]
            assert (request.threadId, request.generation, request.cycle) == (THREAD, 0, 1)
            assert request.pendingTokens >= request.messageTokens == 1000
            assert request.activeObservations == ""
            observed_ids = [m.id for m in request.messages]
            assert observed_ids[0] == "q1"

            answer = await handler(request)
            key = THREAD.encode()
            await produce(
                bootstrap,
                settings.observe_results_topic,
                [(key, _encode(answer)), (key, _encode(answer)), (key, b"{not json")],
            )
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 3})
            dead = await read_topic(bootstrap, settings.observe_results_dlq, until=lambda r: len(r) >= 1)
            assert [r.value for r in dead] == [b"{not json"]

            row = await the_row(settings)
            text = f"OBS: {len(request.messages)} messages about trains"
            assert row["activeObservations"] == text  # once: a second apply would append it again
            assert row["totalTokensObserved"] == row["observationTokenCount"] == count_observations(text)
            assert row["isObserving"] is False
            assert row["observedMessageIds"] == observed_ids
            assert row["generationCount"] == 0
            # the hints Mastra's `persist` leaves (`setThreadOMMetadata`): the title, the hint the answer
            # lacks null (Mastra's `undefined` through @mastra/mongodb), `extracted` merged, and the newest
            # observed message as the cursor (Mastra's `getLastObservedMessageCursor`: the first on a tie)
            newest = request.messages[0]
            for message in request.messages:
                if message.createdAt and newest.createdAt and message.createdAt > newest.createdAt:
                    newest = message
            assert newest.createdAt is not None
            cursor = {"createdAt": format_timestamp(newest.createdAt), "id": newest.id}
            thread = await _thread_row(settings)
            assert thread["metadata"]["mastra"]["om"] == {
                "currentTask": "find the cheapest spring day",
                "suggestedResponse": None,
                "threadTitle": "Cheap spring trains",
                "extracted": {"budget": {"max": 40, "currency": "EUR"}},
                "lastObservedMessageCursor": cursor,
            }
            assert thread["title"] == "Cheap spring trains"  # Mastra's `patchThread` (not pinned)

            # the next turn: the log, then only what it does not cover, then the input
            ask = request_event(THREAD, OWNER, 7, "so which day is cheapest?")
            await produce(bootstrap, settings.requests_topic, [encoded(ask)])
            enriched = values(
                await read_topic(bootstrap, settings.enriched_topic, until=lambda r: len(r) >= 1)
            )
            event = enriched[0]
            history = event["history"]
            assert history["observed"] == len(observed_ids)
            assert history["observationTokens"] == count_observations(text)
            texts = [
                p["text"] for m in event["messages"] for p in m["content"]["parts"] if p["type"] == "text"
            ]
            assert any(text in t for t in texts)  # the log, in Mastra's context wording
            # the observer's current task, kept where Mastra keeps it (the thread's metadata.mastra.om)
            assert "<current-task>\nfind the cheapest spring day\n</current-task>" in texts
            recalled = [m["id"] for m in event["messages"] if m["source"] == "memory"]
            assert not set(observed_ids) & set(recalled)  # observed messages are not sent again
            assert event["messages"][-1]["content"]["parts"][0]["text"] == "so which day is cheapest?"

    finally:
        await drop_database(settings)


async def test_late_answer_after_timeout_applies_once(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The observer does not answer in time: the thread's next turn sends the work again (cycle 2); the
    SDK's worker then answers both; the late answer to cycle 1 is dropped, cycle 2's is applied."""
    settings = await om_service_settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            await sent_work(settings, 1)
            await produce(bootstrap, settings.responses_topic, [_turn(7)])  # in flight: nothing sent
            await age_claim(settings)
            await produce(bootstrap, settings.responses_topic, [_turn(8)])  # timed out: sent again
            work = await sent_work(settings, 2)
            assert [w.cycle for w in work] == [1, 2]
            assert len(work[1].messages) > len(work[0].messages)  # the later turns too

            observer = ObserverWorker.from_settings(
                observer_handler(lambda w: answer_text(f"cycle {w.cycle}")),
                settings,
                group_id=f"{settings.group_id}-obs",
            )
            async with observer:
                running = asyncio.create_task(observer.run())
                await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 2})
                observer.stop()
                assert await running == 2

            row = await the_row(settings)
            assert row["activeObservations"] == "cycle 2"
            assert row["totalTokensObserved"] == count_observations("cycle 2")
            assert row["isObserving"] is False
            assert row["_mh_cycle"] == 2
    finally:
        await drop_database(settings)


def _encode(event: Any) -> bytes:
    from schemas.codec import encode  # noqa: PLC0415

    raw = encode(event)
    json.loads(raw)  # well-formed
    return raw


async def test_a_long_log_is_reflected_into_the_next_generation(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The log passes `REFLECTION_OBSERVATION_TOKENS`: the thread's next saved turn sends a ReflectRequest
    (the whole log); the answer starts generation 1 (`originType: "reflection"`), once though sent twice;
    the next recall carries the condensed log."""
    settings = await om_service_settings(
        kafka_bootstrap, mongo_uri, make_topic, reflection_observation_tokens=50
    )
    bootstrap = settings.kafka_bootstrap_servers
    long_log = "- the user plans a spring trip from Lyon to Turin by train, cheapest days wanted\n" * 8

    async def reflect(work: ReflectRequest) -> str:
        assert work.activeObservations == long_log
        return "- user: Lyon to Turin by train in spring, cheap"

    handler = observer_handler(lambda work: answer_text(long_log), reflect)
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            work = await sent_work(settings, 1)
            await produce(
                bootstrap,
                settings.observe_results_topic,
                [(THREAD.encode(), _encode(await handler(work[0])))],
            )
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 1})

            await produce(bootstrap, settings.responses_topic, [_turn(7)])  # the log is long: reflect
            records = await read_topic(
                bootstrap, settings.observe_requests_topic, until=lambda r: len(r) >= 2
            )
            reflect_work = decode_work(records[-1].value)
            assert isinstance(reflect_work, ReflectRequest)
            assert reflect_work.observationTokens == 50
            answer = _encode(await handler(reflect_work))
            await produce(bootstrap, settings.observe_results_topic, [(THREAD.encode(), answer)] * 2)
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 3})

            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
                settings.mongodb_uri.get_secret_value()
            )
            try:
                rows = (
                    await client[settings.mongodb_database][OBSERVATIONAL]
                    .find({}, {"_id": 0})
                    .sort("generationCount", 1)
                    .to_list()
                )
            finally:
                await client.close()
            assert [(r["generationCount"], r["originType"]) for r in rows] == [
                (0, "initial"),
                (1, "reflection"),
            ]
            assert rows[0]["isReflecting"] is False
            assert rows[1]["activeObservations"] == "- user: Lyon to Turin by train in spring, cheap"

            ask = request_event(THREAD, OWNER, 8, "remind me?")
            await produce(bootstrap, settings.requests_topic, [encoded(ask)])
            event = values(await read_topic(bootstrap, settings.enriched_topic, until=lambda r: len(r) >= 1))[
                0
            ]
            texts = [
                p["text"] for m in event["messages"] for p in m["content"]["parts"] if p["type"] == "text"
            ]
            assert any("Lyon to Turin by train in spring, cheap" in t for t in texts)
            assert not any("cheapest days wanted" in t for t in texts)  # the condensed log, not the long one
    finally:
        await drop_database(settings)


async def test_an_answer_survives_a_service_restart(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The claim lives in MongoDB, the answer in Kafka: the service stops with an observation in flight, the
    observer answers while it is down, and the next instance applies the answer (and sends nothing again)."""
    settings = await om_service_settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    handler = observer_handler(lambda work: answer_text(f"cycle {work.cycle} while the service was down"))
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            work = await sent_work(settings, 1)
        answer = await handler(work[0])
        await produce(bootstrap, settings.observe_results_topic, [(THREAD.encode(), _encode(answer))])
        assert (await the_row(settings))["isObserving"] is True  # nobody applied it yet
        async with running_service(settings):
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 1})
            await produce(bootstrap, settings.responses_topic, [_turn(7)])
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 7})
        row = await the_row(settings)
        assert row["activeObservations"] == "cycle 1 while the service was down"
        assert row["isObserving"] is False
        sent = observe_work(await read_all(bootstrap, settings.observe_requests_topic))
        assert [w.cycle for w in sent] == [1]  # turn 7 alone is far below the threshold: no new work
    finally:
        await drop_database(settings)


async def test_the_turn_that_claimed_sends_its_work_again_when_redelivered(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The service died between a claim and its commit (or the send failed and the batch was retried): the
    same turn comes again and sends the live claim's work again, same cycle, at once; another turn sends
    nothing while the claim lives. (Without `claimed_by` the redelivered turn would wait out the timeout.)"""
    settings = await om_service_settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            turns = [_turn(t) for t in range(1, 7)]
            await produce(bootstrap, settings.responses_topic, turns)
            await sent_work(settings, 1)
            claimed_by = (await the_row(settings))["_mh_claimed_by"]
            turn = next(t for t in range(1, 7) if claimed_by == f"{THREAD}-turn{t}")
            await produce(
                bootstrap, settings.responses_topic, [_turn(9), turns[turn - 1]]
            )  # another, the same
            await sent_work(settings, 2)
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 8})
            work = observe_work(await read_all(bootstrap, settings.observe_requests_topic))
            assert [(w.cycle, w.requestId) for w in work] == [(1, claimed_by), (1, claimed_by)]
            assert (await the_row(settings))["_mh_cycle"] == 1
    finally:
        await drop_database(settings)


async def test_a_hostile_row_never_fails_the_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The thread's row is one no Mastra would read (`activeObservations` a number): its turns are saved and
    announced as ever, none dead-lettered; only the observation is skipped (logged, counted)."""
    settings = await om_service_settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
    try:
        await client[settings.mongodb_database][OBSERVATIONAL].insert_one(
            {"id": "hostile", "lookupKey": f"thread:{THREAD}", "generationCount": 0, "activeObservations": 42}
        )
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            persisted = values(
                await read_topic(bootstrap, settings.persisted_topic, until=lambda r: len(r) >= 6)
            )
            assert [p["skipped"] for p in persisted] == [None] * 6
            ask = request_event(THREAD, OWNER, 7, "still there?")
            await produce(bootstrap, settings.requests_topic, [encoded(ask)])
            event = values(await read_topic(bootstrap, settings.enriched_topic, until=lambda r: len(r) >= 1))[
                0
            ]
            assert event["history"]["observed"] == 0  # the unreadable row is no log
        assert await read_all(bootstrap, settings.responses_dlq) == []
    finally:
        await client.close()
        await drop_database(settings)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_a_replay_with_observe_sends_the_work_the_live_path_would(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str
) -> None:
    """A backfill (`replay --from-beginning`) of six long turns: without `--observe` it rebuilds the history
    and sends no observation work (the thread would stay unobserved until it speaks again); with it, the
    thread is claimed and one ObserveRequest sent, as the live persist path sends it (exactly once: in the
    replay batch's transaction, read `read_committed`), and the replay waits until the observed path beside
    it applied the observer's answer (`tests/integration/test_replay_observe.py`: deterministically)."""
    from tests.integration.test_replay import replay  # noqa: PLC0415 -- the replay tests' runner

    settings = await om_service_settings(
        kafka_bootstrap, mongo_uri, make_topic, processing_guarantee=guarantee
    )
    bootstrap = settings.kafka_bootstrap_servers
    try:
        await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
        result, _ = await replay(settings, "--from-beginning")
        assert result.exit_code == 0
        none = await read_all(
            bootstrap, settings.observe_requests_topic, settle_s=1.0, isolation_level="read_committed"
        )
        assert observe_work(none) == []  # a replay sends no work unless asked

        observer = ObserverWorker.from_settings(
            observer_handler(lambda w: answer_text(f"replayed {len(w.messages)}")),
            settings,
            group_id=f"{settings.group_id}-obs",
        )
        async with running_service(settings, only="observed"), observer:
            running = asyncio.create_task(observer.run())
            result, out = await replay(settings, "--from-beginning", "--observe", "--observe-wait-s", "60")
            observer.stop()
            assert await running == 1
        assert result.exit_code == 0, out
        assert result.counts.observations == 1
        work = await sent_work(settings, 1, committed=True)
        assert [(w.threadId, w.generation, w.cycle) for w in work] == [(THREAD, 0, 1)]
        assert work[0].messages[0].id == "q1"
        row = await the_row(settings)
        assert row["isObserving"] is False  # the replay waited for the answer to be applied
        assert row["activeObservations"] == f"replayed {len(work[0].messages)}"
    finally:
        await drop_database(settings)
