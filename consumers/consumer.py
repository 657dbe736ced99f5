"""The path's Kafka consumer and the loop's knobs, both from the settings; what the loop reports to."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer

from message_history.settings import Settings
from producers.connection import kafka_options

log = logging.getLogger(__name__)


class Health(Protocol):
    """The part of `message_history.app.health.Health` the loop reports to."""

    def set_ready(self, component: str, ready: bool, reason: str = "") -> None: ...

    def beat(self, component: str) -> None: ...


@dataclass(frozen=True, slots=True)
class LoopOptions:
    """The loop's knobs, from the settings."""

    max_batch_records: int
    poll_timeout_ms: int
    commit_interval_s: float
    retry_initial_s: float
    retry_max_s: float
    revoke_drain_s: float
    commit_timeout_s: float
    exit_timeout_s: float  # the loop's own exit (final commit + leaving the group) when no deadline is given
    kafka_grace_s: float = 5.0  # no broker answer for this long: not ready (`consumers.kafka_watch`)

    @classmethod
    def from_settings(cls, settings: Settings) -> LoopOptions:
        return cls(
            max_batch_records=settings.max_batch_records,
            poll_timeout_ms=settings.poll_timeout_ms,
            commit_interval_s=settings.commit_interval_ms / 1000,
            retry_initial_s=settings.retry_initial_backoff_s,
            retry_max_s=settings.retry_max_backoff_s,
            # Every member of the group waits for the slowest revoke (eager rebalancing): at most a quarter
            # of a session, inside the rebalance timeout (`rebalance_timeout_ms`).
            revoke_drain_s=revoke_drain_s(settings),
            commit_timeout_s=commit_timeout_s(settings),
            exit_timeout_s=settings.shutdown_grace_s / 2,
            kafka_grace_s=settings.kafka_unreachable_grace_ms / 1000,
        )


def build_consumer(settings: Settings, *, path: str) -> AIOKafkaConsumer:
    """The path's consumer: manual commits, earliest offset for a new group, committed reads only."""
    instance = f"{settings.group_instance_id}-{path}" if settings.group_instance_id else None
    return AIOKafkaConsumer(
        **kafka_options(settings, client_id=f"message-history-{path}"),
        group_id=settings.group_id,
        group_instance_id=instance,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms(settings.session_timeout_ms),
        rebalance_timeout_ms=rebalance_timeout_ms(settings),
        max_poll_interval_ms=settings.max_poll_interval_ms,
        max_poll_records=settings.max_batch_records,
    )


def build_reader(
    settings: Settings, *, client_id: str, reset: str = "earliest", max_records: int | None = None
) -> AIOKafkaConsumer:
    """A group-less consumer for the tools (`replay`, `dlq`): the caller assigns partitions and seeks, nothing
    is ever committed; committed reads only, as the live service reads."""
    options: dict[str, Any] = {"max_poll_records": max_records} if max_records is not None else {}
    return AIOKafkaConsumer(
        **kafka_options(settings, client_id=client_id),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset=reset,
        isolation_level="read_committed",
        **options,
    )


def revoke_drain_s(settings: Settings) -> float:
    """How long a revoke waits for the batch in flight before abandoning it (the next owner redoes it).

    Eager rebalancing stops every consumer of the group until the slowest member's revoke is done, so this
    is a pause of every thread of every instance. A batch that is working ends in about a second; one that
    is longer is mostly waiting (the barrier, a busy thread), which a rebalance cannot end sooner: a quarter
    of the session timeout.
    """
    return min(
        settings.shutdown_grace_s / 2,
        settings.max_poll_interval_ms / 4000,
        settings.session_timeout_ms / 4000,
    )


def commit_timeout_s(settings: Settings) -> float:
    """One synchronous commit's bound (revoke, shutdown)."""
    return max(5.0, settings.session_timeout_ms / 1000)


def rebalance_timeout_ms(settings: Settings) -> int:
    """How long the broker waits for a live member to rejoin: its whole revoke (drain, then the commit).

    aiokafka's default is the session timeout, shorter than a revoke may take: a member still finishing its
    revoke would be dropped from the generation and rejoin, a second rebalance. A dead member is evicted by
    its session timeout whatever this says; this bounds only how long a slow live member holds everyone.
    """
    revoke_s = revoke_drain_s(settings) + commit_timeout_s(settings)
    return max(settings.session_timeout_ms, int(revoke_s * 1000) + 5000)


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """A tenth of the session timeout, between 500 ms and 3 s (Kafka's own default).

    Members learn that a rebalance started from a heartbeat's answer, and the group's join waits for every
    live member: the interval is added to every failover and every scale event, so it is kept short; ten
    heartbeats per session leave a member several misses before the broker evicts it.
    """
    return max(500, min(3000, session_timeout_ms // 10))


_FORCED_CLOSE_S = 1.0  # each best-effort step after a stop that overran: LeaveGroup, closing the connections


async def stop_consumer(consumer: AIOKafkaConsumer, timeout_s: float) -> bool:
    """`consumer.stop()` (leave the group, close), bounded; True when it finished within `timeout_s`.

    aiokafka's stop waits for its coordination task, which may be inside a group join that the broker holds
    until every member rejoined or was evicted (a dead member: up to its session timeout; a rebalance timeout
    is `max.poll.interval.ms`). Past the bound that task is cancelled and the member leaves with one
    LeaveGroup (none with static membership, by Kafka's design), so the rest of the group does not wait for
    this member's session to expire either; then its connections are closed. Both are best effort.
    """
    stopping = asyncio.ensure_future(consumer.stop())
    try:
        done, _ = await asyncio.wait({stopping}, timeout=max(0.0, timeout_s))
    except asyncio.CancelledError:
        stopping.cancel()
        raise
    if done:
        stopping.result()
        return True
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(stopping, _FORCED_CLOSE_S)
    # aiokafka has no public way to leave or close after its stop was cancelled: its own steps, one by one
    coordinator: Any = getattr(consumer, "_coordinator", None)
    fetcher: Any = getattr(consumer, "_fetcher", None)
    client: Any = getattr(consumer, "_client", None)
    steps = [
        getattr(coordinator, "_maybe_leave_group", None),
        getattr(fetcher, "close", None),
        getattr(client, "close", None),
    ]
    for step in steps:
        if step is None:
            continue
        try:
            await asyncio.wait_for(step(), _FORCED_CLOSE_S)
        except Exception as exc:  # noqa: BLE001 -- best effort on the way out; the overrun is reported
            log.debug("forced consumer close step failed", extra={"error": type(exc).__name__})
    return False
