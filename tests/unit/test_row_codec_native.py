"""The native row codec (`native/`, `message_history_native`) against the Python reference, byte for byte.

Where the native codec answers, its answer is the reference's (`rows_from_raw_py`, itself `row_from_doc`);
where it is not sure it answers None and the reference decides. Checked over generated documents (unicode,
escapes, control and astral characters, numbers, nested parts, unknown keys, wrong types, dates at the
edges, missing and repeated fields, non-canonical spacing and key order), over the bench's and this
service's rows (where it must answer), and over rows @mastra/mongodb wrote (tests/unit/data/mastra_rows.jsonl,
see tests/interop/mastra_rows_corpus.py). The module is built by `stack install --all` (CI): under CI=true a
missing module fails these tests instead of skipping them.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bson
import pytest
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidDocument
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from bench.workload import Workload, seed_documents
from storage import row_codec
from storage.recalled_rows import MESSAGE_PROJECTION
from storage.row_codec import NATIVE_MODULE, codec_fingerprint, rows_from_raw_py, select_codec
from tests.recall_docs import T0, stored_docs

ROOT = Path(__file__).resolve().parents[2]
FINGERPRINT_RS = ROOT / "native" / "src" / "fingerprint.rs"
MASTRA_ROWS = Path(__file__).parent / "data" / "mastra_rows.jsonl"
COVERAGE_SEED = 20261204  # the fixed sample the generator's coverage is counted on


@pytest.fixture(scope="module")
def native() -> Any:
    try:
        return importlib.import_module(NATIVE_MODULE)
    except ImportError:
        reason = f"{NATIVE_MODULE} is not installed (deploy/local/stack install --all builds it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)  # CI builds it: a missing module is a broken build, not a skip
        pytest.skip(reason)


def _differ(native: Any, raws: list[bytes]) -> tuple[int, int]:
    """Assert native == reference wherever native answers; (rows native answered, rows the reference took)."""
    got = native.rows_from_raw(raws)
    want = rows_from_raw_py(raws)
    assert len(got) == len(want) == len(raws)
    for raw, mine, ref in zip(raws, got, want, strict=True):
        if mine is not None:
            assert mine == ref, f"native and reference differ on {raw!r:.600}"
    return sum(r is not None for r in got), sum(r is not None for r in want)


# --- the fingerprint ---------------------------------------------------------------------------------------


def test_the_committed_fingerprint_is_todays_models() -> None:
    match = re.search(r'FINGERPRINT: &str = "([0-9a-f]{64})"', FINGERPRINT_RS.read_text())
    assert match is not None
    assert match.group(1) == codec_fingerprint(), (
        "the models or rules the native codec mirrors changed: review native/src against them, then "
        "regenerate native/src/fingerprint.rs (`python -m storage.row_codec` prints the value) and rebuild"
    )


def test_the_installed_module_is_built_from_these_models(native: Any) -> None:
    assert codec_fingerprint() == native.FINGERPRINT


# --- rows the native codec must answer ---------------------------------------------------------------------


def test_the_benchs_rows_are_all_answered(native: Any) -> None:
    w = Workload(threads=20, history=40, message_bytes=1024)
    raws = [bson.encode(doc) for i in range(w.threads) for doc in seed_documents(w, i)[1]]
    answered, taken = _differ(native, raws)
    assert answered == taken == len(raws)


# one special character at every place of the 8-byte words the native string scan skips by (and past them)
_SPECIALS = [
    '"',
    "\\",
    "\n",
    "\x01",
    "\x1f",
    " ",
    "!",
    "#",
    "[",
    "]",
    "\x7f",
    "é",
    "€",
    "\u2028",
    "\U0001f600",
]


def _row_with_text(body: str) -> dict[str, Any]:
    doc = seed_documents(Workload(threads=1, history=1, message_bytes=16), 0)[1][0]
    doc["content"] = to_json({"format": 2, "parts": [{"type": "text", "text": body}]}).decode()
    return doc


def test_a_special_character_at_every_place_of_a_word_is_read_as_the_reference_reads_it(native: Any) -> None:
    raws = [
        bson.encode(_row_with_text("a" * before + special + "b" * after))
        for special in _SPECIALS
        for before in range(18)
        for after in (0, 1, 7, 8, 9)
    ]
    answered, taken = _differ(native, raws)
    assert answered == taken == len(raws)


def test_a_non_canonical_escape_at_every_place_of_a_word_is_not_sure(native: Any) -> None:
    """`\\/` and an upper-case `\\u00XX`: JSON pydantic-core never writes, not canonical wherever it sits."""
    for escape in ("\\/", "\\u001F", "\\u0041"):
        for before in range(18):
            doc = _row_with_text("x")
            doc["content"] = doc["content"].replace('"x"', '"' + "a" * before + escape + 'b"')
            raw = bson.encode(doc)
            assert native.rows_from_raw([raw]) == rows_from_raw_py([raw]) == [None], (escape, before)


class _NotSureError(Exception):
    pass


def _not_sure(_: str) -> Any:
    raise _NotSureError


def _in_native_subset(raw: bytes) -> bool:
    """Only projected fields, and content without a float or an integer past 18 digits (the native subset)."""
    doc = bson.decode(raw)
    if not set(doc) <= set(MESSAGE_PROJECTION):
        return False
    try:
        json.loads(
            doc["content"], parse_float=_not_sure, parse_int=lambda t: _not_sure(t) if len(t) > 18 else 0
        )
    except _NotSureError:
        return False
    return True


def test_this_services_and_mastras_rows_are_answered(native: Any) -> None:
    taken = 0
    for docs_seed in range(150):
        raws = [bson.encode(doc) for doc in stored_docs(docs_seed, 20, "t-native", "r-native")]
        got = native.rows_from_raw(raws)
        for raw, mine, ref in zip(raws, got, rows_from_raw_py(raws), strict=True):
            if ref is not None and _in_native_subset(raw):
                taken += 1
                assert mine == ref, f"{raw!r:.600}"
            elif mine is not None:
                assert mine == ref
    assert taken > 1200


def test_rows_mastra_wrote_are_answered(native: Any) -> None:
    raws = [base64.b64decode(line) for line in MASTRA_ROWS.read_text().split()]
    assert len(raws) >= 100
    got = native.rows_from_raw(raws)
    want = rows_from_raw_py(raws)
    assert sum(row is not None for row in want) >= 0.95 * len(raws)  # Mastra's compact rows are plain
    subset = 0
    for raw, mine, ref in zip(raws, got, want, strict=True):
        if _in_native_subset(raw):
            subset += 1
            assert mine == ref, f"{raw!r:.600}"
        elif mine is not None:
            assert mine == ref
    assert subset >= 100


# --- generated documents -----------------------------------------------------------------------------------

# text of every kind: control characters, quotes, backslashes, DEL, U+2028, astral (no lone surrogates: BSON
# strings are UTF-8)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(
    [
        "",
        "v2",
        'a"b\\c',
        "\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f",
        "\u2028\u2029",
        "😀𝄞",
        "data-",
        "data-\nx",
        "é",
    ]
)
JSON_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    TEXT,
    TEXT,
    TEXT,
    st.floats(allow_nan=False),  # the native codec leaves floats to the reference: not too many
)
JSON_VALUE = st.recursive(
    JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
KNOWN_KINDS = [
    "text",
    "reasoning",
    "tool-invocation",
    "source",
    "source-document",
    "file",
    "step-start",
    "error",
]
STATES = ["partial-call", "call", "result", "approval-requested", "output-error", "bogus"]


@st.composite
def parts(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*KNOWN_KINDS, "data-chart", "data-", "data-\nx", "future-part", "data-x"]))
    part: dict[str, Any] = {"type": kind}

    def s() -> str:
        return draw(TEXT)

    templates: dict[str, dict[str, Any]] = {
        "text": {"text": s()},
        "reasoning": {"reasoning": s(), "details": [{"type": "text", "text": s()}]},
        "tool-invocation": {
            "toolInvocation": {
                "state": draw(st.sampled_from(STATES)),
                "toolCallId": s(),
                "toolName": s(),
                "args": draw(JSON_VALUE),
                "result": draw(JSON_VALUE),
            }
        },
        "source": {"source": {"sourceType": "url", "id": s(), "url": draw(st.none() | TEXT)}},
        "source-document": {"sourceId": s(), "mediaType": s(), "title": s()},
        "file": {"mimeType": s(), "data": s()},
        "error": {"error": {"name": draw(st.none() | TEXT), "message": s()}},
    }
    part.update(templates.get(kind, {"data": draw(JSON_VALUE)} if kind.startswith("data") else {}))
    return _mutate(draw, part)


def _mutate(draw: st.DrawFn, obj: dict[str, Any]) -> dict[str, Any]:
    """Sometimes: a key dropped, a value of a wrong type, an unknown key first or last, the order shuffled."""
    items = list(obj.items())
    # mostly kept as is, so most generated rows stay plain (middle values: Hypothesis favours the bounds)
    roll = draw(st.integers(0, 24)) - 9
    if roll == 0 and items:
        del items[draw(st.integers(0, len(items) - 1))]
    elif roll == 1 and items:
        i = draw(st.integers(0, len(items) - 1))
        items[i] = (items[i][0], draw(JSON_VALUE))
    elif roll == 2:
        items.insert(draw(st.sampled_from([0, len(items)])), (draw(TEXT), draw(JSON_VALUE)))
    elif roll == 3:
        items = draw(st.permutations(items))
    return dict(items)


@st.composite
def contents(draw: st.DrawFn) -> str | Any:
    value: dict[str, Any] = {"format": draw(st.sampled_from([2] * 8 + [1, "2", 2.0, None]))}
    value["parts"] = draw(st.lists(parts(), max_size=3))
    for key, strategy in [
        ("content", st.none() | TEXT),
        ("toolInvocations", st.none() | st.lists(st.dictionaries(TEXT, JSON_SCALAR, max_size=2), max_size=2)),
        ("reasoning", TEXT),
        ("annotations", st.none() | st.lists(JSON_VALUE, max_size=2)),
        ("metadata", st.none() | st.dictionaries(TEXT, JSON_VALUE, max_size=3)),
        ("providerMetadata", st.none() | st.dictionaries(TEXT, JSON_SCALAR, max_size=2)),
    ]:
        if draw(st.booleans()):
            value[key] = draw(strategy)
    value = _mutate(draw, value)
    how = draw(
        st.sampled_from(["models"] * 8 + ["stringify"] * 4 + ["ascii", "spaced", "sorted", "object", "text"])
    )
    if how == "models":  # pydantic-core's own dump: canonical when the structure is
        return to_json(value).decode()
    if how == "stringify":  # as JSON.stringify (Mastra)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if how == "ascii":
        return json.dumps(value, separators=(",", ":"))
    if how == "spaced":
        return json.dumps(value, ensure_ascii=False)
    if how == "sorted":
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    if how == "object":
        return value  # a sub-document
    return draw(TEXT)


EDGE_MS = [-62135596800001, -62135596800000, -1, 0, 1, 951782400000, 253402300799999, 253402300800000]
IN_RANGE = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)).map(
    lambda d: d.replace(tzinfo=UTC, microsecond=d.microsecond // 1000 * 1000)
)
DATES = st.one_of(
    IN_RANGE,
    IN_RANGE,
    IN_RANGE,
    st.sampled_from(EDGE_MS).map(DatetimeMS),
    st.sampled_from([*EDGE_MS, 1_700_000_000_123]).map(DatetimeMS),
    st.just("2025-01-01T00:00:00.000Z"),  # a legacy string date
)
WRONG = (
    st.none() | st.integers(-1, 1) | st.booleans() | st.floats(allow_nan=False) | st.lists(TEXT, max_size=1)
)


def _element(key: str, value: Any) -> bytes:
    try:
        return bson.encode({key: value})[4:-1]
    except (InvalidDocument, OverflowError):  # what BSON cannot hold (a NUL in a key, a big int): as JSON
        return bson.encode({key: json.dumps(value)})[4:-1]


IDS = st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=12) | st.sampled_from(
    ["m-1", "msg 2"]
)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """A raw document: usually the plain shape, often a field missing, repeated, wrongly typed or unknown."""
    fields: list[tuple[str, Any]] = [
        # mostly an id an event can carry, sometimes any text (blank, edged with spaces: both decline those)
        ("id", draw(st.one_of(*[IDS] * 3, TEXT))),
        ("thread_id", draw(TEXT)),
        ("resourceId", draw(TEXT)),
        ("role", draw(st.sampled_from(["user", "assistant", "system", "signal"] * 3 + ["tool", "User"]))),
        ("type", draw(st.one_of(*[st.sampled_from(["v2", "", "text"])] * 3, TEXT, st.none(), WRONG))),
        ("content", draw(contents())),
        ("createdAt", draw(DATES)),
    ]
    if draw(st.booleans()):
        fields.append(("_mh_extra", draw(st.sampled_from([None, None, None, '{"custom":1}']))))
    roll = draw(st.integers(0, 11)) - 4
    if roll == 0:
        del fields[draw(st.integers(0, len(fields) - 1))]
    elif roll == 1:
        i = draw(st.integers(0, len(fields) - 1))
        fields[i] = (fields[i][0], draw(WRONG))
    elif roll == 2:
        fields.append(draw(st.sampled_from(fields)))  # a repeated field (the driver keeps the last)
    elif roll == 3:
        fields.insert(draw(st.integers(0, len(fields))), (draw(st.sampled_from(["_id", "x", "metadata"])), 1))
    fields = draw(st.permutations(fields)) if draw(st.booleans()) else fields
    body = b"".join(_element(k, v) for k, v in fields)
    return (len(body) + 5).to_bytes(4, "little") + body + b"\x00"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents(), min_size=1, max_size=4))
def test_generated_documents_give_the_references_bytes(native: Any, raws: list[bytes]) -> None:
    _differ(native, raws)


def test_the_generator_reaches_both_answers(native: Any) -> None:
    """The property above is not vacuous: generated documents the native codec takes and ones it refuses.

    The counts are a statistic of the generator, not a property of each input: over seeds 0-39 the documents
    answered went as low as 16 of 300, so they are counted on one fixed sample (the seed, no database) of
    1,000. Even with the seed the sample depends on what ran before in the process (17 of 300 answered after
    the other row-codec test files), hence the larger sample against the same bound.
    """
    answered = refused = 0

    @seed(COVERAGE_SEED)
    @settings(max_examples=1000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(documents())
    def count(raw: bytes) -> None:
        nonlocal answered, refused
        [row] = native.rows_from_raw([raw])
        answered += row is not None
        refused += row is None

    count()
    assert answered > 20
    assert refused > 20


def test_dates_at_the_edges_are_written_as_the_models_write_them(native: Any) -> None:
    content = '{"format":2,"parts":[]}'
    base = {"id": "m", "thread_id": "t", "resourceId": "r", "role": "user", "content": content}
    raws = [bson.encode({**base, "createdAt": DatetimeMS(ms)}) for ms in EDGE_MS]
    raws += [
        bson.encode({**base, "createdAt": datetime(2024, 2, 29, tzinfo=UTC) + timedelta(milliseconds=ms)})
        for ms in range(-86_400_001, 86_400_001, 3_600_007)
    ]
    answered, taken = _differ(native, raws)
    assert answered == taken == len(raws) - 2  # all but the two outside Python's range


def test_malformed_bytes_are_none(native: Any) -> None:
    good = bson.encode({"id": "m", "thread_id": "t", "resourceId": "r", "role": "user", "content": "x"})
    for raw in [b"", b"\x05\x00\x00\x00", good[:-1], good + b"\x00", good[:10], b"\xff" * 40]:
        assert native.rows_from_raw([raw]) == [None]
    assert native.rows_from_raw([bytearray(good)]) == [None]  # not bytes: left to the reference


# --- bounded work (issue 31) -------------------------------------------------------------------------------


def _row_with(content: str) -> bytes:
    return bson.encode(
        {
            "id": "m",
            "thread_id": "t",
            "resourceId": "r",
            "role": "assistant",
            "content": content,
            "createdAt": T0,
        }
    )


def _wide(keys: int, *, top_level: bool = False, duplicate: bool = False) -> str:
    wide = ",".join(f'"key-{i:06d}":{i}' for i in range(keys))
    if duplicate:
        wide += ',"key-000000":0'
    if top_level:
        return '{"format":2,"parts":[],' + wide + "}"
    return '{"format":2,"parts":[],"metadata":{' + wide + "}}"


@pytest.mark.timeout(30)  # a hang guard: the quadratic key check needed minutes for 250,000 keys
def test_wide_rows_are_answered_in_linear_work(native: Any) -> None:
    """250,000 keys in `content.metadata` or at the top of content: answered, as the reference answers."""
    raws = [_row_with(_wide(250_000)), _row_with(_wide(250_000, top_level=True))]
    answered, taken = _differ(native, raws)
    assert answered == taken == 2


@pytest.mark.timeout(60)
def test_a_duplicate_key_in_a_wide_object_is_not_canonical(native: Any) -> None:
    """The sorted duplicate check finds a repeated key at any distance (the models keep one: not canonical)"""
    raws = [_row_with(_wide(100_000, duplicate=True)), _row_with(_wide(10, duplicate=True))]
    assert native.rows_from_raw(raws) == [None, None]
    assert rows_from_raw_py(raws) == [None, None]


@pytest.mark.timeout(60)
def test_past_the_work_budget_or_the_depth_the_reference_decides(native: Any) -> None:
    """More values than MAX_VALUES, or nesting 10,000 deep: native declines (None), the reference decides."""
    over_budget = '{"format":2,"parts":[],"metadata":{"a":[' + ",".join(["0"] * native.MAX_VALUES) + "]}}"
    deep = '{"format":2,"parts":[],"metadata":{"a":' + "[" * 10_000 + "]" * 10_000 + "}}"
    raws = [_row_with(over_budget), _row_with(deep)]
    assert native.rows_from_raw(raws) == [None, None]
    want = rows_from_raw_py(raws)
    assert want[0] is not None  # the reference answers the wide row itself
    assert select_codec("native")(raws) == want


def test_a_panic_in_the_native_codec_is_the_references_batch(
    native: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A Rust panic raises PyO3's PanicException, a BaseException past every `except Exception`: the service's
    wrapper lets the reference decide that batch, counts it, and logs the first one."""
    raws = [bson.encode(doc) for doc in stored_docs(3, 10, "t-panic", "r-panic")]
    native._panic_next_call_for_tests()
    with pytest.raises(BaseException, match="test-only panic") as raised:
        native.rows_from_raw(raws)
    assert not isinstance(raised.value, Exception)  # what made it dangerous
    codec = select_codec("native")
    before = row_codec.native_failures
    native._panic_next_call_for_tests()
    with caplog.at_level(logging.ERROR, logger="storage.row_codec"):
        assert codec(raws) == rows_from_raw_py(raws)
    assert row_codec.native_failures == before + 1
    assert codec(raws) == rows_from_raw_py(raws)  # the next batch: native again
