"""Which fetch errors mean "a producer wrote bytes we cannot read", and the reasons their dead letters get."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import cramjam
import pytest
from aiokafka.errors import (
    CorruptRecordException,
    IllegalStateError,
    KafkaConnectionError,
    UnsupportedCodecError,
)

from consumers.unreadable import describe, is_unreadable
from message_history.errors import EventValidationError
from message_history.settings import Settings
from producers.output import compression_type
from schemas.codec import decode_request, schema_registry_framing


@pytest.mark.parametrize(
    ("error", "unreadable"),
    [
        (UnsupportedCodecError("Libraries for snappy compression codec not found"), True),
        (CorruptRecordException("Invalid CRC"), True),
        (cramjam.DecompressionError("snappy: corrupt input"), True),
        (gzip.BadGzipFile("Not a gzipped file"), True),
        (EOFError("Compressed file ended before the end-of-stream marker was reached"), True),
        (zlib.error("invalid stored block lengths"), True),
        (struct.error("unpack requires a buffer of 4 bytes"), True),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), True),
        (KafkaConnectionError("broker down"), False),  # an outage
        (ConnectionResetError("reset"), False),  # an outage, although an OSError
        (IllegalStateError("not assigned"), False),  # our state, a bug
        (RuntimeError("bug"), False),
    ],
)
def test_is_unreadable(error: BaseException, unreadable: bool) -> None:
    """Errors of the bytes are unreadable; outages and our own mistakes are not."""
    assert is_unreadable(error) is unreadable


def test_a_missing_codec_says_what_to_install() -> None:
    """The reason for a codec without its library names it and the fix."""
    reason = describe(UnsupportedCodecError("Libraries for zstd compression codec not found"))
    assert "zstd" in reason
    assert "cramjam" in reason


def test_schema_registry_framing_is_named_with_its_schema_id() -> None:
    """Magic byte 0 + a 4-byte schema id before the payload: the reason says so, whatever follows."""
    body = json.dumps({"schemaVersion": 1}).encode()
    assert schema_registry_framing(b"\x00" + (7).to_bytes(4, "big") + body) is not None
    with pytest.raises(EventValidationError, match=r"Schema Registry framing .*schema id 7"):
        decode_request(b"\x00" + (7).to_bytes(4, "big") + body)
    with pytest.raises(EventValidationError, match="Schema Registry"):
        decode_request(b"\x00\x00\x00\x01\x00\x02\xa0\x01")  # Avro payload


@pytest.mark.parametrize("raw", [b"", b"{}", b"\x00", b"\x00\x00\x00", b'{"a": 1}', b"[0, 0, 0, 0, 0]"])
def test_json_and_short_values_are_not_taken_for_framing(raw: bytes) -> None:
    """JSON never starts with a zero byte, and fewer than five bytes cannot hold the frame."""
    assert schema_registry_framing(raw) is None


@pytest.mark.parametrize(("setting", "expected"), [("none", None), ("gzip", "gzip"), ("zstd", "zstd")])
def test_output_compression_maps_to_aiokafka(setting: str, expected: str | None) -> None:
    """`none` is aiokafka's None; every other value is passed as is."""
    assert compression_type(Settings(output_compression=setting)) == expected
