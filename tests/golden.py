"""Golden outputs of the recall and the persist path: today's bytes, pinned, so a rewrite of either is proven
byte-identical (issue 25: "outputs byte-identical to today's on the rule tables, the interop fixtures and
generated threads").

A case (built by tests/golden_cases.py) is plain JSON: settings overrides, stored threads, tombstones, and
batches of input records (their exact value bytes). `run_case` plays it through tests/paths.py (the real
handlers, the in-memory storage unless given another, recording publishers) and returns what came out: per
batch the records sent (topic, key, value bytes, headers; grouped by key, each key's in send order: across
threads the order is no promise) and the dead letters (error type, message, retriable), then the busy
markers answered and every touched thread as stored (the thread and its rows as `mastra_messages` documents,
`storage.save_plan.message_write`).

The committed file (tests/data/golden/paths.jsonl.gz) holds each case's input *and* its output, so the replay
(tests/unit/test_golden_paths.py) does not depend on the corpus generator staying the same: only `record`
reads tests/golden_cases.py.

    .venv/bin/python -m tests.golden record   # rewrite the goldens from the current handlers

Time: the one clock the outputs can see is pinned, not normalised after the fact (`frozen_clock`): a
thread's `updatedAt` after a metadata write is "now" (storage.memory); every other output field comes from the
events and the stored rows.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import schemas.messages
from consumers.contract import Refused, settled
from message_history.errors import MessageHistoryError
from message_history.settings import Settings
from schemas.messages import Message, format_timestamp
from storage.protocol import BatchHistoryStorage
from storage.save_plan import message_write
from tests.paths import FakeRecord, Paths

GOLDEN_FILE = Path(__file__).parent / "data" / "golden" / "paths.jsonl.gz"
FROZEN_NOW = datetime(2030, 6, 15, 12, 0, 0, 123000, tzinfo=UTC)
"""The pinned wall clock: later than every stored instant of the corpus, as a real clock would be."""


# --- the clock ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def frozen_clock(now: datetime = FROZEN_NOW) -> Iterator[None]:
    """The project's clock (`schemas.messages.utc_now_ms`) returns `now`, in every loaded module that holds
    it by name. Of the two paths' outputs only a thread's `updatedAt` after a metadata write (the boundary a
    token-limited recall stores) reads it: 58 cases differ when it is not pinned, none otherwise (other
    clock reads, e.g. `consumers.collect`'s provisional thread times, never reach an output)."""
    original = schemas.messages.utc_now_ms
    with contextlib.ExitStack() as stack:
        for module in list(sys.modules.values()):
            if module is not None and getattr(module, "utc_now_ms", None) is original:
                stack.enter_context(mock.patch.object(module, "utc_now_ms", return_value=now))
        yield


def settings_of(overrides: dict[str, Any]) -> Settings:
    """Settings from the case's overrides only: `MESSAGE_HISTORY_*` variables of the environment ignored."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    with mock.patch.dict(os.environ, clean, clear=True):
        return Settings(**overrides)


# --- bytes in the file ---------------------------------------------------------------------------------


def pack(raw: bytes | None) -> str | dict[str, str] | None:
    """Bytes as JSON: text when they are UTF-8, else base64."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode()}


def unpack(value: str | dict[str, str] | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return base64.b64decode(value["b64"])
    return value.encode("utf-8")


# --- one case ----------------------------------------------------------------------------------------


def _dead(error: BaseException) -> dict[str, Any]:
    retriable = error.retriable if isinstance(error, MessageHistoryError) else None
    return {"type": type(error).__name__, "message": str(error), "retriable": retriable}


def _document(row: Message, thread_id: str) -> dict[str, Any]:
    """A stored row as the `mastra_messages` document a save writes for it."""
    write = message_write(row, thread_id, row.resourceId or "", FROZEN_NOW)
    doc: dict[str, Any] = {**write.fields, "createdAt": format_timestamp(write.created)}
    if write.extra is not None:
        doc["_mh_extra"] = write.extra
    return doc


async def _play(case: dict[str, Any], storage: BatchHistoryStorage | None = None) -> dict[str, Any]:
    paths = Paths(settings_of(case.get("settings", {})), storage)
    threads: dict[str, None] = {}
    for stored in case.get("stored", []):
        thread_id = stored["thread"]
        threads[thread_id] = None
        messages = [Message.model_validate_json(m) for m in stored["messages"]]
        if messages:
            await paths.storage.save_messages(
                thread_id=thread_id, resource_id=stored["resource"], messages=messages
            )
        if stored.get("metadata"):
            await paths.storage.save_thread_metadata(thread_id, stored["metadata"])
    for thread_id, seconds in case.get("forgotten_threads", {}).items():
        paths.tombstones.forget_thread(thread_id, seconds)
    for resource_id, seconds in case.get("forgotten_resources", {}).items():
        paths.tombstones.forget_resource(resource_id, seconds)

    batches: list[dict[str, Any]] = []
    offsets = {"recall": 0, "persist": 0}
    for batch in case["batches"]:
        path = batch["path"]
        handler = paths.recall_handler if path == "recall" else paths.persist_handler
        topic = paths.settings.requests_topic if path == "recall" else paths.settings.responses_topic
        records: list[FakeRecord] = []
        for record in batch["records"]:
            key = unpack(record.get("key"))
            if key:
                threads[key.decode("utf-8", "replace")] = None
            records.append(
                FakeRecord(topic, 0, offsets[path], key, unpack(record["value"]), [("trace", b"t")])
            )
            offsets[path] += 1
        first = len(paths.producer.sent)
        out: dict[str, Any] = {}
        try:
            results = [await settled(result) for result in await handler.handle(records, paths.emit)]
        except Exception as exc:  # a record meeting a bug: pinned too, so a rewrite cannot change it unseen
            out["raised"] = _dead(exc)
        else:
            dead: dict[str, Any] = {}
            for index, result in enumerate(results):
                if isinstance(result, Refused):
                    dead[str(index)] = _dead(result.error)
                else:
                    await result.sent
            out["dead"] = dead
        out["sent"] = [
            {
                "topic": s.topic,
                "key": pack(s.key),
                "value": pack(s.value),
                "headers": [[k, pack(v)] for k, v in s.headers],
            }
            # per thread in send order; across threads the order is no promise (threads run concurrently)
            for s in sorted(paths.producer.sent[first:], key=lambda s: s.key or b"")
        ]
        batches.append(out)

    stored_after: dict[str, Any] = {}
    for thread_id in threads:
        if not thread_id:
            continue
        thread = await paths.storage.get_thread(thread_id)
        if thread is None:
            continue
        rows = await paths.storage.list_messages(thread_id, resource_id=None, limit=None)
        stored_after[thread_id] = {
            "resourceId": thread.resourceId,
            "title": thread.title,
            "metadata": thread.metadata,
            "createdAt": format_timestamp(thread.createdAt) if thread.createdAt else None,
            "updatedAt": format_timestamp(thread.updatedAt) if thread.updatedAt else None,
            "rows": [_document(r, thread_id) for r in rows],
        }
    answered = paths.markers.answered_ids()
    return {
        "batches": batches,
        "answered": {t: answered[t] for t in sorted(answered)},
        "stored": stored_after,
    }


def run_case(case: dict[str, Any], *, now: datetime = FROZEN_NOW) -> dict[str, Any]:
    """What today's (or the current) handlers output for `case`, under a pinned clock."""
    with frozen_clock(now):
        return asyncio.run(_play(case))


async def run_case_async(
    case: dict[str, Any], storage: BatchHistoryStorage | None = None, *, now: datetime = FROZEN_NOW
) -> dict[str, Any]:
    """`run_case` inside a running loop, over `storage` (an empty one) when given."""
    with frozen_clock(now):
        return await _play(case, storage)


# --- the file ----------------------------------------------------------------------------------------


def line(case: dict[str, Any], output: dict[str, Any]) -> str:
    """One case's line: its input and output, keys sorted (compact, and stable to compare)."""
    return json.dumps(
        {"case": case, "output": output}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )


def load(path: Path = GOLDEN_FILE) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(text) for text in handle]


def write(entries: Sequence[tuple[dict[str, Any], dict[str, Any]]], path: Path = GOLDEN_FILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(line(case, output) + "\n" for case, output in entries).encode("utf-8")
    # mtime=0: the same goldens give the same file bytes, so a re-record without a change is no diff
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as handle:
        handle.write(body)


def first_difference(expected: Any, got: Any, where: str = "") -> str | None:
    """The first place two JSON values differ, readably (a JSON text inside is decoded to show where)."""
    if isinstance(expected, str) and isinstance(got, str) and expected != got:
        try:
            inner_expected, inner_got = json.loads(expected), json.loads(got)
        except ValueError:
            inner_expected = inner_got = None
        if isinstance(inner_expected, (dict, list)) and isinstance(inner_got, (dict, list)):
            inner = first_difference(inner_expected, inner_got, where + "<json>")
            if inner is not None:
                return inner
        return f"{where}: bytes differ\n  golden:  {expected[:600]!r}\n  current: {got[:600]!r}"
    if isinstance(expected, dict) and isinstance(got, dict):
        if sorted(expected) != sorted(got):  # the file's keys are sorted; order inside values is compared
            return f"{where}: keys {sorted(expected)} -> {sorted(got)}"
        for key in sorted(expected):
            found = first_difference(expected[key], got[key], f"{where}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        for index, (a, b) in enumerate(zip(expected, got, strict=False)):
            label = f"[{index}]"
            if isinstance(a, dict) and isinstance(b, dict) and ("id" in a or "id" in b):
                label = f"[{index} id {a.get('id')!r}" + (
                    f" -> {b.get('id')!r}]" if a.get("id") != b.get("id") else "]"
                )
            found = first_difference(a, b, where + label)
            if found is not None:
                return found
        if len(expected) != len(got):
            return f"{where}: {len(expected)} items -> {len(got)}"
        return None
    if expected != got or type(expected) is not type(got):
        return f"{where}: {expected!r} -> {got!r}"
    return None


def summary(differing: Sequence[tuple[str, str]], total: int) -> str:
    """A failed replay, readably: how many cases differ, the first one and where, and the next few ids."""
    case_id, where = differing[0]
    others = ", ".join(c for c, _ in differing[1:11]) + (" ..." if len(differing) > 11 else "")
    text = f"{len(differing)} of {total} golden cases differ; first: {case_id}\n  at {where}"
    return text + (f"\nalso: {others}" if others else "")


def record() -> int:
    """Build the corpus, play every case on the current handlers, write the goldens."""
    from tests.golden_cases import build_cases  # noqa: PLC0415 -- only recording builds the corpus

    cases = build_cases()
    ids = [c["id"] for c in cases]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        print(f"duplicate case ids: {sorted(duplicates)}", file=sys.stderr)
        return 1
    # each case as the file will hold it (a JSON round trip), so record and replay play the same input
    cases = [json.loads(json.dumps(c)) for c in cases]
    entries = [(case, run_case(case)) for case in cases]
    write(entries)
    print(f"{len(entries)} cases -> {GOLDEN_FILE} ({GOLDEN_FILE.stat().st_size} bytes)")
    return 0


def main(argv: Sequence[str]) -> int:
    if list(argv) != ["record"]:
        print("usage: python -m tests.golden record", file=sys.stderr)
        return 2
    return record()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
