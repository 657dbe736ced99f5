"""Stored rows read as Mastra 1.71 reads them: the table of tests/unit/test_stored_rows.py, row by row,
through @mastra/mongodb's `parseRow` and `MessageList.add(rows, "memory")` under Node
(tests/interop/mastra-core/stored_rows.mjs, on the pinned 1.71.0 of tests/interop/mastra-core/v1).

Every row the service reads gives the message Mastra gives (its `createdAt` compared as an instant), except
a memory `system` row, which Mastra's `add` drops and the service drops (docs/rules.md#r4), and the
service's own `_mh_extra` keys, which Mastra never reads. Every row the service refuses is one Mastra throws
on or one docs/rules.md#stored-rows lists as skipped where Mastra reads it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from message_history.errors import UnreadableRowError
from schemas.stored_rows import read_message
from tests.interop.test_mastra_core_interop import HERE, _run
from tests.unit.test_stored_rows import READ, REFUSED

pytestmark = pytest.mark.interop

V1 = HERE / "v1"  # @mastra/core 1.71.0

# Refused here, read by Mastra (docs/rules.md#stored-rows says why each is skipped instead)
READ_BY_MASTRA_ONLY = {
    "role missing",
    "role unknown",
    "role tool on a v2 row",
    "content an object without format 2",
    "parts not a list",
    "parts missing",
    "lone surrogate",
    "lone surrogate, v1",
    "id an int",
    "id missing",
    "id null",
    "type 5",
    "createdAt yesterday",
    "createdAt null",
    "createdAt missing",
    "createdAt year 20000 as text",
    "createdAt a number",
    "content nested past the JSON parser's limit",
}


def _js(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in doc.items()}


def _mastra(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = _run(
        V1, "stored_rows.mjs", str(V1), stdin=json.dumps([_js(d) for d in docs]).encode()
    )
    return out


def test_rows_the_service_reads_are_what_mastra_recalls() -> None:
    docs = [doc for _, doc, _ in READ]
    for (name, doc, _), theirs in zip(READ, _mastra(docs), strict=True):
        mine = read_message(doc).wire()
        assert "ok" in theirs, (name, theirs)
        if doc["role"] == "system":
            assert theirs["ok"] == [], name  # dropped by Mastra's add, here by docs/rules.md#r4
            continue
        [message] = theirs["ok"]
        assert datetime.fromisoformat(message.pop("createdAt")) == datetime.fromisoformat(
            mine.pop("createdAt")
        )
        for key in set(mine) - set(message):
            assert key not in ("id", "role", "content", "type", "threadId", "resourceId"), (name, key)
            mine.pop(key)  # `_mh_extra`'s keys: the service's own column
        assert mine == message, name


def test_rows_the_service_skips_are_ones_mastra_fails_on_or_listed() -> None:
    docs = [doc for _, doc, _ in REFUSED]
    for (name, doc, _), theirs in zip(REFUSED, _mastra(docs), strict=True):
        with pytest.raises(UnreadableRowError):
            read_message(doc)
        if name in READ_BY_MASTRA_ONLY:
            assert "ok" in theirs, (name, theirs)
        else:
            assert "error" in theirs, (name, theirs)
