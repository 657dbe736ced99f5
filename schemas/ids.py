"""The ids the service gives messages that come without one, and the ones it gave before 0.1.0.

A derived id is a UUIDv5 under one fixed namespace of the compact JSON array `[resourceId, threadId,
requestId, kind, position]` in UTF-8, no spaces: the text JavaScript's `JSON.stringify` writes, so a worker in
any language can derive it (`kind`: `"input"` or `"response"`; `position`: the message's index in that list).
Deterministic, so a redelivered or replayed event produces the same rows; scoped to the tenant and the thread,
so one client's request ids (guessed, or numbered per session like "req-1") never meet another's rows. The
JSON array is an unambiguous encoding: no choice of ids makes two different tuples hash the same text.

A derived id is public: anyone who knows (or guesses) the tuple can compute it, and so another tenant could
store a message under it first, in its own thread. Such an id yields: the persist path saves that message of
the turn under its *alternate* (`alternate_message_id`), a UUID keyed with the deployment's secret (an HMAC
of the derived id), which nobody without the secret can predict, and which is the same on every replay and
redelivery (docs/security.md#derived-ids-and-the-deployment-key).

Before this scheme the id was `{requestId}:{kind}:{position}` (`legacy_message_id`): one namespace for every
tenant. `legacy_ids` names, for an event's derived ids, the id its message had under the old scheme, so that
the persist path can keep a row already stored under it (docs/events.md#11-ids-and-timestamps).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

__all__ = [
    "MESSAGE_ID_NAMESPACE",
    "Kind",
    "alternate_message_id",
    "derived_for_turn",
    "derived_message_id",
    "legacy_ids",
    "legacy_message_id",
]

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


def derived_for_turn(
    candidates: Iterable[str],
    resource_id: str,
    thread_id: str,
    request_id: str,
    *,
    inputs: int,
    responses: int,
) -> frozenset[str]:
    """Which of `candidates` are ids derived for one of the first `inputs` input or `responses` response
    positions of the turn. A turn's input ids were derived from the request's positions, which its response's
    `input` list (recalled messages first, echoes filtered) does not keep, so the caller bounds them by the
    per-event message limit; a thousand positions cost about a millisecond (the common prefix is hashed
    once, digests are compared as bytes), and the scan stops once every candidate is found."""
    wanted: dict[bytes, str] = {}
    for candidate in candidates:
        try:
            parsed = uuid.UUID(candidate)
        except ValueError:
            continue
        if parsed.version == 5 and str(parsed) == candidate:
            wanted[_unversioned(parsed.bytes)] = candidate
    found: set[str] = set()
    # what `derived_message_id` hashes: the JSON array's text, each kind's common prefix hashed once; the
    # positions of both kinds side by side, so that ids at the first positions (the usual) are found at once
    bases = {}
    for kind in ("input", "response"):
        prefix = json.dumps(
            [resource_id, thread_id, request_id, kind], ensure_ascii=False, separators=(",", ":")
        )
        bases[kind] = hashlib.sha1(
            MESSAGE_ID_NAMESPACE.bytes + prefix[:-1].encode() + b",", usedforsecurity=False
        )
    counts = {"input": inputs, "response": responses}
    for position in range(max(inputs, responses)):
        if not wanted:
            break
        for kind, base in bases.items():
            if position >= counts[kind]:
                continue
            digest = base.copy()
            digest.update(f"{position}]".encode())
            hit = wanted.pop(_unversioned(digest.digest()[:16]), None)
            if hit is not None:
                found.add(hit)
    return frozenset(found)


def _unversioned(raw: bytes) -> bytes:
    """A UUID's 16 bytes without its version and variant bits (a SHA-1 prefix compares to a UUIDv5 so)."""
    return raw[:6] + bytes((raw[6] & 0x0F,)) + raw[7:8] + bytes((raw[8] & 0x3F,)) + raw[9:16]


def alternate_message_id(key: bytes, message_id: str) -> str:
    """The id a derived id yields to when another thread holds it: a UUID (RFC 9562 version 8: custom) of the
    first 16 bytes of HMAC-SHA256(`key`, the derived id's text). Deterministic under one key; unpredictable
    without it, so another tenant cannot take it first as it could the derived id."""
    digest = hmac.new(key, message_id.encode(), hashlib.sha256).digest()[:16]
    value = int.from_bytes(digest, "big")
    value &= ~(0xF000 << 64)  # the version nibble: 8
    value |= 0x8000 << 64
    value &= ~(0xC000 << 48)  # the variant bits: RFC 9562 (10)
    value |= 0x8000 << 48
    return str(uuid.UUID(int=value))


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
