"""Forget a thread or a resource, by CLI and by command: rows gone, answered, idempotent, not replayed back.

The tombstone is what makes erasure stick while the topics still hold the data: a replay of the responses
topic, or a late redelivery, skips forgotten turns (`skipped: "forgotten"`); a turn made after the forget is
new history and is saved.
"""

from __future__ import annotations

import argparse
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from message_history.app.forget import add_forget_arguments, run_forget
from message_history.settings import Settings
from schemas.dead_letters import parse_dead_letter_headers
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    message_id,
    read_request_ids,
    response_event,
    running_service,
    stored_messages,
    stored_threads,
    text_message,
    values,
)
from tests.integration.stream_helpers import produce, read_all, read_topic
from tests.integration.test_replay import replay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Item = tuple[bytes | None, bytes | None]


def turns(thread: str, resource: str, count: int = 2) -> list[Item]:
    """`count` one-question turns of `thread` (user + assistant message each, ids from the events)."""
    return [
        encoded(response_event(thread, resource, turn, [text_message("user", f"q{turn}")], f"a{turn}"))
        for turn in range(1, count + 1)
    ]


async def forget_cli(settings: Settings, *argv: str) -> dict[str, Any]:
    """`message-history forget ARGV` in this process; its JSON answer."""
    parser = argparse.ArgumentParser()
    add_forget_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = await run_forget(settings, parser.parse_args(list(argv)), out=out, err=err)
    assert code == 0, err.getvalue()
    answer: dict[str, Any] = json.loads(out.getvalue())
    return answer


def by_thread(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["thread_id"]] = counts.get(row["thread_id"], 0) + 1
    return counts


def command(kind: str, request_id: str, **fields: Any) -> Item:
    event = {"schemaVersion": 1, "command": kind, "requestId": request_id, "createdAt": _now(), **fields}
    key = str(fields["threadId"] if kind == "ForgetThread" else fields["resourceId"])
    return key.encode(), json.dumps(event).encode()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def test_forget_by_cli_is_idempotent_and_a_replay_or_redelivery_does_not_bring_it_back(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """`forget --thread` and `--resource`: rows gone, others untouched, a second run counts zero, and neither
    the live service (late redelivery) nor `replay` writes the forgotten turns again."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.responses_topic)
    history = turns("t1", "alice") + turns("t2", "alice") + turns("t3", "bob")
    try:
        async with running_service(settings, only="persist"):
            await produce(bootstrap, settings.responses_topic, history)
            await read_request_ids(bootstrap, settings.persisted_topic, 6)
            assert by_thread(await stored_messages(settings)) == {"t1": 4, "t2": 4, "t3": 4}

            first = await forget_cli(settings, "--thread", "t1", "--request-id", "erase-1")
            assert (first["scope"], first["threadId"], first["requestId"]) == ("thread", "t1", "erase-1")
            assert (first["deletedMessages"], first["deletedThreads"], first["dryRun"]) == (4, 1, False)
            assert sorted(first["messageIds"]) == sorted(
                message_id("t1", "alice", t, kind) for t in (1, 2) for kind in ("input", "response")
            )
            assert first["threadIds"] == ["t1"]
            assert by_thread(await stored_messages(settings)) == {"t2": 4, "t3": 4}

            again = await forget_cli(settings, "--thread", "t1")
            assert (again["deletedMessages"], again["deletedThreads"], again["messageIds"]) == (0, 0, [])
            assert by_thread(await stored_messages(settings)) == {"t2": 4, "t3": 4}

            dry = await forget_cli(settings, "--resource", "alice", "--dry-run")
            assert (dry["deletedMessages"], dry["deletedThreads"], dry["dryRun"]) == (4, 1, True)
            assert by_thread(await stored_messages(settings)) == {"t2": 4, "t3": 4}

            # a late redelivery of a forgotten turn is skipped; a turn made after the forget is new history
            late = turns("t1", "alice", 1)
            fresh = response_event("t1", "alice", 9, [text_message("user", "new", id="t1-new")], "hi")
            fresh["createdAt"] = _now()
            await produce(bootstrap, settings.responses_topic, [*late, encoded(fresh)])
            persisted = await read_request_ids(bootstrap, settings.persisted_topic, 7)
        skipped = {v["requestId"]: v["skipped"] for v in values(persisted)[-2:]}
        assert skipped == {"t1-turn1": "forgotten", "t1-turn9": None}
        assert by_thread(await stored_messages(settings)) == {"t1": 2, "t2": 4, "t3": 4}

        erased = await forget_cli(settings, "--resource", "alice")
        assert (erased["scope"], erased["resourceId"]) == ("resource", "alice")
        assert (erased["deletedMessages"], erased["deletedThreads"]) == (6, 2)
        assert sorted(erased["threadIds"]) == ["t1", "t2"]
        assert by_thread(await stored_messages(settings)) == {"t3": 4}

        result, printed = await replay(settings, "--from-beginning")
        assert result.exit_code == 0, printed
        assert result.counts.skipped["forgotten"] == 6  # every alice turn in the topic, t1's new one too
        assert by_thread(await stored_messages(settings)) == {"t3": 4}
        assert [t["id"] for t in await stored_threads(settings)] == ["t3"]
    finally:
        await drop_database(settings)


async def test_forget_commands_on_the_topic_are_answered_refused_or_counted_zero(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """`ForgetResource` and `ForgetThread` events: each answered by `HistoryForgotten`; a thread named with
    another owner is a dead letter; repeating a command answers zero; a replay brings nothing back."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.responses_topic)
    await make_topic(partitions=1, name=settings.commands_topic)
    history = turns("a1", "alice") + turns("a2", "alice") + turns("b1", "bob") + turns("c1", "carol")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, history)
            await read_request_ids(bootstrap, settings.persisted_topic, 8)
            await produce(
                bootstrap,
                settings.commands_topic,
                [
                    command("ForgetResource", "c-1", resourceId="alice", metadata={"ticket": "GDPR-7"}),
                    command("ForgetThread", "c-2", threadId="b1", resourceId="mallory"),
                    command("ForgetThread", "c-3", threadId="b1", resourceId="bob"),
                    command("ForgetThread", "c-4", threadId="b1"),
                    (b"x", b"{not json"),
                ],
            )
            answers = await read_request_ids(bootstrap, settings.forgotten_topic, 3)
            letters = await read_topic(bootstrap, settings.commands_dlq, until=lambda rs: len(rs) >= 2)
        rows = await stored_messages(settings)
        result, printed = await replay(settings, "--from-beginning")
        after_replay = await stored_messages(settings)
    finally:
        await drop_database(settings)

    got = {v["requestId"]: v for v in values(answers)}
    assert sorted(got) == ["c-1", "c-3", "c-4"]
    alice = got["c-1"]
    assert (alice["scope"], alice["resourceId"], alice["deletedMessages"], alice["deletedThreads"]) == (
        "resource",
        "alice",
        8,
        2,
    )
    assert sorted(alice["threadIds"]) == ["a1", "a2"]
    assert alice["metadata"] == {"ticket": "GDPR-7"}
    assert alice["eventId"] == "c-1"
    assert (got["c-3"]["deletedMessages"], got["c-3"]["deletedThreads"]) == (4, 1)
    assert (got["c-4"]["deletedMessages"], got["c-4"]["deletedThreads"]) == (0, 0)
    keys = {r.value and json.loads(r.value)["requestId"]: r.key for r in answers}
    assert keys["c-1"] == b"alice"
    assert keys["c-3"] == b"b1"
    infos = sorted(parse_dead_letter_headers(r.headers).error_type for r in letters)
    assert infos == ["EventValidationError", "ThreadOwnershipError"]
    assert by_thread(rows) == {"c1": 4}
    assert result.exit_code == 0, printed
    assert result.counts.skipped["forgotten"] == 6
    assert by_thread(after_replay) == {"c1": 4}
    assert await read_all(bootstrap, settings.persisted_topic, settle_s=0.2)  # the stream went on
