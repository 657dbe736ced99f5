"""`schemas.dead_letters`: the headers a refused record carries: reason (scrubbed, capped) and origin."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from message_history.errors import EventValidationError, StorageUnavailableError, ThreadOwnershipError
from schemas.dead_letters import (
    MAX_MESSAGE_BYTES,
    dead_letter_headers,
    error_message,
    parse_dead_letter_headers,
)

FAILED_AT = datetime(2025, 1, 1, 11, 0, 0, 123456, tzinfo=UTC)


def _headers(
    error: BaseException, original: list[tuple[str, bytes]] | None = None
) -> list[tuple[str, bytes]]:
    return dead_letter_headers(
        error=error,
        source_topic="agent.requests",
        source_partition=3,
        source_offset=42,
        failed_at=FAILED_AT,
        service_version="0.1.0",
        original_headers=original or [],
    )


def test_headers_name_the_error_and_where_the_record_came_from() -> None:
    """Every contract header is present with its value; originals (traceparent) are kept in front."""
    trace = ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    headers = _headers(EventValidationError("Field required", "threadId"), [trace])
    assert headers == [
        trace,
        ("error.type", b"EventValidationError"),
        ("error.message", b"threadId: Field required"),
        ("error.path", b"threadId"),
        ("source.topic", b"agent.requests"),
        ("source.partition", b"3"),
        ("source.offset", b"42"),
        ("failed.at", b"2025-01-01T11:00:00.123Z"),
        ("service.version", b"0.1.0"),
    ]


@pytest.mark.parametrize(
    ("error", "expected_type"),
    [
        pytest.param(EventValidationError("bad"), "EventValidationError", id="validation"),
        pytest.param(ThreadOwnershipError("t", "r", "owner"), "ThreadOwnershipError", id="ownership"),
        pytest.param(StorageUnavailableError("down"), "StorageUnavailableError", id="our-other-error"),
        pytest.param(ValueError("plain"), "ValueError", id="builtin"),
        pytest.param(
            UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "UnicodeDecodeError", id="builtin-sub"
        ),
    ],
)
def test_error_type_is_the_error_type_property_or_class_name(
    error: BaseException, expected_type: str
) -> None:
    """`error.type` is `error_type` for our errors and the class name for anything else."""
    headers = dict(_headers(error))
    assert headers["error.type"] == expected_type.encode()
    assert ("error.path" in headers) == (isinstance(error, EventValidationError) and bool(error.path))


def test_original_headers_with_our_names_are_replaced_not_duplicated() -> None:
    """A record dead-lettered again carries only the latest reason, once; other headers stay in order."""
    original = [("a", b"1"), ("error.type", b"Old"), ("failed.at", b"old"), ("b", b"2")]
    headers = _headers(ValueError("new"), original)
    keys = [k for k, _ in headers]
    assert keys[:2] == ["a", "b"]
    assert keys.count("error.type") == 1
    assert keys.count("failed.at") == 1
    assert dict(headers)["error.type"] == b"ValueError"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        pytest.param("cannot reach mongodb://admin:hunter2@db:27017/x", b"hunter2", id="uri-password"),
        pytest.param("kafka sasl://svc:p%40ss@broker:9093 refused", b"p%40ss", id="uri-encoded-password"),
        pytest.param("login failed: password=hunter2 for user bob", b"hunter2", id="password-pair"),
        pytest.param('config {"password": "hunter2"} rejected', b"hunter2", id="json-password"),
        pytest.param("api_key=sk-123456 invalid", b"sk-123456", id="api-key"),
        pytest.param("client_secret: abcdef", b"abcdef", id="secret"),
    ],
)
def test_error_message_is_scrubbed_of_secrets(text: str, secret: bytes) -> None:
    """Passwords in URIs and `password=`-like pairs never reach the `error.message` header."""
    message = dict(_headers(RuntimeError(text)))["error.message"]
    assert secret not in message
    assert b"***" in message


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("x" * 5000, id="ascii"),
        pytest.param("é" * 5000, id="two-byte"),
        pytest.param("a" + "🎉" * 1000, id="four-byte-misaligned"),
        pytest.param("x" * (MAX_MESSAGE_BYTES + 1), id="one-over"),
    ],
)
def test_error_message_is_capped_at_1_kib_of_valid_utf8(text: str) -> None:
    """A long message is cut to at most 1 KiB without splitting a character, and marked as cut."""
    message = error_message(RuntimeError(text))
    assert len(message) <= MAX_MESSAGE_BYTES
    decoded = message.decode("utf-8")  # raises if a character was split
    assert decoded.endswith("…")
    assert len(message) > MAX_MESSAGE_BYTES - 8  # cut near the cap, not far below


def test_short_messages_are_untouched_and_empty_ones_named() -> None:
    """A message under the cap is kept as is; an error without text gives its class name."""
    assert error_message(RuntimeError("x" * MAX_MESSAGE_BYTES)) == b"x" * MAX_MESSAGE_BYTES
    assert error_message(RuntimeError()) == b"RuntimeError"


def test_headers_read_back() -> None:
    """parse_dead_letter_headers returns what dead_letter_headers wrote, and the original headers apart."""
    error = EventValidationError("contradicts the event's threadId", "messages.1.threadId")
    info = parse_dead_letter_headers(_headers(error, [("traceparent", b"00-abc-def-01")]))
    assert (info.error_type, info.error_message, info.error_path) == (
        "EventValidationError",
        "messages.1.threadId: contradicts the event's threadId",
        "messages.1.threadId",
    )
    assert (info.source_topic, info.source_partition, info.source_offset) == ("agent.requests", 3, 42)
    assert (info.failed_at, info.service_version) == ("2025-01-01T11:00:00.123Z", "0.1.0")
    assert info.headers == [("traceparent", b"00-abc-def-01")]


def test_reading_a_record_that_is_not_a_dead_letter_fails_clearly() -> None:
    """Headers without the dead-letter fields are refused, naming what is missing."""
    with pytest.raises(ValueError, match=r"missing header\(s\) error\.type"):
        parse_dead_letter_headers([("traceparent", b"x")])
