"""`consumers.runtime.retry.wait_to_retry`: the one retry wait counts, says and sleeps, in that order."""

from __future__ import annotations

import logging

import pytest

from consumers.runtime.retry import wait_to_retry
from message_history import metrics


def _retries(path: str, dependency: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "message_history_retries_total", {"path": path, "dependency": dependency}
    )
    return value or 0.0


async def test_a_retry_wait_counts_says_and_sleeps(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="consumers.runtime.retry")
    before = _retries("wait-test", "kafka")
    slept: list[tuple[float, float]] = []

    async def sleep(delay: float) -> None:
        slept.append((delay, _retries("wait-test", "kafka")))

    await wait_to_retry("wait-test", "kafka", 0.25, "fetch failed", extra={"error": "X"}, sleep=sleep)

    assert slept == [(0.25, before + 1)]  # counted before the sleep
    [line] = [r for r in caplog.records if r.getMessage() == "fetch failed"]
    assert (line.__dict__["path"], line.__dict__["error"]) == ("wait-test", "X")


async def test_a_quiet_retry_wait_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="consumers.runtime.retry")

    async def sleep(delay: float) -> None:
        return None

    await wait_to_retry("wait-test", "mongodb", 0.0, sleep=sleep)
    assert not caplog.records
