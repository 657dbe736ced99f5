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
from tests.zones import local_zone

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


def _assert_wraps_as_mastra(cases: list[dict[str, Any]]) -> None:
    """Each case's cycles merged into its `existing` log by `merge_thread_observations` equal Mastra's
    resource-scoped `wrapObservations` applied cycle by cycle."""
    out: dict[str, Any] = run_mastra("wrap", {"cases": cases})
    ours = []
    for case in cases:
        log = case["existing"]
        for cycle in case["cycles"]:
            at = datetime.fromisoformat(cycle["lastObservedAt"].replace("Z", "+00:00"))
            log = merge_thread_observations(
                log, [ThreadObservations(cycle["threadId"], cycle["observations"], at)]
            )
        ours.append(log)
    diffs = [(c, a, b) for c, a, b in zip(cases, ours, out["logs"], strict=True) if a != b]
    assert not diffs, diffs[:2]


@pytest.mark.parametrize("seed", range(3))
def test_resource_logs_match_mastras_wrap_observations(seed: int) -> None:
    """`merge_thread_observations` equals a resource-scoped `ObservationalMemory.wrapObservations` applied
    cycle by cycle (thread tags, same-date merges, boundaries), on generated logs."""
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = [
        {"existing": "", "cycles": [_cycle(rng) for _ in range(rng.randint(1, 6))]} for _ in range(60)
    ]
    _assert_wraps_as_mastra(cases)


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


# around New York's change to summer time (2025-03-09 07:00 UTC), each instant at its own offset
_SUMMER_TIME = [
    {"id": f"s{n}", "role": "user", "threadId": "t2", "createdAt": at, "content": {"format": 2, "parts": []}}
    for n, at in enumerate(
        ["2025-03-09T04:59:00.000Z", "2025-03-09T06:59:00.000Z", "2025-03-09T07:00:00.000Z"]
    )
]


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
@pytest.mark.parametrize("seed", range(3))
def test_other_conversations_match_mastras_format_messages_for_observer(seed: int, zone: str) -> None:
    """`format_messages_for_observer` equals Mastra's `formatMessagesForObserver` (maxPartLength 500) on
    generated text, reasoning and legacy messages (cuts inside surrogate pairs included), both processes in
    the zone `zone` (dates and times are local to each: a day's header moves, half-hour offsets, summer
    time); and the context with the blocks is `buildContextSystemMessages`' with `unobservedContextBlocks`."""
    rng = random.Random(seed)
    cases = [[_text_message(rng, n) for n in range(rng.randint(0, 6))] for _ in range(80)]
    cases.append([{**m, "content": {"format": 2, "parts": [], "content": "x"}} for m in _SUMMER_TIME])
    theirs = run_mastra("observer-text", {"cases": cases}, zone=zone)["texts"]
    with local_zone(zone):
        ours = [format_messages_for_observer(case) for case in cases]
    diffs = [(c, a, b) for c, a, b in zip(cases, ours, theirs, strict=True) if a != b]
    assert not diffs, diffs[:2]
    shown = [case for case, text in zip(cases, ours, strict=True) if "truncated" in text and "\n" in text]
    with local_zone(zone):
        blocks = other_conversations({"t2": shown[0], "t3": shown[1]})
    assert blocks.count("<other-conversation") == 2
    case = {
        "observations": "* 🔴 (09:00) User likes tea",
        "now": "2025-03-05T10:00:00.000Z",
        "others": blocks,
    }
    [built] = run_mastra("build", {"cases": [case]}, zone=zone)["built"]
    now = datetime(2025, 3, 5, 10, tzinfo=UTC)
    assert context_system_messages(case["observations"], now=now, other_conversations=blocks) == built


_VALUES: list[Any] = [
    1, 1.0, 1.5, -0.0, 1e21, 1e-7, 123456789012345678, 2**53 + 1, 0.1 + 0.2, -3, True, False, None,
    "", " ", "é", "🍵 tea", "a\"b\\c\n\t\u0001", "x" * 170, "🍵" * 200, "日本語のテキスト" * 30,
    "word " * 150,
    "%zz", "line\nbreak " * 40,
]  # fmt: skip
_KEYS = [
    "a",
    "city",
    "2",
    "10",
    "0",
    "01",
    "with space",
    "é",
    "$x",
    "_y",
    "k" * 200,
    "🍵",
    "-1",
    "4294967295",
]


def _value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.45:
        return rng.choice(_VALUES)
    if roll < 0.75:
        return {rng.choice(_KEYS) + ("" if rng.random() < 0.7 else str(i)): _value(rng, depth + 1)
                for i in range(rng.choice([0, 1, 2, 3, 5, 25]))}  # fmt: skip
    return [_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 4, 22]))]


_URLS = [
    "https://example.com/a/cat.png", "https://example.com/files/report%20final.pdf?x=1#y", "http://h/a/b/../c.JPG",
    "data:image/png;base64,AAAA", "data:application/pdf;base64,AAAA", "s3://bucket/key/photo.webp",
    "no-scheme.png",
    "https://example.com/", "mailto:someone", "https://example.com/%E9t%C3%A9.gif", "https://example.com/%zz.png",
    "file:///tmp/x.heic", "https://example.com/dir/",
]  # fmt: skip


def _attachment(rng: random.Random) -> dict[str, Any]:
    part: dict[str, Any] = {"type": rng.choice(["image", "file"])}
    part["image" if part["type"] == "image" else "data"] = rng.choice(_URLS)
    if rng.random() < 0.5:
        part["mimeType"] = rng.choice(["image/PNG", "application/pdf", "text/plain", ""])
    if rng.random() < 0.3:
        part["filename"] = rng.choice(["notes.txt", " pic.jpeg ", "", "  ", "archive.tar.gz", "a.png#x"])
    return part


def _result(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.25:
        return rng.choice(["", "  ", "ok", "x " * 400, "🍵" * 300, "word" * 8000])
    if roll < 0.45:
        blocks = [
            {"type": "text", "text": "see"},
            {"type": "image-data", "data": "AAAA", "mediaType": rng.choice(["image/png", None])},
            {"type": "image-url", "url": rng.choice(_URLS)},
            {"type": "media", "data": "AAAA", "mediaType": rng.choice(["image/jpeg", "application/pdf"])},
            {"type": "file-data", "data": "AAAA", "mediaType": "application/pdf", "filename": "r.pdf"},
            {"type": "file-url", "url": rng.choice(_URLS)},
            {"type": "media", "data": "AAAA"},
        ]
        return {"type": "content", "value": rng.sample(blocks, rng.randint(1, len(blocks)))}
    if roll < 0.55:
        return {"encryptedContent": "e" * rng.choice([10, 300]), "rest": _value(rng, 3)}
    if roll < 0.6:
        return {"deep": [[[[{"k": ["v" * 50] * 30}] * 3] * 3] * 3] * 40}
    return _value(rng, 0)


_STATES = ["call", "call", "partial-call", "result", "result", "output-error", "output-denied",
           "approval-requested", "approval-responded", "input-streaming"]  # fmt: skip


def _tool_part(rng: random.Random, calls: list[str]) -> dict[str, Any]:
    if not calls or rng.random() < 0.4:
        calls.append(f"c{len(calls)}")
    invocation: dict[str, Any] = {"state": rng.choice(_STATES), "toolCallId": rng.choice(calls),
                                  "toolName": rng.choice(["weather", "search", "🍵tool"])}  # fmt: skip
    if rng.random() < 0.7:
        deep: Any = "bottom"
        for level in range(rng.randint(1, 9)):
            deep = (
                {"k" * 200 if level == 3 else f"l{level}": deep, "n": level}
                if level % 2
                else [deep, "s" * 200]
            )
        invocation["args"] = rng.choice([_value(rng, 0), {"q": _value(rng, 0), "t": "x" * 2000}, deep])
    if invocation["state"] == "result" and rng.random() < 0.9:
        invocation["result"] = _result(rng)
    if rng.random() < 0.2:
        invocation["isError"] = rng.choice([True, False, 1, 0])
    if rng.random() < 0.3:
        invocation["errorText"] = rng.choice(["boom", "  ", "", "e" * 700])
    if invocation["state"] == "output-denied" and rng.random() < 0.6:
        invocation["approval"] = {"reason": rng.choice(["no thanks", " ", "r" * 600])}
    part: dict[str, Any] = {"type": "tool-invocation", "toolInvocation": invocation}
    if rng.random() < 0.1:
        part["providerMetadata"] = {"mastra": {"modelOutput": _result(rng)}}
    return part


def _any_message(rng: random.Random, n: int, calls: list[str]) -> dict[str, Any]:
    message = _text_message(rng, n)
    parts: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.55:
            parts.append(_tool_part(rng, calls))
        elif roll < 0.8:
            parts.append(_attachment(rng))
        elif roll < 0.97:
            parts.append({"type": rng.choice(["text", "step-start", "source"]), "text": rng.choice(_WORDS)})
        else:  # a toolInvocation that is no object: its fields are undefined to Mastra
            parts.append({"type": "tool-invocation", "toolInvocation": rng.choice(["call", 5, [1]])})
        if rng.random() < 0.2:
            parts[-1]["createdAt"] = 1740819900000 + rng.randint(0, 10**8)
    message["content"] = {"format": 2, "parts": parts}
    if rng.random() < 0.05:
        message["id"] = f"__temporal_{n}"
        message["content"]["metadata"] = {"reminderType": "temporal-gap", "gapText": "3 hours later"}
    return message


@pytest.mark.parametrize(("seed", "max_part_length"), [(0, 500), (1, 500), (2, 500), (3, 500), (4, 0)])
def test_tool_calls_results_and_attachments_match_mastras_format_messages_for_observer(
    seed: int, max_part_length: int
) -> None:
    """Byte for byte Mastra's `formatMessagesForObserver` (UTC; maxPartLength 500 as recall calls it, and 0,
    no cut, which shows the 5 000-token cut of results whole) on generated messages with tool calls in every
    state (shared call ids across messages), results (strings, JSON of every shape, attachment blocks,
    `modelOutput`, long `encryptedContent`), errors, denials, file and image parts."""
    rng = random.Random(1000 + seed)
    cases = []
    for _ in range(60):
        calls: list[str] = []
        cases.append([_any_message(rng, n, calls) for n in range(rng.randint(1, 6))])
    chain: Any = {"end": 1}
    for _ in range(8):
        chain = {"a": chain}
    args = {"deep": chain, "k" * 200: {"v": 1}, "n": float("-0.0"), "big": 1e21}
    invocation = {"state": "call", "toolCallId": "d", "toolName": "t", "args": args}
    fixed = [{"type": "tool-invocation", "toolInvocation": invocation}]
    cases.append([{**_text_message(rng, 99), "content": {"format": 2, "parts": fixed}}])
    theirs = run_mastra("observer-text", {"cases": cases, "maxPartLength": max_part_length})["texts"]
    ours = [format_messages_for_observer(case, max_part_length) for case in cases]
    diffs = [(c, a, b) for c, a, b in zip(cases, ours, theirs, strict=True) if a != b]
    assert not diffs, diffs[:1]
    joined = "\n".join(ours)
    wanted = ["[truncated ~"] if max_part_length == 0 else ["[truncated "]
    for seen in (*wanted, "Tool Call ", "Tool Result ", "Tool Error ", "[Image #", "[File #",
                 "Large string previews",
                 "additional entries omitted", "[max depth reached]", " chars; ",
                 "characters omitted]", "[Image #2", "[stripped encryptedContent"):  # fmt: skip
        assert seen in joined, seen


# What Mastra's Reflector leaves in a resource's log (its system prompt's "THREAD ATTRIBUTION (Resource
# Scope)" example): facts consolidated outside any section, sections kept without their `Date:` line, a
# thread's section split in two, boundaries kept or dropped, a section left open.
_REFLECTED_BITS = [
    "Date: Jan 1, 2025\n", "Date: Jan 2, 2025\n", "* 🔴 (14:30) User prefers TypeScript\n",
    '<thread id="t1">\n', '<thread id="t2">\n', "* 🟡 (14:35) Working on auth feature\n", "</thread>\n",
    "</thread>", "\n\n--- message boundary (2025-01-01T10:00:00.000Z) ---\n\n", "Date:Jan 1, 2025\n", "",
]  # fmt: skip


@pytest.mark.parametrize("seed", range(2))
def test_a_reflected_resource_log_merges_as_mastras(seed: int) -> None:
    """After a resource-scoped reflection the log is the Reflector's text (`createReflectionGeneration`
    stores it as given, `<thread>` sections or not): the next cycles merge into it as a resource-scoped
    `wrapObservations` does, on generated reflected logs."""
    rng = random.Random(100 + seed)
    cases: list[dict[str, Any]] = [
        {
            "existing": "".join(rng.choice(_REFLECTED_BITS) for _ in range(rng.randint(1, 14))).strip(),
            "cycles": [_cycle(rng) for _ in range(rng.randint(1, 4))],
        }
        for _ in range(80)
    ]
    _assert_wraps_as_mastra(cases)
