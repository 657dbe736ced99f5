"""SIGTERM ends the service within its grace whatever the consumer group is doing (issue 23, item 5).

The instance runs as a process, as Kubernetes runs it. Its group is mid-rebalance when the signal lands: a
member was SIGKILLed and another joined, so the broker holds every member's join until the dead member's
session expires (30 s here, longer than the grace). Each consumer's stop waits on that join; before the
bounds, one after the other, past the grace.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.conftest import MakeTopic
from tests.integration.service_harness import (
    ServiceProcess,
    drop_database,
    encoded,
    fresh_settings,
    request_event,
    start_service,
    values,
)
from tests.integration.stream_helpers import produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

GRACE_S = 8.0
SESSION_MS = 30_000  # the dead member holds the rebalance this long: well past the grace
EXIT_MARGIN_S = 2.0  # the interpreter's own start of the exit, after the grace's last step


async def _group(bootstrap: str, group_id: str) -> tuple[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group_id])
        group = response.groups[0]
        return group[2], len(group[5])
    except KafkaError:  # no coordinator yet: the group is still being created
        return "", 0
    finally:
        await admin.close()


async def _until(check: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert callable(check)
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s}s: {what}")
        await asyncio.sleep(0.2)


async def test_sigterm_during_a_rebalance_held_by_a_dead_member_ends_within_the_grace(
    kafka_bootstrap: str, mongo_uri: str, make_topic: MakeTopic, tmp_path: Path, service: list[ServiceProcess]
) -> None:
    """A member SIGKILLed, another joining, then SIGTERM: the instance exits 1 within the grace (its
    consumers could not leave in time; the log names them), and the group goes on without it."""
    settings = fresh_settings(
        kafka_bootstrap, mongo_uri, session_timeout_ms=SESSION_MS, shutdown_grace_s=GRACE_S
    )
    bootstrap = settings.kafka_bootstrap_servers
    for topic in (settings.requests_topic, settings.responses_topic, settings.commands_topic):
        await make_topic(partitions=4, name=topic)
    members_per_instance = 3  # recall, persist, commands

    async def stable(members: int) -> bool:
        state, found = await _group(bootstrap, settings.group_id)
        return state == "Stable" and found == members

    try:
        a = start_service(settings, tmp_path, service, "a")
        b = start_service(settings, tmp_path, service, "b")
        await _until(lambda: stable(2 * members_per_instance), "a and b in a stable group")
        await produce(bootstrap, settings.requests_topic, [encoded(request_event("t1", "u", 1, "q1"))])
        await read_topic(bootstrap, settings.enriched_topic, until=lambda rs: len(rs) >= 1)

        b.signal(signal.SIGKILL)
        assert await b.wait(10) == -signal.SIGKILL
        revokes = a.log().count("partitions revoked")
        # a join: the group rebalances and waits for b's session
        start_service(settings, tmp_path, service, "c")

        async def a_rejoining() -> bool:  # a revoked all of its consumers' partitions: its joins are held
            return a.log().count("partitions revoked") >= revokes + members_per_instance

        await _until(a_rejoining, "a in the rebalance", timeout_s=30)
        state, _ = await _group(bootstrap, settings.group_id)
        assert state in ("PreparingRebalance", "CompletingRebalance"), state

        a.signal(signal.SIGTERM)
        code = await a.wait(GRACE_S + EXIT_MARGIN_S)
        log = a.log()
        assert code == 1, log[-3000:]
        assert "shutdown did not finish cleanly within the grace period" in log, log[-3000:]
        assert "consumer did not stop in time" in log, log[-3000:]
        # ended by the steps' own bounds, not by the watchdog that is only the backstop
        assert "overran the grace period: exiting now" not in log, log[-3000:]
        assert '"message-history stopped"' in log or "message-history stopped" in log, log[-3000:]

        # nothing waits on a: once b's session expired, c owns every partition and serves new turns
        await produce(bootstrap, settings.requests_topic, [encoded(request_event("t2", "u", 1, "q1"))])
        enriched = await read_topic(
            bootstrap,
            settings.enriched_topic,
            until=lambda rs: "t2-turn1" in {v["requestId"] for v in values(rs)},
            timeout_s=90,
        )
        assert {v["requestId"] for v in values(enriched)} >= {"t1-turn1", "t2-turn1"}
    finally:
        await drop_database(settings)
