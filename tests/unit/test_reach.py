"""Reachability and the narration of an outage (pure), and the Kafka watch's readiness on a fake probe."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import pytest

from consumers.kafka_watch import KafkaWatch, component, probe_interval_s, probe_timeout_s
from consumers.outage_log import OutageLog
from consumers.runtime.retry import outage_dependency
from message_history.core.reach import Line, Narration, Reach
from message_history.errors import BarrierUnavailableError, StorageUnavailableError

pytestmark = pytest.mark.timeout(10)

DOWN = "StorageUnavailableError"


# --- Reach ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "now", "reachable"),
    [
        ([], 4.9, True),  # within the grace of the start, nothing asked yet
        ([], 5.0, False),  # a whole grace without an answer
        ([("answered", 3.0)], 7.9, True),
        ([("answered", 3.0)], 8.0, False),
        ([("failed", 1.0), ("failed", 2.0)], 4.0, True),  # failures within the grace: a blip
        ([("failed", 1.0), ("answered", 9.0)], 10.0, True),  # an answer ends it at once
        (
            [("answered", 9.0), ("answered", 2.0)],
            10.0,
            True,
        ),  # a late answer to an old probe moves nothing back
        ([("answered", 2.0), ("failed", 3.0)], 7.5, False),
    ],
)
def test_reachable_while_something_answered_within_the_grace(
    events: list[tuple[str, float]], now: float, reachable: bool
) -> None:
    """Reachable iff the last answer (its probe's send time) is less than a grace ago; failures say why."""
    reach = Reach(grace_s=5.0, last_answer=0.0)
    for kind, at in events:
        if kind == "answered":
            reach.answered(at)
        else:
            reach.failed(f"no answer at {at}")
    assert reach.reachable(now) is reachable


def test_reach_says_why_until_the_next_answer() -> None:
    """The last failure is the reason; an answer clears it."""
    reach = Reach(grace_s=1.0, last_answer=0.0)
    reach.failed("broker 1 did not answer")
    assert reach.why == "broker 1 did not answer"
    assert reach.silent_s(3.0) == 3.0
    reach.answered(2.0)
    assert reach.why == ""


# --- Narration -----------------------------------------------------------------------------------------


def test_narration_says_an_outage_in_a_few_lines() -> None:
    """A failed attempt every second for 100 s: the WARNING when it starts, a summary every 30 s, the INFO
    when it is back; none of the other 97 attempts writes a line."""
    narration = Narration(every_s=30.0)
    lines = [narration.failed(float(t)) for t in range(100, 200)]
    back = narration.back(200.0)
    written = [line for line in lines if line is not None]
    assert [line.kind for line in written] == ["unreachable", *["still unreachable"] * 3]
    assert [line.retries for line in written] == [1, 31, 61, 91]
    assert back == Line("info", "back", 100, 100.0, 100.0)
    assert narration.back(201.0) is None  # said once
    assert not narration.open


def test_a_flapping_dependency_gets_one_warning_per_interval() -> None:
    """Outages of 3 s that open every 5 s (a chunk goes through, the next fails): the first is announced and
    ends with its INFO; the next ones within the interval are shorter than the settle time and write
    nothing; the first one after the interval is announced again."""
    narration = Narration(every_s=30.0)
    written = []
    for start in range(0, 70, 5):  # an outage of 3 s every 5 s
        for t in range(start, start + 3):
            written.append(narration.failed(float(t)))
        written.append(narration.back(float(start + 3)))
    lines = [(line.kind, line.since) for line in written if line is not None]
    assert lines == [(kind, since) for since in (0.0, 30.0, 60.0) for kind in ("unreachable", "back")]


def test_a_second_outage_soon_after_the_first_is_said_once_it_lasts() -> None:
    """An outage 2 s after the previous one ended, failing every second for 10 s: announced after the settle
    time (5 s), and its end said too."""
    narration = Narration(every_s=30.0, settle_s=5.0)
    narration.failed(0.0)
    narration.back(15.0)
    written = [narration.failed(float(t)) for t in range(17, 27)]
    lines = [(line.kind, line.since, line.retries) for line in written if line is not None]
    assert lines == [("unreachable", 17.0, 6)]
    back = narration.back(27.0)
    assert back is not None
    assert back.kind == "back"


def test_narration_dates_the_outage_from_the_last_answer() -> None:
    """`since` (the last answer) dates the outage; a new outage counts its retries afresh."""
    narration = Narration(every_s=30.0)
    first = narration.failed(10.0, since=4.0)
    assert first == Line("warning", "unreachable", 1, 6.0, 4.0)
    narration.failed(11.0)
    narration.back(12.0)
    again = narration.failed(50.0)
    assert again is not None
    assert (again.kind, again.retries, again.since) == ("unreachable", 1, 50.0)


def test_outage_log_writes_what_since_when_and_back(caplog: pytest.LogCaptureFixture) -> None:
    """The lines carry the dependency, the reason, since when (UTC), retries and the duration."""
    now = [1000.0]
    outage = OutageLog(
        "persist", "mongodb", every_s=30.0, clock=lambda: now[0], wall=lambda: 1_800_000_000.0 + now[0]
    )
    caplog.set_level(logging.INFO, logger="consumers.outage_log")
    for _ in range(40):
        outage.failed("mongodb unavailable: StorageUnavailableError")
        now[0] += 1.0
    outage.back()
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        (
            "WARNING",
            "mongodb unreachable since 2027-01-15T08:16:40Z: mongodb unavailable: StorageUnavailableError",
        ),
        (
            "WARNING",
            "mongodb unreachable since 2027-01-15T08:16:40Z (30 s, 31 retries so far): "
            "mongodb unavailable: " + DOWN,
        ),
        ("INFO", "mongodb reachable again after 40 s (40 retries): resumed"),
    ]
    assert caplog.records[0].__dict__["path"] == "persist"


@pytest.mark.parametrize(
    ("error", "dependency"),
    [
        (None, "kafka"),  # outputs not acknowledged
        (BarrierUnavailableError("end offsets"), "kafka"),
        (StorageUnavailableError("down"), "mongodb"),
        (TimeoutError(), "mongodb"),
    ],
)
def test_an_outage_names_its_dependency(error: BaseException | None, dependency: str) -> None:
    """The turn barrier's look-up failing is a Kafka outage, not MongoDB's (it was reported as MongoDB's)."""
    assert outage_dependency(error) == dependency


# --- the Kafka watch on a fake probe --------------------------------------------------------------------


@dataclass
class FakeHealth:
    states: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None:
        self.states[component] = (ready, reason)

    def beat(self, component: str) -> None:
        return None


class Broker:
    """A probe answering from a script: None (answered) or a reason."""

    def __init__(self) -> None:
        self.answer: str | None = None

    async def __call__(self, consumer: object, timeout_s: float) -> str | None:
        return self.answer


async def test_the_watch_turns_the_path_unready_after_the_grace_and_ready_at_the_first_answer() -> None:
    """Probe failures within the grace change nothing; past it `<path>.kafka` is not ready, naming Kafka and
    the reason; the first answer makes it ready again."""
    now = [0.0]
    health = FakeHealth()
    broker = Broker()
    watch = KafkaWatch(object(), health, "recall", grace_s=5.0, clock=lambda: now[0], ask=broker)
    health.set_ready(component("recall"), True)
    broker.answer = "broker 1 did not answer within 2.5 s"
    seen = []
    for _ in range(8):
        now[0] += 1.0
        await watch.step()
        seen.append(health.states[component("recall")][0])
    assert seen == [True, True, True, True, False, False, False, False]
    ready, reason = health.states["recall.kafka"]
    assert not ready
    assert reason.startswith("kafka unreachable for 8 s: broker 1 did not answer")
    broker.answer = None
    now[0] += 1.0
    await watch.step()
    assert health.states["recall.kafka"] == (True, "")


def test_the_probe_fits_in_the_grace() -> None:
    """A hanging probe is given up within half the grace, and probes come at least four times per grace."""
    for grace in (0.5, 2.0, 5.0, 30.0):
        assert probe_timeout_s(grace) <= grace / 2 + 0.2
        assert probe_interval_s(grace) <= grace / 4 + 0.1


async def test_a_broken_probe_stops_the_watch_without_taking_the_path_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A probe that raises (a bug, e.g. aiokafka's internals changed) is logged at ERROR once and leaves the
    path ready: the watch must not take pods out of rotation for its own failure."""

    async def broken(consumer: object, timeout_s: float) -> str | None:
        raise AttributeError("_coordinator")

    health = FakeHealth()
    watch = KafkaWatch(object(), health, "persist", grace_s=0.5, ask=broken)
    caplog.set_level(logging.ERROR, logger="consumers.kafka_watch")
    watch.start()
    for _ in range(100):
        if caplog.records:
            break
        await asyncio.sleep(0.01)
    await watch.stop()
    assert [r.getMessage() for r in caplog.records] == [
        "kafka watch failed: readiness no longer follows Kafka"
    ]
    assert health.states["persist.kafka"] == (True, "")
