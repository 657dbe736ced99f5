"""The codec's two NaN / Infinity / huge-number prescans for tests: the native one (or a skip, a failure under
CI=true, where `stack install --all` builds it) and a block run with either one chosen."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from schemas import codec
from schemas.codec import NATIVE_MODULE

Prescan = Callable[[bytes], bool]


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
