"""`replay --observe` rebuilds Observational Memory deterministically (issue 35), on the real broker and the
MongoDB-wire server.

Three long threads on a three-partition responses topic, each passing a small observation threshold several
times (and its log the reflection threshold): replayed into three fresh databases, each with the service's
observed path and a deterministic stub observer (the Python SDK's `ObserverWorker`) beside it: one record
per batch on one partition at a time, 500 per batch on all three at once, 7 on two. The
`mastra_observational_memory` rows they leave are equal but for their times, ids and claim bookkeeping.
Without the wait (the replay of before: work sent, not waited for) they differ: the batch decides where a
cycle starts, the observer's speed what it covers (batch 500: one cycle of 24 messages per thread and no
reflection, against three cycles of 8 and a reflection).

And a re-enrichment (`--emit-to`) of a request with OM is recalled with the log, as the live recall.

And the bound: with no observer running, the replay stops within `--observe-wait-s` with an error naming
the thread and the claim, resumable at the record that waited; the resume finds the claim open on the
thread's row and waits again. And the wait is per lane: a claim holds its thread's next record, not the
partition's other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from message_history.settings import Settings
from schemas.observational import ObserveRequest, ReflectRequest
from tests.conftest import MakeTopic
from tests.integration.om_service import om_rows, om_settings, om_turn
from tests.integration.service_harness import (
    drop_database,
    encoded,
    request_event,
    running_service,
    stored_messages,
)
from tests.integration.stream_helpers import produce, read_topic
from worker.observer import ObserveFn, ObserverWorker, observer_handler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

THREADS = ("omr-a", "omr-b", "omr-c")
TURNS = 12
# times, ids and the claim's bookkeeping: what may differ between two rebuilds of the same log
UNSTABLE = {
    "id",
    "createdAt",
    "updatedAt",
    "lastReflectionAt",
    "_mh_claimed_at",
    "_mh_claimed_by",
    "_mh_cycle",
}


def _settings(kafka_bootstrap: str, mongo_uri: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "observation_message_tokens": 600,  # about every three turns
        "reflection_observation_tokens": 50,  # two cycles' log
    }
    return om_settings(kafka_bootstrap, mongo_uri, **{**values, **extra})


async def _topics(settings: Settings, make_topic: MakeTopic) -> None:
    for topic in (settings.observe_requests_topic, settings.observe_results_topic):
        await make_topic(partitions=1, name=topic)


def _turns() -> list[tuple[bytes, bytes]]:
    """The threads' turns interleaved (each about 250 OM tokens), keyed by thread."""
    return [
        om_turn(thread, f"{thread}-owner", turn, tagged=True)
        for turn in range(1, TURNS + 1)
        for thread in THREADS
    ]


async def _observe(work: ObserveRequest) -> str:
    """Deterministic: what it was given, in a line (the log grows by one line a cycle)."""
    first, last = work.messages[0].id, work.messages[-1].id
    return f"- {len(work.messages)} messages, {first} to {last}, after {len(work.activeObservations)} chars"


async def _reflect(work: ReflectRequest) -> str:
    lines = work.activeObservations.splitlines()
    return f"- reflected {len(lines)} lines, the last: {lines[-1]}"


@contextlib.asynccontextmanager
async def _observer_beside(
    settings: Settings, *, answer: bool = True, observe: ObserveFn = _observe
) -> AsyncIterator[None]:
    """The service's observed path on `settings`' database and, with `answer`, a stub observer (`observe`)."""
    async with running_service(settings, only="observed"):
        if not answer:
            yield
            return
        observer = ObserverWorker.from_settings(
            observer_handler(observe, _reflect), settings, group_id=f"{settings.group_id}-obs"
        )
        async with observer:
            running = asyncio.create_task(observer.run())
            try:
                yield
            finally:
                observer.stop()
                await running


async def _rows(settings: Settings) -> list[dict[str, Any]]:
    """The rows but for what may differ between two rebuilds, in a fixed order."""
    rows = await om_rows(settings)
    stable = [{k: v for k, v in row.items() if k not in UNSTABLE} for row in rows]
    return sorted(stable, key=lambda r: (r["lookupKey"], r["generationCount"]))


async def _rebuild(settings: Settings, *argv: str) -> list[dict[str, Any]]:
    from tests.integration.test_replay import replay  # noqa: PLC0415 -- the replay tests' runner

    async with _observer_beside(settings):
        result, out = await replay(settings, "--from-beginning", "--observe", "--observe-wait-s", "60", *argv)
        assert result.exit_code == 0, out
        assert result.counts.observations > 0
        assert "observed " in out
    return await _rows(settings)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_replay_observe_rebuilds_the_same_log_whatever_the_batches(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str
) -> None:
    """Batch size 1 on one partition at a time, 500 on three at once, 7 on two: the same rows (several
    cycles and a reflection per thread); each thread's log is settled (no claim left). Exactly once, each
    claim's work goes out in its record's transaction, committed before the wait (else the observer, reading
    `read_committed`, would never see it and the wait would time out)."""
    one = _settings(kafka_bootstrap, mongo_uri, processing_guarantee=guarantee)
    other, third = (
        _settings(kafka_bootstrap, mongo_uri, processing_guarantee=guarantee).model_copy(
            update={"responses_topic": one.responses_topic}
        )
        for _ in range(2)
    )
    await make_topic(partitions=3, name=one.responses_topic)
    for settings in (one, other, third):
        await _topics(settings, make_topic)
    try:
        await produce(one.kafka_bootstrap_servers, one.responses_topic, _turns())
        small = await _rebuild(one, "--batch-size", "1", "--concurrency", "1")
        large = await _rebuild(other, "--batch-size", "500", "--concurrency", "3")
        odd = await _rebuild(third, "--batch-size", "7", "--concurrency", "2")  # cuts inside the cycles
        assert small == large == odd
        keys = {row["lookupKey"] for row in small}
        assert keys == {f"thread:{t}" for t in THREADS}
        assert any(row["generationCount"] >= 1 for row in small)  # reflected too
        newest = {row["lookupKey"]: row for row in small}  # sorted by generation: the last wins
        assert all(row["activeObservations"] for row in newest.values())
        assert not any(row["isObserving"] or row["isReflecting"] for row in small)
    finally:
        for settings in (one, other, third):
            await drop_database(settings)


async def test_replay_observe_stops_within_the_bound_when_no_one_answers(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The observed path runs, no observer does: the replay fails (exit 1) within `--observe-wait-s`, the
    error naming the thread and its claim; the resume point is the record that waited (the first thread's
    5th turn, past its claiming 4th). A resume, nothing in memory, finds the claim open on the thread's row
    and waits for it again (without that read it would save the 5th turn while the claim is open and exit
    0); with an observer it finishes, every claim settled."""
    from tests.integration.test_replay import replay  # noqa: PLC0415

    settings = _settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.responses_topic)
    await _topics(settings, make_topic)
    try:
        await produce(
            settings.kafka_bootstrap_servers, settings.responses_topic, _turns()[:15]
        )  # 5 turns each: the 4th claims (offsets 9, 10, 11), the 5th of the first thread waits (12)
        async with _observer_beside(settings, answer=False):
            started = time.monotonic()
            result, out = await replay(
                settings, "--from-beginning", "--observe", "--observe-wait-s", "3", "--batch-size", "500"
            )
            elapsed = time.monotonic() - started
            assert result.exit_code == 1, out
            assert elapsed < 30
            assert "ObservationWaitError" in out
            assert "thread 'omr-a'" in out
            assert "cycle 1" in out
            assert "sent by partition 0 offset 9" in out
            assert "was not settled within 3 s" in out
            (partition,) = result.partitions
            assert partition.next == 12  # the other threads' claiming turns went on: past offset 9
            assert "--from-offsets 0:12" in out

            # a resume (a new run, nothing in memory) still with no one answering: it waits again
            result, out = await replay(
                settings, "--from-offsets", "0:12", "--observe", "--observe-wait-s", "3"
            )
            assert result.exit_code == 1, out
            assert "thread 'omr-a'" in out
            assert "found open on its row at partition 0 offset 12" in out
            assert result.partitions[0].next == 12

        async with _observer_beside(settings):  # an observer now: the same command resumes and finishes
            result, out = await replay(
                settings, "--from-offsets", "0:12", "--observe", "--observe-wait-s", "60"
            )
        assert result.exit_code == 0, out
        # the claims still open on their rows when it came to them, waited for (the new observer answers
        # the first run's work, maybe before the replay reads the rows)
        assert result.counts.observations <= 3
        rows = await _rows(settings)
        assert [(r["lookupKey"], r["isObserving"]) for r in rows] == [(f"thread:{t}", False) for t in THREADS]
        assert all(r["activeObservations"].startswith("- 8 messages") for r in rows)
    finally:
        await drop_database(settings)


async def test_replay_observe_holds_only_the_claiming_threads_records(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Two threads on one partition: A's 4th turn claims, then two turns of B, then A's 5th. The observer
    answers A's claim only once B's turns are saved (it waits for them, up to 20 s): B's records go on while
    A's claim is open, A's 5th turn waits for it (the per-partition wait of before held B behind A's claim:
    the observer saw no B turn). The rows equal those of a replay one record per batch."""
    slow = _settings(kafka_bootstrap, mongo_uri)
    plain = _settings(kafka_bootstrap, mongo_uri).model_copy(update={"responses_topic": slow.responses_topic})
    await make_topic(partitions=1, name=slow.responses_topic)
    for settings in (slow, plain):
        await _topics(settings, make_topic)
    a = [om_turn("omr-a", "omr-owner", turn, tagged=True) for turn in range(1, 6)]
    b = [om_turn("omr-b", "omr-owner", turn, tagged=True) for turn in range(1, 3)]  # below the threshold
    seen: list[int] = []

    async def after_b(work: ObserveRequest) -> str:
        if work.messages[0].id and work.messages[0].id.startswith("omr-a"):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                saved = [m for m in await stored_messages(slow) if m.get("thread_id") == "omr-b"]
                if len(saved) >= 4:  # B's two turns: a question and an answer each
                    break
                await asyncio.sleep(0.2)
            seen.append(len(saved))
        return await _observe(work)

    try:
        await produce(slow.kafka_bootstrap_servers, slow.responses_topic, [*a[:4], *b, a[4]])
        from tests.integration.test_replay import replay  # noqa: PLC0415

        async with _observer_beside(slow, observe=after_b):
            result, out = await replay(
                slow, "--from-beginning", "--observe", "--observe-wait-s", "60", "--batch-size", "500"
            )
        assert result.exit_code == 0, out
        assert seen == [4]  # B's turns were saved while A's claim was open
        assert result.counts.observations == 1
        one_at_a_time = await _rebuild(plain, "--batch-size", "1")
        rows = await _rows(slow)
        assert rows == one_at_a_time
        newest = {row["lookupKey"]: row for row in rows}
        assert newest["thread:omr-a"]["activeObservations"].startswith("- 8 messages")  # A's 5th not in it
        assert not any(row["isObserving"] or row["isReflecting"] for row in rows)
    finally:
        for settings in (slow, plain):
            await drop_database(settings)


async def test_a_re_enrichment_is_recalled_with_the_log(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """`replay --emit-to` of a request with OM: the thread's log in the context and `history.observed`, the
    messages it covers left out, as the live recall sends it."""
    from tests.integration.test_replay import replay  # noqa: PLC0415

    settings = _settings(kafka_bootstrap, mongo_uri, reflection_observation_tokens=10_000)
    side = f"{settings.enriched_topic}-side"
    await make_topic(partitions=1, name=settings.responses_topic)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=side)
    await _topics(settings, make_topic)
    try:
        turns = [t for t in _turns() if t[0] == b"omr-a"][:4]  # one cycle: turns 1 to 4
        await produce(settings.kafka_bootstrap_servers, settings.responses_topic, turns)
        rows = await _rebuild(settings)
        (log,) = [r["activeObservations"] for r in rows]
        ask = request_event("omr-a", "omr-a-owner", 5, "so which day is cheapest?")
        await produce(settings.kafka_bootstrap_servers, settings.requests_topic, [encoded(ask)])
        result, out = await replay(settings, "--from-beginning", "--emit-to", side)
        assert result.exit_code == 0, out
        (record,) = await read_topic(settings.kafka_bootstrap_servers, side, until=lambda r: len(r) >= 1)
        event = json.loads(record.value)
        assert event["history"]["observed"] == 8
        texts = [p["text"] for m in event["messages"] for p in m["content"]["parts"] if p["type"] == "text"]
        assert any(log in text for text in texts)  # the log, in Mastra's context wording
        recalled = [m["id"] for m in event["messages"] if m["source"] == "memory"]
        assert not any(i.startswith("omr-a-q") for i in recalled)  # what the log covers is not sent again
    finally:
        await drop_database(settings)
