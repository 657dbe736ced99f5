"""Limits on what one inbound event may contain, so a single record cannot exhaust the service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from message_history.settings import settings_slice

if TYPE_CHECKING:
    from message_history.settings import Settings


MAX_ID_LENGTH = 256  # the default id limit: what a worker decoding with the default limits accepts


@dataclass(frozen=True, slots=True)
class Limits:
    """Checked by `schemas.codec.decode_*`; anything over a limit is an `EventValidationError`."""

    max_event_bytes: int = 1_048_576  # the record value, checked before parsing
    max_messages_per_event: int = 1000  # per list (`messages`, `input`, `response`)
    max_parts_per_message: int = 1000  # `content.parts`
    max_id_length: int = MAX_ID_LENGTH  # requestId, threadId, resourceId and every message id, in characters

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return settings_slice(cls, settings)


def id_problem(value: str, max_length: int = MAX_ID_LENGTH) -> str | None:
    """Why `value` cannot be an event's id (blank, or longer than the limit), or None. One rule for the ids
    the codec decodes and for stored rows' ids, which recall writes into events a worker decodes."""
    if not value.strip():
        return "must not be empty or blank"
    if len(value) > max_length:
        return f"is {len(value)} characters; the limit is {max_length}"
    return None
