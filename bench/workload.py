"""The benchmark's workload: threads, their stored history, and the turns every line processes. Pure, no I/O.

One `Workload` describes everything the lines share, so that "the same workload" is literal:

* thread `i` has `history` stored messages (alternating user / assistant, `message_bytes` of text each),
  laid out in MongoDB exactly as `@mastra/mongodb` writes them (`seed_documents`);
* a **turn** `k` of thread `i` is one user message (the request) and one assistant message (the response).
  History occupies turns `0 .. history/2 - 1`; the recall lines all ask for turn `first_new_turn` (they only
  read, so they can share it); each persist line writes its own turn number (`Turns`), so every line's writes
  are inserts of new messages into existing threads, never no-op re-upserts of another line's rows.

Ids are deterministic (`{thread}:m{h}` for history, `{thread}:t{k}:in|out` for turns, request id
`{thread}:t{k}`), and so are timestamps: message `h` of a thread is `BASE + h` seconds, turn `k`'s input and
response are `BASE + 2k` and `BASE + 2k + 1` seconds, so a new turn always sorts after the history.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from schemas.messages import format_timestamp

BASE: Final = datetime(2025, 1, 1, tzinfo=UTC)
_WORDS: Final = (
    "the",
    "agent",
    "recalls",
    "what",
    "the",
    "user",
    "said",
    "before",
    "and",
    "answers",
    "with",
    "the",
    "context",
    "of",
    "the",
    "whole",
    "conversation",
    "so",
    "that",
    "nothing",
    "is",
    "lost",
    "between",
    "turns",
    "of",
    "a",
    "long",
    "thread",
)

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Workload:
    """The knobs every line shares (see `python -m bench --help`)."""

    threads: int = 10_000
    history: int = 40
    message_bytes: int = 1024
    batch: int = 500
    partitions: int = 6
    run_id: str = "local"

    def __post_init__(self) -> None:
        if self.threads < 1 or self.history < 0 or self.message_bytes < 16:
            raise ValueError("need threads >= 1, history >= 0 and message_bytes >= 16")
        if self.batch < 1 or self.partitions < 1:
            raise ValueError("need batch >= 1 and partitions >= 1")

    @property
    def first_new_turn(self) -> int:
        """The first turn after the stored history (history message `h` belongs to turn `h // 2`)."""
        return (self.history + 1) // 2

    def thread_id(self, i: int) -> str:
        return f"bench-{self.run_id}-t{i:06d}"

    def resource_id(self, i: int) -> str:
        return f"bench-user-{i:06d}"

    def as_dict(self) -> Json:
        return asdict(self)


class Turns:
    """Hands out turn numbers: one shared by the recall lines, a fresh one for every writing phase."""

    def __init__(self, workload: Workload) -> None:
        self.recall = workload.first_new_turn
        self._next = workload.first_new_turn + 1

    def fresh(self) -> int:
        turn, self._next = self._next, self._next + 1
        return turn


def text(seed: int, size: int) -> str:
    """`size` characters of plain words, different per `seed`, ASCII (so characters = bytes)."""
    words: list[str] = []
    length = 0
    n = seed
    while length < size:
        word = _WORDS[n % len(_WORDS)]
        n = n * 1103515245 + 12345 & 0x7FFFFFFF  # a cheap LCG: varied text, identical on every run
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def _content(body: str) -> Json:
    return {"format": 2, "parts": [{"type": "text", "text": body}]}


# --- stored history (MongoDB, Mastra's layout) ----------------------------------------------------------


def history_time(h: int) -> datetime:
    return BASE + timedelta(seconds=h)


def seed_documents(w: Workload, i: int) -> tuple[Json, list[Json]]:
    """Thread `i`'s `mastra_threads` row and its `mastra_messages` rows, as @mastra/mongodb writes them."""
    tid, rid = w.thread_id(i), w.resource_id(i)
    messages = [
        {
            "id": f"{tid}:m{h:04d}",
            "thread_id": tid,
            "resourceId": rid,
            "role": "user" if h % 2 == 0 else "assistant",
            "type": "v2",
            "content": json.dumps(_content(text(i * 1000 + h, w.message_bytes)), separators=(",", ":")),
            "createdAt": history_time(h),
        }
        for h in range(w.history)
    ]
    last = history_time(max(w.history - 1, 0))
    thread = {
        "id": tid,
        "resourceId": rid,
        "title": "",
        "metadata": {},
        "createdAt": BASE,
        "updatedAt": last,
    }
    return thread, messages


# --- turns (wire form) ---------------------------------------------------------------------------------


def turn_message(w: Workload, i: int, turn: int, *, role: str) -> Json:
    """The user (`role="user"`) or assistant message of thread `i`'s turn `turn`, as a MastraDBMessage."""
    side, offset = ("in", 0) if role == "user" else ("out", 1)
    return {
        "id": f"{w.thread_id(i)}:t{turn}:{side}",
        "role": role,
        "content": _content(text(i * 1000 + 2 * turn + offset, w.message_bytes)),
        "createdAt": format_timestamp(BASE + timedelta(seconds=2 * turn + offset)),
        "threadId": w.thread_id(i),
        "resourceId": w.resource_id(i),
    }


def _event(w: Workload, i: int, turn: int) -> Json:
    return {
        "schemaVersion": 1,
        "requestId": f"{w.thread_id(i)}:t{turn}",
        "threadId": w.thread_id(i),
        "resourceId": w.resource_id(i),
        "createdAt": format_timestamp(BASE + timedelta(seconds=2 * turn)),
    }


def request_event(w: Workload, i: int, turn: int) -> Json:
    """The `AgentRequest` of thread `i`'s turn: one user message, the service's default recall limit."""
    return {**_event(w, i, turn), "messages": [turn_message(w, i, turn, role="user")]}


def response_event(w: Workload, i: int, turn: int) -> Json:
    """The `AgentResponse` of thread `i`'s turn: its input (`source: input`) and one assistant reply."""
    return {
        **_event(w, i, turn),
        "input": [{**turn_message(w, i, turn, role="user"), "source": "input"}],
        "response": [turn_message(w, i, turn, role="assistant")],
        "finishReason": "stop",
    }


def stored_messages(w: Workload, i: int) -> list[Json]:
    """Thread `i`'s seeded history as MastraDBMessages (wire form, oldest first), for Mastra's own store."""
    _, stored = seed_documents(w, i)
    return [_wire(doc) for doc in stored]


def _wire(doc: Json) -> Json:
    """A stored message document as the wire form (a MastraDBMessage)."""
    return {
        "id": doc["id"],
        "role": doc["role"],
        "content": json.loads(doc["content"]),
        "createdAt": format_timestamp(doc["createdAt"]),
        "threadId": doc["thread_id"],
        "resourceId": doc["resourceId"],
    }


def enriched_event(w: Workload, i: int, turn: int, limit: int) -> Json:
    """What the recall path emits for the turn: the newest `limit` stored messages, then the input.

    Built here without the service, as the pass-through baseline's payload (the bytes B1 moves)."""
    _, stored = seed_documents(w, i)
    recalled = stored[-limit:] if limit else []
    history = [{**_wire(doc), "source": "memory"} for doc in recalled]
    request = request_event(w, i, turn)
    messages = [*history, *({**m, "source": "input"} for m in request["messages"])]
    return {
        **request,
        "messages": messages,
        "history": {"recalled": len(history), "limit": limit},
        "eventId": request["requestId"],
    }


def encode_json(value: Json) -> bytes:
    """Compact UTF-8 JSON, as the service writes its events."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
