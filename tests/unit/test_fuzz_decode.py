"""Property (issue 23, item 3), pure: each path's decode step, on any bytes, returns a valid event or raises
`InvalidInputError`, never another exception; what the contract refuses is refused; what it accepts comes back
as strict JSON (no NaN/Infinity, integers MongoDB can store) that decodes again to the same event.

Many examples, no stack. `FUZZ_EXAMPLES` raises the count (docs/fuzzing.md).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.contract import Record
from consumers.persist import PersistHandler
from consumers.recall import RecallHandler
from message_history.errors import InvalidInputError
from message_history.settings import Settings
from producers.enriched import EnrichedPublisher
from producers.persisted import PersistedPublisher
from schemas.codec import encode
from schemas.commands import decode_command, encode_answer
from schemas.limits import Limits
from storage.memory import InMemoryHistoryStorage
from storage.sequential import SequentialBatches
from tests.fuzzing import EDGES, INT64_MAX, Fuzzed, Topic, any_value, apply_edge, base_event, dumps, not_json

TOPICS: tuple[Topic, ...] = ("requests", "responses", "commands")
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "400"))
LIMITS = Limits(max_event_bytes=16_384, max_messages_per_event=20, max_parts_per_message=20, max_id_length=40)
SETTINGS = Settings(
    max_event_bytes=LIMITS.max_event_bytes,
    max_messages_per_event=LIMITS.max_messages_per_event,
    max_parts_per_message=LIMITS.max_parts_per_message,
    max_id_length=LIMITS.max_id_length,
)
_STORAGE = SequentialBatches(InMemoryHistoryStorage())
# the output is decoded again without the size limit: the ids and times decoding fills in make it longer
_UNBOUNDED = SETTINGS.model_copy(update={"max_event_bytes": 64 * LIMITS.max_event_bytes})


@dataclass(frozen=True)
class _Record:
    """The consumed record a path's `_decode` is handed (it may read the key)."""

    key: bytes | None
    value: bytes | None
    topic: str = "fuzz"
    partition: int = 0
    offset: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


Decoder = Callable[[bytes | None, bytes], bytes]


def _decoders(settings: Settings) -> dict[Topic, Decoder]:
    recall = RecallHandler(settings, _STORAGE, cast(EnrichedPublisher, None))
    persist = PersistHandler(settings, _STORAGE, cast(PersistedPublisher, None))
    limits = Limits.from_settings(settings)

    def request(key: bytes | None, value: bytes) -> bytes:
        return encode(recall._decode(cast(Record, _Record(key, value)), value).request)

    def response(key: bytes | None, value: bytes) -> bytes:
        return encode(persist._decode(cast(Record, _Record(key, value)), value).response)

    return {
        "requests": request,
        "responses": response,
        "commands": lambda _key, value: encode_answer(decode_command(value, limits)),
    }


DECODERS = _decoders(SETTINGS)
AGAIN = _decoders(_UNBOUNDED)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict(data: bytes) -> Any:
    """`data` parsed as strict JSON: NaN/Infinity refused, every number finite; the numbers the service
    uses itself (`memory`: query limits, budgets) within MongoDB's int64 (free-form fields may hold any)."""
    parsed = json.loads(data, parse_constant=_no_constant)

    def walk(value: Any, used: bool) -> None:
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return
        if isinstance(value, int):
            assert not used or abs(value) <= INT64_MAX, f"integer {value} does not fit MongoDB's int64"
        elif isinstance(value, float):
            assert math.isfinite(value), f"number {value} is not finite"
        elif isinstance(value, dict):
            for name, item in value.items():
                walk(item, used or name == "memory")
        else:
            for item in value:
                walk(item, used)

    walk(parsed, False)
    return parsed


def check(record: Fuzzed) -> None:
    """The property for one record (see the module docstring)."""
    if record.value is None:
        return  # a record without a value is refused before decoding (`decode_each`): the stream test has it
    decode = DECODERS[record.topic]
    try:
        wire = decode(record.key, record.value)
    except InvalidInputError as exc:
        reason = str(exc)
        assert record.expect != "accept", f"refused what the contract accepts: {reason}\n{record.describe()}"
        if record.label.startswith("utf-16") or record.label.startswith("utf-32"):
            assert "Schema Registry" not in reason, f"wrong reason {reason!r}\n{record.describe()}"
        if not_json(record.value, LIMITS):
            assert "not valid JSON" in reason, f"wording {reason!r}\n{record.describe()}"
        return
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}\n{record.describe()}") from exc
    assert record.expect != "refuse", f"accepted what the contract refuses\n{record.describe()}"
    try:
        _strict(wire)
        again = AGAIN[record.topic](record.key, wire)
    except Exception as exc:
        raise AssertionError(
            f"accepted, but its output is not valid: {type(exc).__name__}: {exc}\n"
            f"output={wire[:300]!r}\n{record.describe()}"
        ) from exc
    assert again == wire, f"decoding the output again changes it\n{record.describe()}"


@pytest.mark.parametrize("topic", ["requests", "responses", "commands"])
def test_decode_returns_a_valid_event_or_refuses(topic: Topic) -> None:
    """Any bytes on any of the three input topics: a valid event, or `InvalidInputError`, nothing else."""

    # Seeded by the profile (tests/hypothesis_profiles.py): the same draws under CI, new ones elsewhere.
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(any_value(topic, LIMITS))
    def run(record: Fuzzed) -> None:
        check(record)

    run()


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("nan", b'{"a": NaN}'),
        ("truncated", b'{"schemaVersion": 1, "requ'),
        ("utf-16", '{"schemaVersion": 1}'.encode("utf-16-be")),
    ],
)
def test_the_property_fails_on_a_raw_exception(label: str, value: bytes) -> None:
    """The check itself can fail: a decode step that raises anything but `InvalidInputError` is reported."""

    def boom(_key: bytes | None, _value: bytes) -> bytes:
        raise OverflowError("date value out of range")

    DECODERS["requests"], saved = boom, DECODERS["requests"]
    try:
        with pytest.raises(AssertionError, match="OverflowError"):
            check(Fuzzed("requests", label, b"k", value, "either"))
    finally:
        DECODERS["requests"] = saved


def test_every_edge_is_drawn() -> None:
    """The generators reach each kind: a small fixed sample holds edges, garbage, wrong keys and controls."""
    seen: set[str] = set()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(st.sampled_from(TOPICS).flatmap(lambda t: any_value(t, LIMITS)))
    def collect(record: Fuzzed) -> None:
        seen.add(record.label.split(" ")[0])

    collect()
    assert {"edge", "valid", "random", "truncated"} <= seen


def _every_edge() -> list[Any]:
    params = []
    for topic, edges in EDGES.items():
        event = base_event(topic, "h", "r", "q")
        for edge in edges(LIMITS):
            record = Fuzzed(topic, edge.label(), b"h", dumps(apply_edge(event, edge)), edge.expect)
            if len(record.value or b"") > LIMITS.max_event_bytes:
                record = replace(record, expect="refuse")
            params.append(pytest.param(record, id=f"{topic}:{edge.label()}"))
    return params


@pytest.mark.parametrize("record", _every_edge())
def test_every_edge_value(record: Fuzzed) -> None:
    """Table form of the same property: every edge value of every topic once, so a run lists them all."""
    check(record)
