"""A forget's progress (`consumers.commands.ForgetProgress`): the metric follows every chunk, the log line and
the CLI's line at most every `every_s`."""

from __future__ import annotations

import logging

import pytest

from consumers.commands import ForgetProgress
from message_history import metrics
from schemas.commands import ForgetOutcome
from schemas.messages import utc_now_ms


def _outcome(messages: int, threads: int) -> ForgetOutcome:
    return ForgetOutcome(
        "resource", "alice", utc_now_ms(), False, deleted_messages=messages, deleted_threads=threads
    )


@pytest.mark.parametrize(("every_s", "lines"), [(3600.0, 1), (0.0, 3)])
def test_progress_counts_every_chunk_and_says_so_at_most_every_interval(
    every_s: float, lines: int, caplog: pytest.LogCaptureFixture
) -> None:
    shown: list[str] = []
    progress = ForgetProgress(request_id="c-1", via="cli", every_s=every_s, show=shown.append)
    deleted = metrics.FORGET_DELETED.labels(what="messages")
    threads = metrics.FORGET_DELETED.labels(what="threads")
    before = (deleted._value.get(), threads._value.get())
    caplog.set_level(logging.INFO, logger="consumers.commands")
    for messages, thread_count in ((7, 0), (14, 1), (20, 2)):
        progress(_outcome(messages, thread_count))
    assert (deleted._value.get() - before[0], threads._value.get() - before[1]) == (20, 2)
    assert progress.chunks == 3
    said = [r for r in caplog.records if r.getMessage() == "forget in progress"]
    assert len(said) == len(shown) == lines
    assert shown[0] == "forget resource 'alice': 7 messages, 0 threads deleted so far"
