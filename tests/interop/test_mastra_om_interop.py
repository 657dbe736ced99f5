"""Interop with Mastra's Observational Memory (`@mastra/memory` 1.31.0 under Node, tests/interop/mastra-om).

* The recording the unit tests use (tests/data/om/mastra_om.json) is what live Mastra answers today.
* OM's token counter against `message_history.core.om_tokens` on a few hundred generated messages of every
  part kind (attachments aside: those are estimates, see the module).
* The context texts `core/observation_text.py` copies are Mastra's exported constants, and
  `optimize_for_context` equals `optimizeObservationsForContext`.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import UTC, datetime
from typing import Any

import pytest

from message_history.core.observation_others import format_messages_for_observer, other_conversations
from message_history.core.observation_resource import ThreadObservations, merge_thread_observations
from message_history.core.observation_text import context_system_messages
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


_FRAGMENTS = [
    "Date: {date}\n", "* 🔴 (09:{n:02d}) User {verb} ", "* 🟡 ", "[tag, other] ", "-> ", "(meaning {date}) ",
    "(estimated {vague} {year}) ", "(Estimated {month} {day}-{day2}, {year}) ",
    "(meaning {month} to {month} {year}) ",
    "will go ", "plans to ", "wants to ", "about ", "tomorrow ", "\n", "\n\n", "  ", "[O{n}] ",
    "\n\n--- message boundary (2025-01-0{d}T00:00:00.000Z) ---\n\n", "(meaning ", ") ", "Jan {day}, 2025\n",
]  # fmt: skip
_MONTHS = [
    "Jan",
    "February",
    "Mar",
    "April",
    "May",
    "June",
    "jul",
    "Augu",
    "Sept",
    "Oct",
    "Nov",
    "December",
    "Foo",
]


def _random_log(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 40)):
        month = rng.choice(_MONTHS)
        day, year = rng.randint(0, 33), rng.choice(["2024", "2025", "2026", "0049", "1999"])
        date = f"{month} {day}, {year}"
        parts.append(
            rng.choice(_FRAGMENTS).format(
                date=date, n=rng.randint(0, 59), verb=rng.choice(["said", "will start", "plans to go"]),
                vague=rng.choice(["late", "early", "mid", "mid-to-late", "Late"]) + " " + month,
                year=year, month=month, day=day, day2=day + 1, d=rng.randint(1, 9),
            )
        )  # fmt: skip
    return "".join(parts)


@pytest.mark.parametrize("seed", [35, 36])
def test_context_matches_mastra_on_generated_logs(seed: int) -> None:
    """`buildContextSystemMessages` on 300 generated logs (dates of every form, odd months, planned actions,
    boundaries, tags) at generated times: our context messages are Mastra's, to the character."""
    rng = random.Random(seed)
    cases = [
        {
            "observations": _random_log(rng),
            "now": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T10:00:00.000Z",
        }
        for _ in range(300)
    ]
    built = run_mastra("build", {"cases": cases})["built"]
    for case, theirs in zip(cases, built, strict=True):
        now = datetime.fromisoformat(case["now"].replace("Z", "+00:00"))
        assert (context_system_messages(case["observations"], now=now) or None) == theirs, case


_SECTION_BITS = [
    "Date: Jan 1, 2025\n", "Date: Jan 2, 2025\n", "Date:Jan 1, 2025\n", "* 🔴 (09:00) User said ", "x",
    '<thread id="t1">', "</thread>", "<THREAD>", "\n", "  ", "Date: Foo 3, 2024 ", "* done\n", "",
]  # fmt: skip


def _cycle(rng: random.Random) -> dict[str, Any]:
    text = "".join(rng.choice(_SECTION_BITS) for _ in range(rng.randint(0, 8)))
    day = rng.randint(1, 9)
    return {"threadId": rng.choice(["t1", "t2", "t3"]), "observations": text,
            "lastObservedAt": f"2025-01-0{day}T10:00:0{day}.123Z"}  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_resource_logs_match_mastras_wrap_observations(seed: int) -> None:
    """`merge_thread_observations` equals a resource-scoped `ObservationalMemory.wrapObservations` applied
    cycle by cycle (thread tags, same-date merges, boundaries), on generated logs."""
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = [
        {"existing": "", "cycles": [_cycle(rng) for _ in range(rng.randint(1, 6))]} for _ in range(60)
    ]
    out: dict[str, Any] = run_mastra("wrap", {"cases": cases})
    ours = []
    for case in cases:
        log = case["existing"]
        for cycle in case["cycles"]:
            at = datetime.fromisoformat(cycle["lastObservedAt"].replace("Z", "+00:00"))
            cycle_obs = ThreadObservations(cycle["threadId"], cycle["observations"], at)
            log = merge_thread_observations(log, [cycle_obs])
        ours.append(log)
    diffs = [(c, a, b) for c, a, b in zip(cases, ours, out["logs"], strict=True) if a != b]
    assert not diffs, diffs[:2]


_WORDS = ["hi", "tea", "🍵", "x" * 300, "line\nbreak", " ", "é", "ok"]


def _text_message(rng: random.Random, n: int) -> dict[str, Any]:
    day, hour, minute = rng.randint(1, 3), rng.randint(0, 23), rng.choice([0, 0, 5, 30])
    parts: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 3)):
        text = "".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 4)))
        parts.append({"type": rng.choice(["text", "text", "reasoning"]), "text": text, "reasoning": text})
    content: Any = {"format": 2, "parts": parts}
    if not parts and rng.random() < 0.5:
        content = {"format": 2, "parts": [], "content": "legacy " * rng.randint(0, 2)}
    return {"id": f"m{n}", "role": rng.choice(["user", "assistant"]), "threadId": "t2",
            "createdAt": f"2025-03-0{day}T{hour:02d}:{minute:02d}:00.000Z", "content": content}  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_other_conversations_match_mastras_format_messages_for_observer(seed: int) -> None:
    """`format_messages_for_observer` equals Mastra's `formatMessagesForObserver` (maxPartLength 500, UTC) on
    generated text, reasoning and legacy messages (cuts inside surrogate pairs included); and the context with
    the blocks is `buildContextSystemMessages`' with `unobservedContextBlocks`."""
    rng = random.Random(seed)
    cases = [[_text_message(rng, n) for n in range(rng.randint(0, 6))] for _ in range(80)]
    theirs = run_mastra("observer-text", {"cases": cases})["texts"]
    ours = [format_messages_for_observer(case) for case in cases]
    diffs = [(c, a, b) for c, a, b in zip(cases, ours, theirs, strict=True) if a != b]
    assert not diffs, diffs[:2]
    shown = [case for case, text in zip(cases, ours, strict=True) if "truncated" in text and "\n" in text]
    blocks = other_conversations({"t2": shown[0], "t3": shown[1]})
    assert blocks.count("<other-conversation") == 2
    case = {
        "observations": "* 🔴 (09:00) User likes tea",
        "now": "2025-03-05T10:00:00.000Z",
        "others": blocks,
    }
    [built] = run_mastra("build", {"cases": [case]})["built"]
    now = datetime(2025, 3, 5, 10, tzinfo=UTC)
    assert context_system_messages(case["observations"], now=now, other_conversations=blocks) == built
