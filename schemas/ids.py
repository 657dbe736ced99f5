"""The ids the service gives messages that come without one, and the ones it gave before 0.1.0.

A derived id is a UUIDv5 under one fixed namespace of the compact JSON array `[resourceId, threadId,
requestId, kind, position]` in UTF-8, no spaces: the text JavaScript's `JSON.stringify` writes, so a worker in
any language can derive it (`kind`: `"input"` or `"response"`; `position`: the message's index in that list).
Deterministic, so a redelivered or replayed event produces the same rows; scoped to the tenant and the thread,
so one client's request ids (guessed, or numbered per session like "req-1") never meet another's rows. The
JSON array is an unambiguous encoding: no choice of ids makes two different tuples hash the same text.

Before this scheme the id was `{requestId}:{kind}:{position}` (`legacy_message_id`): one namespace for every
tenant. `legacy_ids` names, for an event's derived ids, the id its message had under the old scheme, so that
the persist path can keep a row already stored under it (docs/events.md#11-ids-and-timestamps).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Literal, Protocol

__all__ = ["MESSAGE_ID_NAMESPACE", "Kind", "derived_message_id", "legacy_ids", "legacy_message_id"]

# Fixed forever: changing it changes every derived id, and a replay would then duplicate stored rows.
MESSAGE_ID_NAMESPACE = uuid.UUID("6f1d4c7a-3b52-5e0c-9a41-2d8e7b6c9f10")

Kind = Literal["input", "response"]


def derived_message_id(resource_id: str, thread_id: str, request_id: str, kind: Kind, position: int) -> str:
    """The id of the message at `position` of an event's `kind` list that came without one."""
    # compact separators: the text JavaScript's JSON.stringify writes
    name = json.dumps(
        [resource_id, thread_id, request_id, kind, position], ensure_ascii=False, separators=(",", ":")
    )
    return str(uuid.uuid5(MESSAGE_ID_NAMESPACE, name))


def legacy_message_id(request_id: str, kind: Kind, position: int) -> str:
    """The id the service derived before 0.1.0 for the same message (one namespace for all tenants)."""
    return f"{request_id}:{kind}:{position}"


class _Identified(Protocol):
    @property
    def id(self) -> str | None: ...


def legacy_ids(
    resource_id: str,
    thread_id: str,
    request_id: str,
    lists: Sequence[tuple[Kind, Sequence[_Identified]]],
) -> dict[str, str]:
    """For each message of `lists` whose id is the one derived for its place, that id → its legacy id.

    An id the client chose never matches (it would have to be that UUID), so only ids the service derived
    from this very event get a legacy candidate.
    """
    out: dict[str, str] = {}
    for kind, messages in lists:
        for position, message in enumerate(messages):
            if message.id is not None and message.id == derived_message_id(
                resource_id, thread_id, request_id, kind, position
            ):
                out[message.id] = legacy_message_id(request_id, kind, position)
    return out
