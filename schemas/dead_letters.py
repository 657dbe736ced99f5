"""Dead-letter headers (docs/events.md#9-dead-letters): why a record was refused, and where it came from.

A dead letter is the original key and value bytes, untouched; everything the service has to say about it is in
these headers, so operators and the `dlq` tooling can read the reason without parsing the value. The original
record's headers (notably `traceparent`) are kept; ours replace any of the same name, so a record that was
dead-lettered, replayed and refused again carries the latest reason once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from message_history.errors import EventValidationError, error_type
from message_history.logs import scrub
from schemas.messages import format_timestamp

ERROR_TYPE: Final = "error.type"
ERROR_MESSAGE: Final = "error.message"
ERROR_PATH: Final = "error.path"  # only for EventValidationError: the offending field's dotted path
SOURCE_TOPIC: Final = "source.topic"
SOURCE_PARTITION: Final = "source.partition"
SOURCE_OFFSET: Final = "source.offset"
FAILED_AT: Final = "failed.at"
SERVICE_VERSION: Final = "service.version"

DEAD_LETTER_HEADERS: Final = (
    ERROR_TYPE,
    ERROR_MESSAGE,
    ERROR_PATH,
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    FAILED_AT,
    SERVICE_VERSION,
)

MAX_MESSAGE_BYTES: Final = 1024
_ELLIPSIS: Final = "…".encode()


def error_message(error: BaseException) -> bytes:
    """`error.message`: secrets scrubbed, then capped at 1 KiB without splitting a UTF-8 character."""
    text = scrub(str(error) or type(error).__name__)
    data = text.encode("utf-8", errors="replace")
    if len(data) <= MAX_MESSAGE_BYTES:
        return data
    cut = data[: MAX_MESSAGE_BYTES - len(_ELLIPSIS)].decode("utf-8", errors="ignore")
    return cut.encode() + _ELLIPSIS


def dead_letter_headers(
    *,
    error: BaseException,
    source_topic: str,
    source_partition: int,
    source_offset: int,
    failed_at: datetime,
    service_version: str,
    original_headers: Sequence[tuple[str, bytes]] = (),
) -> list[tuple[str, bytes]]:
    """The headers of the dead letter for a record read from `source_topic`/partition/offset."""
    ours: list[tuple[str, bytes]] = [
        (ERROR_TYPE, error_type(error).encode()),
        (ERROR_MESSAGE, error_message(error)),
    ]
    if isinstance(error, EventValidationError) and error.path:
        ours.append((ERROR_PATH, scrub(error.path).encode()[:MAX_MESSAGE_BYTES]))
    ours += [
        (SOURCE_TOPIC, source_topic.encode()),
        (SOURCE_PARTITION, str(source_partition).encode()),
        (SOURCE_OFFSET, str(source_offset).encode()),
        (FAILED_AT, format_timestamp(failed_at).encode()),
        (SERVICE_VERSION, service_version.encode()),
    ]
    kept = [(k, v) for k, v in original_headers if k not in DEAD_LETTER_HEADERS]
    return kept + ours


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """The dead-letter headers read back; `headers` are the remaining (original) ones, in order."""

    error_type: str
    error_message: str
    source_topic: str
    source_partition: int
    source_offset: int
    failed_at: str
    service_version: str
    error_path: str | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def parse_dead_letter_headers(headers: Sequence[tuple[str, bytes | None]]) -> DeadLetterInfo:
    """Read the dead-letter headers of a record; `ValueError` when one is missing or malformed."""
    ours: dict[str, str] = {}
    rest: list[tuple[str, bytes]] = []
    for key, value in headers:
        if key in DEAD_LETTER_HEADERS:
            ours[key] = (value or b"").decode("utf-8", errors="replace")  # the last one wins
        else:
            rest.append((key, value or b""))
    missing = [k for k in DEAD_LETTER_HEADERS if k != ERROR_PATH and k not in ours]
    if missing:
        raise ValueError(f"not a dead letter: missing header(s) {', '.join(missing)}")
    return DeadLetterInfo(
        error_type=ours[ERROR_TYPE],
        error_message=ours[ERROR_MESSAGE],
        error_path=ours.get(ERROR_PATH),
        source_topic=ours[SOURCE_TOPIC],
        source_partition=int(ours[SOURCE_PARTITION]),
        source_offset=int(ours[SOURCE_OFFSET]),
        failed_at=ours[FAILED_AT],
        service_version=ours[SERVICE_VERSION],
        headers=rest,
    )
