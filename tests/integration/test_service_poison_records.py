"""Issue 23's poison records between good ones, on the requests, responses and commands topics: the service
stays up and ready, every good record is processed, every poison record is dead-lettered byte for byte with
the expected `error.type`.

Besides the records the issue found (calendar-edge times, 2**70, NaN/Infinity, UTF-16), each path meets an
injected bug (a patched function raising for one record): in a decode, in one record's work, and, on the
persist path, after the batch's work where no record is named (the batch is split until the record is
alone). Before containment, each of them stopped the loop and the service exited 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from consumers import commands, persist, recall
from message_history import metrics
from message_history.app.health import Health
from message_history.app.service import run_service
from message_history.errors import FatalStorageError
from schemas.dead_letters import parse_dead_letter_headers
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    drop_database,
    encoded,
    fresh_settings,
    message_id,
    request_event,
    response_event,
    running_service,
    stored_messages,
    text_message,
    values,
)
from tests.integration.stream_helpers import (
    Record,
    committed_offsets,
    produce,
    read_all,
    read_topic,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Item = tuple[bytes | None, bytes | None]
LATEST = "9999-12-31T23:59:59.999Z"
BUG = "EventValidationError"  # what every issue-found poison record is: bad input said as such
SAFE_MAX = 2**53 - 1


def _replace(item: Item, old: str, new: str) -> Item:
    """`item` with a JSON fragment of its value replaced (for the literals `json.dumps` cannot write)."""
    key, value = item
    assert value is not None
    assert old.encode() in value, old
    return key, value.replace(old.encode(), new.encode())


def _request(thread: str, turn: int = 1, **extra: Any) -> dict[str, Any]:
    return request_event(thread, "u", turn, f"question of {thread}", **extra)


def _two_messages(thread: str, created_at: str) -> dict[str, Any]:
    event = _request(thread, createdAt=created_at)
    event["messages"] = [text_message("system", "be brief"), text_message("user", "hi")]
    return event


def _response(thread: str, turn: int = 1, **extra: Any) -> dict[str, Any]:
    request = _request(thread, turn)
    return {**response_event(thread, "u", turn, request["messages"], f"answer of {thread}"), **extra}


def _command(kind: str, request_id: str, created_at: str = "2025-03-01T10:00:00.000Z", **fields: Any) -> Item:
    event = {"schemaVersion": 1, "command": kind, "requestId": request_id, "createdAt": created_at, **fields}
    key = str(fields.get("threadId") or fields["resourceId"])
    return key.encode(), json.dumps(event).encode()


def _requests() -> tuple[list[Item], dict[int, str], list[str]]:
    """(records, poison offset -> error.type, request ids that must be enriched)."""
    utf16 = encoded(_request("p-utf16"))
    records: list[Item] = [
        encoded(_request("g-1")),
        encoded(_two_messages("p-derived", LATEST)),  # the second message's derived time overflows
        encoded(_two_messages("g-2", "9999-12-31T23:59:59.998Z")),  # its last derived time is the latest
        encoded(_request("p-offset-low", createdAt="0001-01-01T00:00:00+01:00")),
        encoded(_request("p-offset-high", createdAt="9999-12-31T23:59:59.999-01:00")),
        encoded(_request("g-3", createdAt="0001-01-01T01:00:00+01:00")),  # = year 1's first instant
        encoded(_request("p-int", memory={"lastMessages": 2**70})),
        encoded(_request("g-4", memory={"lastMessages": SAFE_MAX, "maxTokens": SAFE_MAX})),
        _replace(encoded(_request("p-nan", metadata={"x": 1.5})), '"x": 1.5', '"x": NaN'),
        _replace(encoded(_request("p-inf", metadata={"x": 1.5})), '"x": 1.5', '"x": -Infinity'),
        (utf16[0], utf16[1].decode().encode("utf-16-le")),
        encoded(_request("p-bug")),  # the patched decode raises for it
        encoded(_request("g-5", metadata={"text": "NaN and Infinity, in a string"})),
    ]
    poison = {1: BUG, 3: BUG, 4: BUG, 6: BUG, 8: BUG, 9: BUG, 10: BUG, 11: "ZeroDivisionError"}
    good = ["g-1-turn1", "g-2-turn1", "g-3-turn1", "g-4-turn1", "g-5-turn1"]
    return records, poison, good


def _responses() -> tuple[list[Item], dict[int, str], list[str]]:
    with_args = _response("p-nan-args")
    invocation = {"state": "call", "toolCallId": "c", "toolName": "t", "args": {"n": 1.5}}
    part = {"type": "tool-invocation", "toolInvocation": invocation}
    with_args["response"] = [{"role": "assistant", "content": {"format": 2, "parts": [part]}}]
    records: list[Item] = [
        encoded(_response("h-1")),
        encoded(_response("p-derived", createdAt=LATEST)),  # response.0 is createdAt + 1 ms
        _replace(encoded(with_args), '"n": 1.5', '"n": NaN'),
        encoded(_response("p-offset", createdAt="0001-01-01T00:00:00+01:00")),
        encoded(_response("h-2", createdAt="0001-01-01T00:00:00.000Z")),  # stored as year 1 in MongoDB
        encoded(_response("p-bug")),  # the patched per-record work raises for it
        encoded(_response("p-batch-bug")),  # the patched outcome step raises for it, after the batch's work
        encoded(_response("h-3", createdAt="9999-12-31T23:59:59.997Z")),  # input +0, response +1: the edge
    ]
    poison = {1: BUG, 2: BUG, 3: BUG, 5: "RuntimeError", 6: "ArithmeticError"}
    return records, poison, ["h-1-turn1", "h-2-turn1", "h-3-turn1"]


def _commands() -> tuple[list[Item], dict[int, str], list[str]]:
    records: list[Item] = [
        _command("ForgetThread", "k-1", threadId="nobody-1"),
        (b"x", b'{"command": "ForgetThread"'),
        _command("ForgetThread", "p-offset", "0001-01-01T00:00:00+01:00", threadId="t"),
        _replace(
            _command("ForgetThread", "p-nan", threadId="t", metadata={"x": 1.5}), '"x": 1.5', '"x": NaN'
        ),
        _command("ForgetThread", "p-bug", threadId="t"),  # the patched decode raises for it
        _command("ForgetResource", "k-2", resourceId="nobody-2"),
    ]
    poison = {1: BUG, 2: BUG, 3: BUG, 4: "RuntimeError"}
    return records, poison, ["k-1", "k-2"]


def _inject_bugs(monkeypatch: pytest.MonkeyPatch) -> None:
    """One bug per place a path meets a record: raised only for the records named p-bug / p-batch-bug."""
    turn_memory, turn_input = recall.turn_memory, persist.saved_input  # type: ignore[attr-defined]
    persisted, decode_command = persist.persisted_value, commands.decode_command  # type: ignore[attr-defined]

    def buggy_turn_memory(request: Any, defaults: Any) -> Any:
        if request.threadId == "p-bug":
            return 1 // 0
        return turn_memory(request, defaults)

    def buggy_turn_input(response: Any) -> Any:
        if response.threadId == "p-bug":
            raise RuntimeError("injected bug in one record's work")
        return turn_input(response)

    def buggy_persisted(response: Any, **outcome: Any) -> Any:
        if response.threadId == "p-batch-bug":
            raise ArithmeticError("injected bug after the batch's work")
        return persisted(response, **outcome)

    def buggy_decode_command(raw: bytes, limits: Any) -> Any:
        if b'"p-bug"' in raw:
            raise RuntimeError("injected bug in a command's decode")
        return decode_command(raw, limits)

    monkeypatch.setattr(recall, "turn_memory", buggy_turn_memory)
    monkeypatch.setattr(persist, "saved_input", buggy_turn_input)
    monkeypatch.setattr(persist, "persisted_value", buggy_persisted)
    monkeypatch.setattr(commands, "decode_command", buggy_decode_command)


def _check_letters(
    letters: Sequence[Record], sent: Sequence[Item], poison: dict[int, str], topic: str
) -> None:
    by_offset = {}
    for letter in letters:
        info = parse_dead_letter_headers(letter.headers)
        assert (info.source_topic, info.source_partition) == (topic, 0)
        by_offset[info.source_offset] = (info, letter)
    assert sorted(by_offset) == sorted(poison), topic
    for offset, expected in poison.items():
        info, letter = by_offset[offset]
        assert info.error_type == expected, (topic, offset, info.error_message)
        assert (letter.key, letter.value) == sent[offset], (topic, offset)  # byte for byte


def _unexpected(path: str, error_type: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "message_history_unexpected_errors_total", {"path": path, "error_type": error_type}
    )
    return value or 0.0


async def test_poison_records_on_every_input_topic_are_dead_lettered_and_the_service_stays_up(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    for topic in (settings.requests_topic, settings.responses_topic, settings.commands_topic):
        await make_topic(partitions=1, name=topic)
    requests, bad_requests, good_requests = _requests()
    responses, bad_responses, good_responses = _responses()
    commands_sent, bad_commands, good_commands = _commands()
    _inject_bugs(monkeypatch)
    caplog.set_level("ERROR", logger="consumers.runtime.containment")
    before = {
        ("recall", "ZeroDivisionError"): _unexpected("recall", "ZeroDivisionError"),
        ("persist", "RuntimeError"): _unexpected("persist", "RuntimeError"),
        ("persist", "ArithmeticError"): _unexpected("persist", "ArithmeticError"),
        ("commands", "RuntimeError"): _unexpected("commands", "RuntimeError"),
    }
    health = Health()
    try:
        async with running_service(settings, health=health) as service:
            await produce(bootstrap, settings.requests_topic, requests)
            await produce(bootstrap, settings.responses_topic, responses)
            await produce(bootstrap, settings.commands_topic, commands_sent)

            def has(ids: list[str], field: str = "requestId") -> Any:
                return lambda rs: set(ids) <= {v[field] for v in values(rs)}

            enriched = await read_topic(bootstrap, settings.enriched_topic, until=has(good_requests))
            persisted = await read_topic(bootstrap, settings.persisted_topic, until=has(good_responses))
            forgotten = await read_topic(bootstrap, settings.forgotten_topic, until=has(good_commands))
            letters = {
                settings.requests_topic: await read_topic(
                    bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= len(bad_requests)
                ),
                settings.responses_topic: await read_topic(
                    bootstrap, settings.responses_dlq, until=lambda rs: len(rs) >= len(bad_responses)
                ),
                settings.commands_topic: await read_topic(
                    bootstrap, settings.commands_dlq, until=lambda rs: len(rs) >= len(bad_commands)
                ),
            }
            for topic, sent in (
                (settings.requests_topic, requests),
                (settings.responses_topic, responses),
                (settings.commands_topic, commands_sent),
            ):
                await wait_committed(bootstrap, settings.group_id, topic, {0: len(sent)})
            assert not service.done(), "the service stopped on a record"
            ready, reasons = health.readiness()
            assert ready, reasons
        rows = await stored_messages(settings)
    finally:
        await drop_database(settings)

    assert {v["requestId"] for v in values(enriched)} == set(good_requests)
    assert {v["requestId"] for v in values(persisted)} >= set(good_responses)
    assert {v["requestId"] for v in values(forgotten)} == set(good_commands)
    _check_letters(letters[settings.requests_topic], requests, bad_requests, settings.requests_topic)
    _check_letters(letters[settings.responses_topic], responses, bad_responses, settings.responses_topic)
    _check_letters(letters[settings.commands_topic], commands_sent, bad_commands, settings.commands_topic)

    # the good edge values went through to MongoDB as they are
    created = {row["id"]: row["createdAt"] for row in rows}
    assert created[message_id("h-2", "u", 1, "response")].year == 1
    assert created[message_id("h-3", "u", 1, "response")].isoformat().startswith("9999-12-31T23:59:59.998")
    # nothing of a record refused before the write reached MongoDB
    assert not [row for row in rows if row["thread_id"] in ("p-derived", "p-nan-args", "p-offset", "p-bug")]

    # each bug: its metric, and an ERROR line saying where the record is
    for (path, kind), count in before.items():
        assert _unexpected(path, kind) == count + 1, (path, kind)
    lines = [r for r in caplog.records if r.levelno == logging.ERROR and "unexpected error" in r.getMessage()]
    where = {(r.__dict__["path"], r.__dict__["topic"], r.__dict__["offset"]) for r in lines}
    assert where == {
        ("recall", settings.requests_topic, 11),
        ("persist", settings.responses_topic, 5),
        ("persist", settings.responses_topic, 6),
        ("commands", settings.commands_topic, 4),
    }


async def test_a_record_whose_own_headers_are_over_kafkas_limit_is_still_dead_lettered(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Hostile headers: a bad record carrying 1.1 MB of headers (gzip keeps the batch small for the broker).
    Its dead letter cannot carry them, nor its value: it goes without both, saying so, and the record after it
    is processed. Before, the dead letter's second refusal was raised and stopped the loop."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.requests_topic)
    await produce(
        bootstrap,
        settings.requests_topic,
        [(b"k", b"{not json")],
        headers=[("x-padding", b"h" * 1_100_000)],
        compression_type="gzip",
        max_request_size=4 * 1_048_576,
    )
    await produce(bootstrap, settings.requests_topic, [encoded(_request("after"))])
    try:
        async with running_service(settings, only="recall") as service:
            letters = await read_topic(bootstrap, settings.requests_dlq, until=lambda rs: len(rs) >= 1)
            enriched = await read_topic(bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 1)
            assert not service.done(), "the service stopped on a record"
    finally:
        await drop_database(settings)
    [letter] = letters
    info = parse_dead_letter_headers(letter.headers)
    assert (info.source_offset, info.error_type) == (0, "EventValidationError")
    assert "the record's own headers are omitted from this dead letter" in info.error_message
    assert letter.value == b""
    assert all(key != "x-padding" for key, _ in letter.headers)
    assert [v["requestId"] for v in values(enriched)] == ["after-turn1"]


async def test_a_systemic_refusal_stops_the_loop_and_dead_letters_nothing(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MongoDB refusing for good (say, the service's user lost its write role) is no record's fault: the loop
    stops (exit 1) with an ERROR line naming the batch in hand, nothing is dead-lettered and nothing past the
    batch is committed, so the restarted service reads the same records once the cause is fixed."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    bootstrap = settings.kafka_bootstrap_servers
    await make_topic(partitions=1, name=settings.responses_topic)
    turn_input = persist.saved_input  # type: ignore[attr-defined]

    def refused(response: Any) -> Any:
        if response.threadId == "refused":
            raise FatalStorageError("MongoDB refused the write: OperationFailure code 13 Unauthorized")
        return turn_input(response)

    monkeypatch.setattr(persist, "saved_input", refused)
    caplog.set_level("ERROR", logger="consumers.loop")
    await produce(bootstrap, settings.responses_topic, [encoded(_response("refused"))])
    stop = asyncio.Event()
    try:
        code = await asyncio.wait_for(run_service(settings, stop=stop, only="persist"), 120)
        letters = await read_all(bootstrap, settings.responses_dlq, settle_s=0.5)
        committed = await committed_offsets(bootstrap, settings.group_id, settings.responses_topic)
    finally:
        stop.set()
        await drop_database(settings)
    assert code == 1
    assert letters == []
    assert committed.get(0, 0) == 0
    [line] = [r for r in caplog.records if "no record's fault stops the loop" in r.getMessage()]
    assert line.__dict__["batch"] == {f"{settings.responses_topic}[0]": "0-0"}
    assert line.__dict__["error_type"] == "FatalStorageError"
