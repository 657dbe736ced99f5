"""Replay's batch runner with a scripted handler and a fake clock: retries, give-up, stop, bad records."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced

from consumers.contract import Done, Emit, Refused, Result
from consumers.runtime.emit import FileUnderOffset, SendNow
from message_history.app.replay.plan import Counts
from message_history.app.replay.runner import BatchRunner, PartitionState, ReplayAbortedError
from message_history.app.replay.sinks import InvalidReport
from message_history.errors import EventValidationError, StorageUnavailableError
from producers import transactions
from producers.dead_letters import DeadLetterPublisher, SourceRecord
from producers.transactions import PartitionTransactions
from schemas.events import HistoryPersisted
from tests.paths import RecordingProducer
from tests.unit.test_transactions import FakeBroker, FakeProducer

pytestmark = pytest.mark.timeout(20)

Outcome = str | BaseException  # "ok", "invalid", or an exception the ack fails with


def record(offset: int, partition: int = 3) -> Any:
    return SimpleNamespace(
        topic="rs",
        partition=partition,
        offset=offset,
        key=b"thread",
        value=b"{}",
        headers=[("traceparent", b"00-abc")],
        timestamp=1_700_000_000_000,
    )


def persisted(offset: int) -> HistoryPersisted:
    return HistoryPersisted(
        requestId=f"r{offset}",
        threadId="thread",
        resourceId="user",
        createdAt=datetime(2026, 1, 1, tzinfo=UTC),
        eventId=f"r{offset}",
        savedMessageIds=[f"m{offset}"],
    )


class ScriptedHandler:
    """Plays `script` in order: per call, an exception to raise, or an outcome per record by offset."""

    def __init__(self, script: Sequence[BaseException | dict[int, Outcome]]) -> None:
        self.script = list(script)
        self.calls: list[list[int]] = []

    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]:
        self.calls.append([r.offset for r in records])
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, BaseException):
            raise step
        out: list[Result] = []
        loop = asyncio.get_running_loop()
        for rec in records:
            outcome = step.get(rec.offset, "ok")
            if outcome == "invalid":
                out.append(Refused(EventValidationError("not valid JSON", "input.0")))
                continue
            future: asyncio.Future[Any] = loop.create_future()
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(persisted(rec.offset))
            out.append(Done(future))
        return out


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float, stop: asyncio.Event) -> bool:
        self.sleeps.append(seconds)
        self.now += seconds
        return stop.is_set()


class RecordingDeadLetters(DeadLetterPublisher):
    def __init__(self) -> None:
        super().__init__("rs.dlq")
        self.sent: list[tuple[int, str]] = []

    async def publish(
        self,
        emit: Emit,
        record: SourceRecord,
        error: BaseException,
        *,
        span: Any = None,
        omit_value: bool = False,
        omit_headers: bool = False,
    ) -> asyncio.Future[Any]:
        self.sent.append((record.offset, type(error).__name__))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def runner(
    handler: ScriptedHandler,
    time: FakeTime,
    *,
    report: InvalidReport | None = None,
    dead_letters: DeadLetterPublisher | None = None,
    max_retry_s: float = 30.0,
) -> tuple[BatchRunner, Counts]:
    counts = Counts()
    return (
        BatchRunner(
            handler=handler,
            counts=counts,
            report=report or InvalidReport(None),
            dead_letters=dead_letters,
            emit=SendNow(RecordingProducer()),
            max_retry_s=max_retry_s,
            retry_initial_s=1.0,
            retry_max_s=8.0,
            clock=time.clock,
            sleep=time.sleep,
            rand=lambda: 1.0,  # no jitter: the nominal delay
        ),
        counts,
    )


def state(start: int = 10, end: int = 100) -> PartitionState:
    return PartitionState(partition=3, start=start, end=end, next=start)


async def test_a_clean_batch_moves_the_partition_past_it() -> None:
    """When every record is acknowledged the partition's resume point is one past the batch."""
    time, part = FakeTime(), state()
    run, counts = runner(ScriptedHandler([{}]), time)
    await run.run([record(10), record(11), record(13)], part, asyncio.Event())
    assert (part.next, counts.events, counts.persisted, time.sleeps) == (14, 3, 3, [])


async def test_an_outage_is_retried_with_the_live_backoff_then_succeeds() -> None:
    """A MongoDB outage retries the whole batch with exponential backoff; outcomes are counted once."""
    down = StorageUnavailableError("MongoDB unavailable")
    handler = ScriptedHandler([down, down, {}])
    time, part = FakeTime(), state()
    run, counts = runner(handler, time)
    await run.run([record(10), record(11)], part, asyncio.Event())
    assert handler.calls == [[10, 11], [10, 11], [10, 11]]
    assert time.sleeps == [1.0, 2.0]
    assert (part.next, counts.events) == (12, 2)


async def test_only_records_whose_output_failed_are_retried() -> None:
    """A record whose acknowledgement failed for an outage is retried alone; the others are done once."""
    handler = ScriptedHandler([{11: KafkaConnectionError()}, {}])
    time, part = FakeTime(), state()
    run, counts = runner(handler, time)
    await run.run([record(10), record(11), record(12)], part, asyncio.Event())
    assert handler.calls == [[10, 11, 12], [11]]
    assert (part.next, counts.events, counts.persisted) == (13, 3, 3)


async def test_an_outage_longer_than_max_retry_gives_up_at_the_first_record_not_done() -> None:
    """After `--max-retry-s` of failures the runner raises and the resume point is the first undone record."""
    handler = ScriptedHandler([{10: "ok", 11: KafkaConnectionError(), 12: KafkaConnectionError()}])
    time, part = FakeTime(), state()
    run, counts = runner(handler, time, max_retry_s=10.0)
    with pytest.raises(ReplayAbortedError, match=r"partition 3: dependency unavailable .*--max-retry-s 10"):
        await run.run([record(10), record(11), record(12)], part, asyncio.Event())
    assert part.next == 11
    assert counts.events == 1
    assert sum(time.sleeps) >= 10.0


async def test_a_stop_during_the_backoff_leaves_the_undone_records_for_the_resume() -> None:
    """A signal during a retry wait ends the batch without error, resuming at the first record not done."""
    handler = ScriptedHandler([{10: "ok", 11: KafkaConnectionError()}])
    stop = asyncio.Event()
    stop.set()
    time, part = FakeTime(), state()
    run, _ = runner(handler, time)
    await run.run([record(10), record(11), record(12)], part, stop)
    assert part.next == 11


async def test_an_error_that_is_not_an_outage_propagates_and_keeps_the_resume_point() -> None:
    """A bug is not retried: it propagates, and the partition resumes before the batch."""
    time, part = FakeTime(), state()
    run, _ = runner(ScriptedHandler([RuntimeError("bug")]), time)
    with pytest.raises(RuntimeError, match="bug"):
        await run.run([record(10)], part, asyncio.Event())
    assert (part.next, time.sleeps) == (10, [])


async def test_bad_records_are_dead_lettered_and_counted() -> None:
    """By default a bad record is sent to the dead-letter publisher, counted and sampled with its position."""
    dead = RecordingDeadLetters()
    time, part = FakeTime(), state()
    run, counts = runner(ScriptedHandler([{11: "invalid"}]), time, dead_letters=dead)
    await run.run([record(10), record(11)], part, asyncio.Event())
    assert dead.sent == [(11, "EventValidationError")]
    assert (counts.events, counts.persisted, counts.invalid, counts.dead_lettered) == (2, 1, 1, 1)
    assert counts.invalid_samples == ["3/11: EventValidationError: input.0: not valid JSON"]
    assert part.next == 12


async def test_a_record_kafka_refuses_for_size_is_treated_as_bad_input() -> None:
    """An output too large for Kafka dead-letters its input, like the live loop does."""
    dead = RecordingDeadLetters()
    run, counts = runner(ScriptedHandler([{10: MessageSizeTooLargeError()}]), FakeTime(), dead_letters=dead)
    part = state()
    await run.run([record(10)], part, asyncio.Event())
    assert dead.sent == [(10, "MessageSizeTooLargeError")]
    assert (counts.invalid, part.next) == (1, 11)


async def test_skipped_bad_records_are_written_to_the_report(tmp_path: Path) -> None:
    """With `--skip-invalid` a bad record is not dead-lettered but goes to the JSONL report with its place."""
    path = tmp_path / "invalid.jsonl"
    with InvalidReport(path) as report:
        run, counts = runner(ScriptedHandler([{10: "invalid", 12: "invalid"}]), FakeTime(), report=report)
        await run.run([record(10), record(11), record(12)], state(), asyncio.Event())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["topic"], e["partition"], e["offset"]) for e in lines] == [("rs", 3, 10), ("rs", 3, 12)]
    assert lines[0]["error_type"] == "EventValidationError"
    assert lines[0]["error_path"] == "input.0"
    assert lines[0]["key"] == "thread"
    assert lines[0]["dead_letter_topic"] is None
    assert (counts.invalid, counts.dead_lettered) == (2, 0)


def test_an_unreadable_record_goes_to_the_report_without_a_timestamp(tmp_path: Path) -> None:
    """A record of a batch that could not be read has no timestamp; the report says so instead of failing."""
    from consumers.unreadable import UnreadableRecord, UnreadableRecordError  # noqa: PLC0415

    path = tmp_path / "invalid.jsonl"
    error = UnreadableRecordError("the record batch cannot be decompressed or parsed: CorruptRecordError")
    with InvalidReport(path) as report:
        report.write(UnreadableRecord("rs", 3, 10, error), error, dead_letter_topic="rs.dlq")
    [entry] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (entry["topic"], entry["partition"], entry["offset"], entry["timestamp"]) == ("rs", 3, 10, None)
    assert entry["error_type"] == "UnreadableRecordError"
    assert entry["dead_letter_topic"] == "rs.dlq"


class FilingHandler(ScriptedHandler):
    """Exactly-once: each record's event emitted (filed under its offset) before its `Done`."""

    async def handle(self, records: Sequence[Any], emit: Emit) -> list[Result]:
        for rec in records:
            await emit(rec, "out", key=b"k", value=f"r{rec.offset}".encode())
        return await super().handle(records, emit)


async def _replay_transactions(monkeypatch: pytest.MonkeyPatch, broker: FakeBroker) -> PartitionTransactions:
    async def open_fake(options: Any, transactional_id: str) -> FakeProducer:
        return FakeProducer(broker)

    monkeypatch.setattr(transactions, "open_transactional", open_fake)
    return PartitionTransactions.for_client({}, group_id="g", path="replay", replay=True)


async def test_exactly_once_a_batchs_outputs_go_in_one_transaction_then_the_partition_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's filed outputs, in offset order, in one transaction without offsets (a replay has no
    group); then the resume point passes the batch."""
    broker, time, part = FakeBroker(), FakeTime(), state()
    run, _ = runner(FilingHandler([{}]), time)
    run.emit = FileUnderOffset()
    run.transactions = await _replay_transactions(monkeypatch, broker)
    await run.run([record(10), record(11)], part, asyncio.Event())
    assert (broker.committed, part.next) == ([([b"r10", b"r11"], {})], 12)


async def test_exactly_once_a_fenced_replay_stops_before_the_batch_not_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another replay of the partition fenced this one: its outputs are dropped (not ours to commit), so the
    resume point must stay before the batch (without the guard, `commit` returning False moved it past)."""
    broker, time, part = FakeBroker(), FakeTime(), state()
    run, _ = runner(FilingHandler([{}]), time)
    run.emit = FileUnderOffset()
    run.transactions = await _replay_transactions(monkeypatch, broker)
    broker.answer = ProducerFenced()
    with pytest.raises(ReplayAbortedError, match="fenced"):
        await run.run([record(10), record(11)], part, asyncio.Event())
    assert (broker.committed, part.next) == ([], 10)
