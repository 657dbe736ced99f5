"""Observational Memory's settings: the topics, their dead letters, Mastra's thresholds and the claim timeout,
and how a request's `memory.observationalMemory` resolves over them (docs/observational-memory.md)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from consumers.observational import observation_defaults, request_settings
from message_history.app.service import selected_paths
from message_history.app.topics import service_topics
from message_history.core.observation import DEFAULT_MESSAGE_TOKENS, DEFAULT_OBSERVATION_TOKENS, Threshold
from message_history.settings import Settings
from producers.output import output_topics
from storage.observational import CLAIM_TIMEOUT


def test_defaults_are_mastras_and_the_designs() -> None:
    """Off by default; Mastra's thresholds (30 000 / 40 000); the claim timeout of the storage (5 min)."""
    settings = Settings()
    assert settings.observational_memory is False
    assert settings.observation_message_tokens == DEFAULT_MESSAGE_TOKENS == 30_000
    assert settings.reflection_observation_tokens == DEFAULT_OBSERVATION_TOKENS == 40_000
    assert settings.observation_timeout_s == CLAIM_TIMEOUT.total_seconds() == 300
    assert settings.observe_requests_topic == "agent.memory.observe"
    assert settings.observe_results_topic == "agent.memory.observed"
    assert settings.observe_results_dlq == "agent.memory.observed.dlq"


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESSAGE_HISTORY_OBSERVATIONAL_MEMORY", "true")
    monkeypatch.setenv("MESSAGE_HISTORY_OBSERVATION_MESSAGE_TOKENS", "500")
    monkeypatch.setenv("MESSAGE_HISTORY_REFLECTION_OBSERVATION_TOKENS", "900")
    monkeypatch.setenv("MESSAGE_HISTORY_OBSERVATION_TIMEOUT_S", "2.5")
    monkeypatch.setenv("MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC", "om.out")
    settings = Settings()
    assert settings.observational_memory is True
    assert settings.observe_results_dlq == "om.out.dlq"
    defaults = observation_defaults(settings)
    assert defaults.message_tokens == Threshold(500, 500)
    assert defaults.observation_tokens == 900


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("observation_message_tokens", 0),
        ("reflection_observation_tokens", -1),
        ("observation_timeout_s", 0),
        ("observation_timeout_s", float("inf")),
    ],
)
def test_nonsense_is_refused(name: str, value: float) -> None:
    with pytest.raises(ValidationError):
        Settings.model_validate({name: value})


def test_topics_are_created_and_checked_for_size() -> None:
    """`message-history topics` creates the three topics; the producer checks the two it writes."""
    settings = Settings()
    topics = service_topics(settings)
    for topic in ("agent.memory.observe", "agent.memory.observed", "agent.memory.observed.dlq"):
        assert topic in topics
    assert {"agent.memory.observe", "agent.memory.observed.dlq"} <= set(output_topics(settings))
    assert "agent.memory.observed" not in service_topics(Settings(observe_results_topic=""))


@pytest.mark.parametrize(
    ("service_on", "option", "expected"),
    [
        (False, None, None),  # off, and the request does not ask
        (True, None, Threshold(30_000, 30_000)),  # the service default
        (True, False, None),  # a request turns it off
        (True, {"enabled": False}, None),
        (False, True, Threshold(30_000, 30_000)),  # a request turns it on with the defaults
        (False, {"observation": {"messageTokens": 100}}, Threshold(100, 100)),
        (True, {"observation": {"messageTokens": 100}, "shareTokenBudget": True}, Threshold(100, 40_100)),
        (True, {"scope": "resource"}, Threshold(30_000, 30_000)),  # resource scope: the resource's own log
    ],
)
def test_request_settings(service_on: bool, option: object, expected: Threshold | None) -> None:
    """`memory.observationalMemory` over the service default: absent = the default, false = off, true = the
    service's thresholds, an object overrides what it names."""
    memory = None if option is None else {"observationalMemory": option}
    resolved = request_settings(memory, Settings(observational_memory=service_on))
    assert (resolved.message_tokens if resolved else None) == expected


@pytest.mark.parametrize(
    ("only", "results_topic", "expected"),
    [
        (None, "agent.memory.observed", ("recall", "persist", "commands", "observed")),
        ("persist", "agent.memory.observed", ("persist", "commands", "observed")),
        ("observed", "agent.memory.observed", ("observed",)),
        ("recall", "agent.memory.observed", ("recall",)),
        (None, "", ("recall", "persist", "commands")),
    ],
)
def test_the_observed_path_runs_with_the_persist_path(
    only: Any, results_topic: str, expected: tuple[str, ...]
) -> None:
    """`run` and `run --only persist` include the observed path (the persist path sends its work), unless its
    topic is set empty."""
    assert selected_paths(Settings(observe_results_topic=results_topic), only) == expected


def test_the_worker_echoes_the_option() -> None:
    """The Python SDK's response carries the request's `memory.observationalMemory`, so the persist path
    sees the turn's OM settings (a service with OM off by default observes a thread that asks for it)."""
    from datetime import UTC, datetime  # noqa: PLC0415

    from schemas.events import EnrichedRequest  # noqa: PLC0415
    from worker.turn import Reply, Turn, build_response  # noqa: PLC0415

    option = {"observation": {"messageTokens": 500}}
    event = EnrichedRequest.model_validate(
        {
            "schemaVersion": 1,
            "requestId": "r1",
            "threadId": "t1",
            "resourceId": "u1",
            "createdAt": "2025-01-01T00:00:00.000Z",
            "messages": [],
            "memory": {"observationalMemory": option},
            "history": {"recalled": 0, "limit": 40},
            "eventId": "r1",
        }
    )
    response = build_response(Turn(event), Reply.text("ok"), now=datetime(2025, 1, 1, tzinfo=UTC))
    resolved = request_settings(response.memory, Settings())
    assert resolved is not None
    assert resolved.message_tokens == Threshold(500, 500)


def test_the_observed_dead_letters_redrive_to_the_observed_topic() -> None:
    from message_history.app.dlq import input_topics  # noqa: PLC0415

    assert input_topics(Settings())["agent.memory.observed.dlq"] == "agent.memory.observed"
    assert "agent.memory.observed.dlq" not in input_topics(Settings(observe_results_topic=""))
