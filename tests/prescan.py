"""The codec's two NaN / Infinity / huge-number prescans for tests: the native one (or a skip, a failure under
CI=true, where `stack install --all` builds it), a block run with either one chosen, and the differential
check the decode tests share (a decode with the native prescan = the decode with the Python one)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from message_history.errors import InvalidInputError
from schemas import codec
from schemas.codec import NATIVE_MODULE, encode, maybe_non_finite_py
from schemas.events import EventBase

Prescan = Callable[[bytes], bool]
Decode = Callable[[bytes], EventBase]


def native_prescan() -> Prescan:
    """`message_history_native.maybe_non_finite`; a missing module skips the test (fails it under CI)."""
    try:
        module = importlib.import_module(NATIVE_MODULE)
    except ImportError:
        reason = f"{NATIVE_MODULE} is not installed (deploy/local/stack install --all builds it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)  # CI builds it: a missing module is a broken build, not a skip
        pytest.skip(reason)
    found: Prescan = module.maybe_non_finite
    return found


@contextmanager
def using(prescan: Prescan) -> Iterator[None]:
    """`schemas.codec` asks `prescan` inside the block (in place of `select_prescan`'s choice)."""
    chosen = codec._maybe_non_finite
    codec._maybe_non_finite = prescan
    try:
        yield
    finally:
        codec._maybe_non_finite = chosen


def _outcome(decode: Decode, prescan: Prescan, value: bytes) -> EventBase | tuple[str, str]:
    """The event `decode` makes of `value` with `prescan` as the codec's prescan, or the refusal as (error
    type, message)."""
    with using(prescan):
        try:
            return decode(value)
        except InvalidInputError as exc:
            return type(exc).__name__, str(exc)


def assert_same_decode(decode: Decode, native: Prescan, value: bytes) -> None:
    """With either prescan, `decode` refuses `value` alike or accepts the same event (its fields set, its
    wire form)."""
    expected = _outcome(decode, maybe_non_finite_py, value)
    got = _outcome(decode, native, value)
    assert got == expected, value[:200]
    if isinstance(got, EventBase) and isinstance(expected, EventBase):
        assert got.model_fields_set == expected.model_fields_set
        assert encode(got) == encode(expected), value[:200]
