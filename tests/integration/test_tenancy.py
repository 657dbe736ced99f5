"""Two tenants through the real stack (Kafka, a MongoDB-wire server, the service in process): resource B,
acting as a hostile or careless tenant, can neither touch resource A's history nor learn anything of it
(issue 24).

Each test waits for the service's answer to every record it sends by the group's committed offsets: an offset
is committed only after everything the record caused (enriched request, persisted event or dead letter) is
acknowledged. The pure rules behind these: tests/unit/test_tenancy_rules.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from message_history.settings import Settings
from schemas.dead_letters import parse_dead_letter_headers
from schemas.ids import derived_message_id
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    T0,
    drop_database,
    fresh_settings,
    running_service,
    stored_messages,
    stored_threads,
    text_message,
    values,
)
from tests.integration.stream_helpers import Record, produce, read_all, wait_committed
from tests.integration.test_replay import replay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

A, B = "user-a", "user-b"
A_THREAD, B_THREAD = "thread-of-a", "thread-of-b"


def _request(thread: str, resource: str, rid: str, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": rid,
        "threadId": thread,
        "resourceId": resource,
        "createdAt": T0,
        "messages": list(messages),
    }


def _response(
    thread: str,
    resource: str,
    rid: str,
    input: Sequence[dict[str, Any]],
    response: Sequence[dict[str, Any]],
    created_at: str = T0,
) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": rid,
        "threadId": thread,
        "resourceId": resource,
        "createdAt": created_at,
        "input": list(input),
        "response": list(response),
        "finishReason": "stop",
    }


def _keyed(event: dict[str, Any]) -> tuple[bytes, bytes]:
    return event["threadId"].encode(), json.dumps(event).encode()


class Stack:
    """The service's topics as the tenants use them; every send waits until the service has answered it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bootstrap = settings.kafka_bootstrap_servers
        self.sent = {settings.requests_topic: 0, settings.responses_topic: 0}

    async def send(self, topic: str, items: Sequence[tuple[bytes | None, bytes]]) -> None:
        await produce(self.bootstrap, topic, list(items))
        self.sent[topic] += len(items)
        await wait_committed(self.bootstrap, self.settings.group_id, topic, {0: self.sent[topic]})

    async def ask(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Send a request; its enriched form, or None when it was refused."""
        await self.send(self.settings.requests_topic, [_keyed(event)])
        return _one(await self.read(self.settings.enriched_topic), event)

    async def answer(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Send a response; its `HistoryPersisted`, or None when it was refused."""
        await self.send(self.settings.responses_topic, [_keyed(event)])
        return _one(await self.read(self.settings.persisted_topic), event)

    async def turn(self, thread: str, resource: str, rid: str, text: str) -> dict[str, Any] | None:
        """A whole turn as a client and a worker play it: ask, then answer with the enriched context."""
        enriched = await self.ask(_request(thread, resource, rid, [text_message("user", text)]))
        assert enriched is not None, f"{rid} was refused on the recall path"
        reply = [text_message("assistant", f"re: {text}")]
        return await self.answer(_response(thread, resource, rid, enriched["messages"], reply))

    async def read(self, topic: str) -> list[Record]:
        return await read_all(self.bootstrap, topic, settle_s=0.3)

    async def letters(self) -> list[tuple[str, str, str]]:
        """(error type, path, message) of every dead letter of both paths."""
        out = []
        for topic in (self.settings.requests_dlq, self.settings.responses_dlq):
            for letter in await self.read(topic):
                info = parse_dead_letter_headers(letter.headers)
                out.append((info.error_type, info.error_path or "", info.error_message))
        return out

    async def written_for(self, thread: str) -> str:
        """Every record the service wrote keyed by `thread`, values and headers, as text: what that thread's
        client (or anyone reading its dead letters) can read back."""
        topics = (
            self.settings.enriched_topic,
            self.settings.persisted_topic,
            self.settings.requests_dlq,
            self.settings.responses_dlq,
        )
        text = []
        for topic in topics:
            for record in await self.read(topic):
                if record.key != thread.encode():
                    continue
                text.append(record.value.decode(errors="replace") if record.value else "")
                text.extend(v.decode(errors="replace") for _, v in record.headers if v is not None)
        return "\n".join(text)


def _one(records: list[Record], event: dict[str, Any]) -> dict[str, Any] | None:
    mine = [
        v
        for v in values(records)
        if (v["threadId"], v["requestId"]) == (event["threadId"], event["requestId"])
    ]
    return mine[-1] if mine else None


async def _rows(settings: Settings, thread: str) -> list[dict[str, Any]]:
    return sorted(
        (r for r in await stored_messages(settings) if r["thread_id"] == thread), key=lambda r: r["id"]
    )


@pytest.fixture
async def stack(kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic) -> AsyncIterator[Stack]:
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    try:
        async with running_service(settings):
            yield Stack(settings)
    finally:
        await drop_database(settings)


# --- item 1: message ids scoped to tenant and thread -------------------------------------------------------


async def test_a_request_id_reused_by_another_tenant_touches_nothing_of_the_first(stack: Stack) -> None:
    """B answers a turn on B's own thread with A's requestId: B's turn is stored, A's rows are untouched, and
    nothing the service writes for B names A's thread or resource."""
    assert await stack.turn(A_THREAD, A, "req-1", "a's question")
    before = await _rows(stack.settings, A_THREAD)
    persisted = await stack.turn(B_THREAD, B, "req-1", "b's question")
    assert persisted is not None, await stack.letters()
    assert persisted["skipped"] is None
    assert len(persisted["savedMessageIds"]) == 2
    assert set(persisted["savedMessageIds"]).isdisjoint(r["id"] for r in before)
    assert await _rows(stack.settings, A_THREAD) == before
    assert [r["resourceId"] for r in await _rows(stack.settings, B_THREAD)] == [B, B]
    assert await stack.letters() == []
    written = await stack.written_for(B_THREAD)
    assert A_THREAD not in written
    assert A not in written


async def test_ids_pre_saved_under_the_old_scheme_do_not_stop_anothers_history(stack: Stack) -> None:
    """B saves, first, the ids A's next turn would have used before 0.1.0 (`<requestId>:input:0`): A's history
    keeps growing."""
    assert await stack.turn(A_THREAD, A, "a-1", "first")
    squatted = _response(
        B_THREAD,
        B,
        "b-1",
        [text_message("user", "squat", id="a-2:input:0")],
        [text_message("assistant", "squat", id="a-2:response:0")],
    )
    assert await stack.answer(squatted)
    persisted = await stack.turn(A_THREAD, A, "a-2", "second")
    assert persisted is not None, await stack.letters()
    assert persisted["skipped"] is None
    assert len(await _rows(stack.settings, A_THREAD)) == 4
    assert await stack.letters() == []


async def test_derived_ids_another_tenant_stores_first_do_not_fail_the_turn(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """B computes the ids the service will derive for A's turn "a-2" (public: resource, thread and a numbered
    request id) and stores messages under them first, in B's own thread. A's turn is still saved, under the
    ids' alternates (keyed with the deployment's key, unpredictable to B); B's rows are untouched. A
    redelivery of A's response, by a restarted service, finds the same alternates: nothing is stored twice."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri)
    await make_topic(partitions=1, name=settings.requests_topic)
    await make_topic(partitions=1, name=settings.responses_topic)
    predicted = [derived_message_id(A, A_THREAD, "a-2", kind, 0) for kind in ("input", "response")]
    squat = _response(
        B_THREAD,
        B,
        "b-1",
        [text_message("user", "squat", id=predicted[0])],
        [text_message("assistant", "squat", id=predicted[1])],
    )
    stack = Stack(settings)
    try:
        async with running_service(settings):
            assert await stack.turn(A_THREAD, A, "a-1", "first")
            assert await stack.answer(squat)
            enriched = await stack.ask(_request(A_THREAD, A, "a-2", [text_message("user", "second")]))
            assert enriched is not None
            answer = _response(A_THREAD, A, "a-2", enriched["messages"], [text_message("assistant", "re")])
            persisted = await stack.answer(answer)
            assert await stack.letters() == []
            assert persisted is not None
            assert persisted["skipped"] is None
            saved = persisted["savedMessageIds"]
            assert len(saved) == 2
            assert not set(saved) & set(predicted)
            assert {uuid.UUID(i).version for i in saved} == {8}
            rows = await _rows(settings, A_THREAD)
        async with running_service(settings):  # a restart, then a redelivery of A's answer
            again = await stack.answer(answer)
            assert again is not None
            assert again["savedMessageIds"] == saved
            assert await _rows(settings, A_THREAD) == rows
            assert len(rows) == 4
            assert {r["id"] for r in await _rows(settings, B_THREAD)} == set(predicted)
            later = await stack.ask(_request(A_THREAD, A, "a-3", [text_message("user", "third")]))
            assert later is not None
            memory = [m["id"] for m in later["messages"] if m["source"] == "memory"]
            assert set(saved) <= set(memory)
            assert not set(predicted) & set(memory)
        for dry_run in (["--dry-run"], []):  # a replay of the responses topic lands on the same rows
            result, printed = await replay(settings, "--from-beginning", *dry_run)
            assert result.exit_code == 0, printed
            assert result.counts.invalid == 0, printed
            assert result.counts.messages_inserted == 0, printed
            assert await _rows(settings, A_THREAD) == rows
    finally:
        await drop_database(settings)


async def test_an_explicit_id_equal_to_another_tenants_refuses_only_that_turn(stack: Stack) -> None:
    """B's explicit message id equals one A stored: B's turn is a dead letter whose reason names nothing of A;
    A's rows are unchanged; B's next turn with its own ids is saved."""
    mine = _response(
        A_THREAD,
        A,
        "a-1",
        [text_message("user", "a's words", id="msg-0001")],
        [text_message("assistant", "a's answer", id="msg-0002")],
    )
    assert await stack.answer(mine)
    before = await _rows(stack.settings, A_THREAD)
    theirs = _response(
        B_THREAD,
        B,
        "b-1",
        [text_message("user", "overwrite", id="msg-0001")],
        [text_message("assistant", "x")],
    )
    assert await stack.answer(theirs) is None
    [(error_type, _, reason)] = await stack.letters()
    assert error_type == "MessageIdTakenError"
    assert "msg-0001" in reason
    written = await stack.written_for(B_THREAD)
    assert "msg-0001" in written  # the dead letter is there...
    for secret in (A_THREAD, A):
        assert secret not in written  # ...and names nothing of A
    assert await _rows(stack.settings, A_THREAD) == before
    assert await _rows(stack.settings, B_THREAD) == []
    assert B_THREAD not in {t["id"] for t in await stored_threads(stack.settings)}
    later = _response(B_THREAD, B, "b-2", [text_message("user", "fresh")], [text_message("assistant", "ok")])
    assert await stack.answer(later)
    assert len(await _rows(stack.settings, B_THREAD)) == 2


async def test_one_id_in_two_threads_of_one_batch_is_not_merged(stack: Stack) -> None:
    """A's and B's turns carry one explicit message id and arrive together: the earlier record (A's) is
    saved, the later (B's) refused; the row is A's, with A's content ("last save wins" no more)."""
    turns = [
        _response(thread, owner, f"{owner}-1", [text_message("user", f"{owner}'s", id="dup-1")], [])
        for thread, owner in ((A_THREAD, A), (B_THREAD, B))
    ]
    await stack.send(stack.settings.responses_topic, [_keyed(t) for t in turns])
    [row] = await stored_messages(stack.settings)
    assert (row["id"], row["thread_id"], row["resourceId"]) == ("dup-1", A_THREAD, A)
    assert json.loads(row["content"])["parts"][0]["text"] == f"{A}'s"
    assert [t for t, _, _ in await stack.letters()] == ["MessageIdTakenError"]
    written = await stack.written_for(B_THREAD)
    assert A_THREAD not in written
    assert A not in written


async def test_responses_written_before_scoped_ids_replay_onto_their_rows(stack: Stack) -> None:
    """A response without ids, written before 0.1.0 and already saved under `{requestId}:input:0` /
    `{requestId}:response:0`, is delivered again (a replay): it updates those rows, it adds no copies."""
    old = _response(A_THREAD, A, "old-1", [text_message("user", "q")], [text_message("assistant", "a")])
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(stack.settings.mongodb_uri.get_secret_value())
    try:  # the rows as the previous version stored them
        storage = MongoHistoryStorage(client[stack.settings.mongodb_database])
        legacy = [
            Message.model_validate(
                {
                    **text_message(role, text),
                    "id": f"old-1:{kind}:0",
                    "createdAt": f"2025-03-01T10:00:00.00{ms}Z",
                }
            )
            for role, text, kind, ms in (("user", "q", "input", 0), ("assistant", "a", "response", 1))
        ]
        await storage.save_messages(thread_id=A_THREAD, resource_id=A, messages=legacy)
    finally:
        await client.close()
    persisted = await stack.answer(old)
    assert persisted is not None, await stack.letters()
    assert persisted["savedMessageIds"] == ["old-1:input:0", "old-1:response:0"]
    assert [r["id"] for r in await _rows(stack.settings, A_THREAD)] == ["old-1:input:0", "old-1:response:0"]
    # a turn not stored before gets the scoped ids
    new = _response(A_THREAD, A, "new-1", [text_message("user", "q2")], [text_message("assistant", "a2")])
    assert (await stack.answer(new) or {}).get("savedMessageIds") == [
        derived_message_id(A, A_THREAD, "new-1", kind, 0) for kind in ("input", "response")
    ]


# --- item 3: the echo filter counts a stored copy only in the request's own thread -------------------------


async def test_an_assistant_id_stored_only_in_another_thread_does_not_empty_the_input(stack: Stack) -> None:
    """B's input ends with an assistant message whose id exists only in A's thread: B's input is kept whole,
    exactly as for an id stored nowhere (no existence oracle, no corrupted turn)."""
    assert await stack.turn(B_THREAD, B, "b-1", "hello")  # B's thread is not empty: the filter applies
    mine = _response(
        A_THREAD, A, "a-1", [text_message("user", "q")], [text_message("assistant", "a", id="a-reply")]
    )
    assert await stack.answer(mine)
    outcomes = {}
    for rid, assistant_id in (("b-2", "a-reply"), ("b-3", "stored-nowhere")):
        messages = [text_message("user", "resent"), text_message("assistant", "resent", id=assistant_id)]
        enriched = await stack.ask(_request(B_THREAD, B, rid, messages))
        assert enriched is not None
        outcomes[assistant_id] = [
            m["content"]["parts"][0]["text"] for m in enriched["messages"] if m["source"] == "input"
        ]
    assert outcomes["a-reply"] == outcomes["stored-nowhere"] == ["resent", "resent"]


# --- item 4: one writer per thread --------------------------------------------------------------------------


async def test_records_not_keyed_by_their_thread_are_dead_letters(stack: Stack) -> None:
    """Keyed by something else, or not keyed at all: refused on both paths, nothing stored or enriched."""
    request = json.dumps(_request(B_THREAD, B, "b-1", [text_message("user", "q")])).encode()
    response = json.dumps(
        _response(B_THREAD, B, "b-1", [text_message("user", "q")], [text_message("assistant", "a")])
    ).encode()
    await stack.send(stack.settings.requests_topic, [(A_THREAD.encode(), request), (None, request)])
    await stack.send(stack.settings.responses_topic, [(A_THREAD.encode(), response), (None, response)])
    letters = await stack.letters()
    assert [(t, p) for t, p, _ in letters] == [("EventValidationError", "key")] * 4
    assert values(await stack.read(stack.settings.enriched_topic)) == []
    assert await stored_messages(stack.settings) == []


async def test_two_resources_creating_one_thread_in_one_batch_end_with_one_owner(stack: Stack) -> None:
    """A and B both create thread T in one batch: the first is its owner, the other's turn is refused and
    nothing of it is in T."""
    contested = "contested"
    turns = [
        _response(
            contested,
            owner,
            f"{owner}-1",
            [text_message("user", f"{owner} q")],
            [text_message("assistant", "a")],
        )
        for owner in (A, B)
    ]
    await stack.send(stack.settings.responses_topic, [_keyed(t) for t in turns])
    [thread] = await stored_threads(stack.settings)
    assert (thread["id"], thread["resourceId"]) == (contested, A)
    assert {r["resourceId"] for r in await _rows(stack.settings, contested)} == {A}
    assert len(await _rows(stack.settings, contested)) == 2
    assert [t for t, _, _ in await stack.letters()] == ["ThreadOwnershipError"]


class _BothReadFirst(MongoHistoryStorage):
    """A service instance's storage whose first write waits until the other instance is about to write too:
    both have read (and found no thread) before either writes, the race two instances can run into."""

    def __init__(self, db: Any, gate: asyncio.Barrier) -> None:
        super().__init__(db)
        self._gate = gate
        self._waited = False

    async def _keyed_bulk_write(self, collection: Any, ops: Callable[[bool], Any], operation: str) -> Any:
        if not self._waited:
            self._waited = True
            with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
                await asyncio.wait_for(self._gate.wait(), 30)
        return await super()._keyed_bulk_write(collection, ops, operation)


async def test_two_instances_creating_one_thread_at_once_end_with_one_owner(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic
) -> None:
    """Two service instances (say a live one and a replay, or mis-keyed records on two partitions) save A's
    and B's first turn into the same new thread at the same instant: one owner, nothing of the other."""
    first = fresh_settings(kafka_bootstrap, mongo_uri)
    second = fresh_settings(kafka_bootstrap, mongo_uri, MONGODB_DATABASE=first.mongodb_database)
    for settings in (first, second):
        await make_topic(partitions=1, name=settings.requests_topic)
        await make_topic(partitions=1, name=settings.responses_topic)
    gate = asyncio.Barrier(2)
    clients: list[AsyncMongoClient[dict[str, Any]]] = [AsyncMongoClient(mongo_uri) for _ in range(2)]
    storages = [_BothReadFirst(c[first.mongodb_database], gate) for c in clients]
    await storages[0].ensure_indexes()
    turns = {
        owner: _response(
            "contested", owner, f"{owner}-1", [text_message("user", owner)], [text_message("assistant", "a")]
        )
        for owner in (A, B)
    }
    try:
        async with (
            running_service(first, only="persist", storage=storages[0]),
            running_service(second, only="persist", storage=storages[1]),
        ):
            await asyncio.gather(
                produce(kafka_bootstrap, first.responses_topic, [_keyed(turns[A])]),
                produce(kafka_bootstrap, second.responses_topic, [_keyed(turns[B])]),
            )
            for settings in (first, second):
                await wait_committed(kafka_bootstrap, settings.group_id, settings.responses_topic, {0: 1})
        threads = await stored_threads(first)
        rows = await stored_messages(first)
        letters = [
            parse_dead_letter_headers(letter.headers).error_type
            for settings in (first, second)
            for letter in await read_all(kafka_bootstrap, settings.responses_dlq, settle_s=0.3)
        ]
    finally:
        for client in clients:
            await client.close()
        await drop_database(first)
    [thread] = threads
    owner = thread["resourceId"]
    assert owner in (A, B)
    assert {r["resourceId"] for r in rows} == {owner}
    assert len(rows) == 2
    assert letters == ["ThreadOwnershipError"]
