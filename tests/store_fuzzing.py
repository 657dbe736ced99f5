"""Hypothesis generators of stored documents (issue 31, item 3): `mastra_threads` and `mastra_messages` rows
the service did not write: every field's type, range and absence, v1 and v2 shapes, unknown parts, huge and
deep values (bounded, so a CI run stays quick), ids colliding across threads, and raw BSON no model builds.

The database is an input: a Mastra app of any version, an operator or a bug elsewhere writes these. Each
generated row is a `StoredRow`: its label (which generator, which field, which value: a failure says what
broke), the document as PyMongo inserts it (`doc`) and, for what no Python value encodes (invalid UTF-8, a
date past year 9999, nesting past the decoders' limits), the raw BSON bytes (`raw`). Used by
tests/unit/test_fuzz_stored_rows.py (both paths on tests/paths.py over tests/raw_storage.py) and
tests/integration/test_fuzz_stored_rows.py (the service on the real server).

Sizes are bounded by `Sizes`: `QUICK` for CI, `LONG` for the documented long run
(docs/fuzzing.md#stored-rows-the-store-side-fuzzer).
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import bson
from bson import Decimal128, Int64, ObjectId, Regex
from bson.binary import Binary
from hypothesis import strategies as st

T0: Final = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
ABSENT: Final = object()  # as a field value: leave the field out
ROLES: Final = ("user", "assistant", "system", "tool")
COLLIDING: Final = ("dup-a", "dup-b", "dup-c")  # ids several threads' rows share
# BSON strings are UTF-8 and keys C strings: no lone surrogates, no NUL in keys (raw rows carry the rest)
CHARS: Final = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")


def texts(max_size: int, min_size: int = 0) -> st.SearchStrategy[str]:
    return st.text(CHARS, min_size=min_size, max_size=max_size)


@dataclass(frozen=True)
class Sizes:
    """Bounds of the huge and deep values."""

    text: int  # characters of one huge text
    keys: int  # keys of one wide object
    depth: int  # nesting of one deep value (JSON text; the BSON ones stay within what a server stores)


QUICK: Final = Sizes(text=20_000, keys=2_000, depth=3_000)
LONG: Final = Sizes(text=200_000, keys=20_000, depth=20_000)


@dataclass(frozen=True)
class StoredRow:
    """One stored document: `doc` (PyMongo inserts it) or `raw` (BSON bytes no Python value encodes)."""

    label: str
    doc: dict[str, Any] | None = None
    raw: bytes | None = None

    def bson(self) -> bytes:
        """The document's BSON bytes."""
        if self.raw is not None:
            return self.raw
        assert self.doc is not None
        return bson.encode(self.doc)

    def row_id(self) -> Any:
        """The `id` field as stored (None when absent or not decodable)."""
        if self.doc is not None:
            return self.doc.get("id")
        return None

    def __repr__(self) -> str:
        text = repr(self.doc if self.doc is not None else self.raw)
        return f"StoredRow({self.label}: {text[:300]}{'...' if len(text) > 300 else ''})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis prints examples with it
        printer.text(repr(self))


# --- values -------------------------------------------------------------------------------------------------


@functools.cache
def any_bson() -> st.SearchStrategy[Any]:
    """A value of any BSON type PyMongo encodes (small)."""
    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**31), 2**31 - 1),
        st.integers(-(2**63), 2**63 - 1).map(Int64),
        st.floats(allow_nan=True, allow_infinity=True),
        texts(12),
        st.binary(max_size=8).map(Binary),
        st.just(ObjectId("5f0c9f3b9d3e2a1b2c3d4e5f")),
        st.just(Decimal128("1.5")),
        st.just(Regex("^a", "i")),
        st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)),
    )
    return st.recursive(
        scalar,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts(6), inner, max_size=3)),
        max_leaves=6,
    )


def _ms(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def deep_json(depth: int) -> str:
    """`depth` nested arrays as JSON text."""
    return "[" * depth + "]" * depth


def deep_doc(depth: int) -> dict[str, Any]:
    """`depth` nested sub-documents (BSON encodes them; a decoder may refuse the depth)."""
    doc: dict[str, Any] = {}
    for _ in range(depth):
        doc = {"d": doc}
    return doc


# --- parts --------------------------------------------------------------------------------------------------


@functools.cache
def v2_parts(sizes: Sizes) -> st.SearchStrategy[list[Any]]:
    """Format-2 parts: every kind Mastra writes, unknown ones, and broken ones."""
    text = texts(30)
    invocation = st.fixed_dictionaries(
        {"state": st.sampled_from(["call", "result", "partial-call"]), "toolCallId": text, "toolName": text},
        optional={
            "args": any_bson().filter(lambda v: not isinstance(v, bytes)),
            "result": st.integers(-(2**63), 2**63 - 1),
        },
    )
    good = st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.just({"type": "step-start"}),
        st.builds(lambda i: {"type": "tool-invocation", "toolInvocation": i}, invocation),
        st.builds(
            lambda t: {"type": "reasoning", "reasoning": t, "details": [{"type": "text", "text": t}]}, text
        ),
        st.just({"type": "file", "mimeType": "image/png", "data": "iVBORw0KGgo="}),
        st.just({"type": "source", "source": {"sourceType": "url", "id": "s", "url": "https://x"}}),
        st.builds(lambda n: {"type": f"data-{n}", "data": {"n": 1}}, st.sampled_from(["chart", "x"])),
        st.builds(lambda t: {"type": "text", "text": t, "createdAt": 1_740_819_600_000}, text),
    )
    odd = st.one_of(
        st.builds(lambda k: {"type": k, "payload": [1]}, texts(10)),  # unknown kinds
        st.just({"text": "no type"}),
        st.builds(lambda v: {"type": v}, any_bson()),
        st.just({"type": "text"}),  # no text
        st.builds(lambda v: {"type": "text", "text": v}, any_bson()),
        st.just({"type": "tool-invocation"}),
        st.builds(lambda v: {"type": "tool-invocation", "toolInvocation": v}, any_bson()),
        any_bson(),  # not an object
        st.just({"type": "text", "text": "x" * sizes.text}),
    )
    return st.lists(st.one_of(good, good, odd), max_size=5)


@functools.cache
def v1_items(sizes: Sizes) -> st.SearchStrategy[list[Any]]:
    """A v1 content array (AI SDK v4 core parts), good and broken."""
    text = texts(30)
    good = st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.builds(
            lambda c: {"type": "tool-call", "toolCallId": c, "toolName": "fx", "args": {"a": 1}},
            st.sampled_from(["c1", "c2"]),
        ),
        st.builds(
            lambda c, r: {"type": "tool-result", "toolCallId": c, "toolName": "fx", "result": r},
            st.sampled_from(["c1", "c2"]),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), text),
        ),
        st.just({"type": "image", "image": "https://x/cat.png", "mimeType": "image/png"}),
        st.just({"type": "file", "data": "data:text/plain;base64,aGk=", "mimeType": "text/plain"}),
        st.builds(lambda t: {"type": "reasoning", "text": t, "signature": "s"}, text),
        st.just({"type": "redacted-reasoning", "data": "xx"}),
    )
    odd = st.one_of(
        st.just(None),
        st.just({"type": "tool-call", "toolCallId": "c1", "toolName": "fx"}),  # no args
        st.builds(lambda v: {"type": "image", "image": v}, any_bson()),
        st.builds(lambda v: {"type": "file", "data": v}, any_bson()),
        st.builds(lambda k: {"type": k}, texts(8)),
        any_bson(),
    )
    return st.lists(st.one_of(good, good, odd), max_size=5)


# --- content ------------------------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


@functools.cache
def contents(sizes: Sizes) -> st.SearchStrategy[tuple[str, Any]]:
    """(label, stored `content`): v2 JSON text, v1 arrays and strings, and what no Mastra wrote."""
    v2 = st.builds(
        lambda parts, extra: {"format": 2, "parts": parts, **extra},
        v2_parts(sizes),
        st.fixed_dictionaries(
            {},
            optional={
                "content": texts(20),
                "metadata": st.one_of(any_bson(), st.just({f"k{i}": i for i in range(sizes.keys)})),
                "toolInvocations": st.lists(any_bson(), max_size=2),
                "reasoning": texts(10),
            },
        ),
    )
    return st.one_of(
        st.tuples(st.just("v2 text"), v2.map(_dumps)),
        st.tuples(st.just("v2 object"), v2),
        st.tuples(st.just("v1 array"), v1_items(sizes).map(_dumps)),
        st.tuples(st.just("v1 string"), texts(40)),
        st.tuples(
            st.just("json literal"),
            st.sampled_from(["5", "-0.5", "null", "true", "{}", "[]", '"quoted"', "1e400", "NaN", "[1,{]"]),
        ),
        st.tuples(
            st.just("v2 odd"),
            st.sampled_from(
                [
                    '{"format":2}',
                    '{"format":2,"parts":{}}',
                    '{"format":2,"parts":"x"}',
                    '{"format":3,"parts":[]}',
                    '{"format":"2","parts":[]}',
                    '{"format":2,"parts":[],"format":2}',
                    '{"format":2,"parts":[{"type":"text","text":"\\ud800"}]}',
                    '"\\udfff"',
                    '{"parts":[{"type":"text","text":"no format"}]}',
                ]
            ),
        ),
        st.tuples(st.just("deep json"), st.sampled_from([10, 300, sizes.depth]).map(deep_json)),
        st.tuples(
            st.just("deep v2"),
            st.sampled_from([10, 300, sizes.depth]).map(
                lambda d: '{"format":2,"parts":[{"type":"data-x","data":' + deep_json(d) + "}]}"
            ),
        ),
        st.tuples(st.just("huge text"), st.just("y" * sizes.text)),
        st.tuples(st.just("not a string"), any_bson()),
    )


@functools.cache
def created_ats() -> st.SearchStrategy[tuple[str, Any]]:
    return st.one_of(
        st.tuples(st.just("date"), st.integers(0, 10_000).map(_ms)),
        st.tuples(
            st.just("date us"),
            st.integers(0, 10_000).map(lambda s: _ms(s) + timedelta(microseconds=7)),
        ),
        st.tuples(
            st.just("date edge"),
            st.sampled_from([datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)]),
        ),
        st.tuples(
            st.just("date text"),
            st.sampled_from(
                ["2025-03-01T09:00:01.000Z", "2025-03-01T09:00:02", "yesterday", "", "20000-01-01"]
            ),
        ),
        st.tuples(st.just("date other"), any_bson()),
        st.tuples(st.just("date absent"), st.just(ABSENT)),
    )


def _maybe(strategy: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `strategy`, sometimes `odd` or absent."""
    return st.one_of(strategy, strategy, strategy, odd, st.just(ABSENT))


def _present(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not ABSENT}


@functools.cache
def message_rows(
    thread: str, resource: str, *, sizes: Sizes = QUICK, ids: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[StoredRow]:
    """A `mastra_messages` document of `thread` (its `thread_id`, so its reads meet it), any shape; `ids`:
    its good ids (default: unique-ish ids under the thread's name)."""
    good_ids = ids if ids is not None else texts(12, min_size=1).map(lambda s: f"{thread}-{s}")
    odd_ids = st.one_of(any_bson(), st.sampled_from(COLLIDING), st.just(""), st.just("i" * sizes.text))
    extras = st.one_of(
        st.just(ABSENT),
        st.just(ABSENT),
        st.just('{"custom":{"x":[1]}}'),
        st.sampled_from(["not json", "[1]", '{"id":"shadow","role":"system"}', deep_json(sizes.depth)]),
        any_bson(),
    )
    unknown = st.one_of(
        st.just({}),
        st.builds(
            lambda k, v: {k: v}, st.sampled_from(["unknownField", "$odd", "a.b", "toolCallIds"]), any_bson()
        ),
    )

    def build(
        ident: Any, role: Any, kind: Any, content: tuple[str, Any], created: tuple[str, Any], owner: Any,
        extra: Any, more: dict[str, Any],
    ) -> StoredRow:  # fmt: skip
        doc = _present(
            {
                "id": ident,
                "thread_id": thread,
                "resourceId": owner,
                "role": role,
                "type": kind,
                "content": content[1],
                "createdAt": created[1],
                "_mh_extra": extra,
                **more,
            }
        )
        return StoredRow(f"message {content[0]}, createdAt {created[0]}, fields {sorted(doc)}", doc=doc)

    return st.builds(
        build,
        _maybe(good_ids, odd_ids),
        _maybe(st.sampled_from(ROLES), st.one_of(any_bson(), st.sampled_from(["", "USER", "model"]))),
        _maybe(st.sampled_from(["v2", "text", "tool-call", "tool-result"]), any_bson()),
        contents(sizes),
        created_ats(),
        _maybe(st.just(resource), st.one_of(st.just("someone-else"), any_bson())),
        extras,
        unknown,
    )


@functools.cache
def thread_rows(thread: str, resource: str) -> st.SearchStrategy[StoredRow]:
    """A `mastra_threads` document for `thread`, any shape (owner, metadata and dates included)."""
    boundary = st.one_of(
        any_bson(),
        st.fixed_dictionaries(
            {},
            optional={
                "createdAt": st.one_of(st.just("2025-03-01T09:00:05.000Z"), any_bson()),
                "messageIds": st.one_of(st.lists(texts(5), max_size=3), any_bson()),
                "maxTokens": st.one_of(st.integers(-5, 10**6), any_bson()),
                "atMaxRemoveTokens": st.one_of(st.integers(-5, 10**6), any_bson()),
            },
        ),
    )
    metadata = st.one_of(
        st.builds(lambda b: {"memoryTokenLimiter": b}, boundary),
        st.sampled_from(['{"topic":"x"}', "{not json", '"text"', "[1]", deep_json(3000)]),
        any_bson(),
    )
    doc = st.fixed_dictionaries(
        {
            "id": st.just(thread),
            "resourceId": _maybe(st.just(resource), st.one_of(st.just(""), any_bson())),
            "title": _maybe(texts(10), any_bson()),
            "metadata": _maybe(st.just({}), metadata),
            "createdAt": _maybe(st.just(T0), any_bson()),
            "updatedAt": _maybe(st.just(T0), any_bson()),
        }
    )
    return doc.map(_present).map(lambda d: StoredRow(f"thread fields {sorted(d)}", doc=d))


# --- raw BSON -----------------------------------------------------------------------------------------------


def _element(kind: int, name: str, payload: bytes) -> bytes:
    return bytes([kind]) + name.encode() + b"\x00" + payload


def _string(data: bytes) -> bytes:
    return struct.pack("<i", len(data) + 1) + data + b"\x00"


def _document(elements: list[bytes]) -> bytes:
    body = b"".join(elements) + b"\x00"
    return struct.pack("<i", len(body) + 4) + body


def raw_message(thread: str, resource: str, ident: str, *, odd: str) -> StoredRow:
    """A `mastra_messages` document as BSON bytes with one field no Python value builds (`odd`, one of
    `RAW_ODD`): invalid UTF-8 in `content`, `id` or `role`; `createdAt` in year 20000 or before year 1; a
    90-deep sub-document (within BSON's and servers' limits of 100)."""
    fields: dict[str, bytes] = {
        "id": _element(0x02, "id", _string(ident.encode())),
        "thread_id": _element(0x02, "thread_id", _string(thread.encode())),
        "resourceId": _element(0x02, "resourceId", _string(resource.encode())),
        "role": _element(0x02, "role", _string(b"user")),
        "type": _element(0x02, "type", _string(b"v2")),
        "content": _element(0x02, "content", _string(b'{"format":2,"parts":[{"type":"text","text":"raw"}]}')),
        "createdAt": _element(0x09, "createdAt", struct.pack("<q", int(T0.timestamp() * 1000))),
    }
    changes: dict[str, Callable[[], None]] = {
        "utf8": lambda: fields.update(
            content=_element(
                0x02, "content", _string(b'{"format":2,"parts":[{"type":"text","text":"\xff\xfe"}]}')
            )
        ),
        "id-utf8": lambda: fields.update(id=_element(0x02, "id", _string(ident.encode() + b"\xc3"))),
        "date": lambda: fields.update(
            createdAt=_element(0x09, "createdAt", struct.pack("<q", 569_000_000_000_000))
        ),
        "date-min": lambda: fields.update(createdAt=_element(0x09, "createdAt", struct.pack("<q", -(2**62)))),
        "deep": lambda: fields.update(extraDeep=_element(0x03, "extraDeep", bson.encode(deep_doc(90)))),
        "role-utf8": lambda: fields.update(role=_element(0x02, "role", _string(b"us\xe9r"))),
    }
    changes[odd]()
    return StoredRow(f"raw message {odd}", raw=_document(list(fields.values())))


RAW_ODD: Final = ("utf8", "id-utf8", "date", "date-min", "deep", "role-utf8")
