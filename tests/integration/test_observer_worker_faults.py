"""Observational Memory with a real observer worker process killed (issue 35), on the real broker and the
MongoDB-wire server: the service runs as ever; the observers are `ObserverWorker` + `observer_handler`
processes (`observer_worker_proc.py`) in one consumer group.

* **Killed inside its handler**: the first observer has the work and never answers; it is SIGKILLed there.
  Nothing was answered and its offset was never committed, so a second observer of the same group gets the
  work again and answers it; the answer applies once, to the same claim (cycle 1).
* **Killed after answering**: the first observer's answer is acknowledged (and applied) but its offset commit
  never happens; SIGKILLed there, its work goes to the second observer, which answers it again. The second
  answer names a claim already cleared: dropped (`observed` `stale`), the log not appended twice.

The marker file each first observer writes is how the test knows where it is: no sleeps, no timed asserts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from message_history import metrics
from message_history.settings import Settings
from tests.conftest import MakeTopic
from tests.integration.om_service import om_row_when, om_service_settings, om_turn
from tests.integration.service_harness import ROOT, drop_database, running_service, settings_env
from tests.integration.stream_helpers import produce, read_all, wait_committed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

THREAD = "om-fault-thread"
OWNER = "om-fault-user"


@pytest.fixture
def observers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Observer processes started by a test; any still running at the end is killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _start_observer(
    settings: Settings, mode: str, marker: Path, text: str, log_path: Path
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(settings_env(settings))
    group = f"{settings.group_id}-observer"
    args = [sys.executable, "-m", "tests.integration.observer_worker_proc", mode, group, str(marker), text]
    with log_path.open("ab") as log:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


async def _marked(marker: Path, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 90) -> str:
    """The marker's text once the observer wrote it; fails if the observer exits or never gets there."""
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the observer never reached its marker: {log_path.read_text()[-3000:]}")
        await asyncio.sleep(0.1)
    return marker.read_text()


async def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL


async def _stop(proc: subprocess.Popen[bytes], log_path: Path) -> str:
    """SIGTERM: the worker stops cleanly (exit 0); its log."""
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 30) == 0, log_path.read_text()[-3000:]
    return log_path.read_text()


def _outcome(outcome: str) -> float:
    """`message_history_outcomes_total{path="observed"}` of this process (the service runs in it)."""
    labels = {"path": "observed", "outcome": outcome}
    return metrics.REGISTRY.get_sample_value("message_history_outcomes_total", labels) or 0.0


def _applied_and_stale() -> tuple[float, float]:
    return _outcome("observe-applied"), _outcome("stale")


def _since(before: tuple[float, float]) -> tuple[float, float]:
    """Answers applied and dropped as stale since `before` (`_applied_and_stale()` then)."""
    applied, stale = _applied_and_stale()
    return applied - before[0], stale - before[1]


async def _six_turns(settings: Settings) -> None:
    """Six long turns of one thread: past the threshold, so the service claims the row and sends work."""
    turns = [om_turn(THREAD, OWNER, t) for t in range(1, 7)]
    await produce(settings.kafka_bootstrap_servers, settings.responses_topic, turns)


def _observer(
    settings: Settings,
    tmp_path: Path,
    name: str,
    mode: str,
    text: str,
    observers: list[subprocess.Popen[bytes]],
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """An observer process `name` in `mode` (kept in `observers`), its log and its marker file."""
    log_path, marker = tmp_path / f"{name}.log", tmp_path / f"{name}.marker"
    proc = _start_observer(settings, mode, marker, text, log_path)
    observers.append(proc)
    return proc, log_path, marker


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_an_observer_killed_in_its_handler_is_answered_by_the_next(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    observers: list[subprocess.Popen[bytes]],
    guarantee: str,
) -> None:
    """SIGKILL while the observer's function runs: no answer, no commit. The second observer of the group
    gets the same work (the same claim: cycle 1, `claimed_by`), its answer applies, once."""
    settings = await om_service_settings(
        kafka_bootstrap, mongo_uri, make_topic, processing_guarantee=guarantee
    )
    bootstrap = settings.kafka_bootstrap_servers
    before = _applied_and_stale()
    try:
        async with running_service(settings):
            await _six_turns(settings)
            first, first_log, marker = _observer(
                settings, tmp_path, "first", "hang-in-observe", "never", observers
            )
            inside = await _marked(marker, first, first_log)
            claimed = await om_row_when(settings, lambda row: row.get("isObserving") is True)
            assert inside == f"{claimed['_mh_claimed_by']} 1"  # the first observer has the claim's work
            await _kill(first)
            assert await read_all(bootstrap, settings.observe_results_topic, settle_s=0.5) == []

            text = "- the user wants the cheapest spring train from Lyon to Turin"
            second, second_log, _ = _observer(settings, tmp_path, "second", "answer", text, observers)
            row = await om_row_when(settings, lambda row: row.get("isObserving") is False)
            assert row["activeObservations"] == text
            assert row["_mh_cycle"] == claimed["_mh_cycle"] == 1  # the same claim, not a new cycle
            assert row["observedMessageIds"][0] == "q1"
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 1})
            assert len(await read_all(bootstrap, settings.observe_results_topic)) == 1
            assert _since(before) == (1, 0)
            assert "answered 1" in await _stop(second, second_log)
    finally:
        await drop_database(settings)


async def test_an_observer_killed_after_answering_answers_twice_applied_once(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    observers: list[subprocess.Popen[bytes]],
) -> None:
    """SIGKILL after the answer is acknowledged, before the offset commit: the work is redelivered to the
    second observer, which answers it again. The first answer applied; the second is dropped as stale (its
    claim is cleared), so the log holds the first answer once, not twice."""
    settings = await om_service_settings(kafka_bootstrap, mongo_uri, make_topic)
    bootstrap = settings.kafka_bootstrap_servers
    before = _applied_and_stale()
    try:
        async with running_service(settings):
            await _six_turns(settings)
            first_text = "- the first observer's answer"
            first, first_log, marker = _observer(
                settings, tmp_path, "first", "hang-at-commit", first_text, observers
            )
            await _marked(marker, first, first_log)  # answered and acknowledged; its commit never comes
            row = await om_row_when(settings, lambda row: row.get("isObserving") is False)
            assert row["activeObservations"] == first_text
            await _kill(first)

            second_text = "- the second observer's answer"
            second, second_log, _ = _observer(settings, tmp_path, "second", "answer", second_text, observers)
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 2})
            answers = await read_all(bootstrap, settings.observe_results_topic)
            assert len(answers) == 2  # the same work answered twice
            rows = await om_row_when(settings, lambda row: row.get("isObserving") is False)
            assert rows["activeObservations"] == first_text  # once: not appended again, not replaced
            assert rows["_mh_cycle"] == 1
            assert _since(before) == (1, 1)
            assert "answered 1" in await _stop(second, second_log)
    finally:
        await drop_database(settings)
