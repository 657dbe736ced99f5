"""@mastra/mongodb's documents read back: a `mastra_threads` row as a `Thread`, a `mastra_messages` row as a
`Message` (legacy shapes included), or as a `RecalledRow` view when the recall fast path can prove it equal.

The layout (docs/events.md#14-storage-layout) is the one `MemoryStorageMongoDB` 1.19 writes; top-level
message keys Mastra has no column for are kept as JSON text in `_mh_extra`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from message_history.errors import FatalStorageError
from schemas.messages import Message, MessageContent
from storage.protocol import Thread
from storage.recalled_rows import MESSAGE_PROJECTION, row_from_doc

THREADS = "mastra_threads"
MESSAGES = "mastra_messages"
EXTRA_FIELD = "_mh_extra"
assert EXTRA_FIELD in MESSAGE_PROJECTION  # every field `message_from_doc` reads is read

_MESSAGE_FIELDS = frozenset(Message.model_fields)


def _as_datetime(value: Any) -> datetime | None:
    """A stored date: BSON Date (tz-aware by the codec) or, in legacy rows, an ISO string."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


# --- documents <-> models -----------------------------------------------------------------------------------


def thread_from_doc(doc: Mapping[str, Any]) -> Thread:
    """A `mastra_threads` document as a `Thread` (legacy JSON-string metadata parsed, as Mastra does)."""
    metadata = doc.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = None
    return Thread(
        id=str(doc.get("id", "")),
        resourceId=str(doc.get("resourceId") or ""),
        title=str(doc.get("title") or ""),
        metadata=dict(metadata) if isinstance(metadata, dict) else {},
        createdAt=_as_datetime(doc.get("createdAt")),
        updatedAt=_as_datetime(doc.get("updatedAt")),
    )


def _content_from_text(text: str, doc: Mapping[str, Any]) -> MessageContent | str:
    """Content that is not format-2 JSON: Mastra keeps the raw string when `JSON.parse` fails."""
    try:
        value = json.loads(text)
    except ValueError:
        return text  # legacy plain text; `Message` wraps it as a text part, as Mastra's MessageList does
    if isinstance(value, str):
        return value
    raise FatalStorageError(
        f"message {doc.get('id')!r} of thread {doc.get('thread_id')!r} has content that is not format 2"
    )


def message_from_doc(doc: Mapping[str, Any]) -> Message:
    """A `mastra_messages` document as a `Message`, read as Mastra's `parseRow` does (`type 'v2'` hidden)."""
    raw = doc.get("content")
    content: MessageContent | str | Mapping[str, Any]
    try:
        if isinstance(raw, str):
            try:
                content = MessageContent.model_validate_json(raw)
            except ValidationError:
                content = _content_from_text(raw, doc)
        elif isinstance(raw, Mapping):
            content = MessageContent.model_validate(raw)  # a writer that stored a sub-document
        else:
            raise FatalStorageError(f"message {doc.get('id')!r} has no content")
        data: dict[str, Any] = {
            "id": doc.get("id"),
            "content": content,
            "role": doc.get("role"),
            "createdAt": doc.get("createdAt"),
            "threadId": doc.get("thread_id"),
            "resourceId": doc.get("resourceId"),
        }
        kind = doc.get("type")
        if kind and kind != "v2":
            data["type"] = kind
        extra = doc.get(EXTRA_FIELD)
        if isinstance(extra, str):
            for key, value in json.loads(extra).items():
                if key not in _MESSAGE_FIELDS:
                    data[key] = value
        return Message.model_validate(data)
    except (ValidationError, ValueError) as exc:  # FatalStorageError is neither, so it passes through
        raise FatalStorageError(
            f"message {doc.get('id')!r} of thread {doc.get('thread_id')!r} cannot be read: "
            f"{type(exc).__name__}"
        ) from exc


def _recalled_or_model(doc: Mapping[str, Any]) -> Message:
    return row_from_doc(doc, message_from_doc) or message_from_doc(doc)
