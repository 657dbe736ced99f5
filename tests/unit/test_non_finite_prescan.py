"""The NaN / Infinity / huge-number prescan of `schemas.codec.check_raw`: the native `maybe_non_finite`
(native/src/prescan.rs) and the Python fallback `maybe_non_finite_py` (a translation and substring searches)
answer exactly the definition `maybe_non_finite_reference` (two substring tests and the `_MAYBE_HUGE`
regex) on random bytes and on inputs built around the patterns; the codec uses the native one when it is
installed, the fallback when not.

The module is built by `stack install --all` (CI): under CI=true a missing module fails these tests instead of
skipping them (tests/prescan.py), as tests/unit/test_row_codec_native.py does.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from message_history.errors import EventValidationError
from schemas import codec
from schemas.codec import (
    NATIVE_MODULE,
    check_raw,
    maybe_non_finite_py,
    maybe_non_finite_reference,
    select_prescan,
)
from schemas.limits import Limits
from tests.prescan import Prescan, native_prescan

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "400"))


@pytest.fixture(scope="module")
def native() -> Prescan:
    return native_prescan()


@pytest.fixture(scope="module", params=["native", "python"])
def prescan(request: pytest.FixtureRequest) -> Prescan:
    """Each prescan the codec may use: the native one, and the Python fallback."""
    return native_prescan() if request.param == "native" else maybe_non_finite_py


# --- inputs built around the patterns ----------------------------------------------------------------------

PATTERNS: list[bytes] = [
    b"NaN",
    b"Na",
    b"aN",
    b"nan",
    b"NAN",
    b"Infinity",
    b"Infinit",
    b"nfinity",
    b"-Infinity",
    b"e123",
    b"E123",
    b"e+123",
    b"E-123",
    b"e+12",
    b"e12",
    b"e12x",
    b"e-12.5",
    b"e+-123",
    b"ee123",
    b"e 123",
    b"1e308",
    b"1e-400",
    b"+123",
    b"\xd9\xa1\xd9\xa2\xd9\xa3",  # Arabic-Indic digits in UTF-8: not `\d` on bytes
]
FILLERS: list[bytes] = [b"a", b" ", b"e", b"+", b"7", b"\xff"]


def _runs() -> list[bytes]:
    digits = b"1234567890" * 31
    out: list[bytes] = []
    for n in (2, 3, 298, 299, 300, 301, 400):
        run = digits[:n]
        out += [run, b"[" + run + b"]", b"x" + run, run + b"x", b"e" + run, b"E-" + run, b"7" + run]
    out.append(digits[:299] + b"." + digits[:299])  # two runs of 299 are not one of 300
    out.append(digits[:299] + b"e" + digits[:299])  # ... but the second is an exponent's digits
    return out


def _placed() -> list[bytes]:
    """Each pattern at every offset of 70 bytes of each filler: across the native code's 32-byte chunks, at
    the start, in the middle and cut off at the end."""
    out: list[bytes] = []
    for pattern in PATTERNS:
        for filler in FILLERS:
            for at in range(70):
                out.append(filler * at + pattern + filler * (70 - at))
                out.append(filler * at + pattern)
    return out


TABLE: list[bytes] = [
    b"",
    b"{}",
    b'{"a":1.5e10,"b":"none here"}',
    b'{"n":NaN}',
    b'{"n":-Infinity}',
    b'{"n":1e309}',
    b'{"n":"1e400 in a string"}',
    b"\x00\x00\x00\x01\x02NaN",
    bytes(range(256)),
    *_runs(),
]


@pytest.mark.parametrize("raw", TABLE, ids=range(len(TABLE)))
def test_each_prescan_equals_the_reference_on_the_table(prescan: Prescan, raw: bytes) -> None:
    assert prescan(raw) is maybe_non_finite_reference(raw)


def test_each_prescan_equals_the_reference_on_every_placement(prescan: Prescan) -> None:
    placed = _placed()
    hits = 0
    for raw in placed:
        want = maybe_non_finite_reference(raw)
        assert prescan(raw) is want, raw
        hits += want
    assert 0 < hits < len(placed)  # both answers are exercised


def test_the_table_holds_both_answers() -> None:
    answers = {maybe_non_finite_reference(raw) for raw in TABLE}
    assert answers == {True, False}
    assert maybe_non_finite_reference(b"1" * 299) is False
    assert maybe_non_finite_reference(b"1" * 300) is True
    assert maybe_non_finite_reference(b"e+12") is False
    assert maybe_non_finite_reference(b"E-123") is True


def test_each_prescan_on_large_adversarial_inputs(prescan: Prescan) -> None:
    """The shapes that are slow for a backtracking search, 1 MiB each (the answer, not the time, is checked:
    the Rust tests and the design keep it linear)."""
    n = 1 << 20
    for unit in (b"1" * 299 + b",", b"e+", b"e1", b"Infinit", b"Na", b"1", b"e", b"\xff"):
        raw = (unit * (n // len(unit) + 1))[:n]
        assert prescan(raw) is maybe_non_finite_reference(raw), unit


_PIECES = st.sampled_from(
    [b"e", b"E", b"+", b"-", b"0", b"1", b"9", b"N", b"a", b"I", b"nfinity", b"x", b" ", b"\xff", b"1" * 150]
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=400))
def test_each_prescan_equals_the_reference_on_random_bytes(prescan: Prescan, raw: bytes) -> None:
    assert prescan(raw) is maybe_non_finite_reference(raw)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_PIECES, max_size=120).map(b"".join))
def test_each_prescan_equals_the_reference_on_pattern_pieces(prescan: Prescan, raw: bytes) -> None:
    assert prescan(raw) is maybe_non_finite_reference(raw)


# --- which one the codec uses ------------------------------------------------------------------------------


def test_the_codec_uses_the_native_prescan_when_installed(native: Prescan) -> None:
    assert select_prescan() is native
    assert codec._maybe_non_finite is native  # chosen at import


def test_the_reference_when_the_module_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, NATIVE_MODULE, None)  # `import` raises ImportError
    assert select_prescan() is maybe_non_finite_py


def test_the_reference_when_the_module_lacks_the_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older build of the module (the row codec only) is installed: the reference."""
    monkeypatch.setitem(sys.modules, NATIVE_MODULE, types.ModuleType(NATIVE_MODULE))
    assert select_prescan() is maybe_non_finite_py


def test_the_prescan_gates_the_careful_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """`check_raw` asks `_maybe_non_finite` and nothing else first: a prescan that answers False lets NaN
    through (the models would then read it); the real one refuses it."""
    raw = b'{"n":NaN}'
    with pytest.raises(EventValidationError, match="NaN, Infinity and -Infinity are not JSON"):
        check_raw(raw, Limits(), "event")
    calls: list[bytes] = []

    def never(value: bytes) -> bool:
        calls.append(value)
        return False

    monkeypatch.setattr(codec, "_maybe_non_finite", never)
    check_raw(raw, Limits(), "event")
    assert calls == [raw]


def test_native_takes_bytes_only(native: Prescan) -> None:
    assert native(b"x") is False
    with pytest.raises(TypeError):
        native("NaN")  # type: ignore[arg-type]


class _Panic(BaseException):
    """What PyO3 raises for a Rust panic: `PanicException`, a BaseException (not an Exception)."""


@pytest.mark.parametrize(
    ("raw", "refused"), [(b'{"n":NaN}', True), (b'{"n":1e999}', True), (b'{"n":1.5}', False)]
)
def test_a_panicking_prescan_leaves_the_decision_to_the_reference(
    monkeypatch: pytest.MonkeyPatch, raw: bytes, refused: bool
) -> None:
    """A prescan that panics neither escapes `check_raw` (it would pass every `except Exception` and stop
    the loop) nor lets a value through unchecked: the reference prescan decides."""

    def panics(value: bytes) -> bool:
        raise _Panic("native prescan panicked")

    monkeypatch.setattr(codec, "_maybe_non_finite", panics)
    if refused:
        with pytest.raises(EventValidationError, match="not JSON"):
            check_raw(raw, Limits(), "event")
    else:
        check_raw(raw, Limits(), "event")
