"""Each input topic's dead-letter topic: its override when set, else `<input topic>.dlq`."""

from __future__ import annotations

from message_history.settings import Settings


def _dead_letter_topics(settings: Settings) -> list[str]:
    return [
        settings.requests_dlq,
        settings.responses_dlq,
        settings.commands_dlq,
        settings.observe_results_dlq,
    ]


def test_a_dead_letter_topic_defaults_to_its_input_topic_dot_dlq() -> None:
    settings = Settings(
        requests_topic="in.rq",
        responses_topic="in.rs",
        commands_topic="in.cmd",
        observe_results_topic="in.obs",
        requests_dlq_topic=None,
        responses_dlq_topic=None,
        commands_dlq_topic=None,
        observe_results_dlq_topic=None,
    )
    assert _dead_letter_topics(settings) == ["in.rq.dlq", "in.rs.dlq", "in.cmd.dlq", "in.obs.dlq"]


def test_a_dead_letter_topic_set_is_used_as_set() -> None:
    settings = Settings(
        requests_topic="in.rq",
        responses_topic="in.rs",
        commands_topic="in.cmd",
        observe_results_topic="in.obs",
        requests_dlq_topic="dead.rq",
        responses_dlq_topic="dead.rs",
        commands_dlq_topic="dead.cmd",
        observe_results_dlq_topic="dead.obs",
    )
    assert _dead_letter_topics(settings) == ["dead.rq", "dead.rs", "dead.cmd", "dead.obs"]
