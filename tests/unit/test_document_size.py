"""The size of a message's MongoDB document, computed without the driver, is the BSON size PyMongo sends."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import bson
import pytest

from consumers.contract import Record
from consumers.persist import PersistHandler
from message_history.errors import DocumentTooLargeError
from message_history.settings import Settings
from producers.persisted import PersistedPublisher
from schemas.messages import Message
from storage.document_size import MAX_DOCUMENT_BYTES, check_document_sizes, may_exceed, message_document_bytes
from storage.documents import EXTRA_FIELD
from storage.memory import InMemoryHistoryStorage
from storage.save_plan import message_write
from storage.sequential import SequentialBatches

_KEYED = cast(Record, SimpleNamespace(key=b"t"))  # keyed by the events' threadId, as records must be

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


def _response(
    last: dict[str, Any], *, echoed: dict[str, Any] | None = None, read_only: bool = False
) -> bytes:
    user = {"id": "q", "role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": "q"}]}}
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": "r1",
        "threadId": "t",
        "resourceId": "u",
        "createdAt": "2025-01-01T10:00:00.000Z",
        "input": [*([echoed] if echoed else []), user],
        "response": [last],
        "finishReason": "stop",
    }
    if read_only:
        event["memory"] = {"readOnly": True}
    return json.dumps(event).encode()


_HUGE = "x" * (17 * 1024 * 1024)


def _big(role: str, **content: Any) -> dict[str, Any]:
    return {
        "id": "big",
        "role": role,
        "content": {"format": 2, "parts": [{"type": "text", "text": _HUGE}], **content},
    }


_SMALL = {"id": "a", "role": "assistant", "content": {"format": 2, "parts": [{"type": "text", "text": "a"}]}}


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        pytest.param(
            _response(_big("signal", metadata={"signal": {"transient": True}})), False, id="transient-signal"
        ),
        pytest.param(
            _response(_big("signal", metadata={"signal": {"transient": False}})), True, id="kept-signal"
        ),
        pytest.param(_response(_big("system")), False, id="system"),
        pytest.param(
            _response(_SMALL, echoed={**_big("assistant"), "source": "memory"}), False, id="recalled-echo"
        ),
        pytest.param(_response(_big("assistant"), read_only=True), False, id="read-only"),
        pytest.param(_response(_big("assistant")), True, id="saved"),
    ],
)
def test_only_what_the_turn_saves_is_size_checked(raw: bytes, refused: bool) -> None:
    """A 17 MiB message that is never saved (docs/rules.md#r4 #r6 #r7, read-only) does not refuse its turn;
    one that would be saved is over MongoDB's limit and does."""
    settings = Settings(max_event_bytes=40 * 1024 * 1024)
    handler = PersistHandler(
        settings, SequentialBatches(InMemoryHistoryStorage()), cast(PersistedPublisher, None)
    )
    if refused:
        with pytest.raises(DocumentTooLargeError):
            handler._decode(_KEYED, raw)
    else:
        assert handler._decode(_KEYED, raw).response.requestId == "r1"
