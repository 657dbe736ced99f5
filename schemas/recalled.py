"""Recalled rows as wire bytes: `RecalledRow` (a cheap view of a stored message) and `encode_enriched`.

The recall path's output is mostly stored history: 40 rows of ~1 KB each per event by default. The model
path validates every row into a `Message`, tags it as an `EnrichedMessage` and dumps it again. For a row
whose stored form is already what the models would write (`schemas.canonical`), a `RecalledRow` carries the
enriched message's bytes instead: its header fields encoded once, and the stored `content` spliced as it is.
It is a whole `Message`: `id`, `role`, `createdAt`, `threadId`, `resourceId` and `type` are set (ordering
and dedupe read them as usual), and its `content`, `wire()` and `model_dump*()` are those of `materialize()`,
the model path for that row, built when first asked for (the same result, only slower): the recall path
never asks, it splices the stored bytes (`enriched_json`).

`encode_enriched` gives exactly the bytes of `encode(EnrichedRequest.from_request(...))`: the event is
dumped by pydantic with a marker in place of `messages`, and the messages array is written where the marker
is: rows spliced, every other message dumped by pydantic as it would be inside the event.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, cast

from pydantic import PrivateAttr
from pydantic_core import to_json

from schemas.codec import encode
from schemas.events import AgentRequest, EnrichedMessage, EnrichedRequest, Source
from schemas.messages import Message

__all__ = ["RecalledRow", "encode_enriched", "encode_enriched_fragment", "materialized", "recalled_row"]

_SOURCE_BYTES: Final = {"memory": b',"source":"memory"}', "input": b',"source":"input"}'}
_HEAD_FIELDS: Final = frozenset({"id", "role", "createdAt", "threadId", "resourceId"})
_HEAD_FIELDS_TYPED: Final = _HEAD_FIELDS | {"type"}


class RecalledRow(Message):
    """A stored message the rules can order and dedupe, with its enriched form as bytes; its content is read
    through the model path when first asked for (`materialize`)."""

    # `{"id":…,…,"content":<stored content>`: the enriched message up to its `source`
    _prefix: bytes = PrivateAttr(b"")
    _load: Callable[[], Message] | None = PrivateAttr(None)  # the model path for this row
    _model: Message | None = PrivateAttr(None)  # what `_load` gave, once asked for

    if not TYPE_CHECKING:  # typed as `Message.content`; only the value is missing from the view

        def __getattr__(self, name: str) -> Any:
            if name == "content":
                return self.materialize().content
            return super().__getattr__(name)

    def enriched_json(self, source: Source) -> bytes:
        """The `EnrichedMessage` JSON of this row tagged `source` (its thread/resource are always set)."""
        return _prefix(self) + _SOURCE_BYTES[source]

    def wire(self) -> dict[str, Any]:
        return self.materialize().wire()

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        return self.materialize().model_dump(**kwargs)

    def model_dump_json(self, **kwargs: Any) -> str:
        return self.materialize().model_dump_json(**kwargs)

    def materialize(self) -> Message:
        """The row as the model path reads it (validated `Message`, content included), built once."""
        private = self.__pydantic_private__
        assert private is not None
        model = private["_model"]
        if model is None:
            load = private["_load"]
            assert load is not None
            model = private["_model"] = load()
        return cast(Message, model)


def _prefix(row: RecalledRow) -> bytes:
    return cast(bytes, row.__pydantic_private__["_prefix"])  # type: ignore[index]  # always set


def recalled_row(
    *,
    id: str,
    role: str,
    created_at: datetime,
    created_text: str,
    thread_id: str,
    resource_id: str,
    kind: str | None,
    content: bytes,
    load: Callable[[], Message],
) -> RecalledRow:
    """A `RecalledRow` from values the caller checked (`created_text`: `created_at` as the models write it).

    Built without `model_construct` (its per-field work is most of its cost here): the attributes a
    constructed model has, set directly.
    """
    values: dict[str, Any] = {
        "id": id,
        "role": role,
        "createdAt": created_text,
        "threadId": thread_id,
        "resourceId": resource_id,
    }
    if kind is not None:
        values["type"] = kind
    prefix = b"".join((to_json(values)[:-1], b',"content":', content))
    values["createdAt"] = created_at
    fields_set = set(_HEAD_FIELDS_TYPED if kind is not None else _HEAD_FIELDS)
    if kind is None:
        values["type"] = None
    row = RecalledRow.__new__(RecalledRow)
    object.__setattr__(row, "__dict__", values)
    object.__setattr__(row, "__pydantic_fields_set__", fields_set)
    object.__setattr__(row, "__pydantic_extra__", {})
    object.__setattr__(row, "__pydantic_private__", {"_prefix": prefix, "_load": load, "_model": None})
    return row


def materialized(context: Sequence[tuple[Message, Source]]) -> list[tuple[Message, Source]]:
    """`context` with every `RecalledRow` replaced by its model (for code that needs the models)."""
    return [(m.materialize() if isinstance(m, RecalledRow) else m, s) for m, s in context]


_MARKER: Final = "\x00message-history:messages\x00"


def encode_enriched(
    request: AgentRequest, context: Sequence[tuple[Message, Source]], **summary: Any
) -> bytes:
    """`encode(EnrichedRequest.from_request(request, context, **summary))`, with `RecalledRow`s spliced.

    `summary` is `from_request`'s keywords (`recalled`, `limit`, `complete`, ...), passed on as they are.
    """
    if not any(type(m) is RecalledRow for m, _ in context):
        return encode(EnrichedRequest.from_request(request, context, **summary))
    thread_id, resource_id = request.threadId, request.resourceId
    serializer = EnrichedMessage.__pydantic_serializer__
    pieces: list[bytes] = []  # the messages array, joined once
    for message, source in context:
        pieces.append(b",")
        if type(message) is RecalledRow:
            pieces.append(message.enriched_json(source))
        else:
            tagged = EnrichedMessage.from_message(
                message, source, thread_id=thread_id, resource_id=resource_id
            )
            pieces.append(serializer.to_json(tagged, exclude_unset=True))
    pieces[0] = b"["  # context is not empty: it holds a row
    pieces.append(b"]")
    return _splice(EnrichedRequest.from_request(request, (), **summary), pieces)


def encode_enriched_fragment(
    request: AgentRequest, runs: Sequence[bytes], incoming: Sequence[Message], **summary: Any
) -> bytes:
    """`encode_enriched` of a context of recalled rows and `incoming` (all `input`), where the rows are
    given as bytes: `runs[i]`, their `EnrichedMessage` JSON comma-joined (maybe empty), comes before
    `incoming[i]`, and `runs[-1]` after the last (`len(runs) == len(incoming) + 1`)."""
    if not any(runs):
        return encode(EnrichedRequest.from_request(request, [(m, "input") for m in incoming], **summary))
    thread_id, resource_id = request.threadId, request.resourceId
    serializer = EnrichedMessage.__pydantic_serializer__
    pieces: list[bytes] = []
    for run, message in zip(runs, (*incoming, None), strict=True):
        if run:
            pieces += (b",", run)
        if message is not None:
            tagged = EnrichedMessage.from_message(
                message, "input", thread_id=thread_id, resource_id=resource_id
            )
            pieces += (b",", serializer.to_json(tagged, exclude_unset=True))
    pieces[0] = b"["  # not empty: a run holds a row
    pieces.append(b"]")
    return _splice(EnrichedRequest.from_request(request, (), **summary), pieces)


def _splice(event: EnrichedRequest, pieces: Sequence[bytes]) -> bytes:
    """`event` encoded with `pieces` (a JSON array, in pieces) written as its `messages`."""
    marker = _MARKER
    while True:
        # The marker stands where `messages` is written; the event's own strings could hold the same text,
        # so it must occur exactly once (else another, random one is tried).
        event.messages = [marker]  # type: ignore[list-item]  # a stand-in, never validated
        out = event.__pydantic_serializer__.to_json(event, exclude_unset=True, warnings=False)
        token = b"[" + to_json(marker) + b"]"
        if out.count(token) == 1:
            before, _, after = out.partition(token)
            return b"".join((before, *pieces, after))
        marker = f"\x00message-history:{secrets.token_hex(16)}\x00"
