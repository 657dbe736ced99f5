"""`RawOwner`: the query a raw message row of a batch's `$in` reply answers, read from its bytes.

The recall's `$in` read (`storage.mongo_recall`) asks for many threads at once; each row it gets back is
sorted to its thread, and kept only when the thread's query names no resource or the row's `resourceId` is
that resource. Decoding a row only for that costs most of a raw row's read; `RawOwner` reads the two fields
from the bytes where the document's layout makes it certain, else from the decoded document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from bson.raw_bson import RawBSONDocument

from storage.raw_rows import RAW

if TYPE_CHECKING:
    from storage.protocol import RecallQuery

__all__ = ["RawOwner", "owned_query"]


# Sizes of the fixed-size BSON element types, to step over a top-level element without decoding it.
_FIXED_SIZES: Final = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}


def owned_query(wanted: Mapping[str, RecallQuery], thread: Any, resource: Any) -> RecallQuery | None:
    """The query a row of `thread` owned by `resource` answers: its thread's, when the query names no
    resource or that one (the rule every route of the `$in` read applies: `RawOwner`, the native walk)."""
    query = wanted.get(thread)
    if query is None or query.resource_id is None or resource == query.resource_id:
        return query
    return None


class RawOwner:
    """`thread_id` and the `resourceId` check of a raw reply's documents, read from the bytes where the
    document's layout makes it certain (else from the decoded document, ~5 us: most of a raw row's cost).

    Certain: `id` then `thread_id` as the first two elements, both strings, and no other key named
    `thread_id` after them; then the top-level elements stepped over (not decoded: a nested document is
    skipped by its size, so its keys are never mistaken for the row's) up to `resourceId`, a string, with no
    other key so named after it. One call per row, searching the bytes once per field (~40 rows an event).
    """

    __slots__ = ("_elements",)

    def __init__(self) -> None:
        self._elements: dict[str, bytes] = {}

    def read(self, raw: bytes, wanted: Mapping[str, RecallQuery]) -> RecallQuery | None:
        """The query the document `raw` answers: its `thread_id`'s, when owned by the query's resource (or the
        query names none); else None: as `wanted.get(doc.get("thread_id", ""))`, `doc.get("resourceId") ==
        resource`. Raises what decoding a malformed document raises (the caller names the row)."""
        if raw[4:8] == b"\x02id\x00":
            start = 12 + int.from_bytes(raw[8:12], "little")
            if raw[start : start + 11] == b"\x02thread_id\x00" and raw.find(b"thread_id\x00", start + 11) < 0:
                end = start + 14 + int.from_bytes(raw[start + 11 : start + 15], "little")
                try:
                    query = wanted.get(raw[start + 15 : end].decode())
                except UnicodeDecodeError:
                    return self._decoded(raw, wanted)
                if query is None or query.resource_id is None:
                    return query
                owned = self._owned(raw, end + 1, query.resource_id)
                if owned is None:
                    owned = RawBSONDocument(raw, RAW).get("resourceId") == query.resource_id
                return query if owned else None
        return self._decoded(raw, wanted)

    @staticmethod
    def _decoded(raw: bytes, wanted: Mapping[str, RecallQuery]) -> RecallQuery | None:
        doc: Mapping[str, Any] = RawBSONDocument(raw, RAW)  # decoded as the reply's documents were
        return owned_query(wanted, doc.get("thread_id", ""), doc.get("resourceId"))

    def _owned(self, raw: bytes, at: int, resource: str) -> bool | None:
        """Whether the top-level `resourceId` is `resource`, stepping over the elements from offset `at`;
        None when the bytes do not make it certain."""
        element = self._elements.get(resource)
        if element is None:
            value = resource.encode()
            element = b"\x02resourceId\x00" + (len(value) + 1).to_bytes(4, "little") + value + b"\x00"
            self._elements[resource] = element
        last = len(raw) - 1
        while at < last:
            if raw.startswith(b"resourceId\x00", at + 1):
                if raw.startswith(element, at) and raw.find(b"resourceId\x00", at + len(element)) < 0:
                    return True
                return None  # another value, or another key so named later: the decoded document says
            kind = raw[at]
            key_end = raw.find(b"\x00", at + 1)
            if kind == 0x02:
                at = key_end + 5 + int.from_bytes(raw[key_end + 1 : key_end + 5], "little")
            elif kind in (0x03, 0x04):
                at = key_end + 1 + int.from_bytes(raw[key_end + 1 : key_end + 5], "little")
            elif kind in _FIXED_SIZES:
                at = key_end + 1 + _FIXED_SIZES[kind]
            else:
                return None
        return False if at == last else None  # no top-level `resourceId`: `doc.get` gives None
