"""Is Kafka reachable for this path? A small watch beside the loop asks, because the consumer never says.

aiokafka hides a broker outage from its caller: `getmany` returns nothing, and the fetcher and the group
coordinator retry (and log) by themselves. With nothing in flight, the loop would see no error at all and
the path would stay ready through the whole outage. So each path's loop runs this watch: every `interval_s`
it sends a metadata request naming no topic (the cheapest request a broker answers) to the group
coordinator and to the leader of each partition the path owns, each bounded by a short timeout, on the
consumer's own connections. A broker that is stopped refuses at once; one that is frozen holds the
request until the timeout: both are "no answer". The group coordinator unknown (aiokafka marked it dead
and has not found it again) or a partition without a leader count as no answer too.

When nothing has answered for the grace (`MESSAGE_HISTORY_KAFKA_UNREACHABLE_GRACE_MS`, see
`message_history.core.reach.Reach`), the component `<path>.kafka` turns not ready with a reason naming
Kafka, each further failed probe counts in `message_history_retries_total{dependency="kafka"}`, and the
outage is narrated (`consumers.outage_log`); the first answer makes it ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.client import ConnectionGroup
from aiokafka.protocol.metadata import MetadataRequest

from consumers.consumer import Health
from consumers.outage_log import OutageLog
from message_history import metrics
from message_history.core.reach import Reach

log = logging.getLogger(__name__)

_MAX_NAMED = 3  # partitions without a leader named in a reason


def probe_interval_s(grace_s: float) -> float:
    """A probe every second, or more often with a grace shorter than four seconds."""
    return max(0.1, min(1.0, grace_s / 4))


def probe_timeout_s(grace_s: float) -> float:
    """Half the grace: a frozen broker is found out within the grace and a probe after it."""
    return max(0.2, grace_s / 2)


def component(path: str) -> str:
    """The readiness component the watch reports as (beside the path's own)."""
    return f"{path}.kafka"


class KafkaWatch:
    """Probes the brokers one path's consumer needs; reports to health, the retries metric and the log."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        health: Health,
        path: str,
        *,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
        ask: Callable[[AIOKafkaConsumer, float], Awaitable[str | None]] | None = None,
    ) -> None:
        self._consumer = consumer
        self._ask = ask or probe
        self._health = health
        self._path = path
        self._grace_s = grace_s
        self._clock = clock
        self._reach = Reach(grace_s, clock())
        self._log = OutageLog(path, "kafka", clock=clock)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching (once the consumer is subscribed); ready until the grace has passed silent."""
        if self._task is None:
            self._reach = Reach(self._grace_s, self._clock())
            self._health.set_ready(component(self._path), True)
            self._task = asyncio.create_task(self._watch(), name=f"{self._path}-kafka-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        interval = probe_interval_s(self._grace_s)
        while True:
            sent = self._clock()
            try:
                await self.step()
            except Exception:
                # a bug here (aiokafka's internals changed?) must not take the pod out of rotation
                log.exception(
                    "kafka watch failed: readiness no longer follows Kafka", extra={"path": self._path}
                )
                self._health.set_ready(component(self._path), True)
                return
            await asyncio.sleep(max(0.0, interval - (self._clock() - sent)))

    async def step(self) -> None:
        """One probe and what it changes (the watch's task runs it every interval)."""
        sent = self._clock()
        why = await self._ask(self._consumer, probe_timeout_s(self._grace_s))
        if why is None:
            self._reach.answered(sent)
        else:
            self._reach.failed(why)
        self._report()

    def _report(self) -> None:
        now = self._clock()
        if self._reach.reachable(now):
            if self._log.open:
                self._health.set_ready(component(self._path), True)
                self._log.back()
            return
        silent = self._reach.silent_s(now)
        reason = f"kafka unreachable for {silent:.0f} s: {self._reach.why or 'no answer'}"
        metrics.RETRIES.labels(path=self._path, dependency="kafka").inc()
        self._health.set_ready(component(self._path), False, reason)
        self._log.failed(self._reach.why, since=self._reach.last_answer)


async def probe(consumer: AIOKafkaConsumer, timeout_s: float) -> str | None:
    """None when every broker the consumer needs answered within `timeout_s`; else what did not."""
    client: Any = consumer._client  # no public access to the connections or the metadata
    targets, problems = _targets(consumer, client)
    results = await asyncio.gather(
        *(
            asyncio.wait_for(client.send(node, MetadataRequest([]), group=group), timeout_s)
            for node, group in targets
        ),
        return_exceptions=True,
    )
    for (node, _), result in zip(targets, results, strict=True):
        if isinstance(result, TimeoutError):
            problems.append(f"broker {node} did not answer within {timeout_s:g} s")
        elif isinstance(result, Exception):
            problems.append(f"broker {node}: {type(result).__name__}")
        elif isinstance(result, BaseException):
            raise result
    return "; ".join(dict.fromkeys(problems)) or None  # a node probed on two connections is named once


def _targets(consumer: AIOKafkaConsumer, client: Any) -> tuple[list[tuple[int, ConnectionGroup]], list[str]]:
    """(the brokers to probe and on which connections, the problems known without asking).

    Reads aiokafka's own state (the coordinator's id, the cluster's leaders): it has no public API for it.
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)
    problems: list[str] = []
    targets: set[tuple[int, ConnectionGroup]] = set()
    if coordinator is not None and consumer.subscription():
        if coordinator.coordinator_id is None:
            problems.append("group coordinator not known")
        else:
            targets.add((coordinator.coordinator_id, ConnectionGroup.COORDINATION))
    leaderless: list[str] = []
    for tp in consumer.assignment():
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            leaderless.append(f"{tp.topic}[{tp.partition}]")
        else:
            targets.add((leader, ConnectionGroup.DEFAULT))
    if leaderless:
        named = ", ".join(sorted(leaderless)[:_MAX_NAMED])
        problems.append(f"no leader for {named}{' ...' if len(leaderless) > _MAX_NAMED else ''}")
    if not targets:
        node = client.get_random_node()
        if node is None:
            problems.append("no broker known")
        else:
            targets.add((node, ConnectionGroup.DEFAULT))
    return sorted(targets), problems
