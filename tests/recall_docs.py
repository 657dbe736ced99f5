"""Stored `mastra_messages` documents of every shape, and the recall path's output from them both ways.

Used by the equivalence tests of the recall fast path (tests/unit/test_recalled_rows.py and, against the
real server, tests/integration/test_recalled_rows_mongodb.py): `stored_docs` writes a thread's documents
as this service writes them, as Mastra writes them (`JSON.stringify`: its own key order, spacing, numbers),
and as older versions and other writers left them (content as an object, legacy text, dates as strings,
unknown keys, broken rows). `model_bytes` is the model path's enriched message for one document;
`enriched_both` is a whole enriched event, model path and fast path.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from message_history.core.rules import build_context
from message_history.errors import FatalStorageError
from schemas.codec import decode_request, encode
from schemas.events import AgentRequest, EnrichedMessage, EnrichedRequest
from schemas.messages import Message
from schemas.recalled import encode_enriched
from storage.documents import _recalled_or_model, message_from_doc
from storage.save_plan import message_write
from tests.memory_cases import random_messages, random_part, random_text

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)

_UNICODE = ["", "é", "你好", "😀", "\u2028", "\x00", "\x1f", "tab\tnew\nline", '"quoted" \\ back', "\ud7ff"]


def _mastra_json(content: Any, rng: random.Random) -> str:
    """As `JSON.stringify` would write it (compact, non-ASCII kept), sometimes with keys reordered."""
    style = rng.random()
    if style < 0.15 and isinstance(content, dict):
        content = dict(reversed(list(content.items())))  # e.g. {"parts": ..., "format": 2}
    if style > 0.9:
        return json.dumps(content, ensure_ascii=False, indent=1)
    if 0.8 < style <= 0.9:
        return json.dumps(content)  # ASCII escapes, spaces after separators
    return json.dumps(content, ensure_ascii=False, separators=(",", ":"))


def _odd_content(rng: random.Random) -> Any:
    """Content text (or object) from other writers and broken rows."""
    return rng.choice(
        [
            "plain legacy text",
            json.dumps("a JSON string"),
            '{"format":2,"parts":[],"parts":[{"type":"text","text":"dup"}]}',
            '{"format":2,"parts":[{"type":"data-x","data":NaN}]}',
            '{"format":2,"parts":[{"type":"data-x","data":1e5}]}',
            '{"format":2,"parts":[{"type":"data-x","data":1E+21}]}',
            '{"format":2,"parts":[{"type":"text","text":"\\ud800"}]}',
            '{"format":2,"parts":[{"type":"text","text":"\\u00e9\\/"}]}',
            '{"parts":[{"type":"text","text":"no format"}]}',
            '{"format":2.0,"parts":[]}',
            '{"format":true,"parts":[]}',
            '{"format":1,"parts":[]}',
            '{"format":2,"parts":[{"type":"text"}]}',
            '{"format":2,"parts":[{"type":"data-","data":1}]}',
            '{"format":2,"parts":[{"type":"data-\\n","data":1}]}',
            '{"format":2,"parts":[{"type":5}]}',
            '{"format":2,"parts":["text"]}',
            '{"format":2,"parts":[{"text":"x","type":"text"}]}',
            '{"format":2,"parts":[{"type":"reasoning"}],"content":null,"metadata":{"a":[1,2.5,null]}}',
            '{"format":2,"parts":[{"type":"tool-invocation","toolInvocation":{"state":"bogus",'
            '"toolCallId":"c","toolName":"n"}}]}',
            '{"format":2,"parts":[{"type":"error","error":{"message":"m","name":null,"code":7}}]}',
            '{"format":2,"parts":[],"zeta":1,"content":"extra before a field"}',
            '{"format":2,"parts":[],"content":7}',
            "[1,2]",
            "",
            {"format": 2, "parts": [{"type": "text", "text": "content as an object"}]},
            {"format": 2, "parts": [{"type": "bogus-part"}], "x": 1},
            None,
        ]
    )


def _content(rng: random.Random, index: int) -> dict[str, Any]:
    parts = [random_part(rng, index) for _ in range(rng.randint(0, 5))]
    if rng.random() < 0.3:
        parts.append({"type": "text", "text": rng.choice(_UNICODE) + random_text(rng, 3)})
    if rng.random() < 0.02:
        parts.append({"type": "text", "text": "x" * rng.randint(50_000, 300_000)})  # large content
    content: dict[str, Any] = {"format": 2, "parts": parts}
    if rng.random() < 0.3:
        content["content"] = random_text(rng, 4)
    if rng.random() < 0.1:
        content["metadata"] = {"k": rng.choice([1, 2.5, "v", None, [1, {"a": True}]])}
    if rng.random() < 0.05:
        content["customKey"] = {"kept": True}
    return content


def stored_docs(seed: int, count: int, thread: str, resource: str) -> list[dict[str, Any]]:
    """`count` documents of `thread`, 1 s apart, of every shape (see the module docstring)."""
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = []
    for i in range(count):
        created = T0 + timedelta(seconds=i, milliseconds=rng.randint(0, 999))
        role = rng.choice(["user", "assistant", "assistant", "system", "signal"])
        content = _content(rng, i)
        shape = rng.random()
        if shape < 0.35:
            # this service's own write (`message_write`: the models' dump, `_mh_extra` for unknown keys)
            extra: dict[str, Any] = {"custom": {"n": i}} if rng.random() < 0.1 else {}
            message = Message.model_validate(
                {"id": f"{thread}:m{i}", "role": role, "createdAt": created, "content": content, **extra}
            )
            write = message_write(message, thread, resource, created)
            doc = {**write.fields, "createdAt": created}
            if write.extra is not None:
                doc["_mh_extra"] = write.extra
        else:
            doc = {
                "id": f"{thread}:m{i}",
                "thread_id": thread,
                "resourceId": resource,
                "role": role,
                "type": "v2",
                "content": _mastra_json(content, rng),
                "createdAt": created,
            }
            if shape > 0.85:
                _oddity(doc, rng)
        docs.append(doc)
    return docs


def _oddity(doc: dict[str, Any], rng: random.Random) -> None:
    """One thing older versions or other writers do differently."""
    kind = rng.randint(0, 11)
    if kind == 0:
        doc["content"] = _odd_content(rng)
    elif kind == 1:
        doc["createdAt"] = doc["createdAt"].isoformat().replace("+00:00", "Z")  # a date as a string
    elif kind == 2:
        doc["type"] = rng.choice([None, "", "v3", 5, "v1"])
    elif kind == 3:
        doc.pop("resourceId")
    elif kind == 4:
        doc["role"] = rng.choice(["tool", "", None, 3])
    elif kind == 5:
        doc["_mh_extra"] = json.dumps({"custom": rng.choice(_UNICODE), "role": "ignored"})
    elif kind == 6:
        doc.pop("type")
    elif kind == 7:
        doc["unknownColumn"] = {"a": 1}  # a field the model path does not read
    elif kind == 8:
        doc["id"] = rng.choice([None, 7, ""])
    elif kind == 9:
        doc["createdAt"] = doc["createdAt"].replace(tzinfo=None)  # naive, as some drivers return it
    elif kind == 10:
        doc.pop("createdAt")
    else:
        doc["content"] = _odd_content(rng)


def newest_first(docs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The documents as a recall query returns them: newest first by `(createdAt, id)` (dates only)."""
    dated = [d for d in docs if isinstance(d.get("createdAt"), datetime)]

    def key(doc: Mapping[str, Any]) -> tuple[datetime, str]:
        created = doc["createdAt"]
        return (created if created.tzinfo else created.replace(tzinfo=UTC), str(doc.get("id")))

    return sorted(dated, key=key, reverse=True)


def model_bytes(doc: Mapping[str, Any], thread: str, resource: str) -> bytes | None:
    """The model path's enriched message (source memory) for `doc`; None when that path refuses the row."""
    try:
        message = message_from_doc(doc)
        tagged = EnrichedMessage.from_message(message, "memory", thread_id=thread, resource_id=resource)
    except (FatalStorageError, ValueError):
        return None
    return EnrichedMessage.__pydantic_serializer__.to_json(tagged, exclude_unset=True)


def readable(docs: Sequence[Mapping[str, Any]], thread: str, resource: str) -> list[Mapping[str, Any]]:
    """The documents the model path can send (a thread with a broken row fails recall on both paths)."""
    return [d for d in docs if model_bytes(d, thread, resource) is not None]


def request_for(seed: int, thread: str, resource: str, stored_ids: Sequence[str]) -> AgentRequest:
    """A request on `thread` whose input may repeat stored ids (the incoming copy wins) and whose metadata
    may hold the splice marker's text."""
    rng = random.Random(seed)
    stored_ids = [i for i in stored_ids if i.strip()]
    messages = random_messages(seed, rng.randint(1, 4))
    for i, message in enumerate(messages):
        message["id"] = f"{thread}:in{i}"
        message["threadId"], message["resourceId"] = thread, resource
        if stored_ids and rng.random() < 0.3:
            message["id"] = rng.choice(stored_ids)
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": f"{thread}:req{seed}",
        "threadId": thread,
        "resourceId": resource,
        "createdAt": "2025-03-01T10:00:00.000Z",
        "messages": messages,
    }
    if rng.random() < 0.5:
        event["metadata"] = {"note": "\x00message-history:messages\x00", "messages": []}
    if rng.random() < 0.2:
        event["customTop"] = ["\x00message-history:messages\x00"]
    return decode_request(json.dumps(event).encode())


def enriched_both(
    request: AgentRequest,
    docs_newest_first: Sequence[Mapping[str, Any]],
    *,
    limit: int | None = 40,
    build: Callable[[Mapping[str, Any]], Message] = _recalled_or_model,
) -> tuple[bytes, bytes]:
    """The enriched event from `docs_newest_first` (already cut to the page): model path, fast path."""
    models = [message_from_doc(d) for d in docs_newest_first]
    views = [build(d) for d in docs_newest_first]
    model_context = build_context(models, request.messages)
    view_context = build_context(views, request.messages)
    recalled = sum(1 for _, source in model_context if source == "memory")
    expected = encode(EnrichedRequest.from_request(request, model_context, recalled=recalled, limit=limit))
    return expected, encode_enriched(request, view_context, recalled=recalled, limit=limit)
