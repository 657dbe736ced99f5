"""Poison-record containment (issue 23, item 1): any exception met on one record that is neither an outage nor
systemic makes that record a dead letter, and the rest go on; a batch the path raises for is split until the
record is alone. Pure logic, with fake handlers and records; tests/integration/test_service_poison_records.py
shows it in the running service.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from consumers.commands import CommandsHandler
from consumers.contract import Done, Emit, Record, Refused, Result
from consumers.handler import PathHandler
from consumers.lanes import Failed
from consumers.runtime import containment
from consumers.runtime.containment import (
    Contained,
    UnexpectedReports,
    contain,
    containable,
    decode_each,
    is_systemic,
    report_unexpected,
    settle_outcomes,
)
from consumers.runtime.dead_letters import DeadLetters
from consumers.runtime.retry import Backoff, Failure, retry_batch
from message_history import metrics, tracing
from message_history.errors import (
    EventValidationError,
    FatalStorageError,
    StartupError,
    StorageUnavailableError,
    UnexpectedRecordError,
    error_type,
)
from message_history.settings import Settings
from schemas.dead_letters import ERROR_MESSAGE, ERROR_TYPE, MAX_MESSAGE_BYTES, dead_letter_headers
from schemas.limits import Limits
from tests.paths import no_emit

pytestmark = pytest.mark.timeout(10)

POISON = b"poison"


def record(offset: int, value: bytes | None = b"{}") -> Any:
    return SimpleNamespace(topic="rq", partition=0, offset=offset, key=b"t", value=value, headers=[])


def batch(*values: bytes) -> list[Any]:
    return [record(i, v) for i, v in enumerate(values)]


def _done(value: object) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class RaisesForPoison:
    """A path whose batch work raises, for the whole batch, as soon as one record of it is the poison."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error or ZeroDivisionError("division by zero")
        self.calls: list[list[int]] = []

    async def handle(self, records: Sequence[Record], emit: Emit) -> list[Result]:
        self.calls.append([r.offset for r in records])
        if any(r.value == POISON for r in records):
            raise self.error
        return [Done(_done(f"ok-{r.offset}")) for r in records]


# --- the split ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "poison_at"),
    [
        pytest.param([POISON], [0], id="alone"),
        pytest.param([b"a", b"b", POISON, b"c", b"d", b"e", b"f", b"g"], [2], id="one-of-eight"),
        pytest.param([POISON, b"a", b"b", b"c", b"d"], [0], id="first"),
        pytest.param([b"a", b"b", b"c", b"d", POISON], [4], id="last"),
        pytest.param([POISON, b"a", POISON, b"b", b"c", POISON], [0, 2, 5], id="several"),
        pytest.param([POISON] * 4, [0, 1, 2, 3], id="all"),
    ],
)
async def test_a_batch_that_raises_is_split_until_the_record_is_alone(
    values: list[bytes], poison_at: list[int]
) -> None:
    """Each poison record's result is its error (class and message kept), every other record is handled."""
    handler = RaisesForPoison()
    results = await Contained(handler, "recall").handle(batch(*values), no_emit)
    assert len(results) == len(values)
    for offset, result in enumerate(results):
        if offset in poison_at:
            assert isinstance(result, Refused)
            assert isinstance(result.error, UnexpectedRecordError)
            assert (error_type(result.error), str(result.error), result.error.stage) == (
                "ZeroDivisionError",
                "division by zero",
                "batch",
            )
        else:
            assert isinstance(result, Done)
            assert await result.sent == f"ok-{offset}"
    # halves, in order: every record is handled exactly once by a call that did not raise
    handled = [o for call in handler.calls if not any(values[i] == POISON for i in call) for o in call]
    assert sorted(handled) == [i for i in range(len(values)) if i not in poison_at]


async def test_one_poison_record_in_a_large_batch_costs_a_logarithmic_number_of_calls() -> None:
    values = [b"x"] * 500 + [POISON] + [b"x"] * 11
    handler = RaisesForPoison()
    await Contained(handler, "recall").handle(batch(*values), no_emit)
    assert len(handler.calls) <= 2 * 10 + 1  # 2·log2(512) + the first


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(StorageUnavailableError("MongoDB unavailable"), id="outage"),
        pytest.param(KafkaConnectionError(), id="kafka-outage"),
        pytest.param(FatalStorageError("MongoDB refused find: Unauthorized"), id="mongodb-refuses"),
        pytest.param(TopicAuthorizationFailedError(), id="kafka-not-authorized"),
        pytest.param(StartupError("refused configuration"), id="configuration"),
        pytest.param(MemoryError(), id="memory"),
    ],
)
async def test_outages_and_systemic_refusals_are_raised_for_the_batch_not_split(error: BaseException) -> None:
    """No record's fault: retried (an outage) or stopping the loop (systemic), never dead-lettering all."""
    handler = RaisesForPoison(error)
    with pytest.raises(type(error)):
        await Contained(handler, "persist").handle(batch(b"a", POISON, b"b"), no_emit)
    assert handler.calls == [[0, 1, 2]]


async def _mini_loop(handler: Any, records: list[Any]) -> tuple[list[int], list[tuple[int, str, str]]]:
    """The loop's attempt as `consumers.loop.StreamLoop._attempt` makes it: handle, then settle the outcomes
    (done, or dead-lettered), inside the outage retry loop."""
    done: list[int] = []
    letters: list[tuple[int, str, str]] = []

    async def reject(item: Any, error: BaseException) -> object:
        letters.append((item.offset, error_type(error), str(error)))
        return "dead-lettered"

    async def attempt(items: list[Any]) -> list[Any]:
        return await settle_outcomes(
            items,
            await handler.handle(items, no_emit),
            reject=reject,
            explain=lambda error: error,
            done=lambda item, outcome: done.append(item.offset) if outcome != "dead-lettered" else None,
        )

    async def wait(failure: Failure[Any]) -> bool:
        raise AssertionError("no outage here")

    await retry_batch(records, attempt, backoff=Backoff(0.1, 1.0, lambda: 0.0), wait=wait)
    return done, letters


async def test_without_containment_the_loop_stops_with_it_the_record_is_a_dead_letter() -> None:
    """The same handler: bare, the attempt raises out of the loop (the service exited 1 and crash-looped on
    restart); contained, the poison record is dead-lettered and the others are done."""
    records = batch(b"a", b"b", POISON, b"c")
    with pytest.raises(ZeroDivisionError):
        await _mini_loop(RaisesForPoison(), records)
    done, letters = await _mini_loop(Contained(RaisesForPoison(), "recall"), records)
    assert done == [0, 1, 3]
    assert letters == [(2, "ZeroDivisionError", "division by zero")]


async def test_an_outage_retry_never_sends_a_delivered_dead_letter_again() -> None:
    """Only the records whose outputs failed for an outage are attempted again: a record dead-lettered in
    the failed attempt is not (so `UnexpectedReports` has only re-reads after a revoke to dedupe)."""
    failures = [KafkaConnectionError()]  # the first output of record 0 fails for an outage, once

    async def output(offset: int) -> object:
        if offset == 0 and failures:
            raise failures.pop()
        return f"ok-{offset}"

    class OnePoison:
        def __init__(self) -> None:
            self.calls: list[list[int]] = []

        async def handle(self, records: Sequence[Record], emit: Emit) -> list[Done | Refused]:
            self.calls.append([r.offset for r in records])
            return [
                Refused(contain(ZeroDivisionError("bug"), "process"))
                if r.value == POISON
                else Done(output(r.offset))
                for r in records
            ]

    letters: list[int] = []
    done: list[int] = []

    async def reject(item: Any, error: BaseException) -> object:
        letters.append(item.offset)
        return "dead-lettered"

    handler = OnePoison()

    async def attempt(items: list[Any]) -> list[Any]:
        return await settle_outcomes(
            items,
            await handler.handle(items, no_emit),
            reject=reject,
            explain=lambda error: error,
            done=lambda item, outcome: done.append(item.offset),
        )

    waits: list[int] = []

    async def wait(failure: Failure[Any]) -> bool:
        waits.append(failure.attempt)
        return False

    await retry_batch(batch(b"a", POISON, b"b"), attempt, backoff=Backoff(0.0, 0.0, lambda: 0.0), wait=wait)
    assert waits == [1]
    assert handler.calls == [[0, 1, 2], [0]]
    assert letters == [1]
    assert sorted(done) == [0, 1, 2]


# --- per record: decode, work, outputs ----------------------------------------------------------------------


def _decode(record: Record, value: bytes) -> str:
    if value == POISON:
        raise KeyError("no such field")
    if value == b"bad":
        raise EventValidationError("not valid JSON: expected value", "")
    if value == b"down":
        raise StorageUnavailableError("MongoDB unavailable")
    return value.decode()


async def test_decode_each_contains_any_exception_of_one_record() -> None:
    records = batch(b"a", POISON, b"bad", b"b")
    records.append(record(4, None))
    with tracing.batch_spans("recall", records) as spans:
        results, items = decode_each(records, spans, _decode)
    assert items == [(0, "a"), (3, "b")]
    errors = [r.error if isinstance(r, Refused) else r for r in results]
    assert [type(r).__name__ for r in errors] == [
        "NoneType",
        "UnexpectedRecordError",
        "EventValidationError",
        "NoneType",
        "EventValidationError",
    ]
    bug = errors[1]
    assert isinstance(bug, UnexpectedRecordError)
    assert (bug.error_type, bug.stage, str(bug)) == ("KeyError", "decode", "'no such field'")


async def test_decode_each_raises_an_outage_for_the_batch() -> None:
    records = batch(b"a", b"down")
    with pytest.raises(StorageUnavailableError), tracing.batch_spans("recall", records) as spans:
        decode_each(records, spans, _decode)


async def test_per_thread_contains_a_records_work_and_its_thread_goes_on() -> None:
    """One record's bug is its `Failed`; the next record of the same thread still runs (as for bad input)."""
    path = PathHandler(Settings(), storage=SimpleNamespace(), publisher=None)
    ran: list[int] = []

    async def work(entry: tuple[int, str]) -> str:
        ran.append(entry[0])
        if entry[1] == "poison":
            raise AttributeError("'NoneType' object has no attribute 'id'")
        return entry[1]

    items = [(0, "a"), (1, "poison"), (2, "b"), (3, "c")]
    outcomes = await path.per_thread(items, lambda item: "t1" if item != "c" else "t2", work)
    assert sorted(ran) == [0, 1, 2, 3]
    assert outcomes[0] == "a"
    assert outcomes[2] == "b"
    failed = outcomes[1]
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, UnexpectedRecordError)
    assert (failed.error.error_type, failed.error.stage) == ("AttributeError", "process")


async def test_per_thread_raises_a_systemic_refusal_for_the_batch() -> None:
    path = PathHandler(Settings(), storage=SimpleNamespace(), publisher=None)

    async def work(entry: tuple[int, str]) -> str:
        raise FatalStorageError("MongoDB refused the write: Unauthorized")

    with pytest.raises(FatalStorageError):
        await path.per_thread([(0, "a")], lambda item: item, work)


class FakeForgetting:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def forget_thread(
        self, thread_id: str, *, resource_id: str | None = None, dry_run: bool = False, progress: Any = None
    ) -> Any:
        raise self.error

    async def forget_resource(self, resource_id: str, *, dry_run: bool = False, progress: Any = None) -> Any:
        raise self.error


def _command(request_id: str) -> bytes:
    return (
        b'{"schemaVersion": 1, "command": "ForgetThread", "requestId": "' + request_id.encode() + b'", '
        b'"threadId": "t", "createdAt": "2025-01-01T00:00:00Z"}'
    )


async def test_the_commands_path_contains_a_bug_in_one_command() -> None:
    handler = CommandsHandler(
        forgetting=FakeForgetting(TypeError("unsupported operand")),
        publisher=SimpleNamespace(),  # type: ignore[arg-type]
        limits=Limits(),
    )
    [refused] = await handler.handle([record(0, _command("c-1"))], no_emit)
    assert isinstance(refused, Refused)
    result = refused.error
    assert isinstance(result, UnexpectedRecordError)
    assert (result.error_type, str(result)) == ("TypeError", "unsupported operand")


@pytest.mark.parametrize(
    "error", [StorageUnavailableError("down"), FatalStorageError("Unauthorized")], ids=["outage", "systemic"]
)
async def test_the_commands_path_raises_what_is_no_commands_fault(error: BaseException) -> None:
    handler = CommandsHandler(
        forgetting=FakeForgetting(error),
        publisher=SimpleNamespace(),  # type: ignore[arg-type]
        limits=Limits(),
    )
    with pytest.raises(type(error)):
        await handler.handle([record(0, _command("c-1"))], no_emit)


# --- the rules, the report, the dead letter -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "systemic", "dead_letter"),
    [
        pytest.param(FatalStorageError("auth"), True, False, id="mongodb-refuses"),
        pytest.param(StartupError("config"), True, False, id="configuration"),
        pytest.param(TopicAuthorizationFailedError(), True, False, id="kafka-authorization"),
        pytest.param(MemoryError(), True, False, id="memory"),
        pytest.param(StorageUnavailableError("down"), False, False, id="outage"),
        pytest.param(ConnectionResetError(), False, False, id="socket"),
        pytest.param(EventValidationError("bad"), False, True, id="bad-input"),
        pytest.param(OverflowError("date value out of range"), False, True, id="overflow"),
        pytest.param(RecursionError("maximum recursion depth exceeded"), False, True, id="recursion"),
        pytest.param(AssertionError("invariant"), False, True, id="assertion"),
        pytest.param(KeyError("k"), False, True, id="bug"),
    ],
)
def test_what_is_a_records_fault(error: BaseException, systemic: bool, dead_letter: bool) -> None:
    assert is_systemic(error) is systemic
    assert containable(error) is dead_letter


def test_bad_input_is_kept_as_it_is_and_anything_else_is_wrapped() -> None:
    bad = EventValidationError("not valid JSON", "")
    assert contain(bad, "decode") is bad
    wrapped = contain(OverflowError("date value out of range"), "process")
    assert isinstance(wrapped, UnexpectedRecordError)
    assert (wrapped.error_type, str(wrapped)) == ("OverflowError", "date value out of range")


def test_an_unexpected_error_is_logged_at_error_with_where_the_record_is_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="consumers.runtime.containment")
    labels = {"path": "persist", "error_type": "OverflowError"}
    before = metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", labels) or 0.0
    try:
        raise OverflowError("date value out of range")
    except OverflowError as exc:
        error = contain(exc, "process")
    report_unexpected("persist", record(41), error)
    report_unexpected("persist", record(42), EventValidationError("bad input is not a bug"))
    assert metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", labels) == before + 1
    [line] = caplog.records
    assert line.levelno == logging.ERROR
    assert (line.__dict__["topic"], line.__dict__["partition"], line.__dict__["offset"]) == ("rq", 0, 41)
    assert (line.__dict__["path"], line.__dict__["stage"], line.__dict__["error_type"]) == (
        "persist",
        "process",
        "OverflowError",
    )
    assert line.exc_info is not None  # the traceback of the bug


def test_a_bug_met_again_on_the_same_record_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 32: a record dead-lettered twice (a batch abandoned at a revoke and read again by this process)
    raised the unexpected-error counter twice for one bug; the counter promises records, not attempts."""
    caplog.set_level(logging.WARNING, logger="consumers.runtime.containment")
    labels = {"path": "recall", "error_type": "ZeroDivisionError"}
    before = metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", labels) or 0.0
    reports = UnexpectedReports("recall")
    bug = contain(ZeroDivisionError("integer division or modulo by zero"), "process")
    reports.report(record(11), bug)  # the first attempt's dead letter
    reports.report(record(11), contain(ZeroDivisionError("again"), "process"))  # the same record, again
    after_one = metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", labels)
    reports.report(record(12), bug)  # another record: another bug met
    after_two = metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", labels)
    reports.report(record(13), EventValidationError("bad input is not a bug"))
    assert (after_one, after_two) == (before + 1, before + 2)
    assert [r.__dict__["offset"] for r in caplog.records if r.levelno == logging.ERROR] == [11, 12]


def test_the_dead_letter_of_a_bug_names_its_class_and_a_scrubbed_bounded_message() -> None:
    secret = "mongodb://admin:hunter2@db.internal:27017"
    error = contain(RuntimeError(f"cannot reach {secret} " + "x" * 5000), "process")
    headers = dict(
        dead_letter_headers(
            error=error,
            source_topic="rq",
            source_partition=0,
            source_offset=7,
            failed_at=datetime(2025, 1, 1, tzinfo=UTC),
            service_version="0",
        )
    )
    assert headers[ERROR_TYPE] == b"RuntimeError"
    assert b"hunter2" not in headers[ERROR_MESSAGE]
    assert len(headers[ERROR_MESSAGE]) <= MAX_MESSAGE_BYTES


async def test_a_record_dead_lettered_twice_for_one_bug_counts_one_bug_and_two_dead_letters() -> None:
    """The loop's dead letters (`consumers.runtime.dead_letters.DeadLetters`): a record handled twice (its
    batch retried, or read again after a revoke) is sent twice, and the bug met on it is counted once."""
    sent: list[int] = []

    class Publisher:
        topic = "rq.dlq"

        async def deliver(self, emit: Any, record: Any, error: BaseException, *, span: Any = None) -> object:
            sent.append(record.offset)
            return None

    bugs = {"path": "dl-once", "error_type": "ZeroDivisionError"}
    letters = {"path": "dl-once", "error_type": "ZeroDivisionError"}
    before = metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", bugs) or 0.0
    before_letters = metrics.REGISTRY.get_sample_value("message_history_dead_letters_total", letters) or 0.0
    publisher: Any = Publisher()
    dead_letters = DeadLetters("dl-once", publisher, logging.getLogger("consumers.loop"))
    for _ in range(2):
        await dead_letters.send(record(7), contain(ZeroDivisionError("division by zero"), "process"), no_emit)
    assert sent == [7, 7]
    assert metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", bugs) == before + 1
    dead = metrics.REGISTRY.get_sample_value("message_history_dead_letters_total", letters)
    assert dead == before_letters + 2


def test_unexpected_reports_remember_a_bounded_number_of_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory is bounded (`_REMEMBERED`): past it, the position met longest ago is forgotten (reported
    again if met again), and one met again is kept as the most recent."""
    monkeypatch.setattr(containment, "_REMEMBERED", 2)
    labels = {"path": "bounded", "error_type": "ZeroDivisionError"}
    reports = UnexpectedReports("bounded")
    bug = contain(ZeroDivisionError("division by zero"), "process")

    def count() -> float:
        return metrics.REGISTRY.get_sample_value("message_history_unexpected_errors_total", labels) or 0.0

    before = count()
    for offset in (1, 2, 1, 3):  # 1 met again: 2 is now the oldest, forgotten when 3 comes
        reports.report(record(offset), bug)
    assert count() == before + 3
    assert len(reports._seen) == 2
    reports.report(record(1), bug)  # still remembered
    assert count() == before + 3
    reports.report(record(2), bug)  # forgotten: reported again
    assert count() == before + 4
