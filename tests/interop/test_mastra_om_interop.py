"""Interop with Mastra's Observational Memory (`@mastra/memory` 1.31.0 under Node, tests/interop/mastra-om).

* The recording the unit tests use (tests/data/om/mastra_om.json) is what live Mastra answers today.
* OM's token counter against `message_history.core.om_tokens` on a few hundred generated messages of every
  part kind (attachments aside: those are estimates, see the module).
* The context texts `core/observation_text.py` copies are Mastra's exported constants, and
  `optimize_for_context` equals `optimizeObservationsForContext`.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from message_history.core.om_tokens import attachment_free, count_om_message, count_om_messages
from tests.infra import skip_or_fail
from tests.memory_cases import random_messages
from tests.om_cases import NODE_DIR, RECORDING, record, run_mastra

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module", autouse=True)
def _node_packages() -> None:
    if shutil.which("node") is None:
        skip_or_fail("node is not on PATH")
    if not (NODE_DIR / "node_modules" / "@mastra" / "memory").is_dir():
        skip_or_fail("tests/interop/mastra-om/node_modules is missing (npm ci there)")


def test_the_recording_is_what_mastra_answers() -> None:
    """tests/data/om/mastra_om.json (made by `python -m tests.om_cases record`) is what these packages say."""
    assert record() == json.loads(RECORDING.read_text(encoding="utf-8"))


def test_om_token_counter_matches_mastra_on_generated_messages() -> None:
    """Same count per message and per list as Mastra OM's `TokenCounter`, on every generated part kind."""
    messages = [m for m in random_messages(seed=35, count=400) if attachment_free(m)]
    assert len(messages) > 200
    out: dict[str, Any] = run_mastra("tokens", {"messages": messages})
    ours = [count_om_message(m) for m in messages]
    diffs = [(m, a, b) for m, a, b in zip(messages, ours, out["perMessage"], strict=True) if a != b]
    assert not diffs, diffs[:3]
    assert count_om_messages(messages) == out["total"]
