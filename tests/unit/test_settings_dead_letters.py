"""Each input topic's dead-letter topic: its override when set, else `<input topic>.dlq`."""

from __future__ import annotations

import pytest

from message_history.settings import Settings

INPUTS = ("requests", "responses", "commands", "observe_results")


@pytest.mark.parametrize("name", INPUTS)
def test_a_dead_letter_topic_defaults_to_its_input_topic_dot_dlq(name: str) -> None:
    settings = Settings(**{f"{name}_topic": f"in.{name}"})
    assert getattr(settings, f"{name}_dlq") == f"in.{name}.dlq"


@pytest.mark.parametrize("name", INPUTS)
def test_a_dead_letter_topic_set_is_used_as_set(name: str) -> None:
    settings = Settings(**{f"{name}_topic": f"in.{name}", f"{name}_dlq_topic": f"dead.{name}"})
    assert getattr(settings, f"{name}_dlq") == f"dead.{name}"
