"""The size of a message's MongoDB document, computed without the driver, is the BSON size PyMongo sends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import bson
import pytest

from message_history.errors import DocumentTooLargeError
from schemas.messages import Message
from storage.document_size import MAX_DOCUMENT_BYTES, check_document_sizes, may_exceed, message_document_bytes
from storage.documents import EXTRA_FIELD
from storage.save_plan import message_write

NOW = datetime(2025, 3, 1, tzinfo=UTC)


def _message(text: str, **extra: Any) -> Message:
    content = {"format": 2, "parts": [{"type": "text", "text": text}]}
    return Message.model_validate({"id": "m-é1", "role": "user", "content": content, **extra})


def _stored(message: Message) -> dict[str, Any]:
    """The document `storage.mongodb` writes for `message` (the upsert's fields, `_id` and `createdAt`)."""
    write = message_write(message, "thread-ü", "resource", NOW)
    doc: dict[str, Any] = {"_id": write.fields["id"], **write.fields, "createdAt": write.created}
    if write.extra is not None:
        doc[EXTRA_FIELD] = write.extra
    return doc


@pytest.mark.parametrize(
    "message",
    [
        _message("hello"),
        _message("naïve ☃ text " * 50),
        _message("with extras", custom={"nested": [1, 2.5, "x"]}, flag=True),
        _message("typed", type="tool-call"),
    ],
)
def test_size_is_the_bson_size_of_the_stored_document(message: Message) -> None:
    """Exactly `len(bson.encode(doc))` for the document the storage writes."""
    size = message_document_bytes(message, thread_id="thread-ü", resource_id="resource")
    assert size == len(bson.encode(_stored(message)))


def test_a_message_over_the_limit_is_refused_naming_the_limit() -> None:
    """Over 16 MiB: `DocumentTooLargeError` with the size, the limit and what to do; at the limit: fine."""
    small = _message("x" * 1000)
    size = message_document_bytes(small, thread_id="t", resource_id="r")
    check_document_sizes([small], thread_id="t", resource_id="r", limit=size)
    with pytest.raises(DocumentTooLargeError, match=r"16 MiB.*Split its content") as caught:
        check_document_sizes([small], thread_id="t", resource_id="r", limit=size - 1)
    assert f"{size}-byte" in str(caught.value)


def test_only_large_events_need_the_exact_check() -> None:
    """A 1 MiB event (the default limit) cannot hold a 16 MiB message; a 4 MiB one might."""
    assert not may_exceed(1024 * 1024)
    assert may_exceed(4 * 1024 * 1024)
    assert may_exceed(MAX_DOCUMENT_BYTES)
