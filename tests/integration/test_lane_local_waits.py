"""A waiting request holds its own thread only (issue 23 item 4); a foreign one never waits (issue 24 item 2).

Real Kafka, the real MongoDB-wire server, the service in process. Thread t has a turn enriched and never
answered (or its partition is behind the barrier); its next request must wait. Requests on other threads,
sent after it and spread over the partitions, are all enriched while it is still held: before, the batch
holding it held every thread of the instance until the turn timeout. The assertions are causal: the other
threads are awaited with a bound far below the turn timeout, then t's request is checked not out, then the
cause of its wait is removed and it goes out complete, having waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner

from consumers.persist import PersistHandler
from message_history import metrics
from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    request_event,
    request_id,
    response_event,
    running_service,
    text_message,
    values,
)
from tests.integration.stream_helpers import committed_offsets, produce, read_all, read_topic
from tests.integration.test_service_group import _wait_members
from tests.integration.test_turn_barrier import PARTITIONS, _enriched, _settings, _until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The turn timeout is far above every bound the test waits with: a request held in its batch (the bug)
# would hold the others for all of it, so they would not be out within OTHERS_BOUND_S.
TURN_TIMEOUT_MS = 60_000
OTHERS_BOUND_S = 20.0
HELD = "t"  # the thread whose request waits
OTHERS = 9


def partition_of(thread: str) -> int:
    """The requests partition of `thread` (the default partitioner on its key, as the workers write)."""
    partitions = list(range(PARTITIONS))
    return int(DefaultPartitioner()(thread.encode(), partitions, partitions))


def threads_on(partitions: Sequence[int], count: int, prefix: str = "o") -> list[str]:
    """`count` thread ids spread round-robin over `partitions`."""
    by_partition: dict[int, list[str]] = {p: [] for p in partitions}
    i = 0
    while sum(len(v) for v in by_partition.values()) < count:
        name = f"{prefix}{i}"
        i += 1
        bucket = by_partition.get(partition_of(name))
        if bucket is not None and len(bucket) < -(-count // len(partitions)):
            bucket.append(name)
    return [t for ts in by_partition.values() for t in ts][:count]


async def _lane_settings(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, **extra: Any
) -> Settings:
    return await _settings(
        kafka_bootstrap,
        mongo_uri,
        make_topic,
        turn_timeout_ms=TURN_TIMEOUT_MS,
        max_poll_interval_ms=4 * TURN_TIMEOUT_MS,  # the turn timeout is capped at half of it
        **extra,
    )


async def _send_requests(settings: Settings, threads: Sequence[str], turn: int = 1) -> None:
    await produce(
        settings.kafka_bootstrap_servers,
        settings.requests_topic,
        [encoded(request_event(t, "u", turn, f"q{turn}")) for t in threads],
    )


async def _all_enriched(settings: Settings, rids: Sequence[str], timeout_s: float) -> dict[str, Any]:
    wanted = set(rids)
    records = await read_topic(
        settings.kafka_bootstrap_servers,
        settings.enriched_topic,
        until=lambda rs: wanted <= {v["requestId"] for v in values(rs)},
        timeout_s=timeout_s,
    )
    return {v["requestId"]: v for v in values(records)}


async def _out_now(settings: Settings) -> list[str]:
    records = await read_all(settings.kafka_bootstrap_servers, settings.enriched_topic, settle_s=0.5)
    return [v["requestId"] for v in values(records)]


async def test_a_busy_thread_holds_only_its_own_lane(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """t's turn 1 is enriched and unanswered; t's turn 2 waits (enqueue). Nine requests on other threads,
    on every partition (t's too), sent after it, are all enriched while it waits; answered, it goes out."""
    settings = await _lane_settings(kafka_bootstrap, mongo_uri, make_topic, busy_thread="enqueue")
    others = threads_on(range(PARTITIONS), OTHERS)
    assert {partition_of(t) for t in others} == set(range(PARTITIONS))
    waits = metrics.TURN_WAITS.labels(reason="busy-thread")
    try:
        async with running_service(settings):
            # from a stable group: a rebalance later (a path joining late) would drop the parked turn and
            # fetch it again, and its `waitedMs` would count from the second parking only
            await _wait_members(settings.kafka_bootstrap_servers, settings.group_id, 2)
            await _send_requests(settings, [HELD])
            [first] = await _enriched(settings, request_id(HELD, 1))
            before = waits._value.get()
            await _send_requests(settings, [HELD], turn=2)
            await _until(lambda: waits._value.get() > before, "t's turn 2 never started waiting")
            sent = time.monotonic()
            await _send_requests(settings, others)
            out = await _all_enriched(settings, [request_id(t, 1) for t in others], OTHERS_BOUND_S)
            took = time.monotonic() - sent
            assert request_id(HELD, 2) not in await _out_now(settings)  # still held: the others did not wait
            answer = response_event(HELD, "u", 1, first["messages"], "a1")
            await produce(settings.kafka_bootstrap_servers, settings.responses_topic, [encoded(answer)])
            [second] = await _enriched(settings, request_id(HELD, 2))
    finally:
        await drop_database(settings)
    assert all(out[request_id(t, 1)]["history"]["waitedMs"] == 0 for t in others)
    assert second["history"]["complete"] is True
    assert second["history"]["waitedMs"] > 0
    assert second["history"]["recalled"] >= 2  # turn 1 and its answer
    print(f"\n{OTHERS} other threads enriched {took:.2f}s after they were sent, while t waited")


@contextlib.asynccontextmanager
async def persist_held_for(thread: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[asyncio.Event]:
    """The in-process persist path does not finish a batch holding `thread`'s response until the event is
    set: its partition stays behind the barrier (a slow persist, injected; Kafka and MongoDB are real)."""
    release = asyncio.Event()
    handle = PersistHandler.handle

    async def held(self: PersistHandler, records: Sequence[Any], emit: Any) -> list[Any]:
        if any(r.key == thread.encode() for r in records):
            await release.wait()
        return await handle(self, records, emit)

    monkeypatch.setattr(PersistHandler, "handle", held)
    try:
        yield release
    finally:
        release.set()


async def test_a_partition_behind_the_barrier_holds_only_its_own_lanes(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t's answer is not persisted yet: t's next request waits on the barrier for its partition. Nine
    requests on the other partitions, sent after it, are enriched meanwhile; persisted, t's goes out."""
    settings = await _lane_settings(kafka_bootstrap, mongo_uri, make_topic, barrier="on", busy_thread="allow")
    held_partition = partition_of(HELD)
    others = threads_on([p for p in range(PARTITIONS) if p != held_partition], OTHERS)
    waits = metrics.TURN_WAITS.labels(reason="barrier")
    try:
        async with persist_held_for(HELD, monkeypatch) as release, running_service(settings):
            # from a stable group (see above): a rebalance after t's request parked, in a full run once, sent
            # it again after the release, enriched with no wait (`waitedMs` 0)
            await _wait_members(settings.kafka_bootstrap_servers, settings.group_id, 2)
            answer = response_event(HELD, "u", 1, [text_message("user", "q1")], "a1")
            await produce(settings.kafka_bootstrap_servers, settings.responses_topic, [encoded(answer)])
            before = waits._value.get()
            await _send_requests(settings, [HELD], turn=2)
            await _until(lambda: waits._value.get() > before, "t's request never waited on the barrier")
            await _send_requests(settings, others)
            out = await _all_enriched(settings, [request_id(t, 1) for t in others], OTHERS_BOUND_S)
            assert request_id(HELD, 2) not in await _out_now(settings)
            release.set()
            [second] = await _enriched(settings, request_id(HELD, 2))
    finally:
        await drop_database(settings)
    assert all(out[request_id(t, 1)]["history"]["complete"] is True for t in others)
    assert second["history"]["complete"] is True
    assert second["history"]["waitedMs"] > 0
    assert second["history"]["recalled"] >= 2  # the answer persisted during its wait


async def test_a_revoke_drops_a_parked_request_for_the_next_owner(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """t's turn 2 is parked, and a later request of its partition is done. A second instance joins: the
    revoke neither commits past turn 2 nor keeps its parked work; the partition's owner then enriches it
    once, after turn 1's answer."""
    settings = await _lane_settings(kafka_bootstrap, mongo_uri, make_topic, busy_thread="enqueue")
    [later] = threads_on([partition_of(HELD)], 1, prefix="same")
    waits = metrics.TURN_WAITS.labels(reason="busy-thread")
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            await _send_requests(settings, [HELD])  # offset 0 of its partition
            [first] = await _enriched(settings, request_id(HELD, 1))
            before = waits._value.get()
            await _send_requests(settings, [HELD], turn=2)  # offset 1
            await _until(lambda: waits._value.get() > before, "t's turn 2 never started waiting")
            await _send_requests(settings, [later])  # offset 2, done while turn 2 waits
            await _enriched(settings, request_id(later, 1))
            async with running_service(settings):
                await _wait_members(bootstrap, settings.group_id, 4)  # recall + persist per instance
                committed = await committed_offsets(bootstrap, settings.group_id, settings.requests_topic)
                assert committed.get(partition_of(HELD), 0) <= 1  # never past the parked turn 2
                assert request_id(HELD, 2) not in await _out_now(settings)
                answer = response_event(HELD, "u", 1, first["messages"], "a1")
                await produce(bootstrap, settings.responses_topic, [encoded(answer)])
                [second] = await _enriched(settings, request_id(HELD, 2))
                emitted = await _out_now(settings)
    finally:
        await drop_database(settings)
    assert emitted.count(request_id(HELD, 2)) == 1  # the revoked instance's parked copy never went out
    assert second["history"]["complete"] is True
    assert second["history"]["recalled"] >= 2


async def test_at_the_parking_cap_intake_pauses_until_a_parked_request_is_out(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    """Cap 2 (`MAX_IN_FLIGHT_THREADS`): threads a and b each have turn 2 parked behind an unanswered turn 1.
    The loop stops fetching; a request on thread c sent then is not enriched until a's answer lets a's turn
    2 out, and then it is."""
    settings = await _lane_settings(
        kafka_bootstrap, mongo_uri, make_topic, busy_thread="enqueue", max_in_flight_threads=2
    )
    parked = metrics.PARKED.labels(path="recall")
    bootstrap = settings.kafka_bootstrap_servers
    try:
        async with running_service(settings):
            # a rebalance later (the persist path joining after recall's first batch) would drop the parked
            # requests and fetch them again with c in one batch, past the cap: start from a stable group
            await _wait_members(bootstrap, settings.group_id, 2)
            await _send_requests(settings, ["a", "b"])
            firsts = await _all_enriched(settings, [request_id("a", 1), request_id("b", 1)], OTHERS_BOUND_S)
            await _send_requests(settings, ["a", "b"], turn=2)
            await _until(lambda: parked._value.get() >= 2, "turns 2 never parked")
            await _until(lambda: "parked requests at their cap" in caplog.text, "intake never paused")
            await _send_requests(settings, ["c"])
            assert request_id("c", 1) not in await _out_now(settings)  # not fetched while at the cap
            first = firsts[request_id("a", 1)]
            answer = response_event("a", "u", 1, first["messages"], "a1")
            await produce(bootstrap, settings.responses_topic, [encoded(answer)])
            out = await _all_enriched(settings, [request_id("a", 2), request_id("c", 1)], OTHERS_BOUND_S)
            assert request_id("b", 2) not in out  # still parked: c was fetched once there was room
    finally:
        await drop_database(settings)


async def _foreign_request_on_a_busy_thread(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, policy: str, *, saved: bool = True
) -> tuple[dict[str, str], bytes]:
    """Resource `tenant-a` has a turn on t enriched and unanswered (with `saved`, turn 2, after turn 1 was
    answered and so t stored as tenant-a's; else turn 1, t not stored yet); `tenant-b` sends a request on t.
    Returns the dead letter's headers and value, awaited far below the turn timeout."""
    settings = await _lane_settings(kafka_bootstrap, mongo_uri, make_topic, busy_thread=policy)
    bootstrap = settings.kafka_bootstrap_servers
    owner = [encoded(request_event(HELD, "tenant-a", turn, "q")) for turn in (1, 2)]
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, owner[:1])
            [first] = await _enriched(settings, request_id(HELD, 1))
            if saved:
                answer = response_event(HELD, "tenant-a", 1, first["messages"], "a1")
                await produce(bootstrap, settings.responses_topic, [encoded(answer)])
                await read_topic(bootstrap, settings.persisted_topic, until=bool)  # t is tenant-a's now
                await produce(bootstrap, settings.requests_topic, owner[1:])
                await _enriched(settings, request_id(HELD, 2))  # pending, never answered
            foreign = request_event(HELD, "tenant-b", 1, "q", requestId="b-request")
            await produce(bootstrap, settings.requests_topic, [encoded(foreign)])
            [letter] = await read_topic(
                bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1, timeout_s=OTHERS_BOUND_S
            )
    finally:
        await drop_database(settings)
    return {k: (v or b"").decode() for k, v in letter.headers}, letter.value or b""


@pytest.mark.parametrize("saved", [True, False], ids=["stored-thread", "thread-not-stored-yet"])
@pytest.mark.parametrize("policy", ["reject", "enqueue"])
async def test_a_foreign_request_is_refused_at_once_naming_no_pending_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, policy: str, saved: bool
) -> None:
    """Ownership before the busy gate: refused as an ownership refusal (not "busy"), without waiting in the
    owner's lane, and nothing in the dead letter names the owner's pending request."""
    headers, value = await _foreign_request_on_a_busy_thread(
        kafka_bootstrap, mongo_uri, make_topic, policy, saved=saved
    )
    assert headers["error.type"] == "ThreadOwnershipError"
    assert request_id(HELD, 2 if saved else 1) not in " ".join(headers.values())
    assert b"tenant-a" not in value


async def test_a_foreign_request_refusal_names_no_owner(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The same refusal names nothing of the owner: not its resourceId either (issue 23 item 7)."""
    headers, _ = await _foreign_request_on_a_busy_thread(kafka_bootstrap, mongo_uri, make_topic, "reject")
    assert "tenant-a" not in " ".join(headers.values())
