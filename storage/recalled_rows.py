"""A `mastra_messages` document as a `RecalledRow` when the fast path is sure it reads as the model path.

`message_from_doc` (storage/documents.py) is the model path: it validates the document into a `Message`. For
a document in the plain shape, the same `Message` is predictable without validating: `recalled_row` checks
every field `message_from_doc` reads and gives up (None) on anything else, so the caller takes the model
path for that row. Given up on: no or non-string `id`/`thread_id`/`resourceId`, an unknown `role`, a
`createdAt` that is not a BSON date (legacy strings), a `type` that is not a string, unknown keys kept in
`_mh_extra`, `content` stored as an object or as text that is not canonical (`schemas.canonical`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, get_args

from schemas.canonical import canonical_content
from schemas.limits import id_problem
from schemas.messages import Message, Role, format_timestamp
from schemas.recalled import RecalledRow, recalled_row

__all__ = ["MESSAGE_PROJECTION", "row_from_doc"]

_ROLES: Final = frozenset(get_args(Role))

MESSAGE_PROJECTION: Final[Mapping[str, int]] = {
    "_id": 0,
    "id": 1,
    "thread_id": 1,
    "resourceId": 1,
    "role": 1,
    "type": 1,
    "content": 1,
    "createdAt": 1,
    "_mh_extra": 1,
}
"""The fields `message_from_doc` reads: nothing else of a message document is sent back."""


def row_from_doc(doc: Mapping[str, Any], load: Callable[[Mapping[str, Any]], Message]) -> RecalledRow | None:
    """The document as a `RecalledRow` (`load(doc)` is its model path), or None when not sure."""
    if doc.get("_mh_extra") is not None:
        return None  # unknown keys: the model path merges them
    ident = doc.get("id")
    thread_id = doc.get("thread_id")
    resource_id = doc.get("resourceId")
    role = doc.get("role")
    created = doc.get("createdAt")
    raw = doc.get("content")
    if (
        type(ident) is not str
        or id_problem(ident) is not None  # no event could carry it: the model path refuses and counts it
        or type(thread_id) is not str
        or type(resource_id) is not str
        or type(role) is not str
        or role not in _ROLES
        or type(created) is not datetime
        or created.tzinfo is None
        or created.microsecond % 1000
        or type(raw) is not str
    ):
        return None
    kind = doc.get("type")
    if not kind or kind == "v2":
        kind = None  # as `message_from_doc`: Mastra's own 'v2' is not part of the message
    elif type(kind) is not str:
        return None
    content = canonical_content(raw)
    if content is None:
        return None
    return recalled_row(
        id=ident,
        role=role,
        created_at=created,
        created_text=format_timestamp(created),
        thread_id=thread_id,
        resource_id=resource_id,
        kind=kind,
        content=content,
        load=lambda: load(doc),
    )
