"""`MessageHistory` (recall / persist_turn and the Mastra-shaped steps) over the in-memory storage."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import pytest

from message_history.core.message_list import MessageList
from message_history.core.request_context import MASTRA_MEMORY, RequestContext
from message_history.errors import (
    AbortError,
    EventValidationError,
    InvalidInputError,
    StorageUnavailableError,
    ThreadOwnershipError,
)
from message_history.processor import (
    MessageHistory,
    OutputResult,
    abort,
)
from schemas.messages import Message
from storage.memory import InMemoryHistoryStorage
from storage.protocol import HistoryStorage, Thread
from tests.rule_cases import (
    PERSIST_CASES,
    RECALL_CASES,
    RESOURCE,
    TAKEN_CASES,
    THREAD,
    CountingStorage,
    PersistCase,
    RecallCase,
    TakenCase,
    memory_context,
    msg,
    run_persist_case,
    run_process_input_case,
    run_process_output_case,
    run_recall_case,
    run_taken_case,
    seed,
)


@pytest.fixture(params=["in-memory"])
def history_storage(request: pytest.FixtureRequest) -> HistoryStorage:
    """The storage the rule tables run against (a storage module adds its own parameter)."""
    assert request.param == "in-memory"
    return InMemoryHistoryStorage()


# --- the rule tables ------


@pytest.mark.parametrize("case", RECALL_CASES, ids=[c.id for c in RECALL_CASES])
async def test_recall_rules(history_storage: HistoryStorage, case: RecallCase) -> None:
    """recall() builds the context each recall rule prescribes, with one thread read and ≤ 1 page read."""
    await run_recall_case(history_storage, case)


@pytest.mark.parametrize("case", RECALL_CASES, ids=[c.id for c in RECALL_CASES])
async def test_process_input_rules(history_storage: HistoryStorage, case: RecallCase) -> None:
    """process_input() puts the same recalled messages into the MessageList, tagged memory."""
    await run_process_input_case(history_storage, case)


@pytest.mark.parametrize("case", PERSIST_CASES, ids=[c.id for c in PERSIST_CASES])
async def test_persist_rules(history_storage: HistoryStorage, case: PersistCase) -> None:
    """persist_turn() saves exactly what each persistence rule prescribes, in a single write."""
    await run_persist_case(history_storage, case)


@pytest.mark.parametrize("case", PERSIST_CASES, ids=[c.id for c in PERSIST_CASES])
async def test_process_output_result_rules(history_storage: HistoryStorage, case: PersistCase) -> None:
    """process_output_result() saves what persist_turn() saves, from a MessageList and a request context."""
    await run_process_output_case(history_storage, case)


# --- identity and construction ------


def test_identity_is_mastras() -> None:
    """The processor carries Mastra's id and name."""
    history = MessageHistory(storage=InMemoryHistoryStorage(), last_messages=50)
    assert (history.id, history.name, history.last_messages) == ("message-history", "MessageHistory", 50)


@pytest.mark.parametrize("bad", [-1, True], ids=["negative", "true"])
def test_constructor_rejects_bad_last_messages(bad: int) -> None:
    """A negative or boolean-true last_messages is refused at construction."""
    with pytest.raises(ValueError, match="lastMessages"):
        MessageHistory(storage=InMemoryHistoryStorage(), last_messages=bad)


# --- abort ------


class ExplodingSaveStorage(InMemoryHistoryStorage):
    """An in-memory storage whose save fails the test if it is ever called."""

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        raise AssertionError("nothing may be written after abort")


class Guardrail:
    """An input/output processor that aborts when a message contains a forbidden word."""

    def __init__(self, word: str) -> None:
        self.word = word

    def _check(self, message_list: MessageList, abort: Callable[[str | None], NoReturn]) -> None:
        for message in message_list.get_all():
            if any(self.word in getattr(part, "text", "") for part in message.content.parts):
                abort(f"blocked: {self.word}")

    async def process_input(
        self,
        *,
        messages: Sequence[Message],
        message_list: MessageList,
        abort: Callable[[str | None], NoReturn],
        request_context: RequestContext | None = None,
        tracing_context: object | None = None,
    ) -> MessageList:
        self._check(message_list, abort)
        return message_list

    async def process_output_result(
        self,
        *,
        messages: Sequence[Message],
        message_list: MessageList,
        abort: Callable[[str | None], NoReturn],
        request_context: RequestContext | None = None,
        tracing_context: object | None = None,
        result: OutputResult | Mapping[str, Any] | None = None,
    ) -> MessageList:
        self._check(message_list, abort)
        return message_list


async def run_chain(
    storage: InMemoryHistoryStorage, user_text: str, reply_text: str, *, guard_input: bool, guard_output: bool
) -> None:
    """One turn: input processors, a fake model, output processors (the README's shape)."""
    context = memory_context()
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE)
    message_list.add({"role": "user", "content": user_text}, "input")
    inputs: list[Any] = [Guardrail("forbidden")] if guard_input else []
    inputs.append(MessageHistory(storage=storage))
    outputs: list[Any] = [Guardrail("secret")] if guard_output else []
    outputs.append(MessageHistory(storage=storage))
    for processor in inputs:
        message_list = await processor.process_input(
            messages=message_list.get_input(), message_list=message_list, abort=abort, request_context=context
        )
    message_list.add({"role": "assistant", "content": reply_text}, "response")
    for processor in outputs:
        message_list = await processor.process_output_result(
            messages=message_list.get_response(),
            message_list=message_list,
            abort=abort,
            request_context=context,
            result={"finishReason": "stop"},
        )


def test_abort_raises_abort_error_with_its_reason() -> None:
    """abort(reason) raises AbortError carrying the reason; without one the reason is 'aborted'."""
    with pytest.raises(AbortError) as raised:
        abort("over budget")
    assert raised.value.reason == "over budget"
    with pytest.raises(AbortError) as raised_default:
        abort()
    assert raised_default.value.reason == "aborted"


async def test_abort_in_an_input_processor_stops_the_turn_and_writes_nothing() -> None:
    """An input processor calling abort stops the turn before any save; the reason reaches the caller."""
    storage = ExplodingSaveStorage()
    with pytest.raises(AbortError, match="blocked: forbidden"):
        await run_chain(storage, "a forbidden question", "answer", guard_input=True, guard_output=False)
    assert await storage.list_messages(THREAD, resource_id=None, limit=None) == []


async def test_abort_in_an_output_processor_before_history_writes_nothing() -> None:
    """An output processor running before MessageHistory and calling abort prevents the save."""
    storage = InMemoryHistoryStorage()
    with pytest.raises(AbortError, match="blocked: secret"):
        await run_chain(storage, "hello", "the secret is 42", guard_input=False, guard_output=True)
    assert await storage.list_messages(THREAD, resource_id=None, limit=None) == []
    assert await storage.get_thread(THREAD) is None


async def test_chain_without_abort_saves_the_turn() -> None:
    """The same chain, when nobody aborts, saves the user message and the reply (the abort tests can fail)."""
    storage = InMemoryHistoryStorage()
    await run_chain(storage, "hello", "hi there", guard_input=True, guard_output=True)
    stored = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert [m.role for m in stored] == ["assistant", "user"]


# --- storage errors (docs/rules.md#r12) and ownership -------------------------------------------------------


class BrokenStorage(InMemoryHistoryStorage):
    """A storage whose reads or writes fail like an unreachable database."""

    def __init__(self, *, fail: str) -> None:
        super().__init__()
        self.fail = fail

    async def get_thread(self, thread_id: str) -> Thread | None:
        if self.fail == "get_thread":
            raise StorageUnavailableError("down")
        return await super().get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        if self.fail == "list_messages":
            raise StorageUnavailableError("down")
        return await super().list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        if self.fail == "save_messages":
            raise StorageUnavailableError("down")
        return await super().save_messages(thread_id=thread_id, resource_id=resource_id, messages=messages)


@pytest.mark.parametrize("fail", ["get_thread", "list_messages"])
async def test_failed_read_is_an_error_not_an_empty_history(fail: str) -> None:
    """A failing read propagates from process_input and leaves the list without recalled messages."""
    storage = BrokenStorage(fail=fail)
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE).add(msg("u1", t=1), "input")
    with pytest.raises(StorageUnavailableError):
        await MessageHistory(storage=storage).process_input(
            messages=[], message_list=message_list, abort=abort, request_context=memory_context()
        )
    assert [m.id for m in message_list.get_all()] == ["u1"]


async def test_failed_write_propagates() -> None:
    """A failing save propagates from process_output_result (the caller retries; nothing is swallowed)."""
    storage = BrokenStorage(fail="save_messages")
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE).add(msg("u1", t=1), "input")
    with pytest.raises(StorageUnavailableError):
        await MessageHistory(storage=storage).process_output_result(
            messages=[], message_list=message_list, abort=abort, request_context=memory_context()
        )


async def test_persist_into_a_thread_of_another_resource_is_refused() -> None:
    """Saving a turn into a thread owned by another resource raises and writes nothing."""
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg("x1", t=1, resource="r2")], owner="r2")
    with pytest.raises(ThreadOwnershipError):
        await MessageHistory(storage=storage).persist_turn(
            thread_id=THREAD, resource_id=RESOURCE, input=[msg("u1", t=2)], response=[]
        )
    assert [m.id for m in await storage.list_messages(THREAD, resource_id=None, limit=None)] == ["x1"]


async def test_skipped_persist_still_enforces_ownership() -> None:
    """A read-only turn on a thread of another resource is refused too (docs/events.md#14-storage-layout)."""
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg("x1", t=1, resource="r2")], owner="r2")
    with pytest.raises(ThreadOwnershipError):
        await MessageHistory(storage=storage).persist_turn(
            thread_id=THREAD, resource_id=RESOURCE, input=[msg("u1", t=2)], response=[], read_only=True
        )


async def test_skipped_persist_reports_the_stored_thread_with_one_read() -> None:
    """A skipped save reads the thread once (for ownership and the outcome) and writes nothing."""
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg("u0", t=5)])
    counting = CountingStorage(storage)
    outcome = await MessageHistory(storage=counting).persist_turn(
        thread_id=THREAD, resource_id=RESOURCE, input=[msg("u1", t=9)], response=[], read_only=True
    )
    assert outcome.skipped == "read-only"
    assert outcome.thread is not None
    assert outcome.thread.updatedAt == msg("u0", t=5).createdAt
    assert dict(counting.calls) == {"get_thread": 1}


async def test_persist_message_naming_another_thread_is_refused_before_writing() -> None:
    """A message whose threadId is not the turn's is a typed input error, and nothing is saved."""
    storage = InMemoryHistoryStorage()
    with pytest.raises(InvalidInputError, match="threadId"):
        await MessageHistory(storage=storage).persist_turn(
            thread_id=THREAD,
            resource_id=RESOURCE,
            input=[msg("u1", t=1), msg("u2", t=2, thread="elsewhere")],
            response=[],
        )
    assert await storage.get_thread(THREAD) is None


async def test_persist_stamps_thread_and_resource_on_bare_messages() -> None:
    """Messages without threadId/resourceId are saved with the turn's."""
    storage = InMemoryHistoryStorage()
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD,
        resource_id=RESOURCE,
        input=[msg("u1", t=1, thread=None, resource=None)],
        response=[],
    )
    assert [(m.threadId, m.resourceId) for m in outcome.messages] == [(THREAD, RESOURCE)]
    (stored,) = await storage.list_messages(THREAD, resource_id=RESOURCE, limit=None)
    assert (stored.threadId, stored.resourceId) == (THREAD, RESOURCE)


@pytest.mark.parametrize(
    ("existing_owner", "expected_owner"),
    [(None, THREAD), ("r9", "r9")],
    ids=["new-thread-owned-by-its-own-id", "existing-thread-keeps-its-owner"],
)
async def test_persist_without_resource_uses_owner_or_thread_id(
    existing_owner: str | None, expected_owner: str
) -> None:
    """Without a resource id a turn goes to the thread's owner, or the thread id (Mastra's fallback)."""
    storage = InMemoryHistoryStorage()
    if existing_owner is not None:
        await seed(storage, [msg("x1", t=1, resource=existing_owner)], owner=existing_owner)
    outcome = await MessageHistory(storage=storage).persist_turn(
        thread_id=THREAD, resource_id=None, input=[msg("u1", t=2, resource=None)], response=[]
    )
    assert outcome.thread is not None
    assert outcome.thread.resourceId == expected_owner
    assert outcome.messages[0].resourceId == expected_owner


async def test_replaying_a_turn_changes_nothing() -> None:
    """Saving the same turn twice keeps one copy per id, the first createdAt, and the thread's timestamps."""
    storage = InMemoryHistoryStorage()
    history = MessageHistory(storage=storage)
    first = await history.persist_turn(
        thread_id=THREAD, resource_id=RESOURCE, input=[msg("u1", t=1)], response=[msg("a1", "assistant", t=2)]
    )
    before = await storage.list_messages(THREAD, resource_id=None, limit=None)
    # The replayed copies even claim later timestamps: createdAt stays the first insert's.
    for shift in (0, 500):
        again = await history.persist_turn(
            thread_id=THREAD,
            resource_id=RESOURCE,
            input=[msg("u1", t=1 + shift)],
            response=[msg("a1", "assistant", t=2 + shift)],
        )
        after = await storage.list_messages(THREAD, resource_id=None, limit=None)
        assert [m.wire() for m in after] == [m.wire() for m in before]
        assert first.thread is not None
        assert again.thread is not None
        assert (again.thread.createdAt, again.thread.updatedAt) == (
            first.thread.createdAt,
            first.thread.updatedAt,
        )


# --- the request context ------


async def test_request_context_last_messages_overrides_the_processor() -> None:
    """memoryConfig.lastMessages in the request context wins over the constructor's value for that turn."""
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg(f"m{i}", t=i) for i in range(10)])
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE)
    await MessageHistory(storage=storage, last_messages=2).process_input(
        messages=[], message_list=message_list, abort=abort, request_context=memory_context(lastMessages=5)
    )
    assert [m.id for m in message_list.get_remembered()] == ["m5", "m6", "m7", "m8", "m9"]


async def test_thread_falls_back_to_the_message_list() -> None:
    """Without a MastraMemory entry the list's own thread and resource are used (Mastra 1.71)."""
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg("u1", t=1)])
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE)
    await MessageHistory(storage=storage).process_input(messages=[], message_list=message_list, abort=abort)
    assert [m.id for m in message_list.get_remembered()] == ["u1"]


async def test_request_context_thread_wins_over_the_list() -> None:
    """The request context's thread is used even when the list names another thread."""
    storage = InMemoryHistoryStorage()
    await seed(storage, [msg("u1", t=1)])
    message_list = MessageList()
    await MessageHistory(storage=storage).process_input(
        messages=[], message_list=message_list, abort=abort, request_context=memory_context()
    )
    assert [m.id for m in message_list.get_remembered()] == ["u1"]


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("t1", "MastraMemory"),
        ({"thread": "t1"}, "MastraMemory.thread"),
        ({"thread": {"id": 7}}, "MastraMemory.thread.id"),
        ({"thread": {"id": "t1"}, "resourceId": 3}, "MastraMemory.resourceId"),
        ({"thread": {"id": "t1"}, "memoryConfig": []}, "MastraMemory.memoryConfig"),
        ({"thread": {"id": "t1"}, "memoryConfig": {"readOnly": "yes"}}, "MastraMemory.memoryConfig.readOnly"),
        (
            {"thread": {"id": "t1"}, "memoryConfig": {"lastMessages": -2}},
            "MastraMemory.memoryConfig.lastMessages",
        ),
        (
            {"thread": {"id": "t1"}, "memoryConfig": {"lastMessages": True}},
            "MastraMemory.memoryConfig.lastMessages",
        ),
    ],
    ids=[
        "not-an-object",
        "thread-not-an-object",
        "thread-id-not-a-string",
        "resource-not-a-string",
        "config-not-an-object",
        "read-only-not-a-bool",
        "negative-last-messages",
        "last-messages-true",
    ],
)
async def test_invalid_memory_context_is_a_typed_error(value: object, path: str) -> None:
    """An invalid MastraMemory entry raises EventValidationError naming the field, before any storage call."""
    counting = CountingStorage(InMemoryHistoryStorage())
    with pytest.raises(EventValidationError) as raised:
        await MessageHistory(storage=counting).process_input(
            messages=[],
            message_list=MessageList(),
            abort=abort,
            request_context=RequestContext({MASTRA_MEMORY: value}),
        )
    assert raised.value.path == path
    assert sum(counting.calls.values()) == 0


async def test_output_result_object_carries_finish_reason() -> None:
    """An OutputResult with finishReason 'error' and no response skips the save like the mapping form."""
    storage = InMemoryHistoryStorage()
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE).add(msg("u1", t=1), "input")
    await MessageHistory(storage=storage).process_output_result(
        messages=[],
        message_list=message_list,
        abort=abort,
        request_context=memory_context(),
        result=OutputResult(finishReason="error"),
    )
    assert await storage.get_thread(THREAD) is None


async def test_context_messages_are_never_saved() -> None:
    """Messages added with source 'context' are part of the prompt but not of the saved turn."""
    storage = InMemoryHistoryStorage()
    message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE)
    message_list.add(msg("ctx", t=0), "context").add(msg("u1", t=1), "input").add(
        msg("a1", "assistant", t=2), "response"
    )
    await MessageHistory(storage=storage).process_output_result(
        messages=[], message_list=message_list, abort=abort, request_context=memory_context()
    )
    stored = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert sorted(m.id or "" for m in stored) == ["a1", "u1"]


async def test_two_turns_round_trip() -> None:
    """A second turn recalls the first turn's saved messages as memory and saves only its own."""
    storage = InMemoryHistoryStorage()
    history = MessageHistory(storage=storage, last_messages=10)
    for n in (1, 2):
        message_list = MessageList(thread_id=THREAD, resource_id=RESOURCE)
        message_list.add(msg(f"u{n}", t=10 * n), "input")
        await history.process_input(
            messages=[], message_list=message_list, abort=abort, request_context=memory_context()
        )
        message_list.add(msg(f"a{n}", "assistant", t=10 * n + 1), "response")
        counting = CountingStorage(storage)
        await MessageHistory(storage=counting).process_output_result(
            messages=[], message_list=message_list, abort=abort, request_context=memory_context()
        )
        assert counting.calls["save_messages"] == 1
    assert [m.id for m in message_list.get_remembered()] == ["u1", "a1"]
    assert [m.id for m in message_list.get_all()] == ["u1", "a1", "u2", "a2"]
    stored = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert [m.id for m in stored] == ["a2", "u2", "a1", "u1"]


# --- derived ids another thread holds (the library, as the persist path) -------------------------------


@pytest.mark.parametrize("case", TAKEN_CASES, ids=[c.id for c in TAKEN_CASES])
async def test_a_derived_id_another_thread_holds_yields_to_its_alternate(
    history_storage: HistoryStorage, case: TakenCase
) -> None:
    """Given the deployment's keys and the turn's request id, `persist_turn` saves a derived id of the turn
    that another thread holds under its alternate (as the persist path); a client's own id, an id derived for
    another turn, or a library given no keys (or no request id) is refused as before (`MessageIdTakenError`),
    nothing written. The other thread's row is never touched."""
    await run_taken_case(history_storage, case)
