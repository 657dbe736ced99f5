"""Raw `mastra_messages` documents straight to recalled rows' bytes: `rows_from_raw`.

The recall path reads replies as raw BSON and wants, per plain row, the enriched message's JSON (the bytes
`RecalledRow.enriched_json("memory")` gives) plus the few header fields the rules order and dedupe by. Two
implementations give the same answer:

- `rows_from_raw_py`, the reference: decodes each document as the service's collections do (`bson`, aware
  UTC dates) and asks `storage.recalled_rows.row_from_doc` (so it is today's rule by construction);
- the native one (`message_history_native`, a Rust extension in `native/`, built by `stack install --all`
  and in the image), used when it is installed, allowed by `MESSAGE_HISTORY_ROW_CODEC`, and built from the
  models of this checkout (its compiled `FINGERPRINT` equals `codec_fingerprint()`). Where it is not sure it
  answers None, and the reference decides that row; so it can only ever be narrower, never different.

`tests/unit/test_row_codec_native.py` compares both byte for byte on generated and Mastra-written rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import json
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, ParamSpec, TypeVar, get_args

import bson
from bson.codec_options import CodecOptions

import schemas.canonical
from message_history import metrics
from message_history.core.recall_plan import PlainPage, PlainRow
from message_history.errors import StartupError
from message_history.settings import Settings
from schemas.events import EnrichedMessage
from schemas.messages import _KNOWN_PARTS, Message, MessageContent, Role, ToolState, format_timestamp
from storage.raw_batches import Bytes, array_documents_py
from storage.recalled_rows import row_from_doc

__all__ = [
    "NATIVE_MODULE",
    "Owner",
    "RowCodec",
    "array_documents",
    "codec_fingerprint",
    "group_rows",
    "owners_from_raw",
    "owners_from_raw_py",
    "plain_page_of",
    "rows_from_raw",
    "rows_from_raw_py",
    "select_codec",
    "use_codec",
]

log = logging.getLogger(__name__)

RowCodec = Literal["auto", "native", "python"]
Owner = tuple[str, str | None]
"""A raw message row's top-level `thread_id` and `resourceId` (None: absent or not a string)."""
InputKey = tuple[int | None, str]
"""An input message's sort key as `rules.sort_key` orders it: its `createdAt` in ms since the epoch (None:
undated, after every stored row) and its id (`""`: none)."""
Fused = tuple[int, int, list[bytes]]
"""`plain_runs`' answer: how many rows the page gives (`len(rows_from_raw(docs)[:read])`), how many it
recalls, and `plain_page`'s runs."""
Wanted = tuple[str, str | None, int | None]
"""A thread a `$in` recall reads: its id, the resource its rows must name (None: any), its limit (None: all
rows)."""
NATIVE_MODULE: Final = "message_history_native"
P = ParamSpec("P")
R = TypeVar("R")

# As storage/client.py's CODEC: the reference reads a document exactly as the service's collections do.
_DECODE: Final[CodecOptions[dict[str, Any]]] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)


def _no_model(doc: Any) -> Message:
    raise AssertionError("rows_from_raw never materializes a row")  # pragma: no cover -- never called


def rows_from_raw_py(docs: Sequence[bytes]) -> list[PlainRow | None]:
    """Per raw document, its `PlainRow` when `row_from_doc` builds a `RecalledRow` for it, else None."""
    out: list[PlainRow | None] = []
    for raw in docs:
        try:
            doc = bson.decode(raw, codec_options=_DECODE)
        except Exception:  # noqa: BLE001 -- any malformed document is the model path's to refuse
            out.append(None)
            continue
        row = row_from_doc(doc, _no_model)
        if row is None:
            out.append(None)
            continue
        created = doc["createdAt"]
        ms = (created - _EPOCH) // _MS
        out.append((row.id, ms, row.role, row.type, row.enriched_json("memory")))  # type: ignore[arg-type]
    return out


def codec_fingerprint() -> str:
    """What the native codec mirrors, hashed: a change here means the crate must be reviewed and rebuilt.

    The JSON schemas of the models whose output it writes, the literal tables it checks against, and the
    source of the rules it reimplements (the canonical check, the per-row decision, the timestamp format).
    """
    mirrored = {
        "schemas": {
            model.__name__: model.model_json_schema(mode="serialization")
            for model in (Message, MessageContent, EnrichedMessage)
        },
        "roles": list(get_args(Role)),
        "tool_states": list(get_args(ToolState)),
        "parts": sorted(_KNOWN_PARTS),
        "sources": [
            inspect.getsource(schemas.canonical),
            inspect.getsource(row_from_doc),
            inspect.getsource(format_timestamp),
        ],
    }
    text = json.dumps(mirrored, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _native() -> Any | None:
    try:
        return importlib.import_module(NATIVE_MODULE)
    except ImportError:
        return None


def select_codec(mode: RowCodec = "auto") -> Callable[[Sequence[bytes]], list[PlainRow | None]]:
    """The `rows_from_raw` implementation `mode` allows, checked against this checkout's models.

    `python`: the reference. `auto`: the native codec when installed and built from these models, else the
    reference (a WARNING when installed but stale). `native`: the native codec, or StartupError.
    """
    if mode == "python":
        return rows_from_raw_py
    module = _native()
    if module is None:
        if mode == "native":
            raise StartupError(
                f"MESSAGE_HISTORY_ROW_CODEC=native but {NATIVE_MODULE} is not installed (stack install --all)"
            )
        return rows_from_raw_py
    expected = codec_fingerprint()
    if expected != module.FINGERPRINT:
        message = (
            f"{NATIVE_MODULE} was built from other models (fingerprint {module.FINGERPRINT[:12]}, "
            f"these models {expected[:12]}): recalled rows take the Python reference"
        )
        if mode == "native":
            raise StartupError(message)
        log.warning(message)
        return rows_from_raw_py
    return _with_reference(module.rows_from_raw)


_PASS_THROUGH: Final = (KeyboardInterrupt, SystemExit, asyncio.CancelledError, GeneratorExit)
"""What the native codec's failures never swallow: the process' and the task's own stop signals."""

native_failures = 0
"""How many batches the native codec failed (raised or panicked) and the reference decided instead."""


def _native_failed(error: BaseException) -> None:
    global native_failures  # noqa: PLW0603 -- a process-wide count
    native_failures += 1
    metrics.NATIVE_CODEC_FAILURES.inc()
    if native_failures == 1:  # once: a bug that fails every batch must not flood the log
        log.error(
            "the native row codec failed; the Python reference decides this batch (and any other it fails)",
            exc_info=error,
        )


def _with_reference(
    native: Callable[[Sequence[bytes]], list[PlainRow | None]],
) -> Callable[[Sequence[bytes]], list[PlainRow | None]]:
    """`native`, with the reference deciding every row it is not sure about (its None), and the whole batch
    when it fails: any exception, and a Rust panic too (PyO3 raises `PanicException`, a `BaseException`
    that would pass every `except Exception` and end the process)."""

    def rows(docs: Sequence[bytes]) -> list[PlainRow | None]:
        try:
            out = native(docs)
        except _PASS_THROUGH:
            raise
        except BaseException as error:  # noqa: BLE001 -- see the docstring: the reference decides
            _native_failed(error)
            return rows_from_raw_py(docs)
        for i, row in enumerate(out):
            if row is None:
                out[i] = rows_from_raw_py((docs[i],))[0]
        return out

    return rows


def owners_from_raw_py(docs: Sequence[bytes]) -> list[Owner | None]:
    """The reference: not sure of any row (`storage.raw_owner.RawOwner` reads each)."""
    return [None] * len(docs)


def _native_or(mode: RowCodec, name: str, reference: Callable[P, R]) -> Callable[P, R]:
    """The native module's function `name` when it is installed, has it and `mode` is not `python`, else
    `reference`; a call that fails (an exception, a Rust panic: PyO3's `PanicException` is a
    `BaseException`) is counted as the codec's and answered by `reference` with the same arguments. For the
    walks that mirror no model (they read BSON elements), so a stale fingerprint does not matter."""
    module = _native() if mode != "python" else None
    native: Callable[P, R] | None = getattr(module, name, None)
    if native is None:
        return reference
    walk = native  # bound for the closure (mypy keeps `native` optional inside it)

    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return walk(*args, **kwargs)
        except _PASS_THROUGH:
            raise
        except BaseException as error:  # noqa: BLE001 -- as `_with_reference`: the reference decides
            _native_failed(error)
            return reference(*args, **kwargs)

    return guarded


def select_owners(mode: RowCodec = "auto") -> Callable[[Sequence[bytes]], list[Owner | None]]:
    """`owners_from_raw`'s implementation (`_native_or`): the native walk, else the reference."""
    return _native_or(mode, "owners_from_raw", owners_from_raw_py)


def no_grouping(docs: Sequence[bytes], wanted: Sequence[Wanted]) -> list[list[bytes]] | None:
    """Where the native module is not there: not grouped here (`storage.mongo_recall.group_rows_py`, the
    reference, groups every batch)."""
    return None


def select_group(
    mode: RowCodec = "auto",
) -> Callable[[Sequence[bytes], Sequence[Wanted]], list[list[bytes]] | None]:
    """`group_rows`' implementation (`_native_or`): the native grouping, else `no_grouping` (a failed
    call too: the reference then groups that batch)."""
    return _native_or(mode, "group_rows", no_grouping)


def select_split(mode: RowCodec = "auto") -> Callable[[Bytes, int, int], list[bytes] | None]:
    """`array_documents`' implementation (`_native_or`): the native cut, else the reference (also for
    bounds the native cut refuses with a `ValueError`)."""
    return _native_or(mode, "array_documents", array_documents_py)


_PlainRuns = Callable[[Sequence[bytes], int, int, Sequence[InputKey], Sequence[str]], Fused | None]


def no_fusing(
    docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[InputKey], incoming_ids: Sequence[str]
) -> Fused | None:
    """Where the native codec is not taken: nothing decided here (the caller reads the rows with
    `rows_from_raw` and decides with `plain_page`, the reference)."""
    return None


def select_plain_runs(
    mode: RowCodec = "auto", codec: Callable[[Sequence[bytes]], list[PlainRow | None]] | None = None
) -> _PlainRuns:
    """`plain_runs`' implementation: the native one wherever the native codec is taken (`codec`, what
    `select_codec(mode)` chose: `plain_runs` writes each row's JSON as `rows_from_raw` does, so it must be
    built from these models), else `no_fusing`; a failed call is counted and answered by `no_fusing`
    (`_native_or`)."""
    if (select_codec(mode) if codec is None else codec) is rows_from_raw_py:
        return no_fusing
    return _native_or(mode, "plain_runs", no_fusing)


_selected: Callable[[Sequence[bytes]], list[PlainRow | None]] | None = None
_selected_plain: _PlainRuns | None = None
_selected_owners: Callable[[Sequence[bytes]], list[Owner | None]] | None = None
_selected_split: Callable[[Bytes, int, int], list[bytes] | None] | None = None
_selected_group: Callable[[Sequence[bytes], Sequence[Wanted]], list[list[bytes]] | None] | None = None


def rows_from_raw(docs: Sequence[bytes]) -> list[PlainRow | None]:
    """Per raw BSON document of the messages collection (fields of MESSAGE_PROJECTION), its PlainRow when
    storage/recalled_rows.py would build a RecalledRow for it (the plain shape, canonical content), else None
    (the caller takes the model path for that row). Never raises for a malformed row: None.

    The implementation is chosen once, at first use, with `MESSAGE_HISTORY_ROW_CODEC` (`select_codec`);
    the service chooses it at start-up with `use_codec`.
    """
    global _selected  # noqa: PLW0603 -- chosen once per process
    if _selected is None:
        _selected = select_codec(_mode_from_env())
    return _selected(docs)


def plain_page_of(
    docs: Sequence[bytes], read: int, limit: int, incoming: Sequence[Message]
) -> tuple[PlainPage, int] | None:
    """`plain_page(rows_from_raw(docs)[:read], limit, incoming)` and how many rows that slice holds, decided
    in one native call with no Python object per row (`message_history_native.plain_runs`), when the codec is
    sure of every document of `docs` and the page qualifies; None otherwise (the native codec not taken, a
    row it is not sure of, a page that does not qualify, an input time not a UTC instant in whole ms): the
    caller then reads the rows and asks `plain_page`, which decides. Never raises for a malformed row."""
    global _selected, _selected_plain  # noqa: PLW0603 -- chosen once per process
    if _selected_plain is None:
        mode = _mode_from_env()
        if _selected is None:
            _selected = select_codec(mode)
        _selected_plain = select_plain_runs(mode, _selected)
    if _selected_plain is no_fusing:
        return None
    keys: list[InputKey] = []
    for message in incoming:
        when = message.createdAt
        if when is None:
            keys.append((None, message.id or ""))
            continue
        if when.tzinfo is not UTC:
            return None  # every validated time is UTC; anything else is the reference's to compare
        ms, rest = divmod(when - _EPOCH, _MS)
        if rest:
            return None  # finer than a stored time: the reference compares it exactly
        keys.append((ms, message.id or ""))
    ids = [m.id for m in incoming if m.id is not None]
    answer = _selected_plain(docs, read, limit, keys, ids)
    if answer is None:
        return None
    count, recalled, runs = answer
    return PlainPage(tuple(runs), recalled), count


def owners_from_raw(docs: Sequence[bytes]) -> list[Owner | None]:
    """Per raw message document, its `(thread_id, resourceId)` where the native walk is sure (a decoded
    document would give the same: the last element of a name, top level only), else None (`RawOwner` reads
    that row). Never raises for a malformed row."""
    global _selected_owners  # noqa: PLW0603 -- chosen once per process
    if _selected_owners is None:
        _selected_owners = select_owners(_mode_from_env())
    return _selected_owners(docs)


def group_rows(docs: Sequence[bytes], wanted: Sequence[Wanted]) -> list[list[bytes]] | None:
    """A `$in` recall reply's rows per `wanted` thread (in its order): the rows it answers, at most its limit,
    in reply order, when the native walk is sure of every row's owner (`group_rows_py` would give the same);
    None when it is not, or is not installed: then `group_rows_py` groups the batch. Never raises for a
    malformed row."""
    global _selected_group  # noqa: PLW0603 -- chosen once per process
    if _selected_group is None:
        _selected_group = select_group(_mode_from_env())
    return _selected_group(docs, wanted)


def array_documents(payload: Bytes, start: int, end: int) -> list[bytes] | None:
    """The documents of the BSON array at `payload[start:end]` (a `find` reply's batch), each as bytes, or
    None when the bytes do not make that certain (`storage.raw_batches.cut_batch` then leaves the reply to
    PyMongo). Never raises for malformed bytes."""
    global _selected_split  # noqa: PLW0603 -- chosen once per process
    if _selected_split is None:
        _selected_split = select_split(_mode_from_env())
    return _selected_split(payload, start, end)


def use_codec(mode: RowCodec) -> None:
    """Choose `rows_from_raw`'s implementation now (start-up), so a stale native module is logged early."""
    global _selected, _selected_owners, _selected_split, _selected_group, _selected_plain  # noqa: PLW0603
    _selected = select_codec(mode)
    _selected_plain = select_plain_runs(mode, _selected)  # the codec's decision, its fingerprint read once
    _selected_owners = select_owners(mode)
    _selected_group = select_group(mode)
    _selected_split = select_split(mode)


def _mode_from_env() -> RowCodec:
    return Settings().row_codec


if __name__ == "__main__":  # `python -m storage.row_codec`: the fingerprint native/src/fingerprint.rs holds
    sys.stdout.write(codec_fingerprint() + "\n")
