"""`persisted_value` writes the bytes the `HistoryPersisted` model writes, for any response and outcome.

The persist path encodes its outcome events without building the model (issue 25); the model stays the
reference: every generated response (with or without metadata of any JSON, odd text in ids), saved ids,
`skipped` reason and thread time (any offset, sub-millisecond digits) gives the same bytes both ways.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from message_history.errors import EventValidationError
from schemas.codec import decode_response, encode, persisted_value
from schemas.events import HistoryPersisted, Skipped

# Ids the decode accepts: a blank one (" ", "\u3000") is refused before any outcome exists (schemas/codec.py
# check_id; test_a_blank_id_is_refused below), so it is no input of this property.
ID = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
    str.strip
)
TEXT = st.text(max_size=8) | st.sampled_from(['"', "\\", "\u2028", "😀", "\x00\x1f", "</script>"])
JSON_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)
TIMES = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2999, 12, 31),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]),
)


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "requestId": draw(ID),
        "threadId": draw(ID),
        "resourceId": draw(ID),
        "createdAt": draw(TIMES).isoformat(),
        "input": [],
        "response": [],
    }
    if draw(st.booleans()):
        event["metadata"] = draw(st.none() | st.dictionaries(TEXT, JSON_VALUE, max_size=4))
    return json.dumps(event).encode()


_ODD_IDS = b'{"schemaVersion": 1, "requestId": " 0", "threadId": "\\u00a0t", "resourceId": "r ", '
_ODD_IDS += b'"createdAt": "2000-01-01T00:00:00+00:00", "input": [], "response": []}'


@settings(max_examples=300, deadline=None)
@example(raw=_ODD_IDS, saved=["\u00a0m"], skipped=None, updated=None)  # ids with spaces around: not blank
@given(
    raw=responses(),
    saved=st.lists(ID, max_size=4),
    skipped=st.none() | st.sampled_from(get_args(Skipped)),
    updated=st.none() | TIMES,
)
def test_bytes_equal_the_models(
    raw: bytes, saved: list[str], skipped: Skipped | None, updated: datetime | None
) -> None:
    response = decode_response(raw)
    model = HistoryPersisted.for_response(
        response, saved_ids=saved, skipped=skipped, thread_updated_at=updated
    )
    value = persisted_value(response, saved_ids=saved, skipped=skipped, thread_updated_at=updated)
    assert value == encode(model)


@pytest.mark.parametrize("blank", [" ", "\t", "\u3000", "\u00a0 "])
def test_a_blank_id_is_refused(blank: str) -> None:
    """Why `ID` leaves blank ids out: the decode refuses them, so no outcome is ever encoded for one."""
    event = {"schemaVersion": 1, "requestId": "q", "threadId": "t", "resourceId": blank}
    raw = json.dumps(
        {**event, "createdAt": "2000-01-01T00:00:00+00:00", "input": [], "response": []}
    ).encode()
    with pytest.raises(EventValidationError, match="resourceId: must not be empty or blank"):
        decode_response(raw)
