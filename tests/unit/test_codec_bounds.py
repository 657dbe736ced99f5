"""The recall codecs' bounds (issue 31), pure: a failing native codec never ends the process, and the
canonical check's cache does not grow with wide rows. The native codec's own bounds: test_row_codec_native.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import tracemalloc
from types import SimpleNamespace
from typing import Any

import bson
import pytest

from message_history import metrics
from schemas import canonical
from schemas.canonical import canonical_content
from storage import row_codec
from storage.row_codec import codec_fingerprint, rows_from_raw_py, select_codec
from tests.recall_docs import stored_docs


class _Panic(BaseException):
    """Stands for pyo3_runtime.PanicException: a BaseException, not an Exception."""


def _raising_native(error: BaseException) -> Any:
    def rows(docs: Any) -> list[Any]:
        raise error

    return SimpleNamespace(FINGERPRINT=codec_fingerprint(), rows_from_raw=rows)


def _name(error: BaseException) -> str:
    return type(error).__name__


@pytest.mark.parametrize("error", [_Panic("boom"), RuntimeError("bug"), MemoryError()], ids=_name)
def test_a_failing_native_codec_leaves_the_batch_to_the_reference(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: BaseException
) -> None:
    """Any failure of the native codec, a BaseException too, is counted and the reference decides the batch;
    only the first is logged (a codec that fails every batch must not flood the log)."""
    monkeypatch.setattr(row_codec, "_native", lambda: _raising_native(error))
    monkeypatch.setattr(row_codec, "native_failures", 0)
    counted = metrics.NATIVE_CODEC_FAILURES._value.get()
    raws = [bson.encode(doc) for doc in stored_docs(5, 6, "t-fail", "r-fail")]
    codec = select_codec("native")
    with caplog.at_level(logging.ERROR, logger="storage.row_codec"):
        assert codec(raws) == rows_from_raw_py(raws)
        assert codec(raws) == rows_from_raw_py(raws)
    assert row_codec.native_failures == 2
    assert metrics.NATIVE_CODEC_FAILURES._value.get() == counted + 2  # the metric an alert can read
    assert caplog.text.count("the native row codec failed") == 1


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), SystemExit(1), asyncio.CancelledError(), GeneratorExit()], ids=_name
)
def test_stop_signals_pass_through(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """The process' and the task's own stop signals are not the codec's failures: they go on."""
    monkeypatch.setattr(row_codec, "_native", lambda: _raising_native(error))
    with pytest.raises(type(error)):
        select_codec("native")([bson.encode(stored_docs(1, 1, "t", "r")[0])])


def _wide_content(row: int, keys: int) -> str:
    doc: dict[str, Any] = {"format": 2, "parts": [{"type": "text", "text": "hi"}]}
    doc.update({f"r{row}-key-{i:06d}": i for i in range(keys)})  # unknown keys: part of the shape
    return json.dumps(doc, separators=(",", ":"))


@pytest.mark.timeout(120)
def test_wide_rows_do_not_grow_the_canonical_cache() -> None:
    """12 rows of 20,000 distinct top-level keys each: the check answers each, and keeps (almost) nothing. The
    shape cache kept every key tuple (16 MB here; 177 MB for 60 rows of 60,000 keys in issue 31)."""
    texts = [_wide_content(row, 20_000) for row in range(12)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert all(canonical_content(text) is not None for text in texts)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 4 * 1024 * 1024  # pydantic-core's own (bounded) string cache is about 1 MiB of it


def test_the_cache_budget_is_in_bytes() -> None:
    """Narrow shapes with long keys stop being cached at the byte budget, not at a count."""
    long_key = "k" * 10_000  # 400 shapes of one such key: 4 MB when each is kept
    texts = [
        json.dumps({"format": 2, "parts": [], f"{long_key}{i}": 0}, separators=(",", ":")) for i in range(400)
    ]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert all(canonical_content(text) is not None for text in texts)
        del texts
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < canonical._PLAN_CACHE_BYTES + 1024 * 1024
