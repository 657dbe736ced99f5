"""`message-history dlq inspect | redrive` on the real broker, beside the service running in-process."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from message_history.app.dlq import options_from_args, run_dlq
from message_history.app.dlq_plan import REDRIVE_OF, add_dlq_arguments
from message_history.settings import Settings
from schemas.dead_letters import parse_dead_letter_headers
from tests import infra
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    ROOT,
    drop_database,
    encoded,
    fresh_settings,
    message_id,
    request_event,
    response_event,
    running_service,
    settings_env,
    stored_messages,
    text_message,
    values,
)
from tests.integration.stream_helpers import produce, read_all, read_topic, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_dlq_arguments(parser)
    return parser.parse_args(argv)


async def dlq(settings: Settings, *argv: str) -> tuple[int, str, str]:
    """Run `message-history dlq ARGV` in-process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    options = options_from_args(_args(*argv), settings)
    code = await run_dlq(settings, options, stop=asyncio.Event(), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def dlq_process(settings: Settings, *argv: str) -> tuple[int, str, str]:
    """`python -m message_history dlq ARGV` as a child process with the settings in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(settings_env(settings))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "message_history", "dlq", *argv,
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_redrive_of_selected_dead_letters_after_a_fix(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Oversized requests become dead letters; after the limit is raised, `dlq redrive` of the chosen one
    makes the service enrich it; the other dead letters and the valid requests are not touched, and a
    second redrive sends nothing."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, max_event_bytes=2048)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    await make_topic(partitions=2, name=settings.requests_dlq)
    chosen = request_event("big-1", "u", 1, "x" * 3000)
    requests: list[tuple[bytes | None, bytes | None]] = [
        encoded(request_event("a", "u", 1, "fine")),
        encoded(chosen),
        (b"bad", b"{not json"),
        encoded(request_event("big-2", "u", 1, "y" * 3000)),
        encoded(request_event("b", "u", 1, "fine too")),
    ]
    trace = ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.requests_topic, requests, headers=[trace])
            await read_topic(bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 2)
            await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 3)
            await wait_committed(bootstrap, settings.group_id, settings.requests_topic, {0: len(requests)})

        # The operator looks: three dead letters, with reasons; picks the big-1 one by its position.
        code, out, _ = await dlq_process(settings, "inspect", "--path", "recall", "--json")
        assert code == 0
        listed = [json.loads(line) for line in out.splitlines()]
        assert sorted(d["source"]["offset"] for d in listed) == [1, 2, 3]
        assert {d["errorType"] for d in listed} == {"EventValidationError"}
        (pick,) = [d for d in listed if d["source"]["offset"] == 1]
        assert "2048" in pick["errorMessage"]  # the reason names the limit

        # The fix: a limit large enough for these requests.
        fixed = settings.model_copy(update={"max_event_bytes": 8192})
        async with running_service(fixed):
            code, out, err = await dlq(
                fixed, "redrive", "--path", "recall", "--error-type", "EventValidationError",
                "--offsets", f"{pick['partition']}:{pick['offset']}",
            )  # fmt: skip
            assert code == 0, err
            assert out.count("redrove ") == 1
            assert "redrive: redriven 1, skipped 0 already redriven" in err
            enriched = await read_topic(
                bootstrap,
                settings.enriched_topic,
                until=lambda rs: "big-1-turn1" in {v["requestId"] for v in values(rs)},
            )
            await wait_committed(
                bootstrap, settings.group_id, settings.requests_topic, {0: len(requests) + 1}
            )

            # Idempotent: the same redrive again finds the marker and sends nothing.
            code, out, err = await dlq(
                fixed, "redrive", "--path", "recall", "--offsets", f"{pick['partition']}:{pick['offset']}"
            )
            assert code == 0, err
            assert "redrove " not in out
            assert "redrive: redriven 0, skipped 1 already redriven" in err

        requests_now = await read_all(bootstrap, settings.requests_topic, settle_s=0.5)
        enriched = await read_all(bootstrap, settings.enriched_topic, settle_s=1.0)
        letters = await read_all(bootstrap, settings.requests_dlq, settle_s=0.5)
    finally:
        await drop_database(settings)

    # The redriven record is the original bytes, with its own headers and a marker, not the service's.
    assert len(requests_now) == len(requests) + 1
    redriven = requests_now[-1]
    assert (redriven.key, redriven.value) == requests[1]
    headers = dict(redriven.headers)
    assert headers["traceparent"] == trace[1]
    assert headers[REDRIVE_OF] == f"{settings.requests_dlq}:{pick['partition']}:{pick['offset']}".encode()
    assert not {"error.type", "error.message", "source.topic", "failed.at"} & set(headers)
    # Processed after the fix, once; nothing else was enriched again.
    assert sorted(v["requestId"] for v in values(enriched)) == ["a-turn1", "b-turn1", "big-1-turn1"]
    (big,) = [v for v in values(enriched) if v["requestId"] == "big-1-turn1"]
    assert big["messages"][-1]["content"]["parts"][0]["text"] == "x" * 3000
    # The dead letters not chosen are still there, and none was added.
    assert sorted(parse_dead_letter_headers(r.headers).source_offset for r in letters) == [1, 2, 3]


async def test_redrive_on_the_persist_path_stores_only_the_selected_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Two oversized responses are dead-lettered at different times; after the fix, `dlq redrive --since`
    between them sends back only the later one, whose turn is then stored; the earlier one stays a dead
    letter and nothing of it reaches MongoDB."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, max_event_bytes=2048)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    early = response_event("early", "u", 1, [text_message("user", "q", id="early-q")], "e" * 3000)
    late = response_event("late", "u", 1, [text_message("user", "q", id="late-q")], "l" * 3000)
    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [encoded(early)])
            await read_topic(bootstrap, settings.responses_dlq, until=lambda rs: len(rs) >= 1)
            mark = datetime.now(UTC)
            await produce(bootstrap, settings.responses_topic, [encoded(late)])
            await read_topic(bootstrap, settings.responses_dlq, until=lambda rs: len(rs) >= 2)
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 2})

        # Both dead-letter topics by default; the recall path's was never created (nothing refused there).
        code, out, err = await dlq(settings, "inspect")
        assert code == 0, err
        assert f"{settings.requests_dlq} does not exist (no dead letters yet)" in err
        assert len(out.splitlines()) == 2

        fixed = settings.model_copy(update={"max_event_bytes": 16384})
        async with running_service(fixed):
            since = mark.isoformat()
            code, out, err = await dlq(fixed, "redrive", "--path", "persist", "--since", since)
            assert code == 0, err
            assert out.count("redrove ") == 1
            persisted = await read_topic(bootstrap, settings.persisted_topic, until=lambda rs: len(rs) >= 1)
        rows = await stored_messages(settings)
        letters = await read_all(bootstrap, settings.responses_dlq, settle_s=0.5)
    finally:
        await drop_database(settings)

    assert [v["requestId"] for v in values(persisted)] == ["late-turn1"]
    assert sorted(r["id"] for r in rows) == sorted(["late-q", message_id("late", "u", 1, "response")])
    assert len(letters) == 2  # the early one is still there, nothing was added


async def test_inspect_filters_by_reason_time_and_offsets(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """`dlq inspect` lists only the dead letters matching every filter; records without dead-letter headers
    are counted, not listed; the live group's offsets are not involved (the command has no group)."""
    dlq_topic = await make_topic(partitions=1)
    source = await make_topic(partitions=1)
    rows = [
        ("EventValidationError", "2026-01-10T08:00:00.000Z"),
        ("ThreadOwnershipError", "2026-01-10T09:30:00.000Z"),
        ("EventValidationError", "2026-01-10T09:45:00.000Z"),
        ("EventValidationError", "2026-01-10T11:00:00.000Z"),
    ]
    for index, (error_type, failed_at) in enumerate(rows):
        await produce(
            kafka_bootstrap,
            dlq_topic,
            [(b"k", b'{"n": %d}' % index)],
            headers=_dead_letter_headers(source, index, error_type, failed_at),
        )
    await produce(kafka_bootstrap, dlq_topic, [(b"k", b"stray")])  # offset 4: not a dead letter
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)

    async def offsets(*argv: str) -> tuple[list[int], str]:
        code, out, err = await dlq(settings, "inspect", "--topic", dlq_topic, "--json", *argv)
        assert code == 0, err
        return [json.loads(line)["offset"] for line in out.splitlines()], err

    assert (await offsets())[0] == [0, 1, 2, 3]  # the stray record is counted, not listed
    assert (await offsets("--error-type", "EventValidationError"))[0] == [0, 2, 3]
    assert (await offsets("--since", "2026-01-10T09:00:00Z", "--until", "2026-01-10T10:00:00Z"))[0] == [1, 2]
    assert (await offsets("--offsets", "0:1-3", "--error-type", "EventValidationError"))[0] == [2, 3]
    assert (await offsets("--limit", "2"))[0] == [0, 1]
    listed, err = await offsets("--error-type", "ThreadOwnershipError")
    assert listed == [1]
    assert "read 5 record(s), 1 selected, 1 without dead-letter headers" in err


def _dead_letter_headers(
    source: str, offset: int, error_type: str, failed_at: str
) -> list[tuple[str, bytes]]:
    return [
        ("traceparent", f"00-{offset:032x}-{offset:016x}-01".encode()),
        ("error.type", error_type.encode()),
        ("error.message", b"refused"),
        ("source.topic", source.encode()),
        ("source.partition", b"0"),
        ("source.offset", str(offset).encode()),
        ("failed.at", failed_at.encode()),
        ("service.version", b"0.1.0"),
    ]


async def test_redrive_copies_the_original_bytes_back(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    """The chosen dead letters' key and value bytes go back to `source.topic` untouched (not JSON, several
    lines, whatever they were), keeping their own headers, dropping the service's, each once."""
    source = await make_topic()
    dlq_topic = await make_topic(name=f"{source}.dlq")  # its own input: the name minus .dlq
    sent = [b'{"ok": 0}', b"\xff\x00 not json", b'{"ok": 2}\n{"second line": true}', b'{"ok": 3}']
    for index, value in enumerate(sent):
        headers = _dead_letter_headers(source, index, "EventValidationError", "2026-01-01T00:00:00.000Z")
        await produce(kafka_bootstrap, dlq_topic, [(f"thread-{index}".encode(), value)], headers=headers)
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)

    code, out, err = await dlq(settings, "redrive", "--topic", dlq_topic, "--offsets", "0:1-2", "--dry-run")
    assert code == 0, err
    assert out.count("would redrive") == 2
    assert "redrive: would redrive 2" in err
    assert await read_all(kafka_bootstrap, source, settle_s=0.2) == []  # a dry run sends nothing
    code, _, err = await dlq_process(settings, "redrive", "--topic", dlq_topic, "--offsets", "0:1-2")
    assert code == 0, err
    assert "dlq redrive: read 2/2" in err  # the progress line
    code, _, err = await dlq_process(settings, "redrive", "--topic", dlq_topic, "--offsets", "0:1-2")
    assert code == 0, err
    received = await read_all(kafka_bootstrap, source, settle_s=1.0)

    assert [(r.key, r.value) for r in received] == [(b"thread-1", sent[1]), (b"thread-2", sent[2])]
    for index, record in zip((1, 2), received, strict=True):
        names: dict[str, Any] = dict(record.headers)
        assert names["traceparent"] == f"00-{index:032x}-{index:016x}-01".encode()
        assert names[REDRIVE_OF] == f"{dlq_topic}:0:{index}".encode()
        assert set(names) == {"traceparent", REDRIVE_OF, "redrive.at"}


async def test_redrive_all_never_delivers_a_planted_command(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """Whoever can write to a dead-letter topic can make `source.topic` name any topic. A `ForgetResource`
    planted in the requests' dead-letter topic with `source.topic` = the commands topic is refused by
    `redrive --all` (reported, counted, not sent): nothing reaches the commands topic, while the genuine dead
    letter beside it goes back to its own input topic."""
    run = infra.unique_name("")
    settings = Settings(
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        requests_topic=f"rq-{run}",
        responses_topic=f"rs-{run}",
        commands_topic=f"cm-{run}",
    )
    for topic in (settings.requests_topic, settings.requests_dlq, settings.commands_topic):
        await make_topic(name=topic)
    failed_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    genuine = b'{"a": "request refused earlier"}'
    planted = json.dumps(
        {"schemaVersion": 1, "command": "ForgetResource", "requestId": "evil", "resourceId": "victim",
         "createdAt": failed_at}
    ).encode()  # fmt: skip
    headers = _dead_letter_headers(settings.requests_topic, 7, "EventValidationError", failed_at)
    await produce(kafka_bootstrap, settings.requests_dlq, [(b"thread-1", genuine)], headers=headers)
    headers = _dead_letter_headers(settings.commands_topic, 8, "EventValidationError", failed_at)
    await produce(kafka_bootstrap, settings.requests_dlq, [(b"victim", planted)], headers=headers)

    code, out, err = await dlq(settings, "redrive", "--all", "--dry-run")
    assert code == 0, err
    assert f"would redrive {settings.requests_dlq}:0:0" in out
    assert f"refused {settings.requests_dlq}:0:1: source.topic {settings.commands_topic!r}" in out
    code, out, err = await dlq_process(settings, "redrive", "--all")
    assert code == 0, err
    assert out.count("redrove ") == 1
    assert f"refused {settings.requests_dlq}:0:1" in out
    assert "redrive: redriven 1, skipped 0 already redriven, refused 1" in err

    assert await read_all(kafka_bootstrap, settings.commands_topic, settle_s=1.0) == []
    (back,) = await read_all(kafka_bootstrap, settings.requests_topic, settle_s=0.5)
    assert (back.key, back.value) == (b"thread-1", genuine)
