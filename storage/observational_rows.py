"""A `mastra_observational_memory` row read as `@mastra/mongodb`'s `parseOMDocument` reads it: the
`ObservationalRecord`, or `UnreadableRowError` (reason `om`) for a row no Mastra could use.

Rows are input (a Mastra app of any version, or a hand, wrote them): each field is checked for its type and
range, a count that is no finite number or a fractional generation or claim cycle refuses the row, and a raw
row is decoded alone (`storage.raw_rows`), so one bad row is skipped and counted (`storage.unreadable`), never
a crash. The store (`storage.observational`) reads and writes through these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from bson.raw_bson import RawBSONDocument

from message_history.errors import UnreadableRowError
from storage.raw_rows import decode_row
from storage.unreadable import skip

__all__ = [
    "CLAIMED_AT",
    "CLAIMED_BY",
    "CYCLE",
    "OBSERVATIONAL",
    "THREADS_AFTER",
    "ObservationalRecord",
    "readable_record",
    "record_from_doc",
    "record_from_raw",
]

OBSERVATIONAL: Final = "mastra_observational_memory"
CYCLE: Final = "_mh_cycle"
CLAIMED_AT: Final = "_mh_claimed_at"
CLAIMED_BY: Final = "_mh_claimed_by"
THREADS_AFTER: Final = "_mh_threads_after"
"""Resource scope: where the next page of the resource's threads starts (`{at, id}`: the last thread read,
by `(updatedAt, id)` newest first; absent: from the newest). A hint, not a claim: a row without it (a new
generation, a Mastra app's) starts from the newest thread again."""


@dataclass(frozen=True, slots=True)
class ObservationalRecord:
    """A row as Mastra's `parseOMDocument` reads it (the fields the service uses), plus the claim cycle."""

    id: str
    lookup_key: str
    scope: str
    thread_id: str | None
    resource_id: str
    generation: int
    origin_type: str
    active_observations: str
    observation_token_count: int
    pending_message_tokens: int
    total_tokens_observed: int
    last_observed_at: datetime | None
    observed_message_ids: tuple[str, ...]
    is_observing: bool
    is_reflecting: bool
    config: dict[str, Any]
    metadata: dict[str, Any] | None
    created_at: datetime | None
    updated_at: datetime | None
    cycle: int
    claimed_by: str | None = (
        None  # the request whose turn made the live claim (None: none, or a Mastra app's)
    )
    threads_after: tuple[datetime, str] | None = None  # resource scope's next thread page (`THREADS_AFTER`)


class _Refused(Exception):  # noqa: N818 -- internal: a field no Mastra would read, said in words
    """A field that makes the row unreadable (its message says which and why)."""


def _number(doc: Mapping[str, Any], name: str, *, key: bool = False) -> int:
    """`Number(doc.x || 0)` for a count; a value that is no finite number makes the row unreadable, and so
    does a fraction in a `key` (the generation, the claim cycle: the conditional writes match them exactly,
    so a truncated one would leave the row claimed by nobody, silently, for ever)."""
    value = doc.get(name)
    if value is None or value is False or value == "":
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Refused(f"{name} is {type(value).__name__} {str(value)[:40]!r}, not a number")
    if key and value != int(value):
        raise _Refused(f"{name} is {value!r}, not a whole number")
    return int(value)


def _date(doc: Mapping[str, Any], name: str) -> datetime | None:
    value = doc.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise _Refused(f"{name} {value[:40]!r} is not a date") from None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    raise _Refused(f"{name} is {type(value).__name__}, not a date")


def _text(doc: Mapping[str, Any], name: str, default: str = "") -> str:
    value = doc.get(name)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise _Refused(f"{name} is {type(value).__name__}, not text")
    return value


def record_from_doc(doc: Mapping[str, Any]) -> ObservationalRecord:
    """A row as Mastra reads it, or `UnreadableRowError` (reason `om`) for one Mastra could not use."""
    ident = doc.get("id")
    try:
        config = doc.get("config")
        metadata = doc.get("metadata")
        return ObservationalRecord(
            id=_text(doc, "id") or _missing("id"),
            lookup_key=_text(doc, "lookupKey"),
            scope=_text(doc, "scope", "thread"),
            thread_id=_text(doc, "threadId") or None,
            resource_id=_text(doc, "resourceId"),
            generation=_number(doc, "generationCount", key=True),
            origin_type=_text(doc, "originType", "initial"),
            active_observations=_text(doc, "activeObservations"),
            observation_token_count=_number(doc, "observationTokenCount"),
            pending_message_tokens=_number(doc, "pendingMessageTokens"),
            total_tokens_observed=_number(doc, "totalTokensObserved"),
            last_observed_at=_date(doc, "lastObservedAt"),
            observed_message_ids=_message_ids(doc),
            is_observing=bool(doc.get("isObserving")),
            is_reflecting=bool(doc.get("isReflecting")),
            config=dict(config) if isinstance(config, Mapping) else {},
            metadata=dict(metadata) if isinstance(metadata, Mapping) else None,
            created_at=_date(doc, "createdAt"),
            updated_at=_date(doc, "updatedAt"),
            cycle=_number(doc, CYCLE, key=True),
            claimed_by=_text(doc, CLAIMED_BY) or None,
            threads_after=_position(doc.get(THREADS_AFTER)),
        )
    except _Refused as exc:
        raise UnreadableRowError(OBSERVATIONAL, ident, doc.get("lookupKey"), "om", str(exc)) from None


def _position(value: Any) -> tuple[datetime, str] | None:
    """`THREADS_AFTER` as written (`{at: Date, id: str}`); anything else is no position (the scan starts
    from the newest thread again): a hint never makes the row unreadable."""
    if not isinstance(value, Mapping):
        return None
    at, ident = value.get("at"), value.get("id")
    if not isinstance(at, datetime) or not isinstance(ident, str):
        return None
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC), ident)


def _missing(name: str) -> str:
    raise _Refused(f"the row has no {name}")


def _message_ids(doc: Mapping[str, Any]) -> tuple[str, ...]:
    ids = doc.get("observedMessageIds")
    if ids is None:
        return ()
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise _Refused("observedMessageIds is not a list of ids")
    return tuple(ids)


def record_from_raw(raw: RawBSONDocument) -> ObservationalRecord:
    """A row read raw, decoded alone: one the codec or Mastra's reading refuses is `UnreadableRowError`, never
    the driver's `InvalidBSON` (which `storage_errors` would call a fatal storage error)."""
    return record_from_doc(decode_row(raw.raw, OBSERVATIONAL))


def readable_record(raw: RawBSONDocument) -> ObservationalRecord | None:
    try:
        return record_from_raw(raw)
    except UnreadableRowError as exc:
        skip(exc)
        return None
