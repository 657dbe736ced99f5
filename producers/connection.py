"""Connection options shared by every Kafka client of the service (bootstrap, TLS, SASL), from the settings,
and the reading of the cluster's topic metadata those clients share.

Only here do secrets leave `SecretStr`: they go straight into the client, never into a log line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from message_history.settings import Settings


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
