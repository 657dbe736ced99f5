"""`storage.row_codec`: the Python reference answers as `row_from_doc` does, and the codec is chosen safely.

The reference is checked here against today's per-row rule (`row_from_doc` on the document as the service's
collections decode it); the native codec against the reference in tests/unit/test_row_codec_native.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import bson
import pytest

from message_history.app.service import open_storage
from message_history.core.recall_plan import PlainRow
from message_history.errors import StartupError
from message_history.settings import Settings
from storage import row_codec
from storage.client import CODEC
from storage.documents import message_from_doc
from storage.recalled_rows import row_from_doc
from storage.row_codec import codec_fingerprint, rows_from_raw_py, select_codec
from tests.recall_docs import stored_docs

THREAD, OWNER = "t-codec", "r-codec"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _expected(raw: bytes) -> PlainRow | None:
    """Today's answer: the document as the service reads it, through `row_from_doc`."""
    doc = bson.decode(raw, codec_options=CODEC)
    row = row_from_doc(doc, message_from_doc)
    if row is None:
        return None
    assert row.id is not None
    assert row.createdAt is not None
    ms = (row.createdAt - EPOCH) // timedelta(milliseconds=1)
    return (row.id, ms, row.role, row.type, row.enriched_json("memory"))


def test_the_reference_answers_as_row_from_doc() -> None:
    taken = refused = 0
    for seed in range(200):
        raws = [bson.encode(doc) for doc in stored_docs(seed, 20, THREAD, OWNER)]
        got = rows_from_raw_py(raws)
        for raw, row in zip(raws, got, strict=True):
            assert row == _expected(raw)
            taken += row is not None
            refused += row is None
    assert taken > 2000  # most rows are plain ...
    assert refused > 300  # ... and the odd ones are left to the model path


def test_the_header_fields_are_the_rows() -> None:
    created = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    doc = {
        "id": "m1",
        "thread_id": "t",
        "resourceId": "r",
        "role": "assistant",
        "type": "v2",
        "content": '{"format":2,"parts":[{"type":"text","text":"hi"}]}',
        "createdAt": created,
    }
    [row] = rows_from_raw_py([bson.encode(doc)])
    assert row == (
        "m1",
        int(created.timestamp() * 1000),
        "assistant",
        None,
        b'{"id":"m1","role":"assistant","createdAt":"2025-01-02T03:04:05.678Z","threadId":"t",'
        b'"resourceId":"r","content":{"format":2,"parts":[{"type":"text","text":"hi"}]},"source":"memory"}',
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x05\x00\x00\x00",  # no terminator
        bson.encode({"id": "m"})[:-1] + b"\x01",  # a wrong terminator
        bson.encode({"id": "m"}) + b"\x00",  # trailing bytes
        bson.encode({"id": "m"}).replace(b"m", b"\xff"),  # not UTF-8
        # a date past year 9999: the driver cannot decode it
        b"\x17\x00\x00\x00\x09createdAt\x00" + (253402300800000).to_bytes(8, "little", signed=True) + b"\x00",
    ],
    ids=["empty", "truncated", "terminator", "trailing", "utf8", "date-range"],
)
def test_a_malformed_document_is_none_not_an_error(raw: bytes) -> None:
    assert rows_from_raw_py([raw]) == [None]


def test_python_is_the_reference() -> None:
    assert select_codec("python") is rows_from_raw_py


def _fake_native(fingerprint: str) -> Any:
    def rows(docs: Any) -> list[Any]:
        return [("native", 0, "user", None, b"{}") if i == 0 else None for i, _ in enumerate(docs)]

    return SimpleNamespace(FINGERPRINT=fingerprint, rows_from_raw=rows)


def test_a_native_module_built_from_other_models_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(row_codec, "_native", lambda: _fake_native("0" * 64))
    with caplog.at_level(logging.WARNING, logger="storage.row_codec"):
        assert select_codec("auto") is rows_from_raw_py
    assert "built from other models" in caplog.text
    with pytest.raises(StartupError, match="built from other models"):
        select_codec("native")


def test_a_current_native_module_is_used_and_the_reference_decides_its_nones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(row_codec, "_native", lambda: _fake_native(codec_fingerprint()))
    raws = [bson.encode(doc) for doc in stored_docs(1, 3, THREAD, OWNER)]
    got = select_codec("auto")(raws)
    assert got[0] == ("native", 0, "user", None, b"{}")  # the native answer stands
    assert got[1:] == rows_from_raw_py(raws[1:])  # its None: the reference's answer


def test_native_required_but_missing_stops_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_codec, "_native", lambda: None)
    assert select_codec("auto") is rows_from_raw_py
    with pytest.raises(StartupError, match="not installed"):
        select_codec("native")


def test_the_fingerprint_follows_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    before = codec_fingerprint()
    monkeypatch.setattr(row_codec, "_KNOWN_PARTS", frozenset({"text", "new-part"}))
    assert codec_fingerprint() != before


async def test_the_service_chooses_the_codec_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """`open_storage` (service start-up) selects the codec before connecting: `native` without it stops."""
    monkeypatch.setattr(row_codec, "_native", lambda: None)
    with pytest.raises(StartupError, match="not installed"):
        async with open_storage(Settings(row_codec="native")):
            pass  # pragma: no cover -- never reached
    monkeypatch.setattr(row_codec, "_native", lambda: _fake_native("0" * 64))
    monkeypatch.setattr(row_codec, "_selected", None)
    with pytest.raises(StartupError, match="built from other models"):
        async with open_storage(Settings(row_codec="native")):
            pass  # pragma: no cover -- never reached


def test_rows_from_raw_takes_the_reference_when_the_native_module_is_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESSAGE_HISTORY_ROW_CODEC", "auto")
    monkeypatch.setattr(row_codec, "_native", lambda: _fake_native("0" * 64))
    monkeypatch.setattr(row_codec, "_selected", None)  # chosen at first use
    raws = [bson.encode(doc) for doc in stored_docs(2, 3, THREAD, OWNER)]
    assert row_codec.rows_from_raw(raws) == rows_from_raw_py(raws)  # not the fake's "native" row
