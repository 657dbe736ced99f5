"""The demo works on topics of its own: it creates, and afterwards deletes, every topic it names."""

from __future__ import annotations

from message_history.app.demo import demo_settings
from message_history.app.topics import service_topics
from message_history.settings import Settings


def test_every_topic_the_demo_uses_is_its_own() -> None:
    """Deleting the demo's topics never touches the environment's (the commands path's ones included)."""
    base = Settings()
    topics = service_topics(demo_settings(base, "r1"))
    assert len(topics) == len(service_topics(base))  # the commands path's topics are among them
    assert [t for t in topics if not t.startswith("demo-r1.")] == []
