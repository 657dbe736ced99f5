"""The one settings object, read from the environment once at start and frozen.

Kafka and MongoDB endpoints use the names every tool knows (`KAFKA_BOOTSTRAP_SERVERS`, `MONGODB_URI`,
`MONGODB_DATABASE`); everything else is `MESSAGE_HISTORY_<FIELD>`. Secrets are `SecretStr`, so they print
as `**********` in logs, reprs and `message-history config`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting of the service, with its default. The README's configuration table mirrors this."""

    model_config = SettingsConfigDict(env_prefix="MESSAGE_HISTORY_", frozen=True, extra="ignore")

    # --- endpoints (unprefixed names) ---
    kafka_bootstrap_servers: str = Field(
        "127.0.0.1:9092", validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS")
    )
    mongodb_uri: SecretStr = Field(
        SecretStr("mongodb://127.0.0.1:27017"), validation_alias=AliasChoices("MONGODB_URI")
    )
    mongodb_database: str = Field("mastra", validation_alias=AliasChoices("MONGODB_DATABASE"))

    # --- Kafka security (all optional; PLAINTEXT by default) ---
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: str | None = None

    # --- topics ---
    requests_topic: str = "agent.requests"
    enriched_topic: str = "agent.requests.enriched"
    responses_topic: str = "agent.responses"
    persisted_topic: str = "agent.history.persisted"
    requests_dlq_topic: str | None = None  # default: requests_topic + ".dlq"
    responses_dlq_topic: str | None = None  # default: responses_topic + ".dlq"

    # --- consumer group ---
    group_id: str = "message-history"
    group_instance_id: str | None = None  # static membership (the pod name on Kubernetes)
    session_timeout_ms: int = Field(30_000, ge=6_000)
    max_poll_interval_ms: int = Field(300_000, ge=10_000)

    # --- recall ---
    last_messages: int = Field(40, ge=0)
    max_tokens: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Token budget of the recalled history when the request does not say (Mastra's "
            "`messageHistory.maxTokens`; `0` = no history); unset = no token budget."
        ),
    )
    at_max_remove_tokens: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description=(
            "How far below the default budget a trim goes (≤ `MAX_TOKENS`); unset = 25% of the budget."
        ),
    )
    retain_full_input: bool = Field(
        False,
        description="Take every request's input as sent (no client-echo filter) unless the request says.",
    )

    # --- batching and flow control ---
    max_batch_records: int = Field(500, ge=1)
    poll_timeout_ms: int = Field(200, ge=1)
    max_in_flight_threads: int = Field(256, ge=1)
    commit_interval_ms: int = Field(200, ge=1)
    linger_ms: int = Field(5, ge=0)

    # --- limits on input ---
    max_event_bytes: int = Field(1_048_576, ge=1024)
    max_messages_per_event: int = Field(1_000, ge=1)
    max_parts_per_message: int = Field(1_000, ge=1)
    max_id_length: int = Field(256, ge=8)

    # --- outages ---
    retry_initial_backoff_s: float = Field(0.2, gt=0)
    retry_max_backoff_s: float = Field(10.0, gt=0)
    mongodb_timeout_ms: int = Field(5_000, ge=100)

    # --- lifecycle and operations ---
    shutdown_grace_s: float = Field(25.0, gt=0)
    http_host: str = "0.0.0.0"  # noqa: S104 -- probes reach the pod IP; the local stack overrides it
    http_port: int = Field(8080, ge=0, le=65535)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _budget_consistent(self) -> Settings:
        if self.at_max_remove_tokens is not None and (
            self.max_tokens is None or self.at_max_remove_tokens > self.max_tokens
        ):
            raise ValueError("at_max_remove_tokens needs max_tokens and must not exceed it")
        return self

    @property
    def requests_dlq(self) -> str:
        return self.requests_dlq_topic or f"{self.requests_topic}.dlq"

    @property
    def responses_dlq(self) -> str:
        return self.responses_dlq_topic or f"{self.responses_topic}.dlq"
