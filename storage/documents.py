"""@mastra/mongodb's documents read back: a `mastra_threads` row as a `Thread`, a `mastra_messages` row as a
`Message` (legacy shapes included), or as a `RecalledRow` view when the recall fast path can prove it equal.

The layout (docs/events.md#14-storage-layout) is the one `MemoryStorageMongoDB` 1.19 writes; top-level
message keys Mastra has no column for are kept as JSON text in `_mh_extra`. Every row shape a published
Mastra writes (v1 rows included) is read as Mastra 1.71 reads it, by `schemas.stored_rows` (pure); a row no
Mastra would read raises `UnreadableRowError`, which the storage's readers skip and count
(`storage.unreadable`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from schemas.messages import Message
from schemas.stored_rows import EXTRA_FIELD, MESSAGES, THREADS, read_message, stored_datetime
from storage.protocol import Thread
from storage.recalled_rows import MESSAGE_PROJECTION, row_from_doc

__all__ = ["EXTRA_FIELD", "MESSAGES", "THREADS", "message_from_doc", "thread_from_doc"]

assert EXTRA_FIELD in MESSAGE_PROJECTION  # every field `message_from_doc` reads is read


# --- documents <-> models -----------------------------------------------------------------------------------


def thread_from_doc(doc: Mapping[str, Any]) -> Thread:
    """A `mastra_threads` document as a `Thread` (legacy JSON-string metadata parsed, as Mastra does)."""
    metadata = doc.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except (ValueError, RecursionError):  # as Mastra: metadata it cannot parse is no metadata
            metadata = None
    return Thread(
        id=str(doc.get("id", "")),
        resourceId=str(doc.get("resourceId") or ""),
        title=str(doc.get("title") or ""),
        metadata=dict(metadata) if isinstance(metadata, dict) else {},
        createdAt=stored_datetime(doc.get("createdAt")),
        updatedAt=stored_datetime(doc.get("updatedAt")),
    )


def message_from_doc(doc: Mapping[str, Any]) -> Message:
    """A `mastra_messages` document as a `Message`, read as Mastra 1.71 reads it (`schemas.stored_rows`):
    `UnreadableRowError` for a row no Mastra would read."""
    return read_message(doc)


def _recalled_or_model(doc: Mapping[str, Any]) -> Message:
    return row_from_doc(doc, message_from_doc) or message_from_doc(doc)
