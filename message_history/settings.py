"""The one settings object, read from the environment once at start and frozen.

Kafka and MongoDB endpoints use the names every tool knows (`KAFKA_BOOTSTRAP_SERVERS`, `MONGODB_URI`,
`MONGODB_DATABASE`); everything else is `MESSAGE_HISTORY_<FIELD>`. Secrets are `SecretStr`, so they print
as `**********` in logs, reprs and `message-history config`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar, overload

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")


class _DeadLetterTopic:
    """`settings.<input>_dlq`: an input topic's dead-letter topic, its override `<input>_dlq_topic`, else
    `<input>_topic` + `.dlq`. A descriptor: the rule once, one line per input topic in `Settings`."""

    def __set_name__(self, owner: type[Settings], name: str) -> None:
        self._input = name.removesuffix("_dlq")

    @overload
    def __get__(self, settings: None, owner: type[Settings]) -> Self: ...
    @overload
    def __get__(self, settings: Settings, owner: type[Settings]) -> str: ...
    def __get__(self, settings: Settings | None, owner: type[Settings]) -> str | Self:
        if settings is None:
            return self
        override: str | None = getattr(settings, f"{self._input}_dlq_topic")
        return override or f"{getattr(settings, f'{self._input}_topic')}.dlq"


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

    # --- forget (docs/operations.md#9-forget-erasure-requests) ---
    forget_chunk_size: int = Field(
        1000,
        ge=1,
        le=100_000,
        description=(
            "Rows a forget finds and deletes per step (threads, messages, markers): each step is a few "
            "bounded operations, so a resource of any size is forgotten in steps that finish, with progress."
        ),
    )

    # --- derived message ids (docs/security.md#derived-ids-and-the-deployment-key) ---
    message_id_key: SecretStr | None = Field(
        None,
        description=(
            "Secret keying the alternate of a derived message id that another thread holds (so no tenant can "
            "predict it). Unset: the deployment's own random key, made once and kept in MongoDB "
            "(`message_history_keys`). Must be the same on every instance; never logged."
        ),
    )
    message_id_previous_keys: SecretStr | None = Field(
        None,
        description=(
            "Comma-separated keys used before `MESSAGE_ID_KEY` (after a rotation): a turn saved under an "
            "alternate made with one of them keeps that id on replay."
        ),
    )

    # --- topics ---
    requests_topic: str = "agent.requests"
    enriched_topic: str = "agent.requests.enriched"
    responses_topic: str = "agent.responses"
    persisted_topic: str = "agent.history.persisted"
    requests_dlq_topic: str | None = None  # default: requests_topic + ".dlq"
    responses_dlq_topic: str | None = None  # default: responses_topic + ".dlq"
    commands_topic: str = Field(
        "agent.history.commands",
        description=(
            "Input of the commands path: `ForgetThread` / `ForgetResource` events (runs with `run` and "
            "`run --only persist`); empty = no commands path."
        ),
    )
    forgotten_topic: str = Field(
        "agent.history.forgotten", description="Output of the commands path: `HistoryForgotten` events."
    )
    commands_dlq_topic: str | None = Field(
        None, description="Dead letters of the commands path; unset = commands topic + `.dlq`."
    )

    # --- Observational Memory (docs/observational-memory.md) ---
    observational_memory: bool = Field(
        False,
        description=(
            "Observational Memory for every request that does not say (`memory.observationalMemory`): "
            "a thread's unobserved messages past `OBSERVATION_MESSAGE_TOKENS` are sent to observer "
            "workers on `OBSERVE_REQUESTS_TOPIC`, and recall sends the observation log plus the unobserved "
            "messages."
        ),
    )
    observation_message_tokens: int = Field(
        30_000,
        ge=1,
        description=(
            "Mastra's `observation.messageTokens`: unobserved message tokens (Mastra OM's count) that "
            "trigger an observation, when the request does not say."
        ),
    )
    reflection_observation_tokens: int = Field(
        40_000,
        ge=1,
        description=(
            "Mastra's `reflection.observationTokens`: observation log tokens that trigger a reflection, when "
            "the request does not say."
        ),
    )
    observation_timeout_s: float = Field(
        300.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "How long an observation (reflection) sent to an observer holds its thread's claim: past it the "
            "next turn of the thread, or the observed path's sweep (every half of it), sends it again (a "
            "crashed or slow observer never leaves it stuck); an answer to the old claim is then dropped."
        ),
    )
    observe_requests_topic: str = Field(
        "agent.memory.observe",
        description="Output of the persist path for observer workers: `ObserveRequest` / `ReflectRequest`.",
    )
    observe_results_topic: str = Field(
        "agent.memory.observed",
        description=(
            "Input of the observed path: observers' `ObserveResult` / `ReflectResult` (runs with `run` and "
            "`run --only persist`); empty = no observed path."
        ),
    )
    observe_results_dlq_topic: str | None = Field(
        None, description="Dead letters of the observed path; unset = observe results topic + `.dlq`."
    )

    # --- consumer group ---
    group_id: str = "message-history"
    group_instance_id: str | None = None  # static membership (the pod name on Kubernetes)
    session_timeout_ms: int = Field(
        10_000, ge=6_000
    )  # failover time vs false evictions: operations-stream.md
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
    max_rows_per_request: int = Field(
        5_000,
        ge=100,
        description=(
            "Most stored rows one request's recall reads (a count recall's page, a token budget's pages), "
            "whatever its `lastMessages` says: past it the newest rows are recalled and the event says "
            "`history.truncated: true`. The default keeps one recall of 1 KB rows well inside "
            "`MONGODB_TIMEOUT_MS`."
        ),
    )
    row_codec: Literal["auto", "native", "python"] = Field(
        "auto",
        description=(
            "How recalled rows are read from the raw replies: `native` (the Rust codec built by "
            "`stack install --all` and into the image; start-up fails without it), `python` (the reference), "
            "`auto` (native when installed and built from these models, else python)."
        ),
    )

    # --- turn ordering (docs/events.md#16-turn-ordering-the-barrier-and-busy-threads) ---
    barrier: Literal["on", "off"] = Field(
        "on",
        description=(
            "Turn barrier: before recalling, wait until every response of the thread's partition that was on "
            "the responses topic when the request was fetched is persisted. Needs equal partition counts."
        ),
    )
    busy_thread: Literal["enqueue", "allow", "reject"] = Field(
        "enqueue",
        description=(
            "A request whose thread has a turn enriched but not answered yet: `enqueue` waits for that "
            "answer, `allow` recalls at once, `reject` dead-letters it with `error.type` `ThreadBusyError`."
        ),
    )
    turn_timeout_ms: int = Field(
        60_000,
        ge=0,
        description=(
            "Longest wait of a request (parked in its thread's lane) for the barrier or a busy thread; then "
            "it goes out with "
            "`history.complete: false`. Capped at half of `MAX_POLL_INTERVAL_MS`."
        ),
    )
    abandon_turn_after_ms: int = Field(
        900_000,
        ge=1000,
        description=(
            "A turn enriched and not answered for this long is abandoned (its worker dropped it): its thread "
            "is no longer busy, so `enqueue` does not wait for it and `reject` does not refuse the thread's "
            "next requests; a warning names it. Longer than the slowest turn a worker may take."
        ),
    )

    # --- delivery (docs/operations-stream.md#11-exactly-once) ---
    processing_guarantee: Literal["at-least-once", "exactly-once"] = Field(
        "at-least-once",
        description=(
            "`exactly-once`: each input partition's outputs (enriched, persisted, dead letters, forget "
            "answers) and its committed offset go in one Kafka transaction, so `read_committed` consumers "
            "see every output once across crashes, rebalances and zombie instances; outputs are released "
            "at each commit (`COMMIT_INTERVAL_MS` later at most)."
        ),
    )
    max_held_outputs: int = Field(
        100_000,
        ge=1,
        description=(
            "`exactly-once`: outputs held (produced, not yet committed) per path at most; past it intake "
            "pauses until commits drain them (a commit failing for a while must not grow memory)."
        ),
    )

    # --- batching and flow control ---
    max_batch_records: int = Field(500, ge=1)
    poll_timeout_ms: int = Field(200, ge=1)
    max_in_flight_threads: int = Field(256, ge=1)
    commit_interval_ms: int = Field(200, ge=1)
    # 0: a quiet turn's output leaves at once (5 ms was +5 ms per event, 40% of an idle turn's latency);
    # under load the producer still batches, one request per broker at a time (see the anchor below)
    # docs/operations.md#11-runtime-and-allocator-settings
    linger_ms: int = Field(0, ge=0)
    output_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none",
        description=(
            "Compression of every record the service produces (enriched, persisted, dead letters, answers). "
            "`none` by default: every Kafka client reads it (KafkaJS reads only gzip without extra codecs). "
            "Inputs in any of these codecs are always read."
        ),
    )

    # --- limits on input ---
    max_event_bytes: int = Field(1_048_576, ge=1024)
    max_messages_per_event: int = Field(1_000, ge=1)
    max_parts_per_message: int = Field(1_000, ge=1)
    max_id_length: int = Field(256, ge=36)  # a derived message id is a 36-character UUID

    # --- outages ---
    retry_initial_backoff_s: float = Field(0.2, gt=0)
    retry_max_backoff_s: float = Field(10.0, gt=0)
    mongodb_timeout_ms: int = Field(5_000, ge=100)
    storage_timeout_tries: int = Field(
        3,
        ge=1,
        description=(
            "A record whose own MongoDB read or write times out this many times, alone in its attempt and "
            "while the server answers a ping, is dead-lettered with `error.type` `StorageTimeout` (an outage "
            "is still waited out)."
        ),
    )
    kafka_unreachable_grace_ms: int = Field(
        5_000,
        ge=500,
        description=(
            "How long no broker a path needs (its group coordinator, its partitions' leaders) may leave a "
            "probe unanswered before the path reports not ready (`<path>.kafka` on `/readyz`); probes go "
            "every second, so a shorter blip never makes the pod unready."
        ),
    )

    # --- retention ---
    prune_older_than: str | None = Field(
        None,
        description=(
            "Run `prune` from the service every `PRUNE_INTERVAL_S`: delete messages older than this "
            "(`90d`, `12h`, `30m`, `2w`), threads left empty and busy-thread markers that no longer matter. "
            "Unset = off."
        ),
    )
    prune_interval_s: float = Field(
        3600.0,
        gt=0,
        description=(
            "Interval between the service's prune runs; with several replicas one of them prunes per "
            "interval (the holder of a lease two intervals long, in `message_history_leases`)."
        ),
    )
    prune_batch_size: int = Field(1000, ge=1, description="Rows deleted per batch by `prune`.")

    # --- runtime (docs/operations.md#11-runtime-and-allocator-settings) ---
    gc_freeze: bool = Field(
        True,
        description=(
            "Move every object alive after start-up (modules, models, settings) out of the garbage "
            "collector's reach (`gc.freeze()`), so that its full collections walk only what the stream "
            "allocates."
        ),
    )
    gc_threshold: int = Field(
        100_000,
        ge=0,
        description=(
            "The young generation's collection threshold (`gc.set_threshold`; Python's default is 700): "
            "allocations net of frees between two young collections; 0 turns automatic collection off."
        ),
    )

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
    def turn_timeout_s(self) -> float:
        """The wait bound in seconds; at most half the poll interval, so a waiting batch keeps its group."""
        return min(self.turn_timeout_ms, self.max_poll_interval_ms // 2) / 1000

    # each input topic's dead-letter topic, one rule for all (`_DeadLetterTopic`)
    requests_dlq: ClassVar[_DeadLetterTopic] = _DeadLetterTopic()
    responses_dlq: ClassVar[_DeadLetterTopic] = _DeadLetterTopic()
    commands_dlq: ClassVar[_DeadLetterTopic] = _DeadLetterTopic()
    observe_results_dlq: ClassVar[_DeadLetterTopic] = _DeadLetterTopic()


def settings_slice(cls: type[D], settings: Settings) -> D:
    """The dataclass `cls` filled from the settings of the same names: one spelling of each shared option
    (`schemas.limits.Limits`, `core.memory_options.MemoryDefaults`); a field the settings lack is an
    AttributeError."""
    values: dict[str, Any] = {f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)}
    return cls(**values)
