"""How large the MongoDB document of a message is, computed without the driver (pure).

MongoDB refuses a document over 16 MiB (`maxBsonObjectSize`), and PyMongo refuses it before sending, for the
whole bulk write it is in. The persist path checks a turn's messages first, so such a message makes its event
a dead letter naming the limit, and the rest of the batch is written. The size is the exact BSON size of the
document `storage.save_plan` writes for a message (the layout of `mastra_messages`); a thread document holds
no message content (`title ''`, `metadata {}` on insert) and is never near the limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from message_history.errors import DocumentTooLargeError
from schemas.messages import Message
from storage.documents import EXTRA_FIELD
from storage.save_plan import message_write

MAX_DOCUMENT_BYTES: Final = 16 * 1024 * 1024
"""MongoDB's `maxBsonObjectSize`, the same on every MongoDB since 1.8 and on the MongoDB-wire servers."""

EXPANSION: Final = 5
"""An event value of n bytes cannot make a stored content JSON of more than about 5n bytes (a number written
`1e15` comes back as `1000000000000000.0`); under that bound no exact check is needed."""

_HEADROOM: Final = 64 * 1024  # ids, dates and field names beside the content
_ANY_TIME: Final = datetime(2000, 1, 1, tzinfo=UTC)  # a date is 8 bytes whichever it is


def _string(key: str, value: str) -> int:
    return 1 + len(key.encode()) + 1 + 4 + len(value.encode()) + 1


def _date(key: str) -> int:
    return 1 + len(key.encode()) + 1 + 8


def message_document_bytes(message: Message, *, thread_id: str, resource_id: str) -> int:
    """The BSON size of the `mastra_messages` document of `message`: the one `storage.save_plan` writes."""
    write = message_write(message, thread_id, resource_id, _ANY_TIME)
    size = 4 + 1  # length prefix, terminator
    size += _string("_id", write.fields["id"] or "") + _date("createdAt")
    size += sum(_string(key, str(value or "")) for key, value in write.fields.items())
    if write.extra is not None:
        size += _string(EXTRA_FIELD, write.extra)
    return size


def may_exceed(value_bytes: int) -> bool:
    """False when an event of `value_bytes` cannot hold a message over the limit: no check needed."""
    return value_bytes * EXPANSION + _HEADROOM > MAX_DOCUMENT_BYTES


def check_document_sizes(
    messages: Iterable[Message], *, thread_id: str, resource_id: str, limit: int = MAX_DOCUMENT_BYTES
) -> None:
    """Raise `DocumentTooLargeError` for the first message whose document would be over `limit` bytes."""
    for message in messages:
        size = message_document_bytes(message, thread_id=thread_id, resource_id=resource_id)
        if size > limit:
            raise DocumentTooLargeError(
                f"message {message.id!r} would be a {size}-byte MongoDB document; MongoDB's limit is {limit} "
                f"bytes (16 MiB) per document. Split its content over several messages or store large "
                "payloads elsewhere and reference them"
            )
