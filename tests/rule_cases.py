"""The MessageHistory rule tables (docs/rules.md#r1-to-r12), as data plus runners, over any `HistoryStorage`.

`RECALL_CASES` and `PERSIST_CASES` describe a stored thread, a turn, and what must come out. The `run_*`
coroutines play one case against a storage through `MessageHistory`: directly (`recall` / `persist_turn`, the
Kafka paths' entry points) and through the Mastra-shaped steps (`process_input` / `process_output_result`
with a `MessageList` and a `RequestContext`). A storage test module parametrizes the cases and supplies its
storage; tests/unit/test_processor.py does it with the in-memory storage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.core.budget import Boundary, HistoryLoader, TokenBudget, page_of
from message_history.core.message_list import MessageList
from message_history.core.request_context import MASTRA_MEMORY, RequestContext
from message_history.core.rules import LastMessages, SkipReason, Source
from message_history.core.tokens import count_message
from message_history.errors import MessageHistoryError, MessageIdTakenError, ThreadOwnershipError
from message_history.processor import USE_DEFAULT, MessageHistory
from schemas.ids import alternate_message_id, derived_message_id
from schemas.messages import Message, TextPart, ToolInvocationPart
from storage.protocol import HistoryStorage, Page, PageQuery, Thread

T0 = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
THREAD = "t1"
RESOURCE = "r1"


# --- building messages ------


def at(ms: int) -> datetime:
    """T0 plus `ms` milliseconds."""
    return T0 + timedelta(milliseconds=ms)


def tool(name: str, state: str, call_id: str = "call-1") -> dict[str, Any]:
    """A tool-invocation part (with a result when the state is 'result')."""
    invocation: dict[str, Any] = {"state": state, "toolCallId": call_id, "toolName": name, "args": {"q": 1}}
    if state == "result":
        invocation["result"] = {"ok": True}
    return {"type": "tool-invocation", "toolInvocation": invocation}


def msg(
    id: str,
    role: str = "user",
    *,
    t: int,
    text: str | None = None,
    parts: list[dict[str, Any]] | None = None,
    content_text: str | None = None,
    thread: str | None = THREAD,
    resource: str | None = RESOURCE,
    content_extra: dict[str, Any] | None = None,
    **extra: Any,
) -> Message:
    """A format-2 message created `t` ms after T0; `text` makes a single text part (and `content`)."""
    if parts is None:
        parts = [{"type": "text", "text": text if text is not None else f"{role} {id}"}]
    content: dict[str, Any] = {"format": 2, "parts": parts}
    if content_text is not None:
        content["content"] = content_text
    elif text is not None:
        content["content"] = text
    content.update(content_extra or {})
    data: dict[str, Any] = {"id": id, "role": role, "createdAt": at(t), "content": content, **extra}
    if thread is not None:
        data["threadId"] = thread
    if resource is not None:
        data["resourceId"] = resource
    return Message.model_validate(data)


TRANSIENT_SIGNAL = {"signal": {"type": "notification", "tagName": "notification", "transient": True}}
"""`content.metadata` of a transient signal (Mastra 1.71's `createSignal({..., transient: true})`)."""


def signal_msg(id: str, *, t: int, transient: bool = True) -> Message:
    """A `signal` message, transient unless told otherwise (then it carries the signal without the flag)."""
    signal = dict(TRANSIENT_SIGNAL["signal"])
    if not transient:
        del signal["transient"]
    return msg(id, "signal", t=t, content_extra={"metadata": {"signal": signal}})


def summarize(message: Message) -> list[str]:
    """A message's parts as short strings: `text:<text>`, `tool:<state>:<name>`, or the part type."""
    out: list[str] = []
    for part in message.content.parts:
        if isinstance(part, TextPart):
            out.append(f"text:{part.text}")
        elif isinstance(part, ToolInvocationPart):
            out.append(f"tool:{part.toolInvocation.state}:{part.toolInvocation.toolName}")
        else:
            out.append(part.type)
    return out


# --- a storage that counts calls ------


class CountingStorage(HistoryStorage):
    """Delegates to a `HistoryStorage` and counts calls per method (to check the one-round-trip rules)."""

    def __init__(self, inner: HistoryStorage) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    async def get_thread(self, thread_id: str) -> Thread | None:
        self.calls["get_thread"] += 1
        return await self.inner.get_thread(thread_id)

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        self.calls["list_messages"] += 1
        return await self.inner.list_messages(thread_id, resource_id=resource_id, limit=limit)

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        self.calls["save_messages"] += 1
        return await self.inner.save_messages(thread_id=thread_id, resource_id=resource_id, messages=messages)

    async def list_page(self, query: PageQuery) -> Page:
        self.calls["list_page"] += 1
        return await self.inner.list_page(query)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        self.calls["save_thread_metadata"] += 1
        await self.inner.save_thread_metadata(thread_id, update)

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        self.calls["get_messages"] += 1
        return await self.inner.get_messages(message_ids, thread_ids=thread_ids)


async def seed(storage: HistoryStorage, messages: Sequence[Message], *, owner: str = RESOURCE) -> None:
    """Store `messages` (grouped by thread, in one save per thread) as a Mastra app would have."""
    by_thread: dict[str, list[Message]] = {}
    for message in messages:
        by_thread.setdefault(message.threadId or THREAD, []).append(message)
    for thread_id, rows in by_thread.items():
        await storage.save_messages(thread_id=thread_id, resource_id=owner, messages=rows)


def memory_context(
    *, thread: str | None = THREAD, resource: str | None = RESOURCE, **config: Any
) -> RequestContext:
    """A request context carrying `MastraMemory` as Mastra's Agent fills it in."""
    value: dict[str, Any] = {}
    if thread is not None:
        value["thread"] = {"id": thread}
    if resource is not None:
        value["resourceId"] = resource
    if config:
        value["memoryConfig"] = config
    return RequestContext({MASTRA_MEMORY: value})


# --- recall ------


def _thread_of(n: int, *, start: int = 0) -> list[Message]:
    """`n` alternating user/assistant messages, 1 ms apart."""
    return [msg(f"m{i:05d}", "user" if i % 2 == 0 else "assistant", t=start + i) for i in range(n)]


@dataclass(frozen=True)
class RecallCase:
    """A stored thread, an incoming turn, and the context the model must see (`(id, source)` in order)."""

    id: str
    stored: list[Message]
    incoming: list[Message]
    expected: list[tuple[str, Source]]
    last_messages: LastMessages | object = USE_DEFAULT  # the per-turn value; USE_DEFAULT = processor's
    processor_last_messages: LastMessages = None
    thread: str | None = THREAD
    resource: str | None = RESOURCE
    owner: str = RESOURCE
    expected_limit: int | None = 40
    list_calls: int = 1
    texts: dict[str, str] = field(default_factory=dict)  # id -> expected first text part
    error: type[MessageHistoryError] | None = None


_FORTY_FIVE = _thread_of(45)
_TWO_THOUSAND = _thread_of(2000)

RECALL_CASES: list[RecallCase] = [
    RecallCase(
        id="history-oldest-first-then-input",
        stored=[msg("u1", t=1), msg("a1", "assistant", t=2), msg("u2", t=3), msg("a2", "assistant", t=4)],
        incoming=[msg("u3", t=5)],
        expected=[("u1", "memory"), ("a1", "memory"), ("u2", "memory"), ("a2", "memory"), ("u3", "input")],
    ),
    RecallCase(
        id="last-messages-unset-means-40",
        stored=_FORTY_FIVE,
        incoming=[msg("new", t=100)],
        expected=[*((m.id or "", "memory") for m in _FORTY_FIVE[5:]), ("new", "input")],
    ),
    RecallCase(
        id="last-messages-0-recalls-nothing-and-does-not-query",
        stored=_FORTY_FIVE,
        incoming=[msg("new", t=100)],
        last_messages=0,
        expected=[("new", "input")],
        expected_limit=0,
        list_calls=0,
    ),
    RecallCase(
        id="last-messages-false-recalls-everything",
        stored=_FORTY_FIVE,
        incoming=[msg("new", t=100)],
        last_messages=False,
        expected=[*((m.id or "", "memory") for m in _FORTY_FIVE), ("new", "input")],
        expected_limit=None,
    ),
    RecallCase(
        id="last-messages-n-takes-the-newest-n",
        stored=_FORTY_FIVE,
        incoming=[msg("new", t=100)],
        last_messages=3,
        expected=[("m00042", "memory"), ("m00043", "memory"), ("m00044", "memory"), ("new", "input")],
        expected_limit=3,
    ),
    RecallCase(
        id="processor-last-messages-used-when-the-turn-sets-none",
        stored=_FORTY_FIVE,
        incoming=[],
        processor_last_messages=2,
        expected=[("m00043", "memory"), ("m00044", "memory")],
        expected_limit=2,
    ),
    RecallCase(
        id="turn-last-messages-null-means-40-over-the-processor-value",
        stored=_FORTY_FIVE,
        incoming=[],
        processor_last_messages=2,
        last_messages=None,
        expected=[(m.id or "", "memory") for m in _FORTY_FIVE[5:]],
    ),
    RecallCase(
        id="createdAt-ties-page-and-order-by-id",
        stored=[msg("b", t=7), msg("c", "assistant", t=7), msg("a", t=7), msg("old", t=1)],
        incoming=[],
        last_messages=2,
        expected=[("b", "memory"), ("c", "memory")],
        expected_limit=2,
    ),
    RecallCase(
        id="incoming-tied-with-history-ordered-by-id",
        stored=[msg("b", t=7), msg("d", "assistant", t=7)],
        incoming=[msg("c", t=7), msg("a", t=7)],
        expected=[("a", "input"), ("b", "memory"), ("c", "input"), ("d", "memory")],
    ),
    RecallCase(
        id="incoming-older-than-history-sorted-by-createdAt",
        stored=[msg("u1", t=10), msg("a1", "assistant", t=20)],
        incoming=[msg("early", t=15)],
        expected=[("u1", "memory"), ("early", "input"), ("a1", "memory")],
    ),
    RecallCase(
        id="system-rows-in-storage-never-recalled",
        stored=[msg("u1", t=1), msg("s1", "system", t=2), msg("a1", "assistant", t=3)],
        incoming=[msg("u2", t=4)],
        expected=[("u1", "memory"), ("a1", "memory"), ("u2", "input")],
    ),
    RecallCase(
        id="system-rows-count-toward-the-page-then-are-dropped",
        stored=[msg("u1", t=1), msg("s1", "system", t=2), msg("a1", "assistant", t=3)],
        incoming=[],
        last_messages=2,
        expected=[("a1", "memory")],
        expected_limit=2,
    ),
    RecallCase(
        id="stored-transient-signal-recalled-under-a-count-cap-as-mastra",
        stored=[msg("u1", t=1), signal_msg("s1", t=2), msg("a1", "assistant", t=3)],
        incoming=[msg("u2", t=4)],
        expected=[("u1", "memory"), ("s1", "memory"), ("a1", "memory"), ("u2", "input")],
    ),
    RecallCase(
        id="incoming-transient-signal-stays-in-the-context",
        stored=[msg("u1", t=1)],
        incoming=[msg("u2", t=2), signal_msg("s2", t=3)],
        expected=[("u1", "memory"), ("u2", "input"), ("s2", "input")],
    ),
    RecallCase(
        id="incoming-system-message-kept-as-input",
        stored=[msg("u1", t=1)],
        incoming=[msg("sys", "system", t=0, text="Be brief."), msg("u2", t=2)],
        expected=[("sys", "input"), ("u1", "memory"), ("u2", "input")],
    ),
    RecallCase(
        id="duplicate-id-incoming-copy-wins",
        stored=[msg("u1", t=1, text="stored text"), msg("a1", "assistant", t=2)],
        incoming=[msg("u1", t=1, text="edited text")],
        expected=[("u1", "input"), ("a1", "memory")],
        texts={"u1": "edited text"},
    ),
    RecallCase(
        id="messages-of-another-resource-in-the-thread-filtered-out",
        stored=[msg("u1", t=1), msg("x1", t=2, resource="r2"), msg("a1", "assistant", t=3)],
        incoming=[],
        expected=[("u1", "memory"), ("a1", "memory")],
    ),
    RecallCase(
        id="empty-thread-recalls-nothing",
        stored=[],
        incoming=[msg("u1", t=1)],
        expected=[("u1", "input")],
    ),
    RecallCase(
        id="no-thread-no-storage-call",
        stored=[msg("u1", t=1)],
        incoming=[msg("u2", t=2, thread=None)],
        thread=None,
        expected=[("u2", "input")],
        list_calls=0,
    ),
    RecallCase(
        id="thread-of-another-resource-refused",
        stored=[msg("u1", t=1, resource="r2")],
        incoming=[msg("u2", t=2)],
        owner="r2",
        expected=[],
        list_calls=0,
        error=ThreadOwnershipError,
    ),
    RecallCase(
        id="2000-message-thread-recall-all",
        stored=_TWO_THOUSAND,
        incoming=[msg("new", t=5000)],
        last_messages=False,
        expected=[*((m.id or "", "memory") for m in _TWO_THOUSAND), ("new", "input")],
        expected_limit=None,
    ),
    RecallCase(
        id="2000-message-thread-recall-default-40",
        stored=_TWO_THOUSAND,
        incoming=[msg("new", t=5000)],
        expected=[*((m.id or "", "memory") for m in _TWO_THOUSAND[-40:]), ("new", "input")],
    ),
]


async def run_recall_case(storage: HistoryStorage, case: RecallCase) -> None:
    """`MessageHistory.recall` yields the case's context with one thread read and at most one page read."""
    await seed(storage, case.stored, owner=case.owner)
    counting = CountingStorage(storage)
    history = MessageHistory(storage=counting, last_messages=case.processor_last_messages)
    call = history.recall(
        thread_id=case.thread,
        resource_id=case.resource,
        incoming=case.incoming,
        last_messages=case.last_messages,  # type: ignore[arg-type]  # USE_DEFAULT or a LastMessages value
    )
    if case.error is not None:
        with pytest.raises(case.error):
            await call
        assert counting.calls["list_messages"] == 0
        return
    outcome = await call
    assert [(m.id, source) for m, source in outcome.context] == case.expected
    assert outcome.recalled == sum(1 for _, source in case.expected if source == "memory")
    assert outcome.limit == case.expected_limit
    assert counting.calls["list_messages"] == case.list_calls
    assert counting.calls["get_thread"] == (1 if case.thread else 0)
    assert counting.calls["save_messages"] == 0
    by_id = {m.id: m for m, _ in outcome.context}
    for message_id, text in case.texts.items():
        assert summarize(by_id[message_id])[0] == f"text:{text}"


async def run_process_input_case(storage: HistoryStorage, case: RecallCase) -> None:
    """`process_input` adds the same recalled messages to a `MessageList`, tagged `memory`, in order."""
    await seed(storage, case.stored, owner=case.owner)
    history = MessageHistory(storage=storage, last_messages=case.processor_last_messages)
    message_list = MessageList(thread_id=case.thread, resource_id=case.resource)
    message_list.add(case.incoming, "input")
    config: dict[str, Any] = {}
    if case.last_messages is not USE_DEFAULT:
        config["lastMessages"] = case.last_messages
    context = memory_context(thread=case.thread, resource=case.resource, **config) if case.thread else None
    call = history.process_input(
        messages=message_list.get_input(), message_list=message_list, request_context=context
    )
    if case.error is not None:
        with pytest.raises(case.error):
            await call
        assert message_list.get_remembered() == []
        return
    returned = await call
    assert returned is message_list
    system_ids = {m.id for m in message_list.get_system()}
    expected = [(mid, source) for mid, source in case.expected if mid not in system_ids]
    got = [(m.id, "+".join(sorted(message_list.get_sources(m.id or "")))) for m in message_list.get_all()]
    assert got == expected
    for message_id, text in case.texts.items():
        found = message_list.get(message_id)
        assert found is not None
        assert summarize(found)[0] == f"text:{text}"


# --- persistence ------


@dataclass(frozen=True)
class PersistCase:
    """A finished turn and what storage must hold afterwards."""

    id: str
    input: list[Message]
    response: list[Message]
    saved: list[str]
    skipped: SkipReason | None = None
    finish_reason: str | None = None
    read_only: bool = False
    thread: str | None = THREAD
    parts: dict[str, list[str]] = field(default_factory=dict)  # id -> summarize() of the stored message
    content_text: dict[str, str | None] = field(default_factory=dict)  # id -> stored content.content
    legacy_tool_names: dict[str, list[str]] = field(
        default_factory=dict
    )  # id -> content.toolInvocations names


_WM = "<working_memory># User\n- name: Ada</working_memory>"

PERSIST_CASES: list[PersistCase] = [
    PersistCase(
        id="input-then-response-saved",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2)],
        saved=["u1", "a1"],
    ),
    PersistCase(
        id="system-messages-never-saved",
        input=[msg("s0", "system", t=0, text="You are terse."), msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2)],
        saved=["u1", "a1"],
    ),
    PersistCase(
        id="transient-signals-never-saved-from-input-or-response",
        input=[msg("u1", t=1), signal_msg("si", t=2), signal_msg("sk", t=3, transient=False)],
        response=[signal_msg("sr", t=4), msg("a1", "assistant", t=5)],
        saved=["u1", "sk", "a1"],
    ),
    PersistCase(
        id="response-of-only-a-transient-signal-nothing-to-save",
        input=[],
        response=[signal_msg("sr", t=4)],
        saved=[],
        skipped="nothing-to-save",
    ),
    PersistCase(
        id="failed-turn-whose-response-is-only-a-transient-signal-saves-the-input",
        input=[msg("u1", t=1)],
        response=[signal_msg("sr", t=4)],
        finish_reason="error",
        saved=["u1"],
    ),
    PersistCase(
        id="memory-sourced-input-never-resaved",
        input=[msg("old", t=1, source="memory"), msg("u2", t=3, source="input")],
        response=[msg("a2", "assistant", t=4)],
        saved=["u2", "a2"],
    ),
    PersistCase(
        id="only-memory-sourced-input-nothing-to-save",
        input=[msg("old", t=1, source="memory")],
        response=[],
        saved=[],
        skipped="nothing-to-save",
    ),
    PersistCase(
        id="read-only-writes-nothing",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2)],
        read_only=True,
        saved=[],
        skipped="read-only",
    ),
    PersistCase(
        id="no-thread-writes-nothing",
        input=[msg("u1", t=1, thread=None)],
        response=[msg("a1", "assistant", t=2, thread=None)],
        thread=None,
        saved=[],
        skipped="no-thread",
    ),
    PersistCase(
        id="failed-turn-without-response-skipped",
        input=[msg("u1", t=1)],
        response=[],
        finish_reason="error",
        saved=[],
        skipped="failed-turn",
    ),
    PersistCase(
        id="failed-turn-with-response-saved",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, text="Partial answer")],
        finish_reason="error",
        saved=["u1", "a1"],
    ),
    PersistCase(
        id="failed-turn-whose-response-is-only-a-partial-call-saves-the-input",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, parts=[tool("search", "partial-call")])],
        finish_reason="error",
        saved=["u1"],
    ),
    PersistCase(
        id="input-without-response-saved-when-not-failed",
        input=[msg("u1", t=1)],
        response=[],
        finish_reason="stop",
        saved=["u1"],
    ),
    PersistCase(
        id="partial-call-parts-removed",
        input=[msg("u1", t=1)],
        response=[
            msg(
                "a1",
                "assistant",
                t=2,
                parts=[
                    {"type": "step-start"},
                    tool("search", "partial-call"),
                    {"type": "text", "text": "Wait"},
                ],
            )
        ],
        saved=["u1", "a1"],
        parts={"a1": ["step-start", "text:Wait"]},
    ),
    PersistCase(
        id="message-left-empty-dropped",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, parts=[tool("search", "partial-call")])],
        saved=["u1"],
    ),
    PersistCase(
        id="client-side-tool-call-in-state-call-kept",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, parts=[tool("askUser", "call")])],
        saved=["u1", "a1"],
        parts={"a1": ["tool:call:askUser"]},
    ),
    PersistCase(
        id="completed-tool-result-kept",
        input=[msg("u1", t=1)],
        response=[
            msg("a1", "assistant", t=2, parts=[tool("search", "result"), {"type": "text", "text": "3"}])
        ],
        saved=["u1", "a1"],
        parts={"a1": ["tool:result:search", "text:3"]},
    ),
    PersistCase(
        id="update-working-memory-calls-removed",
        input=[msg("u1", t=1)],
        response=[
            msg(
                "a1",
                "assistant",
                t=2,
                parts=[tool("updateWorkingMemory", "result"), {"type": "text", "text": "Noted."}],
            )
        ],
        saved=["u1", "a1"],
        parts={"a1": ["text:Noted."]},
    ),
    PersistCase(
        id="message-with-only-update-working-memory-dropped-nothing-to-save",
        input=[],
        response=[msg("a1", "assistant", t=2, parts=[tool("updateWorkingMemory", "call")])],
        saved=[],
        skipped="nothing-to-save",
    ),
    PersistCase(
        id="legacy-tool-invocations-array-left-as-upstream",
        input=[],
        response=[
            msg(
                "a1",
                "assistant",
                t=2,
                text="Noted.",
                content_extra={
                    "toolInvocations": [
                        {"state": "result", "toolCallId": "c1", "toolName": "updateWorkingMemory"}
                    ]
                },
            )
        ],
        saved=["a1"],
        legacy_tool_names={"a1": ["updateWorkingMemory"]},
    ),
    PersistCase(
        id="working-memory-block-stripped-and-trimmed",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, text=f"Hello {_WM} there ")],
        saved=["u1", "a1"],
        parts={"a1": ["text:Hello  there"]},
        content_text={"a1": "Hello  there"},
    ),
    PersistCase(
        id="several-working-memory-blocks-stripped",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, text=f"{_WM}A{_WM}B{_WM}")],
        saved=["u1", "a1"],
        parts={"a1": ["text:AB"]},
    ),
    PersistCase(
        id="unclosed-working-memory-tag-left-untouched",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, text=" Hi <working_memory>never closed ")],
        saved=["u1", "a1"],
        parts={"a1": ["text: Hi <working_memory>never closed "]},
        content_text={"a1": " Hi <working_memory>never closed "},
    ),
    PersistCase(
        id="closed-block-removed-before-an-unclosed-tag",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, text=f" A{_WM} <working_memory>rest ")],
        saved=["u1", "a1"],
        parts={"a1": ["text:A <working_memory>rest"]},
    ),
    PersistCase(
        id="text-without-working-memory-not-trimmed",
        input=[msg("u1", t=1, text="  padded  ")],
        response=[msg("a1", "assistant", t=2, text=" access")],
        saved=["u1", "a1"],
        parts={"u1": ["text:  padded  "], "a1": ["text: access"]},
        content_text={"u1": "  padded  ", "a1": " access"},
    ),
    PersistCase(
        id="text-emptied-by-stripping-is-kept-as-an-empty-part",
        input=[msg("u1", t=1)],
        response=[msg("a1", "assistant", t=2, text=_WM)],
        saved=["u1", "a1"],
        parts={"a1": ["text:"]},
        content_text={"a1": ""},
    ),
    PersistCase(
        id="nothing-at-all-nothing-to-save",
        input=[],
        response=[],
        saved=[],
        skipped="nothing-to-save",
    ),
]


# --- docs/rules.md#r11: a response folded into the latest assistant message (Mastra's `MessageMerger`) ---


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


_STEP: dict[str, Any] = {"type": "step-start"}


@dataclass(frozen=True)
class ContinueCase:
    """The latest stored assistant message's parts, a new-id response's parts, and the parts Mastra 1.71 gives
    the merged message (checked against Mastra's own `processOutputResult` in tests/interop)."""

    id: str
    latest: list[dict[str, Any]]
    response: list[dict[str, Any]]
    merged: list[dict[str, Any]]
    same_id: bool = False  # the response carries the stored message's id (`merge_response`)


CONTINUE_CASES: list[ContinueCase] = [
    ContinueCase(
        id="text-after-a-tool-part-opens-a-step",
        latest=[_text("Asking."), tool("ask", "result", "c1")],
        response=[_text("Here it is.")],
        merged=[_text("Asking."), tool("ask", "result", "c1"), _STEP, _text("Here it is.")],
    ),
    ContinueCase(
        id="text-after-text-adds-no-step-start",
        latest=[_text("Let me look.")],
        response=[_text("Found it.")],
        merged=[_text("Let me look."), _text("Found it.")],
    ),
    ContinueCase(
        id="a-new-call-adds-no-step-start",
        latest=[_text("Checking.")],
        response=[tool("search", "call", "c2")],
        merged=[_text("Checking."), tool("search", "call", "c2")],
    ),
    ContinueCase(
        id="a-result-advances-its-call-and-the-text-after-it-opens-a-step",
        latest=[_text("Let me ask."), tool("ask", "call", "c1")],
        response=[tool("ask", "result", "c1"), _text("Thanks.")],
        merged=[_text("Let me ask."), tool("ask", "result", "c1"), _STEP, _text("Thanks.")],
    ),
    ContinueCase(
        id="the-response-own-step-start-is-kept",
        latest=[_text("OK.")],
        response=[_STEP, _text("More.")],
        merged=[_text("OK."), _STEP, _text("More.")],
    ),
    ContinueCase(
        id="a-part-the-message-already-holds-is-not-added-again",
        latest=[_text("Same.")],
        response=[_text("Same.")],
        merged=[_text("Same.")],
    ),
    ContinueCase(
        id="a-step-start-the-message-already-holds-as-often-is-dropped",
        latest=[_text("A."), tool("f", "result", "c1"), _STEP, _text("B.")],
        response=[_STEP, _text("C.")],
        merged=[_text("A."), tool("f", "result", "c1"), _STEP, _text("B."), _text("C.")],
    ),
    ContinueCase(
        id="the-synthesized-step-start-names-the-last-step-model",
        latest=[_STEP | {"model": "m1"}, _text("A."), tool("f", "result", "c1")],
        response=[_text("B.")],
        merged=[
            _STEP | {"model": "m1"},
            _text("A."),
            tool("f", "result", "c1"),
            _STEP | {"model": "m1"},
            _text("B."),
        ],
    ),
    ContinueCase(
        id="parts-go-next-to-the-call-they-follow",
        latest=[_text("Calling."), tool("f", "call", "c1"), tool("g", "call", "c2")],
        response=[_text("Meanwhile."), tool("f", "result", "c1"), _text("After f.")],
        merged=[
            _STEP,
            _text("Meanwhile."),
            _text("Calling."),
            tool("f", "result", "c1"),
            _STEP,
            _text("After f."),
            tool("g", "call", "c2"),
        ],
    ),
    ContinueCase(
        id="same-id-text-after-the-calls-opens-a-step",
        latest=[tool("f", "call", "c1"), tool("g", "result", "c2")],
        response=[tool("f", "result", "c1"), tool("g", "call", "c2"), _text("Done.")],
        merged=[tool("f", "result", "c1"), tool("g", "result", "c2"), _STEP, _text("Done.")],
        same_id=True,
    ),
    ContinueCase(
        id="same-id-text-before-the-calls-goes-first-in-a-step",
        latest=[tool("f", "call", "c1"), tool("g", "result", "c2")],
        response=[_text("Done."), tool("f", "result", "c1"), tool("g", "call", "c2")],
        merged=[_STEP, _text("Done."), tool("f", "result", "c1"), tool("g", "result", "c2")],
        same_id=True,
    ),
    ContinueCase(
        id="same-id-text-after-text-adds-no-step-start",
        latest=[_text("A.")],
        response=[_text("B.")],
        merged=[_text("A."), _text("B.")],
        same_id=True,
    ),
]


async def run_persist_case(storage: HistoryStorage, case: PersistCase) -> None:
    """`persist_turn` saves exactly the case's messages, in one write, filtered by the rules."""
    counting = CountingStorage(storage)
    history = MessageHistory(storage=counting)
    outcome = await history.persist_turn(
        thread_id=case.thread,
        resource_id=RESOURCE,
        input=case.input,
        response=case.response,
        finish_reason=case.finish_reason,
        read_only=case.read_only,
    )
    assert outcome.skipped == case.skipped
    assert outcome.saved_ids == case.saved
    assert counting.calls["save_messages"] == (0 if case.skipped else 1)
    # No history read, but the tool-state merge's (one lookup by id, and the newest row when the turn
    # brings no new user message: it may continue the thread's latest assistant message).
    writes_user = any(m.role == "user" and m.id in case.saved for m in case.input)
    assert counting.calls["get_messages"] == (0 if case.skipped else 1)
    assert counting.calls["list_messages"] == (0 if case.skipped or writes_user else 1)
    await check_stored(storage, case)
    if case.skipped is None:
        assert outcome.thread is not None
        assert outcome.thread.id == THREAD
        assert outcome.thread.resourceId == RESOURCE


async def run_process_output_case(storage: HistoryStorage, case: PersistCase) -> None:
    """`process_output_result` over a `MessageList` saves the same messages as `persist_turn`."""
    message_list = MessageList(thread_id=case.thread, resource_id=RESOURCE if case.thread else None)
    for message in case.input:
        extra = message.model_extra or {}
        message_list.add(message, "memory" if extra.get("source") == "memory" else "input")
    message_list.add(case.response, "response")
    context = memory_context(readOnly=case.read_only) if case.thread else None
    history = MessageHistory(storage=storage)
    result = {"finishReason": case.finish_reason} if case.finish_reason else None
    returned = await history.process_output_result(
        messages=message_list.get_all(), message_list=message_list, request_context=context, result=result
    )
    assert returned is message_list
    await check_stored(storage, case)


async def check_stored(storage: HistoryStorage, case: PersistCase) -> None:
    """Storage holds exactly the case's saved messages, with the expected parts and texts."""
    if case.thread is None:
        return
    stored = await storage.list_messages(THREAD, resource_id=None, limit=None)
    assert sorted(m.id or "" for m in stored) == sorted(case.saved)
    if not case.saved:
        assert await storage.get_thread(THREAD) is None
    by_id = {m.id: m for m in stored}
    for message_id, expected_parts in case.parts.items():
        assert summarize(by_id[message_id]) == expected_parts
    for message_id, text in case.content_text.items():
        assert by_id[message_id].content.content == text
    for message_id, names in case.legacy_tool_names.items():
        legacy = by_id[message_id].content.toolInvocations or []
        assert [entry["toolName"] for entry in legacy] == names
    for message in stored:
        assert message.role != "system"
        assert "source" not in (message.model_extra or {})
        assert message.threadId == THREAD
        assert message.resourceId == RESOURCE


# --- token-limited loading over rows in memory ------


def load_all(
    rows_newest_first: Sequence[Message],
    *,
    boundary: Boundary | None,
    max_messages: int | None,
    budget: TokenBudget | None,
    count: Callable[[Message], float] | None = None,
    max_rows: int | None = None,
) -> tuple[list[Message], int]:
    """Run a `HistoryLoader` over rows held in memory, page by page as a storage would answer it:
    (its result, pages fetched). `count` defaults to the loader's own (Mastra's counter)."""
    loader = HistoryLoader(
        boundary=boundary,
        max_messages=max_messages,
        budget=budget,
        count=count or count_message,
        max_rows=max_rows,
    )
    ordered = sorted(rows_newest_first, key=lambda m: (m.createdAt, m.id or ""), reverse=True)
    request = loader.next_page
    while request is not None:
        rows, has_more = page_of(ordered, request)
        request = loader.feed(rows, has_more=has_more)
    return loader.result(), loader.pages


# --- derived ids another thread holds (the library given the deployment's keys) ---------------------------

KEY, OLD_KEY = b"k" * 32, b"o" * 32
REQUEST = "req-1"
D_IN = derived_message_id(RESOURCE, THREAD, REQUEST, "input", 0)
D_OUT = derived_message_id(RESOURCE, THREAD, REQUEST, "response", 0)
OTHER_REQUEST = derived_message_id(RESOURCE, THREAD, "req-2", "response", 0)  # derived, not for this turn


@dataclass(frozen=True)
class TakenCase:
    id: str
    taken: tuple[str, ...]  # ids another thread (another tenant's) holds first
    keys: tuple[bytes, ...]
    request_id: str | None
    saved: tuple[str, ...] | type[MessageIdTakenError]  # the ids the turn is saved under, or its refusal
    own: tuple[str, ...] = ()  # ids already in the turn's own thread
    response_id: str = D_OUT  # the id of the turn's response message


TAKEN_CASES = [
    TakenCase("no keys: refused as before", (D_OUT,), (), REQUEST, MessageIdTakenError),
    TakenCase("no request id: refused as before", (D_OUT,), (KEY,), None, MessageIdTakenError),
    TakenCase(
        "a client's own id: refused",
        ("client-a",),
        (KEY,),
        REQUEST,
        MessageIdTakenError,
        response_id="client-a",
    ),
    TakenCase(
        "derived for another turn: refused",
        (OTHER_REQUEST,),
        (KEY,),
        REQUEST,
        MessageIdTakenError,
        response_id=OTHER_REQUEST,
    ),
    TakenCase("nothing taken: ids as given", (), (KEY,), REQUEST, (D_IN, D_OUT)),
    TakenCase(
        "response id taken: its alternate",
        (D_OUT,),
        (KEY,),
        REQUEST,
        (D_IN, alternate_message_id(KEY, D_OUT)),
    ),
    TakenCase(
        "both taken: both alternates",
        (D_IN, D_OUT),
        (KEY,),
        REQUEST,
        (alternate_message_id(KEY, D_IN), alternate_message_id(KEY, D_OUT)),
    ),
    TakenCase(
        "after a rotation: the previous key's alternate in this thread is kept",
        (D_OUT,),
        (KEY, OLD_KEY),
        REQUEST,
        (D_IN, alternate_message_id(OLD_KEY, D_OUT)),
        own=(alternate_message_id(OLD_KEY, D_OUT),),
    ),
    TakenCase(
        "after a rotation, nothing stored under the previous key: the current key's",
        (D_OUT,),
        (KEY, OLD_KEY),
        REQUEST,
        (D_IN, alternate_message_id(KEY, D_OUT)),
    ),
]


async def run_taken_case(storage: HistoryStorage, case: TakenCase) -> None:
    """One `TAKEN_CASES` row: another thread's rows seeded, the turn persisted by a library given the case's
    keys and request id, then what it saved (or its refusal) and the other thread's rows untouched."""
    if case.taken:
        await seed(storage, [msg(i, t=1, thread="intruder", resource="r2") for i in case.taken], owner="r2")
    if case.own:
        await seed(storage, [msg(i, "assistant", t=2) for i in case.own])
    history = MessageHistory(storage=storage, message_id_keys=case.keys)
    turn = history.persist_turn(
        thread_id=THREAD,
        resource_id=RESOURCE,
        input=[msg(D_IN, t=3)],
        response=[msg(case.response_id, "assistant", t=4)],
        request_id=case.request_id,
    )
    if case.saved is MessageIdTakenError:
        with pytest.raises(MessageIdTakenError):
            await turn
        assert await storage.get_messages([D_IN], thread_ids=(THREAD,)) == []
    else:
        outcome = await turn
        assert tuple(outcome.saved_ids) == case.saved
        stored = await storage.list_messages(THREAD, resource_id=None, limit=None)
        assert {m.id for m in stored} == set(case.saved) | set(case.own)
    held = await storage.list_messages("intruder", resource_id=None, limit=None)
    assert sorted(m.id or "" for m in held) == sorted(case.taken)
