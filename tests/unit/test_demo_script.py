"""What the demo prints of a stored thread: its row, its messages in order, its observation log when kept."""

from __future__ import annotations

import json
from datetime import datetime

from message_history.app.demo_script import message_text, render_stored_thread, script

THREAD = {
    "id": "t1",
    "resourceId": "ada@demo",
    "title": "Ada",
    "createdAt": datetime(2026, 1, 2, 3, 4, 5, 6000),
}
MESSAGES = [
    {
        "id": "m1",
        "role": "user",
        "createdAt": "x",
        "content": json.dumps({"format": 2, "parts": [{"type": "text", "text": "hi"}]}),
    },
    {"id": "m2", "role": "assistant", "createdAt": "y", "content": "plain"},
]


def test_a_stored_thread_is_its_row_then_its_messages() -> None:
    """Naive stored times print as UTC with milliseconds; a JSON-string content prints its text parts."""
    lines = render_stored_thread(THREAD, MESSAGES, None)
    assert lines[0].startswith(
        "thread t1 | resourceId ada@demo | title 'Ada' | createdAt 2026-01-02T03:04:05.006Z"
    )
    assert lines[1:] == ["  1. x user: hi  (id m1)", "  2. y assistant: plain  (id m2)"]


def test_the_observation_row_prints_its_log_line_by_line() -> None:
    """With an observational memory row: one header line, then each line of the log, indented."""
    om = {
        "generationCount": 0,
        "observationTokenCount": 12,
        "isObserving": False,
        "activeObservations": "- a\n- b",
    }
    lines = render_stored_thread(THREAD, [], om)
    assert lines[1:] == ["  observations (generation 0, 12 tokens, observing False):", "    - a", "    - b"]


def test_the_script_fills_extra_threads_and_turns_with_generic_lines() -> None:
    """Beyond the two scripted users and their three lines, generic ones keep every thread the same length."""
    threads = script("r1", 3, 4)
    assert [t.thread_id for t in threads] == ["demo-r1-ada", "demo-r1-bob", "demo-r1-user3"]
    assert threads[0].lines[3] == "This is message 4 from ada."
    assert threads[2].lines == [f"This is message {k} from user3." for k in range(1, 5)]
    assert message_text({"content": {"format": 2, "parts": [], "content": "legacy"}}) == "legacy"
