"""Generated messages and conversations for the token and memory tests (seeded, so reproducible).

`random_texts` and `random_messages` cover every part type and tool state the counter distinguishes, in
text mixing English, German/French/Spanish/Polish accents, CJK, Hangul, kana, emoji, numbers, punctuation
runs and unusual spaces. `conversation` builds a multi-turn thread with tool calls linked across messages.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)

_WORDS = [
    "hello",
    "world",
    "a",
    "to",
    "the",
    "tokenization",
    "conversation",
    "memory",
    "Grüße",
    "straße",
    "café",
    "naïve",
    "jalapeño",
    "żółć",
    "čeština",
    "Łódź",
    "你好",
    "世界",
    "안녕하세요",
    "カタカナ",
    "ひらがな",
    "3.14",
    "1,5",
    "2025",
    "12:30",
    "e-mail",
    "foo_bar",
    "a/b/c",
    "x+y=z",
    "!!!",
    "...",
    "(ok)",
    "[1]",
    "{json}",
    "😀",
    "🚀rocket",
    "naïve-ish",
    "ÀÉÎ",
    "Ÿ",
    "ẞig",
    "ÄÖÜ",
    "über",
    "supercalifragilistic",
    "https://example.com/x?y=1",
    "user@example.com",
    "#tag",
    "$100",
    "50%",
    "`code`",
    "~tilde",
    "a|b",
]
_SPACES = [
    " ",
    " ",
    " ",
    "  ",
    "\n",
    "\t",
    "\u00a0",
    "\u2003",
    "\u3000",
    "\ufeff",
    "\u0085",
    "\u001f",
    " \n ",
]


def random_text(rng: random.Random, words: int | None = None) -> str:
    """Words and separators drawn at random (possibly empty)."""
    n = rng.randint(0, 30) if words is None else words
    pieces: list[str] = []
    for _ in range(n):
        pieces.append(rng.choice(_WORDS))
        pieces.append(rng.choice(_SPACES))
    return "".join(pieces)


def random_texts(seed: int, count: int) -> list[str]:
    """`count` texts, a few of them edge cases."""
    rng = random.Random(seed)
    fixed = ["", " ", "a", "abcd", "1.2.3", "1..2", "你", "ab😀", "😀😀", "ß" * 7, "ą" * 8, "x" * 13]
    return fixed + [random_text(rng) for _ in range(count)]


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randint(0, 8 if depth < 2 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -7, 42, 10**15, 2**53])
    if kind == 3:
        return rng.choice([0.5, 1.0, -2.25, 1e21, 1.5e-7, 3.14159, 100.0, 1e-6, 123456.789])
    if kind in (4, 5):
        return random_text(rng, rng.randint(0, 6))
    if kind == 6:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}_{rng.choice(_WORDS)}": _json_value(rng, depth + 1) for i in range(rng.randint(0, 4))}


def _media(rng: random.Random) -> dict[str, Any]:
    data = rng.choice(
        [
            "aGVsbG8gd29ybGQ=" * rng.randint(1, 40),
            "data:image/png;base64,iVBORw0KGgo=",
            "data:text/plain;base64," + "QUJD" * rng.randint(1, 50),
            "data:,plain",
            "https://example.com/file.bin",
            "s3://bucket/key",
            "",
        ]
    )
    key = rng.choice(["mediaType", "mimeType"])
    payload: dict[str, Any] = {"type": rng.choice(["image", "file", "media"]), "data": data}
    payload[key] = rng.choice(["image/png", "image/jpeg", "application/pdf", "text/plain", "audio/wav"])
    if rng.random() < 0.3:
        payload["filename"] = "f.bin"
    return payload


_STATES = [
    "partial-call",
    "call",
    "result",
    "approval-requested",
    "approval-responded",
    "output-error",
    "output-denied",
]


def tool_part(rng: random.Random, call_id: str, state: str | None = None) -> dict[str, Any]:
    """A tool-invocation part in a random (or the given) state with random args and result."""
    state = state or rng.choice(_STATES)
    invocation: dict[str, Any] = {
        "state": state,
        "toolCallId": call_id,
        "toolName": rng.choice(["search", "calculator", "weather", "", "askUser"]),
    }
    args_kind = rng.randint(0, 4)
    if args_kind == 0:
        invocation["args"] = random_text(rng, 3)
    elif args_kind == 1:
        invocation["args"] = {}
    elif args_kind != 2:  # 2: no args at all
        invocation["args"] = _json_value(rng)
    if state == "result" or rng.random() < 0.1:
        result_kind = rng.randint(0, 5)
        if result_kind == 0:
            invocation["result"] = random_text(rng, 5)
        elif result_kind == 1:
            invocation["result"] = _media(rng)
        elif result_kind == 2:
            invocation["result"] = [_media(rng) for _ in range(rng.randint(1, 3))]
        elif result_kind == 3:
            invocation["result"] = [_media(rng), "not media"]
        elif result_kind != 4:  # 4: a result state without a result key
            invocation["result"] = _json_value(rng)
    return {"type": "tool-invocation", "toolInvocation": invocation}


def random_part(rng: random.Random, index: int) -> dict[str, Any]:
    """One part of any type the message model knows, or an unknown one."""
    kind = rng.choice(
        [
            "text",
            "text",
            "tool",
            "tool",
            "file",
            "reasoning",
            "source",
            "source-document",
            "step-start",
            "error",
            "data",
            "unknown",
        ]
    )
    if kind == "text":
        return {"type": "text", "text": random_text(rng)}
    if kind == "tool":
        return tool_part(rng, f"call-{index}-{rng.randint(0, 3)}")
    if kind == "file":
        media = _media(rng)
        return {
            "type": "file",
            "mimeType": media.get("mediaType", media.get("mimeType")),
            "data": media["data"],
        }
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "reasoning": random_text(rng, 4),
            "details": [{"type": "text", "text": random_text(rng, 3)}],
        }
    if kind == "source":
        return {
            "type": "source",
            "source": {"sourceType": "url", "id": f"s{index}", "url": "https://x.org/a"},
        }
    if kind == "source-document":
        return {"type": "source-document", "sourceId": f"d{index}", "mediaType": "text/plain", "title": "Doc"}
    if kind == "step-start":
        return {"type": "step-start"}
    if kind == "error":
        return {"type": "error", "error": {"message": random_text(rng, 3)}}
    if kind == "data":
        return {"type": "data-progress", "data": _json_value(rng)}
    return {"type": "custom-kind", "payload": _json_value(rng)}


def random_messages(seed: int, count: int) -> list[dict[str, Any]]:
    """`count` wire messages with 0-5 parts of every kind (roles user and assistant)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(count):
        parts = [random_part(rng, i) for _ in range(rng.randint(0, 5))]
        content: dict[str, Any] = {"format": 2, "parts": parts}
        if rng.random() < 0.3:
            content["content"] = random_text(rng, 4)
        out.append(
            {
                "id": f"m{i}",
                "role": rng.choice(["user", "assistant"]),
                "createdAt": (T0 + timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
                "threadId": "t",
                "resourceId": "r",
                "content": content,
            }
        )
    return out


def _wire_time(ms: int) -> str:
    return (T0 + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Turn:
    """Builds one turn's messages on a shared clock."""

    def __init__(self, rng: random.Random, turn: int, clock: int, thread: str, resource: str) -> None:
        self.rng, self.turn, self.clock = rng, turn, clock
        self.thread, self.resource = thread, resource
        self.messages: list[dict[str, Any]] = []

    def add(self, role: str, parts: list[dict[str, Any]], *, tie: bool = False) -> None:
        if not tie:
            self.clock += self.rng.randint(1, 50)
        self.messages.append(
            {
                "id": f"t{self.turn:03d}m{len(self.messages)}",
                "role": role,
                "createdAt": _wire_time(self.clock),
                "threadId": self.thread,
                "resourceId": self.resource,
                "content": {"format": 2, "parts": parts},
            }
        )


def conversation(seed: int, turns: int, thread: str = "t", resource: str = "r") -> list[list[dict[str, Any]]]:
    """A multi-turn thread, turn by turn: each turn is [user, assistant...] wire messages.

    Assistants call tools: a call and its result in one message, or the call in one message and the result
    in a later one (linked by `toolCallId`), sometimes a pending client call. Several messages of a turn may
    share one instant (ties), and texts vary in length so token budgets cut in different places.
    """
    rng = random.Random(seed)
    out: list[list[dict[str, Any]]] = []
    clock = 0
    for index in range(turns):
        turn = _Turn(rng, index, clock + rng.randint(1000, 5000), thread, resource)
        turn.add("user", [{"type": "text", "text": random_text(rng, rng.randint(1, 40))}])
        for step in range(rng.randint(0, 3)):
            call = f"call-{index}-{step}"
            shape = rng.randint(0, 2)
            if shape == 0:
                turn.add("assistant", [tool_part(rng, call, "result")], tie=rng.random() < 0.3)
            elif shape == 1:
                turn.add("assistant", [tool_part(rng, call, "call")], tie=rng.random() < 0.3)
                turn.add("assistant", [tool_part(rng, call, "result")], tie=rng.random() < 0.3)
            else:
                turn.add("assistant", [{"type": "step-start"}, tool_part(rng, call, "call")])
        text = random_text(rng, rng.randint(1, 60))
        turn.add("assistant", [{"type": "text", "text": text}], tie=rng.random() < 0.2)
        clock = turn.clock
        out.append(turn.messages)
    return out
