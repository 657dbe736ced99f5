"""The path's Kafka consumer and the loop's knobs, both from the settings; what the loop reports to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer

from message_history.settings import Settings
from producers.connection import kafka_options


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

    @classmethod
    def from_settings(cls, settings: Settings) -> LoopOptions:
        return cls(
            max_batch_records=settings.max_batch_records,
            poll_timeout_ms=settings.poll_timeout_ms,
            commit_interval_s=settings.commit_interval_ms / 1000,
            retry_initial_s=settings.retry_initial_backoff_s,
            retry_max_s=settings.retry_max_backoff_s,
            # A revoke must finish well inside the rebalance timeout (max.poll.interval for aiokafka).
            revoke_drain_s=min(settings.shutdown_grace_s / 2, settings.max_poll_interval_ms / 4000),
            commit_timeout_s=max(5.0, settings.session_timeout_ms / 1000),
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
        heartbeat_interval_ms=max(1000, settings.session_timeout_ms // 3),
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
