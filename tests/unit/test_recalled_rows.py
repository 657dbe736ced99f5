"""The recall fast path (`RecalledRow`, `encode_enriched`) gives the model path's bytes, or steps aside.

Over documents (tests/recall_docs.py: this service's writes, Mastra's `JSON.stringify`, legacy and broken
rows), the rule tables (tests/rule_cases.py, recalled through `MessageHistory` over a document-backed
storage) and a few thousand generated threads: every row the fast path takes encodes byte for byte as
the model path's, every row it refuses is left to the model path, and a whole enriched event is the same
bytes either way. Against the real server: tests/integration/test_recalled_rows_mongodb.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from message_history.core.rules import build_context
from message_history.processor import MessageHistory
from schemas.canonical import canonical_content
from schemas.codec import decode_request, encode
from schemas.events import EnrichedRequest
from schemas.messages import Message, MessageContent
from schemas.recalled import RecalledRow, encode_enriched, materialized, recalled_row
from storage.documents import _recalled_or_model, message_from_doc
from storage.protocol import HistoryStorage, Page, PageQuery, Thread
from storage.recalled_rows import row_from_doc
from storage.save_plan import message_write
from tests.memory_cases import random_messages
from tests.recall_docs import enriched_both, model_bytes, newest_first, readable, request_for, stored_docs
from tests.rule_cases import RECALL_CASES, RESOURCE, RecallCase

THREAD, OWNER = "t-eq", "r-eq"


def test_rows_the_fast_path_takes_encode_as_the_model_path() -> None:
    taken = refused = 0
    for seed in range(300):
        for doc in stored_docs(seed, 20, THREAD, OWNER):
            row = row_from_doc(doc, message_from_doc)
            expected = model_bytes(doc, THREAD, OWNER)
            if row is None:
                refused += 1
                continue
            taken += 1
            assert expected is not None, f"the fast path took a row the model path refuses: {doc!r:.300}"
            assert row.enriched_json("memory") == expected, f"{doc!r:.300}"
            model = row.materialize()
            assert model == message_from_doc(doc)
            assert (row.id, row.role, row.createdAt, row.threadId, row.resourceId, row.type) == (
                model.id,
                model.role,
                model.createdAt,
                model.threadId,
                model.resourceId,
                model.type,
            )
    # both paths are exercised: most rows (ours and Mastra's compact JSON) are spliced, odd ones are not
    assert taken > 3000
    assert refused > 600


def test_mastra_compact_json_and_our_own_writes_are_spliced() -> None:
    content = {"format": 2, "parts": [{"type": "text", "text": "héllo 😀"}], "content": "héllo 😀"}
    mastra = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
    assert canonical_content(mastra) == mastra.encode()
    ours = MessageContent.model_validate(content).model_dump_json(exclude_unset=True)
    assert canonical_content(ours) == ours.encode()


@pytest.mark.parametrize(
    "text",
    [
        '{"parts":[],"format":2}',  # key order: the models write format first
        '{"format": 2, "parts": []}',  # spacing
        '{"format":2,"parts":[{"text":"x","type":"text"}]}',  # part key order
        '{"format":2,"parts":[{"type":"data-x","data":1e5}]}',  # a number the models write otherwise
        '{"format":2,"parts":[{"type":"data-x","data":NaN}]}',  # NaN: the models write null
        '{"format":2,"parts":[{"type":"text","text":"\\u00e9"}]}',  # an escape the models do not use
        '{"format":2,"parts":[],"parts":[]}',  # a duplicate key
        '{"parts":[]}',  # no format: the models add it
        '{"format":2,"parts":[{"type":"text"}]}',  # invalid: the model path refuses it
        '{"format":2,"parts":[{"type":"data-","data":1}]}',  # invalid data part type
        '{"format":2,"parts":[],"x":1,"content":"c"}',  # a declared field after an unknown key
        '"legacy"',
        "not json",
    ],
)
def test_content_the_fast_path_is_not_sure_about(text: str) -> None:
    assert canonical_content(text) is None


def test_a_guard_fails_without_it() -> None:
    # the key-order check is what keeps Mastra's reordered JSON off the fast path: spliced as it is, the
    # event would differ from the model path's
    text = '{"format":2,"parts":[{"text":"x","type":"text"}]}'
    doc = {
        "id": "m",
        "thread_id": THREAD,
        "resourceId": OWNER,
        "role": "user",
        "content": text,
        "createdAt": datetime(2025, 1, 1, tzinfo=UTC),
    }
    assert row_from_doc(doc, message_from_doc) is None

    forced = recalled_row(
        id="m",
        role="user",
        created_at=doc["createdAt"],  # type: ignore[arg-type]
        created_text="2025-01-01T00:00:00.000Z",
        thread_id=THREAD,
        resource_id=OWNER,
        kind=None,
        content=text.encode(),
        load=lambda: message_from_doc(doc),
    )
    assert forced.enriched_json("memory") != model_bytes(doc, THREAD, OWNER)


def test_generated_threads_give_the_same_event_bytes() -> None:
    spliced = 0
    for seed in range(3000):
        thread = f"t{seed}"
        docs = newest_first(readable(stored_docs(seed, seed % 45, thread, OWNER), thread, OWNER))
        page = docs[:40]
        ids = [str(d["id"]) for d in page]
        request = request_for(seed, thread, OWNER, ids)
        expected, fast = enriched_both(request, page)
        assert fast == expected, f"seed {seed}"
        spliced += sum(1 for d in page if row_from_doc(d, message_from_doc) is not None)
    assert spliced > 20_000


def test_an_event_without_rows_is_encoded_as_before() -> None:
    request = request_for(1, THREAD, OWNER, [])
    context = build_context([], request.messages)
    expected = encode(EnrichedRequest.from_request(request, context, recalled=0, limit=40))
    assert encode_enriched(request, context, recalled=0, limit=40) == expected


def test_the_marker_in_the_request_does_not_move_the_splice() -> None:
    docs = newest_first(stored_docs(7, 10, THREAD, OWNER))
    page = readable(docs, THREAD, OWNER)
    event = {
        "schemaVersion": 1,
        "requestId": "q",
        "threadId": THREAD,
        "resourceId": OWNER,
        "createdAt": "2025-03-01T10:00:00.000Z",
        "messages": random_messages(3, 1),
        "metadata": {"a": ["\x00message-history:messages\x00"]},  # the first marker, as the event's own
    }
    for m in event["messages"]:  # type: ignore[attr-defined]
        m["threadId"], m["resourceId"] = THREAD, OWNER
    request = decode_request(json.dumps(event).encode())
    expected, fast = enriched_both(request, page)
    assert fast == expected


def test_materialized_gives_the_models() -> None:
    docs = newest_first(readable(stored_docs(11, 30, THREAD, OWNER), THREAD, OWNER))
    rows = [_recalled_or_model(d) for d in docs]
    assert any(isinstance(r, RecalledRow) for r in rows)
    context = build_context(rows, [])
    models = materialized(context)
    assert all(not isinstance(m, RecalledRow) for m, _ in models)
    assert models == build_context([message_from_doc(d) for d in docs], [])


def test_a_row_is_a_whole_message_its_content_read_once_when_asked() -> None:
    """A `RecalledRow` is typed as a `Message`: its content, dump and wire form are the model path's (read
    once, on first use), so code given a row as a `Message` is never wrong, only slower."""
    docs = readable(stored_docs(5, 30, THREAD, OWNER), THREAD, OWNER)
    doc = next(d for d in docs if isinstance(_recalled_or_model(d), RecalledRow))
    loads: list[Mapping[str, Any]] = []

    def load(d: Mapping[str, Any]) -> Message:
        loads.append(d)
        return message_from_doc(d)

    row = row_from_doc(doc, load)
    assert isinstance(row, RecalledRow)
    model = message_from_doc(doc)
    assert loads == []  # built without its content
    assert row.content == model.content
    assert row.model_dump() == model.model_dump()
    assert row.model_dump_json(exclude_unset=True) == model.model_dump_json(exclude_unset=True)
    assert row.wire() == model.wire()
    assert len(loads) == 1
    with pytest.raises(AttributeError):
        _ = row.no_such_field  # type: ignore[attr-defined]  # only `content` is read through the model


# --- the rule tables, recalled through MessageHistory over documents ---------------------------------------


class DocStorage(HistoryStorage):
    """A `HistoryStorage` over `mastra_messages` documents, rows built by `build` (model or fast path)."""

    def __init__(
        self, docs: Sequence[Mapping[str, Any]], owner: str, build: Callable[[Mapping[str, Any]], Message]
    ) -> None:
        self.docs = docs
        self.owner = owner
        self.build = build

    async def get_thread(self, thread_id: str) -> Thread | None:
        if not any(d["thread_id"] == thread_id for d in self.docs):
            return None
        return Thread(thread_id, self.owner, "", {})

    async def list_messages(
        self, thread_id: str, *, resource_id: str | None, limit: int | None
    ) -> list[Message]:
        docs = [
            d
            for d in newest_first(self.docs)
            if d["thread_id"] == thread_id and (resource_id is None or d.get("resourceId") == resource_id)
        ]
        return [self.build(d) for d in (docs if limit is None else docs[:limit])]

    async def save_messages(self, *, thread_id: str, resource_id: str, messages: Sequence[Message]) -> Thread:
        raise NotImplementedError

    # The rule tables' recall cases are count-limited and plan no stored-copy lookup: never reached.
    async def list_page(self, query: PageQuery) -> Page:
        raise NotImplementedError

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        raise NotImplementedError

    async def get_messages(
        self, message_ids: Sequence[str], *, thread_ids: Collection[str] | None = None
    ) -> list[Message]:
        raise NotImplementedError


def _doc(message: Message, mastra: bool) -> dict[str, Any]:
    thread, resource = message.threadId or "t1", message.resourceId or RESOURCE
    created = message.createdAt or datetime(2025, 1, 1, tzinfo=UTC)
    if mastra:
        wire = json.loads(message.content.model_dump_json(exclude_unset=True))
        content = json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
        return {
            "id": message.id,
            "thread_id": thread,
            "resourceId": resource,
            "role": message.role,
            "type": "v2",
            "content": content,
            "createdAt": created,
        }
    write = message_write(message, thread, resource, created)
    doc = {**write.fields, "createdAt": created}
    if write.extra is not None:
        doc["_mh_extra"] = write.extra
    return doc


@pytest.mark.parametrize("mastra", [False, True], ids=["ours", "mastra"])
@pytest.mark.parametrize("case", [c for c in RECALL_CASES if c.error is None], ids=lambda c: c.id)
async def test_rule_tables_give_the_same_event(case: RecallCase, mastra: bool) -> None:
    docs = [_doc(m, mastra) for m in case.stored]
    outcomes = []
    for build in (message_from_doc, _recalled_or_model):
        storage = DocStorage(docs, case.owner, build)
        history = MessageHistory(storage=storage, last_messages=case.processor_last_messages)
        outcomes.append(
            await history.recall(
                thread_id=case.thread,
                resource_id=case.resource,
                incoming=case.incoming,
                last_messages=case.last_messages,  # type: ignore[arg-type]  # USE_DEFAULT or a LastMessages
            )
        )
    model, fast = outcomes
    assert [(m.id, s) for m, s in fast.context] == [(m.id, s) for m, s in model.context] == case.expected
    if any(s == "memory" for _, s in model.context):
        assert any(isinstance(m, RecalledRow) for m, _ in fast.context)  # the fast path was taken
    if case.thread is None:
        return
    event = {
        "schemaVersion": 1,
        "requestId": "q",
        "threadId": case.thread,
        "resourceId": case.resource or case.owner,
        "createdAt": "2025-01-01T11:00:00.000Z",
        "messages": [],
    }
    request = decode_request(json.dumps(event).encode())
    summary: dict[str, Any] = {"recalled": model.recalled, "limit": model.limit}
    expected = encode(EnrichedRequest.from_request(request, model.context, **summary))
    assert encode_enriched(request, fast.context, **summary) == expected
