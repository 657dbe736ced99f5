"""Every parser of the product on inputs sized to expose super-linear cost (issue 31): 100,000 keys,
10,000-deep nesting, 64 KB of backslashes, in an event's message content, through each path's decoding and
the recall path's canonical check and reference row codec. Each either answers or refuses the input
(InvalidInputError); the timeouts are hang guards, not timing assertions. The regular expressions:
test_regex_bounds.py; the native codec: test_row_codec_native.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import bson
import pytest

from message_history.errors import InvalidInputError
from schemas.canonical import canonical_content
from schemas.codec import decode_request, decode_response
from schemas.commands import decode_command
from schemas.limits import Limits
from storage.row_codec import rows_from_raw_py
from tests.fuzzing import base_event
from tests.recall_docs import T0

LIMITS = Limits(max_event_bytes=16 * 1024 * 1024)  # the size cap is not what is tested here
HOLE = '"__hostile__"'
DEEP = 10_000
WIDE = 100_000

FRAGMENTS = {
    "wide-object": "{" + ",".join(f'"key-{i:06d}":{i}' for i in range(WIDE)) + "}",
    "wide-array": "[" + ",".join(["0"] * WIDE) + "]",
    "deep-arrays": "[" * DEEP + "]" * DEEP,
    "deep-objects": '{"a":' * DEEP + "0" + "}" * DEEP,
    "backslashes": json.dumps("\\" * 65_536),
    "password-backslashes": json.dumps('password="' + "\\" * 65_536),
    "many-numbers": "[" + ",".join(["1" * 299] * 3000) + "]",
    "huge-exponent": "[" + ",".join(["1e999"] * 3000) + "]",
}


def _event(topic: str, fragment: str) -> bytes:
    event: dict[str, Any] = base_event(topic, "t-bounds", "r-bounds", "q-bounds")  # type: ignore[arg-type]
    messages = event.get("messages") or event.get("response")
    assert messages is not None
    messages[0]["content"]["metadata"] = "__hostile__"
    return json.dumps(event).replace(HOLE, fragment).encode()


DECODERS: dict[str, tuple[str, Callable[[bytes, Limits], Any]]] = {
    "request": ("requests", decode_request),
    "response": ("responses", decode_response),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fragment", sorted(FRAGMENTS))
@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_event_decoding_finishes(decoder: str, fragment: str) -> None:
    """Each path's decoder answers or refuses a hostile content at once."""
    topic, decode = DECODERS[decoder]
    raw = _event(topic, FRAGMENTS[fragment])
    with contextlib.suppress(InvalidInputError):
        decode(raw, LIMITS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fragment", sorted(FRAGMENTS))
def test_command_decoding_finishes(fragment: str) -> None:
    """The commands path's decoder too (a hostile field where the command has none)."""
    event = base_event("commands", "t-bounds", "r-bounds", "q-bounds")
    event["extra"] = "__hostile__"
    raw = json.dumps(event).replace(HOLE, FRAGMENTS[fragment]).encode()
    with contextlib.suppress(InvalidInputError):
        decode_command(raw, LIMITS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fragment", sorted(FRAGMENTS))
def test_stored_content_finishes(fragment: str) -> None:
    """A stored message's content: the canonical check and the reference row codec answer at once."""
    content = '{"format":2,"parts":[],"metadata":' + FRAGMENTS[fragment] + "}"
    canonical_content(content)
    doc = {"id": "m", "thread_id": "t", "resourceId": "r", "role": "assistant", "content": content}
    [row] = rows_from_raw_py([bson.encode({**doc, "createdAt": T0})])
    if fragment == "wide-object":
        assert row is not None  # wide but plain: the reference answers it itself
