"""`message-history replay` on real Kafka and a real MongoDB-wire server.

Each test has its own topics (fresh names), group and databases. Replays run in-process through
`run_replay` (the same function the console script runs), except the interrupt test, which signals a real
`message-history replay` child process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from pymongo import AsyncMongoClient

from consumers import persist
from message_history.app.replay.command import ReplayResult, run_replay
from message_history.app.replay.options import options_from_args
from message_history.app.replay.plan import add_replay_arguments, parse_offsets
from message_history.settings import Settings
from schemas.codec import decode_response
from schemas.dead_letters import parse_dead_letter_headers
from schemas.ids import legacy_ids
from storage.mongodb import MongoHistoryStorage
from storage.protocol import SaveTurn
from tests import infra
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    ROOT,
    drop_database,
    fresh_settings,
    request_event,
    response_event,
    running_service,
    settings_env,
    stored_messages,
    stored_threads,
    text_message,
    values,
)
from tests.integration.stream_helpers import Record, committed_offsets, produce, read_all, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Item = tuple[bytes | None, bytes]
Docs = tuple[list[dict[str, Any]], list[dict[str, Any]]]


# --- events ------------------------------------------------------------------------------------------------


def _stamp(turn: int, ms: int) -> str:
    return f"2025-03-01T10:{turn:02d}:00.{ms:03d}Z"


def conversation(thread: str, turns: int) -> list[dict[str, Any]]:
    """`AgentResponse`s of one thread as a worker sends them: each turn's input echoes the history it was
    given (source "memory", never re-saved) before the new user message; ids and createdAt explicit, except on
    the last turn's answer (filled deterministically); one message carries a field the contract does not name.
    """
    owner = f"user-{thread}"
    history: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for turn in range(turns):
        user = text_message(
            "user", f"{thread} question {turn}", id=f"{thread}-u{turn}", createdAt=_stamp(turn, 0)
        )
        if turn == 0:
            user["providerMetadata"] = {"vendor": {"trace": [1, 2]}}
        event = response_event(
            thread,
            owner,
            turn,
            [*({**m, "source": "memory"} for m in history), {**user, "source": "input"}],
            "",
        )
        answer = text_message("assistant", f"{thread} answer {turn}")
        if turn < turns - 1:
            answer.update(id=f"{thread}-a{turn}", createdAt=_stamp(turn, 400))
        event["response"] = [answer]
        events.append(event)
        history += [user, answer]
    return events


def mixed_events(threads: int, turns: int) -> list[Item]:
    """Conversations interleaved turn by turn, plus a read-only turn, a failed turn, a redelivered turn and a
    record that is not JSON: every outcome the persist path has."""
    convs = {f"th{i}": conversation(f"th{i}", turns) for i in range(threads)}
    items: list[Item] = []
    for turn in range(turns):
        for thread in convs:
            items.append(_encode(convs[thread][turn]))
    read_only = response_event("ro", "user-ro", 0, [text_message("user", "do not keep", id="ro-u0")], "ok")
    read_only["memory"] = {"readOnly": True}
    failed = response_event("fail", "user-fail", 0, [text_message("user", "boom", id="fail-u0")], "x")
    failed.update(response=[], finishReason="error")
    items += [_encode(read_only), _encode(failed), items[0], (b"th0", b"{not json")]
    return items


def simple_events(count: int, prefix: str = "s") -> list[Item]:
    """`count` one-turn conversations on distinct threads (user + assistant message each)."""
    return [
        _encode(
            response_event(f"{prefix}{i}", f"user-{prefix}{i}", 0, [text_message("user", f"q{i}")], f"a{i}")
        )
        for i in range(count)
    ]


def _encode(event: dict[str, Any]) -> Item:
    return event["threadId"].encode(), json.dumps(event).encode()


def saved_ids(raw_values: Sequence[bytes]) -> set[str]:
    """Message ids the persist path saves for simple events: input and response, ids as decoding fills."""
    ids: set[str] = set()
    for raw in raw_values:
        event = decode_response(raw)
        ids |= {
            m.id for m in [*event.input, *event.response] if m.id and getattr(m, "source", None) != "memory"
        }
    return ids


# --- helpers -----------------------------------------------------------------------------------------------


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_replay_arguments(parser)
    return parser.parse_args(["--progress", "none", "--max-retry-s", "90", *argv])


async def replay(settings: Settings, *argv: str) -> tuple[ReplayResult, str]:
    """Run a replay in this event loop; (its result, what it printed to stdout)."""
    options = options_from_args(parse_args(*argv), settings, tty=False)
    out = io.StringIO()
    result = await asyncio.wait_for(run_replay(settings, options, out=out, err=io.StringIO()), 180)
    return result, out.getvalue()


async def docs(settings: Settings) -> Docs:
    """Both collections, `_id` left out, sorted by id."""
    messages = sorted(await stored_messages(settings), key=lambda d: d["id"])
    threads = sorted(await stored_threads(settings), key=lambda d: d["id"])
    return messages, threads


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def databases(*settings: Settings) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for each in settings:
            await drop_database(each)


def other_database(settings: Settings) -> Settings:
    return settings.model_copy(update={"mongodb_database": f"t_{infra.unique_name('')}"})


async def setup(kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, partitions: int = 2) -> Settings:
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=partitions, name=settings.responses_topic)
    return settings


# --- tests -------------------------------------------------------------------------------------------------


async def test_replay_into_an_empty_database_equals_what_the_live_service_built(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Both collections rebuilt by a replay equal the live ones document for document (createdAt included)."""
    live = await setup(kafka_bootstrap, mongo_uri, make_topic)
    rebuilt = other_database(live)
    items = mixed_events(threads=4, turns=3)
    await produce(kafka_bootstrap, live.responses_topic, items)
    ends = await end_offsets(kafka_bootstrap, live.responses_topic)
    async with databases(live, rebuilt):
        async with running_service(live, only="persist"):
            await wait_committed(kafka_bootstrap, live.group_id, live.responses_topic, ends)
        expected = await docs(live)

        result, printed = await replay(rebuilt, "--from-beginning")

        assert result.exit_code == 0, printed
        assert await docs(rebuilt) == expected
        assert (len(expected[0]), len(expected[1])) == (4 * 3 * 2, 4)  # the test data did reach the database
        counts = result.counts
        assert counts.events == len(items)
        assert (counts.persisted, dict(counts.skipped), counts.invalid) == (
            4 * 3 + 1,  # every turn, and the redelivered one again
            {"read-only": 1, "failed-turn": 1},
            1,
        )
        assert (counts.messages_inserted, counts.threads) == (4 * 3 * 2, 4)
        assert printed.startswith(f"replay of {live.responses_topic} finished")


async def test_a_replay_of_responses_saved_before_scoped_ids_adds_no_copies(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Responses without ids, saved by a version before 0.1.0 under `{requestId}:{kind}:{i}`, replayed now:
    every message is found under its old id in its thread and updated there, none is inserted again under the
    scoped id (docs/events.md#11-ids-and-timestamps)."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    items = simple_events(6, prefix="old")
    await produce(kafka_bootstrap, settings.responses_topic, items)
    async with databases(settings):
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(settings.mongodb_uri.get_secret_value())
        try:  # the turns as the previous version saved them: same rows, the old ids
            storage = MongoHistoryStorage(client[settings.mongodb_database])
            await storage.ensure_indexes()
            turns = []
            for _, value in items:
                event = decode_response(value)
                old = legacy_ids(
                    event.resourceId,
                    event.threadId,
                    event.requestId,
                    [("input", event.input), ("response", event.response)],
                )
                messages = [m.to_message() for m in event.input] + list(event.response)
                turns.append(
                    SaveTurn(
                        event.threadId,
                        event.resourceId,
                        [m.model_copy(update={"id": old[m.id or ""]}) for m in messages],
                    )
                )
            await storage.save_many(turns)
        finally:
            await client.close()
        before = await docs(settings)
        assert len(before[0]) == 6 * 2
        assert all(d["id"].endswith((":input:0", ":response:0")) for d in before[0])

        result, printed = await replay(settings, "--from-beginning")

        assert result.exit_code == 0, printed
        assert await docs(settings) == before
        assert (result.counts.messages_inserted, result.counts.messages_present) == (0, len(before[0]))


async def test_replaying_twice_changes_nothing_and_emits_only_when_asked(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """A second replay leaves both collections identical (all messages already present); nothing goes to the
    persisted topic unless `--emit-persisted`, which sends one event per response."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    items = mixed_events(threads=3, turns=2)
    await produce(kafka_bootstrap, settings.responses_topic, items)
    async with databases(settings):
        first, _ = await replay(settings, "--from-beginning")
        assert first.exit_code == 0
        before = await docs(settings)
        assert await read_all(kafka_bootstrap, settings.persisted_topic, settle_s=0.5) == []

        second, printed = await replay(settings, "--from-beginning", "--emit-persisted")

        assert second.exit_code == 0, printed
        assert await docs(settings) == before
        assert (second.counts.messages_inserted, second.counts.messages_present) == (0, len(before[0]))
        emitted = values(await read_all(kafka_bootstrap, settings.persisted_topic))
        valid = len(items) - 1
        assert len(emitted) == valid
        assert {e["skipped"] for e in emitted} == {None, "read-only", "failed-turn"}
        assert f"emitted to         {settings.persisted_topic}" in printed


async def test_replay_while_the_live_service_runs_leaves_its_group_offsets_alone(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """The live group's committed offsets read by an admin client are the same before and after a replay of
    the whole topic into the live database, and the database is unchanged."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    await produce(kafka_bootstrap, settings.responses_topic, simple_events(40))
    ends = await end_offsets(kafka_bootstrap, settings.responses_topic)
    async with databases(settings), running_service(settings, only="persist"):
        await wait_committed(kafka_bootstrap, settings.group_id, settings.responses_topic, ends)
        offsets_before = await committed_offsets(kafka_bootstrap, settings.group_id, settings.responses_topic)
        docs_before = await docs(settings)

        result, printed = await replay(settings, "--from-beginning")

        assert result.exit_code == 0, printed
        assert result.counts.events == 40
        assert await committed_offsets(kafka_bootstrap, settings.group_id, settings.responses_topic) == (
            offsets_before
        )
        assert offsets_before == ends
        assert await docs(settings) == docs_before


async def test_a_run_stops_at_the_end_captured_at_start_while_a_producer_keeps_writing(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """With records arriving throughout, the replay finishes, having read exactly the offsets below the ends
    it captured when it started, and MongoDB holds exactly those records' messages."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    await produce(kafka_bootstrap, settings.responses_topic, simple_events(100, prefix="early"))
    writing = asyncio.Event()
    done = asyncio.Event()

    async def keep_writing() -> None:
        n = 0
        while not done.is_set():
            await produce(kafka_bootstrap, settings.responses_topic, simple_events(5, prefix=f"late{n}-"))
            n += 1
            writing.set()
            await asyncio.sleep(0.05)

    producer = asyncio.create_task(keep_writing())
    async with databases(settings):
        try:
            await asyncio.wait_for(writing.wait(), 30)
            result, printed = await replay(settings, "--from-beginning", "--rate", "40")
        finally:
            done.set()
            await producer
        assert result.exit_code == 0, printed
        final = await end_offsets(kafka_bootstrap, settings.responses_topic)
        captured = {r.partition: r.end for r in result.ranges}
        assert sum(final.values()) > sum(captured.values())  # the producer wrote past the captured ends
        assert result.counts.events == sum(r.size for r in result.ranges)
        records = await read_all(kafka_bootstrap, settings.responses_topic, settle_s=0.5)
        below = [r.value for r in records if r.offset < captured[r.partition]]
        assert len(below) == result.counts.events
        assert {d["id"] for d in (await docs(settings))[0]} == saved_ids(below)


async def test_resume_from_the_offsets_printed_after_sigint_completes_the_work(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """SIGINT stops a slow `message-history replay` mid-way with exit 130 and a `--from-offsets` flag; a
    replay with that flag stores everything that was missing, and nothing is missing at the end."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    items = simple_events(120)
    await produce(kafka_bootstrap, settings.responses_topic, items)
    expected = saved_ids([value for _, value in items])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(settings_env(settings))
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    async with databases(settings):
        with stdout.open("wb") as out, stderr.open("wb") as err:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "message_history", "replay", "--from-beginning", "--rate", "12"),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
            )
            try:
                deadline = time.monotonic() + 60
                while not (await docs(settings))[0]:  # it has written something: mid-way
                    assert child.returncode is None, stderr.read_text()
                    assert time.monotonic() < deadline, stderr.read_text()
                    await asyncio.sleep(0.2)
                child.send_signal(signal.SIGINT)
                code = await asyncio.wait_for(child.wait(), 60)
            finally:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
        printed = stdout.read_text()
        assert code == 130, printed + stderr.read_text()
        match = re.search(r"^resume with: --from-offsets (\S+)$", printed, re.MULTILINE)
        assert match is not None, printed
        resume_at = parse_offsets(match.group(1))
        stored_at_stop = {d["id"] for d in (await docs(settings))[0]}
        assert 0 < len(stored_at_stop) < len(expected)

        result, again = await replay(settings, "--from-offsets", match.group(1))

        assert result.exit_code == 0, again
        ends = await end_offsets(kafka_bootstrap, settings.responses_topic)
        assert result.counts.events == sum(ends[p] - o for p, o in resume_at.items())
        messages, threads = await docs(settings)
        assert {d["id"] for d in messages} == expected
        assert len(threads) == 120


async def test_dry_run_counts_what_would_be_inserted_and_writes_nothing(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    mongo_client: AsyncMongoClient[dict[str, Any]],
) -> None:
    """A dry run counts threads and messages, split into would-be-inserted and already-present, and leaves
    the database as it was (an empty one is not even created)."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    items = simple_events(30)
    await produce(kafka_bootstrap, settings.responses_topic, items)
    records = await read_all(kafka_bootstrap, settings.responses_topic, settle_s=0.5)
    on_p0 = saved_ids([r.value for r in records if r.partition == 0])
    threads_p0 = {r.key for r in records if r.partition == 0}
    assert 0 < len(on_p0) < 60
    async with databases(settings):
        empty, _ = await replay(settings, "--from-beginning", "--dry-run")
        assert empty.exit_code == 0
        assert (empty.counts.messages_inserted, empty.counts.messages_present) == (60, 0)
        assert (empty.counts.threads, empty.counts.threads_new, empty.counts.persisted) == (30, 30, 30)
        assert await mongo_client[settings.mongodb_database].list_collection_names() == []  # not even created

        await replay(settings, "--from-offsets", "0:0")  # fill partition 0's turns for real
        before = await docs(settings)
        assert {d["id"] for d in before[0]} == on_p0

        partly, printed = await replay(settings, "--from-beginning", "--dry-run")

        assert partly.exit_code == 0
        counts = partly.counts
        assert (counts.messages_inserted, counts.messages_present) == (60 - len(on_p0), len(on_p0))
        assert (counts.threads, counts.threads_new) == (30, 30 - len(threads_p0))
        assert await docs(settings) == before
        assert f"({60 - len(on_p0)} would be inserted, {len(on_p0)} already present)" in printed


async def test_bad_records_are_dead_lettered_with_the_live_headers(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Records that are not JSON or not an AgentResponse go to the topic's DLQ, bytes and key untouched, with
    the live service's headers naming where they came from; the good ones around them are saved."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic, partitions=1)
    good = simple_events(3)
    bad: list[Item] = [(b"k1", b"not json"), (b"k2", json.dumps({"schemaVersion": 1}).encode())]
    await produce(
        kafka_bootstrap,
        settings.responses_topic,
        [good[0], bad[0], good[1], bad[1], good[2]],
        headers=[("traceparent", b"00-trace-01")],
    )
    async with databases(settings):
        result, printed = await replay(settings, "--from-beginning")

        assert result.exit_code == 0, printed
        assert (result.counts.invalid, result.counts.dead_lettered, result.counts.persisted) == (2, 2, 3)
        dead = await read_all(kafka_bootstrap, settings.responses_dlq)
        assert [(r.key, r.value) for r in dead] == bad
        infos = [parse_dead_letter_headers(r.headers) for r in dead]
        assert [(i.source_topic, i.source_partition, i.source_offset) for i in infos] == [
            (settings.responses_topic, 0, 1),
            (settings.responses_topic, 0, 3),
        ]
        assert {i.error_type for i in infos} == {"EventValidationError"}
        assert all(i.headers == [("traceparent", b"00-trace-01")] for i in infos)
        assert len((await docs(settings))[0]) == 6
        assert f"(dead-lettered to {settings.responses_dlq})" in printed
        assert "    at 0/1: EventValidationError" in printed


async def test_poison_records_and_a_bug_are_dead_lettered_and_the_replay_goes_on(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23's records (a derived time past 9999, an offset before year 1, NaN) and a bug met on one record
    (patched to raise) are dead-lettered as the live loop does; the good records around them are saved. Before
    containment the OverflowError and the bug ended the replay with exit code 1."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic, partitions=1)
    good = simple_events(3)
    late = response_event("late", "u", 0, [text_message("user", "q")], "a")
    early = response_event("early", "u", 0, [text_message("user", "q")], "a")
    nan = response_event("nan", "u", 0, [text_message("user", "q")], "a")
    bug = response_event("bug", "u", 0, [text_message("user", "q")], "a")
    bad: list[Item] = [
        _encode(late | {"createdAt": "9999-12-31T23:59:59.999Z"}),
        _encode(early | {"createdAt": "0001-01-01T00:00:00+01:00"}),
        (b"nan", json.dumps(nan | {"metadata": {"x": 1}}).replace('"x": 1', '"x": NaN').encode()),
        _encode(bug),
    ]
    turn_input = persist.saved_input  # type: ignore[attr-defined]

    def buggy(response: Any) -> Any:
        if response.threadId == "bug":
            raise KeyError("injected bug")
        return turn_input(response)

    monkeypatch.setattr(persist, "saved_input", buggy)
    await produce(
        kafka_bootstrap,
        settings.responses_topic,
        [good[0], bad[0], bad[1], good[1], bad[2], bad[3], good[2]],
    )
    async with databases(settings):
        result, printed = await replay(settings, "--from-beginning")

        assert result.exit_code == 0, printed
        assert (result.counts.invalid, result.counts.dead_lettered, result.counts.persisted) == (4, 4, 3)
        dead = await read_all(kafka_bootstrap, settings.responses_dlq)
        assert [(r.key, r.value) for r in dead] == bad
        infos = [parse_dead_letter_headers(r.headers) for r in dead]
        assert [(i.source_offset, i.error_type) for i in infos] == [
            (1, "EventValidationError"),
            (2, "EventValidationError"),
            (4, "EventValidationError"),
            (5, "KeyError"),
        ]
        assert {d["thread_id"] for d in (await docs(settings))[0]} == {"s0", "s1", "s2"}


async def test_skip_invalid_reports_bad_records_instead_of_dead_lettering(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """With `--skip-invalid` nothing reaches the DLQ; each bad record is in the JSONL report, where it was."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic, partitions=1)
    good = simple_events(2)
    await produce(
        kafka_bootstrap, settings.responses_topic, [good[0], (b"k", b"\xff\xfe"), good[1], (b"k", b"[]")]
    )
    report = tmp_path / "invalid.jsonl"
    async with databases(settings):
        result, printed = await replay(
            settings, "--from-beginning", "--skip-invalid", "--invalid-report", str(report)
        )

        assert result.exit_code == 0, printed
        assert (result.counts.invalid, result.counts.dead_lettered, result.counts.persisted) == (2, 0, 2)
        assert await read_all(kafka_bootstrap, settings.responses_dlq, settle_s=0.5) == []
        entries = [json.loads(line) for line in report.read_text().splitlines()]
        assert [(e["topic"], e["partition"], e["offset"], e["error_type"]) for e in entries] == [
            (settings.responses_topic, 0, 1, "EventValidationError"),
            (settings.responses_topic, 0, 3, "EventValidationError"),
        ]
        assert "(not dead-lettered, reported)" in printed


async def test_emit_to_re_enriches_requests_into_a_side_topic(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """`--emit-to` runs the requests topic through the live recall path into another topic: each request
    comes out with its thread's stored history; the live enriched topic gets nothing."""
    settings = await setup(kafka_bootstrap, mongo_uri, make_topic)
    await make_topic(partitions=2, name=settings.requests_topic)
    side = f"side-{infra.unique_name('')}"
    await produce(kafka_bootstrap, settings.responses_topic, [_encode(e) for e in conversation("th", 2)])
    requests = [
        request_event("th", "user-th", 2, "third question"),
        request_event("other", "user-o", 0, "hi"),
    ]
    await produce(kafka_bootstrap, settings.requests_topic, [_encode(e) for e in requests])
    async with databases(settings):
        filled, _ = await replay(settings, "--from-beginning")
        assert filled.counts.messages_inserted == 4

        result, printed = await replay(settings, "--from-beginning", "--emit-to", side)

        assert result.exit_code == 0, printed
        assert (result.counts.enriched, result.counts.recalled) == (2, 4)
        enriched = {e["requestId"]: e for e in values(await read_topic_all(kafka_bootstrap, side, 2))}
        third = enriched[requests[0]["requestId"]]
        assert [m["source"] for m in third["messages"]] == ["memory"] * 4 + ["input"]
        assert [m["id"] for m in third["messages"][:4]] == [
            "th-u0",
            "th-a0",
            "th-u1",
            third["messages"][3]["id"],
        ]
        assert third["history"]["recalled"] == 4
        assert enriched[requests[1]["requestId"]]["history"]["recalled"] == 0
        assert await read_all(kafka_bootstrap, settings.enriched_topic, settle_s=0.5) == []
        assert f"emitted to         {side}" in printed


async def read_topic_all(bootstrap: str, topic: str, count: int) -> list[Record]:
    records = await read_all(bootstrap, topic, settle_s=0.5)
    assert len(records) == count, [r.value for r in records]
    return records


async def test_replaying_a_batch_of_more_than_100_stored_messages_again_changes_nothing(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
) -> None:
    """A second replay whose batch re-saves more than 100 stored messages succeeds and changes nothing."""
    # A bulk `update` whose every upsert matches a stored row (FerretDB 1.24 hung on 100+ of them).
    settings = fresh_settings(kafka_bootstrap, mongo_uri, mongodb_timeout_ms=3000)
    await make_topic(partitions=1, name=settings.responses_topic)
    await produce(kafka_bootstrap, settings.responses_topic, simple_events(60))  # one batch, 120 messages
    async with databases(settings):
        first, printed = await replay(settings, "--from-beginning")
        assert first.exit_code == 0, printed
        before = await docs(settings)

        second, printed = await replay(settings, "--from-beginning", "--max-retry-s", "5")

        assert second.exit_code == 0, printed
        assert await docs(settings) == before
