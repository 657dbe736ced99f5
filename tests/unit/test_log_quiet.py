"""The drivers' repeated lines are rate-limited on the log handler; everything else goes through."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from message_history.log_quiet import QuietLines
from message_history.logs import configure_logging

pytestmark = pytest.mark.timeout(10)


def _record(name: str, msg: str, *args: object, error: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(error), error, None) if error is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, exc_info)


def test_a_kind_passes_once_per_interval_and_says_how_many_were_held() -> None:
    """One kind (logger and template, whatever its arguments) passes first, then once per interval, the
    one after a pause carrying `repeated`."""
    now = [0.0]
    quiet = QuietLines(interval_s=60.0, clock=lambda: now[0])
    passed = []
    for second in range(150):
        now[0] = float(second)
        record = _record("aiokafka", "Unable connect to node with id %s: %s", 1, f"attempt {second}")
        if quiet.filter(record):
            passed.append((second, getattr(record, "repeated", 0)))
    assert passed == [(0, 0), (60, 59), (120, 59)]


def test_kinds_are_counted_apart() -> None:
    """Another template or another logger is another kind: each says its first line."""
    quiet = QuietLines(clock=lambda: 0.0)
    records = [
        _record("aiokafka", "Unable connect to node with id %s: %s", 1, "refused"),
        _record("aiokafka", "Unable to update metadata from %s", [1]),
        _record("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, "x"),
        _record("aiokafka.consumer.group_coordinator", "Group Coordinator Request failed: %s", "x"),
        _record("aiokafka", "Unable connect to node with id %s: %s", 2, "refused"),
    ]
    assert [quiet.filter(r) for r in records] == [True, True, True, True, False]


def test_other_lines_are_untouched() -> None:
    """The service's own lines, a logger merely named like a driver, and asyncio's errors that are not an
    outage (a bug, a refusal) always pass."""
    quiet = QuietLines(clock=lambda: 0.0)
    for _ in range(3):
        assert quiet.filter(_record("consumers.loop", "dead-lettered a record"))
        assert quiet.filter(_record("aiokafkax", "not a driver"))
        assert quiet.filter(_record("asyncio", "Task exception was never retrieved", error=ValueError("bug")))
        refused = TopicAuthorizationFailedError("t")
        assert quiet.filter(_record("asyncio", "Task exception was never retrieved", error=refused))


def test_a_retriable_error_left_in_a_task_is_quieted() -> None:
    """asyncio's "never retrieved" line for a retriable Kafka error (a commit cut off during the outage)
    is one kind, whatever task it names."""
    quiet = QuietLines(clock=lambda: 0.0)
    lines = [
        _record(
            "asyncio", f"Task exception was never retrieved\nfuture: <Task-{n}>", error=KafkaConnectionError()
        )
        for n in range(5)
    ]
    assert [quiet.filter(r) for r in lines] == [True, False, False, False, False]


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


def test_the_service_log_is_quieted(stream: io.StringIO) -> None:
    """`configure_logging` installs the filter: 1,000 identical driver errors write one line, the service's
    own warnings all of theirs (without the filter, 1,000 lines: the issue's flood)."""
    for n in range(1000):
        logging.getLogger("aiokafka").error("Unable connect to node with id %s: %s", 1, n)
    for n in range(3):
        logging.getLogger("consumers.loop").warning("dead-lettered a record %d", n)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["logger"] for line in lines] == ["aiokafka", *["consumers.loop"] * 3]
