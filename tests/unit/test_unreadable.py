"""`storage.unreadable`: raw documents decoded one by one (a refusal names its row), the batch's ledger of
skipped rows, the bounded log-once; and the recall's decoding of raw replies (`MongoHistoryStorage`'s
`recalled_from_raw`, `plain_rows`) skipping what the codec refuses. Invalid UTF-8 is built as raw BSON bytes
here: the MongoDB-wire server of the test stack refuses to store it (a real MongoDB stores what a driver
sends), so the real server's tests (tests/integration/test_unreadable_rows.py) cover the other shapes."""

from __future__ import annotations

import json
import logging
import struct
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from message_history import metrics
from message_history.errors import FatalStorageError, UnreadableRowError
from storage import unreadable
from storage.errors import to_storage_error
from storage.mongo_threads import _thread_doc
from storage.mongodb import MongoHistoryStorage
from storage.raw_rows import decode_row, keys_of
from storage.unreadable import SkipLedger, collecting, skip

T = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
TEXT = '{"format":2,"parts":[{"type":"text","text":"PLACEHOLDER"}]}'


def raw_row(thread: str = "t1", ident: str = "m1", **fields: Any) -> bytes:
    doc: dict[str, Any] = {
        "id": ident,
        "thread_id": thread,
        "resourceId": "r1",
        "role": "user",
        "type": "v2",
        "content": TEXT,
    }
    doc["createdAt"] = T
    doc.update(fields)
    return bson.encode(doc)


def invalid_utf8(raw: bytes, where: bytes = b"PLACEHOLDER") -> bytes:
    """`raw` with `where` (a string's bytes) replaced by as many bytes that are not UTF-8."""
    return raw.replace(where, b"\xff" * len(where))


def nested(depth: int) -> bytes:
    inner = b"\x05\x00\x00\x00\x00"
    for _ in range(depth):
        body = b"\x03a\x00" + inner + b"\x00"
        inner = struct.pack("<i", len(body) + 4) + body
    return inner


def deep_row(depth: int) -> bytes:
    body = raw_row()[4:-1] + b"\x03deep\x00" + nested(depth)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


CODEC_REFUSES: list[tuple[str, bytes, str, object, object]] = [
    ("invalid UTF-8 in content", invalid_utf8(raw_row()), "text", "m1", "t1"),
    ("invalid UTF-8 in the id", invalid_utf8(raw_row(ident="PLACEHOLDER")), "text", "\ufffd" * 11, "t1"),
    ("a date in year 20000", raw_row(createdAt=DatetimeMS(568_971_820_800_000)), "createdAt", "m1", "t1"),
    ("nested past the decoder's depth", deep_row(2000), "nesting", None, None),
    ("truncated", raw_row()[:-7], "bson", None, None),
]


@pytest.mark.parametrize(
    ("raw", "reason", "row_id", "thread_id"),
    [c[1:] for c in CODEC_REFUSES],
    ids=[c[0] for c in CODEC_REFUSES],
)
def test_a_document_the_codec_refuses_is_its_rows_refusal(
    raw: bytes, reason: str, row_id: object, thread_id: object
) -> None:
    with pytest.raises(UnreadableRowError) as caught:
        decode_row(raw, "mastra_messages")
    assert caught.value.reason == reason
    assert caught.value.row_id == row_id  # as far as a lenient decoding reads it
    assert caught.value.thread_id == thread_id


@pytest.mark.parametrize("raw", [c[1] for c in CODEC_REFUSES], ids=[c[0] for c in CODEC_REFUSES])
def test_without_the_guard_the_codec_error_was_systemic(raw: bytes) -> None:
    """The driver decodes a reply with this same codec; its error went through `storage_errors` and became
    `FatalStorageError`, which stops the loop (issue 31)."""
    with pytest.raises(InvalidBSON) as caught:
        bson.decode(raw)
    assert isinstance(to_storage_error(caught.value, "list_messages"), FatalStorageError)


def test_the_recall_decoding_skips_a_row_the_codec_refuses() -> None:
    """A raw reply with an undecodable row: the plain route leaves it to the model route (None), which
    skips it and reads the others; counted and noted for its thread."""
    good = raw_row(ident="g").replace(b"PLACEHOLDER", b"fine text!!")
    bad = invalid_utf8(raw_row(ident="b"))
    assert MongoHistoryStorage.plain_rows([good, bad])[1] is None
    with collecting("recall") as ledger:
        rows = MongoHistoryStorage.recalled_from_raw([good, bad])
    assert [m.id for m in rows] == ["g"]
    assert ledger.skipped("t1", 40) == 1
    assert ledger.unreadable("t1", ["b"]) is not None


def test_a_v1_row_in_a_raw_reply_is_read() -> None:
    raw = bson.encode(
        {"id": "v", "thread_id": "t1", "resourceId": "r1", "role": "tool", "createdAt": T,
         "content": json.dumps([{"type": "tool-result", "toolCallId": "c", "toolName": "f", "result": 1}])}
    )  # fmt: skip
    [message] = MongoHistoryStorage.recalled_from_raw([raw])
    assert message.role == "assistant"


def _error(row: str, thread: str = "t1") -> UnreadableRowError:
    return UnreadableRowError("mastra_messages", row, thread, "content", "bad")


LEDGER: list[tuple[str, list[tuple[str, int | None]], int | None, int]] = [
    ("nothing skipped", [], 10, 0),
    ("within the page", [("a", 3)], 10, 1),
    ("past the page", [("a", 12)], 10, 0),
    ("right after a page it pushed out", [("a", 3), ("b", 10)], 10, 2),
    ("at the page's end, pushed out by none", [("a", 10)], 10, 0),
    ("no limit: every ranked row", [("a", 3), ("b", 99)], None, 2),
    ("a look-up by id is no history", [("a", None)], 10, 0),
    ("the same row twice counts once", [("a", 3), ("a", 3)], 10, 1),
    ("the lower rank wins", [("a", 30), ("a", 2)], 10, 1),
]


@pytest.mark.parametrize(("notes", "limit", "expected"), [c[1:] for c in LEDGER], ids=[c[0] for c in LEDGER])
def test_ledger_counts_the_rows_a_page_went_past(
    notes: list[tuple[str, int | None]], limit: int | None, expected: int
) -> None:
    ledger = SkipLedger("recall")
    for row, rank in notes:
        ledger.note(_error(row), rank)
    assert ledger.skipped("t1", limit) == expected
    assert ledger.skipped("other", limit) == 0


def test_a_row_is_logged_once_and_the_memory_is_bounded(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unreadable, "_LOGGED_MAX", 3)
    monkeypatch.setattr(unreadable, "_logged", type(unreadable._logged)())
    counter = metrics.UNREADABLE_ROWS.labels(path="other", collection="mastra_messages", reason="content")
    before = counter._value.get()
    with caplog.at_level(logging.WARNING, logger="storage.unreadable"):
        for _ in range(5):
            skip(_error("x"))
        for n in range(10):
            skip(_error(f"y{n}"))
    lines = [r for r in caplog.records if r.name == "storage.unreadable"]
    assert [getattr(r, "row_id", None) for r in lines] == ["x", *(f"y{n}" for n in range(10))]
    assert getattr(lines[0], "thread_id", None) == "t1"
    assert len(unreadable._logged) == 3  # bounded
    assert counter._value.get() == before + 15  # every skip counted


def test_a_thread_row_the_codec_refuses_is_read_leniently_for_its_owner() -> None:
    """Invalid UTF-8 in a thread's title: counted as unreadable, read with it replaced, the owner kept (the
    owner check needs the row; a `resourceId` so read is no one's, so it refuses rather than admits)."""
    raw = bson.encode(
        {"id": "th", "resourceId": "r1", "title": "PLACEHOLDER", "metadata": {}, "createdAt": T}
    )
    bad = RawBSONDocument(invalid_utf8(raw))
    counter = metrics.UNREADABLE_ROWS.labels(path="other", collection="mastra_threads", reason="text")
    before = counter._value.get()
    doc = _thread_doc(bad)
    assert doc is not None
    assert (doc["id"], doc["resourceId"], doc["title"]) == ("th", "r1", "\ufffd" * 11)
    assert counter._value.get() == before + 1
    assert _thread_doc(RawBSONDocument(deep_row(2000))) is None  # not even leniently: not found


# --- forget and prune: the keys of a row to delete ---------------------------------------------------------

KEYS_REFUSED: list[tuple[str, bytes, str, dict[str, Any]]] = [
    (
        "invalid UTF-8 in the id",
        invalid_utf8(bson.encode({"_id": 7, "id": "PLACEHOLDER"})),
        "text",
        {"_id": 7, "id": "\ufffd" * 11},
    ),
    (
        "an _id in year 20000",
        bson.encode({"_id": DatetimeMS(568_971_820_800_000), "id": "m1"}),
        "createdAt",
        {"_id": DatetimeMS(568_971_820_800_000), "id": "m1"},  # its exact milliseconds: a delete finds it
    ),
]


@pytest.mark.parametrize(
    ("raw", "reason", "expected"), [c[1:] for c in KEYS_REFUSED], ids=[c[0] for c in KEYS_REFUSED]
)
def test_a_row_to_delete_the_codec_refuses_is_counted_and_keeps_its_id(
    raw: bytes, reason: str, expected: dict[str, Any]
) -> None:
    """Forget's and prune's finds: a refused row is counted as unreadable, and its `_id` read so that a
    delete by it finds the row (the strict decoding raised, and the forget stopped as `FatalStorageError`)."""
    with pytest.raises(InvalidBSON) as caught:
        bson.decode(raw)
    assert isinstance(to_storage_error(caught.value, "forget messages"), FatalStorageError)
    counter = metrics.UNREADABLE_ROWS.labels(path="other", collection="mastra_messages", reason=reason)
    before = counter._value.get()
    assert keys_of(RawBSONDocument(raw), "mastra_messages") == expected
    assert counter._value.get() == before + 1


def test_a_readable_row_to_delete_is_decoded_and_not_counted() -> None:
    counter = metrics.UNREADABLE_ROWS.labels(path="other", collection="mastra_messages", reason="text")
    before = counter._value.get()
    raw = RawBSONDocument(bson.encode({"_id": 7, "id": "m1"}))
    assert keys_of(raw, "mastra_messages") == {"_id": 7, "id": "m1"}
    assert keys_of(RawBSONDocument(deep_row(2000)), "mastra_messages") is None
    assert counter._value.get() == before
