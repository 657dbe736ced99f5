"""Observational Memory's faults on the real broker and the MongoDB-wire server (issue 35): the service killed
between a claim and its work, and a claim whose work was lost while its thread stays silent.

* **Killed mid-observation**: the service claims the thread's row (`isObserving`) and its `ObserveRequest`
  never becomes durable (the first process's observe sends never complete); it is SIGKILLed there. The turn
  was never acknowledged, so the restarted service gets it again and sends the live claim's work (same
  cycle, `claimed_by`) at once, well within the claim's timeout; the answer applies and the flag clears.
* **Stale claim, silent thread**: the work went out, no answer ever comes back (the observer lost it) and the
  thread says nothing more. The observed path's sweep (`consumers.observe_sweep`) takes the claim again once
  it is older than `OBSERVATION_TIMEOUT_S` and sends the work again (cycle 2), without a new turn.

"Older than the timeout" is the claim's time moved back in MongoDB, never a wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from message_history.settings import Settings
from schemas.codec import encode
from schemas.observational import ObserveRequest
from tests.conftest import MakeTopic
from tests.integration.om_service import (
    age_claim,
    answer_text,
    observe_work,
    om_row_when,
    om_rows,
    om_service_settings,
    om_turn,
    sent_work,
)
from tests.integration.service_harness import (
    ROOT,
    ServiceProcess,
    drop_database,
    running_service,
    settings_env,
)
from tests.integration.stream_helpers import produce, read_all, read_topic, wait_committed
from worker.observer import observer_handler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

THREAD = "om-fault-thread"
OWNER = "om-fault-user"


def _turn(turn: int) -> tuple[bytes, bytes]:
    return om_turn(THREAD, OWNER, turn)


# `message-history run` whose observe sends never complete: the work is handed to the producer and never
# acknowledged, as when the process dies before Kafka has it (the claim, made before the send, is written)
_NEVER_SENT = """
import asyncio, sys
from producers.observe import ObservePublisher

async def never(self, emit, record, event, *, headers=()):
    return asyncio.get_running_loop().create_future()

ObservePublisher.publish = never
from message_history.app.cli import main
sys.exit(main(["run"]))
"""


def _start_never_sending(settings: Settings, log_path: Path) -> ServiceProcess:
    proc = ServiceProcess(settings, log_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(settings_env(settings))
    with log_path.open("ab") as log:
        proc.process = subprocess.Popen(
            [sys.executable, "-c", _NEVER_SENT], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    return proc


@pytest.mark.parametrize(
    ("guarantee", "spoke_again"),
    [("at-least-once", False), ("at-least-once", True), ("exactly-once", True)],
    ids=["silent", "spoke-again", "spoke-again-exactly-once"],
)
async def test_service_killed_between_claim_and_work_observes_after_restart(
    kafka_bootstrap: str,
    mongo_uri: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    service: list[ServiceProcess],
    guarantee: str,
    spoke_again: bool,
) -> None:
    """SIGKILL after the claim is in MongoDB and before its ObserveRequest is durable: the restarted service
    sends the claim's work (the unacknowledged claiming turn comes again), the answer applies, the flag
    clears. `spoke_again`: the thread's next turn arrived while the service was down, so the claiming turn
    comes back in one batch with a later one of its thread (the batch's work is decided on its last turn:
    without looking at every turn of the batch, the claim would wait out its timeout). The claim timeout stays
    at its default (300 s): nothing here waits for it."""
    settings = await om_service_settings(
        kafka_bootstrap, mongo_uri, make_topic, processing_guarantee=guarantee
    )
    bootstrap = settings.kafka_bootstrap_servers
    turns = 7 if spoke_again else 6
    try:
        await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
        first = _start_never_sending(settings, tmp_path / "first.log")
        service.append(first)
        claimed = await om_row_when(settings, lambda row: row.get("isObserving") is True)
        first.signal(signal.SIGKILL)
        assert await first.wait(10) == -signal.SIGKILL
        # the window: claimed in MongoDB, no work in Kafka, the claiming turn not acknowledged
        assert await read_all(bootstrap, settings.observe_requests_topic, settle_s=0.5) == []
        assert (await om_rows(settings))[0]["_mh_cycle"] == claimed["_mh_cycle"] == 1
        if spoke_again:
            await produce(bootstrap, settings.responses_topic, [_turn(7)])

        second = ServiceProcess(settings, tmp_path / "second.log")
        second.start()
        service.append(second)
        # exactly once: the work is in the redelivered turn's transaction (read `read_committed`)
        work = await sent_work(settings, 1, committed=True)
        assert (work[0].cycle, work[0].requestId) == (1, claimed["_mh_claimed_by"])  # the same claim's work
        answer = await observer_handler(lambda w: answer_text(f"seen {len(w.messages)} after the crash"))(
            work[0]
        )
        await produce(bootstrap, settings.observe_results_topic, [(THREAD.encode(), encode(answer))])
        row = await om_row_when(settings, lambda row: row.get("isObserving") is False)
        assert row["activeObservations"] == f"seen {len(work[0].messages)} after the crash"
        assert row["_mh_cycle"] == 1
        assert row["observedMessageIds"][0] == "q1"
        await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: turns})
        second.signal(signal.SIGTERM)
        assert await second.wait(settings.shutdown_grace_s + 5) == 0, second.log()[-3000:]
    finally:
        await drop_database(settings)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
async def test_a_stale_claim_is_sent_again_while_the_thread_is_silent(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, guarantee: str
) -> None:
    """The work went out and no answer ever comes; the thread says nothing more. Past the timeout the sweep
    takes the claim again and sends the work again (a new cycle), with no new turn; the late answer to the
    old cycle is dropped, the new one applies. (Without the sweep no work would ever follow: every turn is
    saved and acknowledged before the claim is aged.) Exactly once, the sweep sends on its own plain
    producer: its work is read `read_committed` too."""
    settings = await om_service_settings(
        kafka_bootstrap, mongo_uri, make_topic, observation_timeout_s=4.0, processing_guarantee=guarantee
    )
    bootstrap = settings.kafka_bootstrap_servers

    async def work_until(ready: Any) -> list[ObserveRequest]:
        records = await read_topic(
            bootstrap,
            settings.observe_requests_topic,
            until=lambda rs: ready(observe_work(rs)),
            isolation_level="read_committed",
        )
        return observe_work(records)

    try:
        async with running_service(settings):
            await produce(bootstrap, settings.responses_topic, [_turn(t) for t in range(1, 7)])
            await wait_committed(bootstrap, settings.group_id, settings.responses_topic, {0: 6})
            sent = await work_until(lambda work: len(work) >= 1)
            last = max(w.cycle for w in sent)
            await age_claim(settings)  # no turn will come: only the sweep can send it again
            work = await work_until(lambda work: any(w.cycle > last for w in work))
            old = next(w for w in work if w.cycle == last)
            new = next(w for w in work if w.cycle == last + 1)
            assert (new.recordId, new.generation) == (old.recordId, old.generation)
            assert new.requestId == old.requestId  # the claim's maker, kept
            assert [m.id for m in new.messages] == [m.id for m in old.messages]  # nothing new was said

            handler = observer_handler(lambda w: answer_text(f"cycle {w.cycle}"))
            answers = [(THREAD.encode(), encode(await handler(w))) for w in (old, new)]  # the late one first
            await produce(bootstrap, settings.observe_results_topic, answers)
            await wait_committed(bootstrap, settings.group_id, settings.observe_results_topic, {0: 2})
            row = await om_row_when(settings, lambda row: row.get("isObserving") is False)
            assert row["activeObservations"] == f"cycle {last + 1}"  # once: the late answer dropped
            assert row["_mh_cycle"] == last + 1
            assert row["_mh_claimed_at"] is None
    finally:
        await drop_database(settings)
