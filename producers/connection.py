"""Connection options shared by every Kafka client of the service (bootstrap, TLS, SASL), from the settings,
and the reading of the cluster's topic metadata those clients share.

Only here do secrets leave `SecretStr`: they go straight into the client, never into a log line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from aiokafka.errors import KafkaError

from message_history.settings import Settings

if TYPE_CHECKING:
    from aiokafka.admin import AIOKafkaAdminClient


def kafka_options(settings: Settings, *, client_id: str) -> dict[str, Any]:
    """Keyword arguments for `AIOKafkaProducer` / `AIOKafkaConsumer` common to both."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "client_id": client_id,
        "security_protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_sasl_mechanism is not None:
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_sasl_username
        if settings.kafka_sasl_password is not None:
            options["sasl_plain_password"] = settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context  # noqa: PLC0415 -- only when TLS is configured

        options["ssl_context"] = create_ssl_context(cafile=settings.kafka_ssl_cafile)
    return options


def topic_partitions(described: Iterable[Mapping[str, Any]]) -> dict[str, set[int]]:
    """{topic: its partition ids} from `AIOKafkaAdminClient.describe_topics()`; a topic the broker reports
    with an error (it does not exist, or is not readable) is left out, as if it did not exist."""
    return {
        entry["topic"]: {p["partition"] for p in entry["partitions"]}
        for entry in described
        if entry.get("error_code", 0) == 0
    }


_DESCRIBE_TRIES: Final = 3


async def all_topic_partitions(admin: AIOKafkaAdminClient) -> dict[str, set[int]]:
    """Every topic's partition ids, in one metadata read of all topics (naming one could make a broker with
    auto-create create it). The admin client asks one broker at random, so a broker that is down is tried
    past: a retriable error is tried again, up to `_DESCRIBE_TRIES` times, then raised."""
    for attempt in range(1, _DESCRIBE_TRIES + 1):
        try:
            return topic_partitions(await admin.describe_topics())
        except KafkaError as exc:
            if attempt == _DESCRIBE_TRIES or not getattr(exc, "retriable", False):
                raise
    raise AssertionError("unreachable")
