"""Tenants neither touch nor see each other, as pure logic: the derived message ids (`schemas.ids`), the save
plan's per-message ownership (`storage.save_plan`), the echo filter's own-thread rule (`core.echo`), the key
check (`schemas.codec.keyed_by_thread`) and the in-memory storage's thread-filtered lookup. The same cases
through Kafka and MongoDB: tests/integration/test_tenancy.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from message_history.core.echo import filter_echo, plan_echo
from message_history.core.rules import check_owner, owner_refusal
from message_history.errors import EventValidationError, MessageIdTakenError, ThreadOwnershipError
from message_history.settings import Settings
from schemas.codec import decode_request, decode_response, keyed_by_thread
from schemas.ids import MESSAGE_ID_NAMESPACE, Kind, derived_message_id, legacy_ids, legacy_message_id
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from storage.protocol import SaveTurn, Thread
from storage.save_plan import plan_saves
from tests.rule_cases import at, msg

# --- derived ids -------------------------------------------------------------------------------------------

Fields = tuple[str, str, str, Kind, int]
BASE: Fields = ("user-1", "thread-7", "req-42", "input", 0)


def test_the_derivation_is_pinned() -> None:
    """The namespace and the encoding never change: a replay must find the rows stored under these ids."""
    assert uuid.UUID("6f1d4c7a-3b52-5e0c-9a41-2d8e7b6c9f10") == MESSAGE_ID_NAMESPACE
    # the example of docs/events.md#11-ids-and-timestamps
    assert derived_message_id(*BASE) == "35d97688-db25-515c-9db7-a7f0b2036c26"
    name = json.dumps(list(BASE), ensure_ascii=False, separators=(",", ":"))
    assert derived_message_id(*BASE) == str(uuid.uuid5(MESSAGE_ID_NAMESPACE, name))
    assert uuid.UUID(derived_message_id(*BASE)).version == 5
    # computed with Node's crypto over JSON.stringify: a worker in JavaScript derives the same ids
    assert (
        derived_message_id('ü\n\x1f\u2028"', "t", "r", "response", 3)
        == "ad1c6f43-f979-579d-8743-7394a81a74cb"
    )


@pytest.mark.parametrize(
    "other",
    [
        ("user-2", "thread-7", "req-42", "input", 0),  # another tenant, same thread id and request id
        ("user-1", "thread-8", "req-42", "input", 0),  # another thread of the same tenant
        ("user-1", "thread-7", "req-43", "input", 0),
        ("user-1", "thread-7", "req-42", "response", 0),
        ("user-1", "thread-7", "req-42", "input", 1),
    ],
    ids=["resource", "thread", "request", "kind", "position"],
)
def test_every_field_changes_the_id(other: Fields) -> None:
    assert derived_message_id(*other) != derived_message_id(*BASE)


@pytest.mark.parametrize(
    ("one", "two"),
    [
        (("a:b", "c", "r", "input", 0), ("a", "b:c", "r", "input", 0)),  # a separator inside an id
        (('a"', "b", "r", "input", 0), ("a", '"b', "r", "input", 0)),  # a quote inside an id
        (("a", "b", "r,1", "input", 0), ("a", "b", "r", "input", 10)),
        (("", "ab", "r", "input", 0), ("a", "b", "r", "input", 0)),
    ],
)
def test_the_encoding_is_unambiguous(one: Fields, two: Fields) -> None:
    """No choice of ids makes two different tuples hash the same text (a plain join would)."""
    assert derived_message_id(*one) != derived_message_id(*two)


def _response(**overrides: Any) -> bytes:
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": "req-42",
        "threadId": "thread-7",
        "resourceId": "user-1",
        "createdAt": "2025-01-01T11:00:00.000Z",
        "input": [
            {"role": "user", "content": "q"},
            {"id": "explicit", "role": "user", "content": "given"},
        ],
        "response": [{"role": "assistant", "content": "a"}],
    }
    event.update(overrides)
    return json.dumps(event).encode()


def test_decoding_derives_scoped_ids_and_keeps_the_clients() -> None:
    event = decode_response(_response())
    assert [m.id for m in event.input] == [
        derived_message_id("user-1", "thread-7", "req-42", "input", 0),
        "explicit",
    ]
    assert [m.id for m in event.response] == [
        derived_message_id("user-1", "thread-7", "req-42", "response", 0)
    ]
    other = decode_response(_response(resourceId="user-2", threadId="thread-9"))  # same request id
    assert (other.input[0].id, other.response[0].id) != (event.input[0].id, event.response[0].id)
    assert other.input[0].id != event.input[0].id
    assert other.response[0].id != event.response[0].id


def test_legacy_ids_name_only_the_ids_the_service_derived() -> None:
    """Each derived id maps to the id the pre-0.1.0 codec gave the same message; a client's id never does."""
    event = decode_response(_response())
    ids = legacy_ids(
        event.resourceId,
        event.threadId,
        event.requestId,
        [("input", event.input), ("response", event.response)],
    )
    assert ids == {
        derived_message_id("user-1", "thread-7", "req-42", "input", 0): "req-42:input:0",
        derived_message_id("user-1", "thread-7", "req-42", "response", 0): "req-42:response:0",
    }
    assert legacy_message_id("req-42", "response", 3) == "req-42:response:3"
    # an id derived for another place (a request's input, echoed at another position) is not a candidate
    moved = legacy_ids("user-1", "thread-7", "req-42", [("input", [event.input[1], event.input[0]])])
    assert moved == {}


# --- the key check -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "refused"),
    [
        (b"thread-7", None),
        (None, "the record has no key; records must be keyed by their threadId"),
        (b"thread-8", "the record's key is not its threadId; records must be keyed by it"),
        (b"", "the record's key is not its threadId; records must be keyed by it"),
        (b"thread-7 ", "the record's key is not its threadId; records must be keyed by it"),
    ],
)
def test_a_record_must_be_keyed_by_its_thread(key: bytes | None, refused: str | None) -> None:
    event = decode_request(
        json.dumps(
            {
                "schemaVersion": 1,
                "requestId": "r",
                "threadId": "thread-7",
                "resourceId": "u",
                "createdAt": "2025-01-01T11:00:00.000Z",
                "messages": [],
            }
        )
    )
    if refused is None:
        assert keyed_by_thread(key, event) is event
        return
    with pytest.raises(EventValidationError) as error:
        keyed_by_thread(key, event)
    assert (error.value.path, error.value.reason) == ("key", refused)


# --- the save plan: per-message ownership ------------------------------------------------------------------

A_THREAD = Thread("a-thread", "user-a", createdAt=at(0), updatedAt=at(0))


def _turn(thread: str, resource: str, *ids: str) -> SaveTurn:
    return SaveTurn(
        thread, resource, [msg(i, t=n, thread=thread, resource=resource) for n, i in enumerate(ids)]
    )


def _outcomes(results: list[Thread | ThreadOwnershipError]) -> list[str]:
    return [type(r).__name__ for r in results]


@pytest.mark.parametrize(
    ("turns", "homes", "expected", "written"),
    [
        pytest.param(
            [_turn("b-thread", "user-b", "b1", "a1")],
            {"a1": "a-thread"},
            ["MessageIdTakenError"],
            {},
            id="an id stored in another tenant's thread",
        ),
        pytest.param(
            [_turn("b2-thread", "user-a", "x", "a1")],
            {"a1": "a-thread"},
            ["MessageIdTakenError"],
            {},
            id="an id stored in another thread of the same tenant",
        ),
        pytest.param(
            [_turn("a-thread", "user-a", "a1", "a2")],
            {"a1": "a-thread"},
            ["Thread"],
            {"a1": "a-thread", "a2": "a-thread"},
            id="an id stored in the turn's own thread (a redelivery)",
        ),
        pytest.param(
            [_turn("a-thread", "user-a", "same"), _turn("b-thread", "user-b", "same", "b1")],
            {},
            ["Thread", "MessageIdTakenError"],
            {"same": "a-thread"},
            id="one batch, two threads, one id: the later turn is refused, nothing merged",
        ),
        pytest.param(
            [_turn("b-thread", "user-b", "same"), _turn("b-thread", "user-b", "same")],
            {},
            ["Thread", "Thread"],
            {"same": "b-thread"},
            id="one batch, one thread, one id twice: written once",
        ),
        pytest.param(
            [_turn("b-thread", "user-b", "a1"), _turn("b-thread", "user-b", "b2")],
            {"a1": "a-thread"},
            ["MessageIdTakenError", "Thread"],
            {"b2": "b-thread"},
            id="only the turn carrying the id is refused",
        ),
        pytest.param(
            [_turn("a-thread", "user-b", "b1")],
            {},
            ["ThreadOwnershipError"],
            {},
            id="another tenant's thread",
        ),
    ],
)
def test_the_plan_refuses_a_turn_whose_message_id_is_another_threads(
    turns: list[SaveTurn], homes: dict[str, str], expected: list[str], written: dict[str, str]
) -> None:
    results, plan = plan_saves(turns, {"a-thread": A_THREAD}, homes=homes, now=at(0))
    assert _outcomes(results) == expected
    assert {i: w.fields["thread_id"] for i, w in plan.messages.items()} == written
    for result in results:
        if isinstance(result, MessageIdTakenError):
            assert "a-thread" not in str(result)
            assert "user-a" not in str(result)


# --- the echo filter: only the request's own thread counts -------------------------------------------------


def _assistant(id: str, thread: str) -> Message:
    return msg(id, "assistant", t=5, thread=thread)


@pytest.mark.parametrize(
    ("stored_in", "kept"),
    [
        ("b-thread", 0),  # stored in this thread: an echo, nothing is new
        ("a-thread", 2),  # stored only in another thread: as if unknown, the input is kept whole
        (None, 2),  # unknown: kept whole
    ],
)
def test_the_echo_filter_counts_only_a_copy_in_the_requests_thread(stored_in: str | None, kept: int) -> None:
    incoming = [msg("u1", t=1, thread="b-thread"), _assistant("shared", "b-thread")]
    plan = plan_echo(incoming)
    stored = {} if stored_in is None else {"shared": _assistant("shared", stored_in)}
    out = filter_echo(incoming, plan, thread_empty=False, stored=stored, thread_id="b-thread")
    assert len(out) == kept


async def test_the_memory_storage_looks_ids_up_in_the_given_threads_only() -> None:
    storage = InMemoryHistoryStorage()
    await storage.save_messages(thread_id="a-thread", resource_id="user-a", messages=[msg("a1", t=0)])
    await storage.save_messages(thread_id="b-thread", resource_id="user-b", messages=[msg("b1", t=0)])
    assert [m.id for m in await storage.get_messages(["a1", "b1"], thread_ids=["b-thread"])] == ["b1"]
    assert await storage.get_messages(["a1"], thread_ids=["b-thread"]) == []
    assert await storage.get_messages(["a1"], thread_ids=[]) == []
    assert sorted(m.id or "" for m in await storage.get_messages(["a1", "b1"])) == ["a1", "b1"]  # operators


def test_the_id_length_limit_always_admits_the_derived_ids() -> None:
    """A worker echoes the derived ids back: a limit below their length would refuse every answer (found by
    the fuzzing: with `MESSAGE_HISTORY_MAX_ID_LENGTH=32` every echoed response was a dead letter)."""
    derived = derived_message_id("r" * 300, "t" * 300, "q" * 300, "response", 10**6)
    floor = Settings.model_fields["max_id_length"].metadata[0].ge
    assert len(derived) == floor == 36
    Settings(max_id_length=36)
    with pytest.raises(ValidationError):
        Settings(max_id_length=35)


@pytest.mark.parametrize(
    ("owner", "resource", "refused"),
    [
        ("r1", "r1", False),
        ("r1", "r2", True),
        ("", "r2", False),  # a thread stored without an owner is anyone's
        ("r1", None, False),  # no resource named: nothing to compare
        (None, "r2", False),  # no thread stored yet
    ],
)
def test_one_ownership_rule_for_the_library_the_paths_and_both_storages(
    owner: str | None, resource: str | None, refused: bool
) -> None:
    """`core.rules.owner_refusal` is the rule; the buffer, the Mongo save plan and the in-memory storage
    refuse exactly when it does."""
    thread = None if owner is None else Thread(id="t", resourceId=owner)
    refusal = owner_refusal(thread, "t", resource)
    assert (refusal is not None) is refused
    if refused:
        assert isinstance(refusal, ThreadOwnershipError)
        with pytest.raises(ThreadOwnershipError):
            check_owner(thread, "t", resource)
    else:
        check_owner(thread, "t", resource)
    if thread is not None and resource is not None:
        turn = SaveTurn("t", resource, [msg("m1", "user", t=1)])
        results, _ = plan_saves([turn], {"t": thread}, now=at(0))
        assert isinstance(results[0], ThreadOwnershipError) is refused
        storage = InMemoryHistoryStorage()
        storage._threads["t"] = thread
        save = storage.save_messages(thread_id="t", resource_id=resource, messages=turn.messages)
        if refused:
            with pytest.raises(ThreadOwnershipError):
                asyncio.run(save)
        else:
            asyncio.run(save)
