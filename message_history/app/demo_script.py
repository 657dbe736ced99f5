"""What `message-history demo` says and prints: the scripted conversation, the stand-in agent's and the stub
observer's answers, and the lines each part prints. Pure (no Kafka, no MongoDB): `demo.py` runs it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from schemas.events import AgentRequest, EnrichedRequest
from schemas.observational import ObserveRequest

TEXT_WIDTH = 90

SCRIPTS: list[tuple[str, list[str]]] = [
    (
        "ada",
        [
            "Hi, I'm Ada. I write programs for the Analytical Engine.",
            "My favourite number is 1843.",
            "What do you remember about me?",
        ],
    ),
    (
        "bob",
        [
            "Hello, Bob here. I'm planning a trip to Lisbon.",
            "I'll travel by night train from Paris.",
            "Remind me: where am I going, and how?",
        ],
    ),
]


# --- the scripted conversation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoThread:
    thread_id: str
    resource_id: str
    lines: list[str]


def script(run_id: str, threads: int, turns: int) -> list[DemoThread]:
    """`threads` conversations of `turns` user lines each (the two scripted ones first, then generic ones)."""
    out = []
    for t in range(threads):
        name, lines = SCRIPTS[t] if t < len(SCRIPTS) else (f"user{t + 1}", [])
        said = [lines[k] if k < len(lines) else f"This is message {k + 1} from {name}." for k in range(turns)]
        out.append(DemoThread(f"demo-{run_id}-{name}", f"{name}@demo", said))
    return out


def build_request(thread: DemoThread, turn: int, request_id: str) -> AgentRequest:
    """The turn's `AgentRequest`: one user message (its id and createdAt are filled in by the service)."""
    text = thread.lines[turn - 1]
    return AgentRequest.model_validate(
        {
            "schemaVersion": 1,
            "requestId": request_id,
            "threadId": thread.thread_id,
            "resourceId": thread.resource_id,
            "createdAt": _now(),
            "metadata": {"demo": True, "turn": turn},
            "messages": [{"role": "user", "content": _content(text)}],
        }
    )


# --- the stand-in agent and the stub observer --------------------------------------------------------------


def answer_from_memory(enriched: EnrichedRequest) -> str:
    """What the stand-in agent says: deterministic, and visibly built from the recalled history."""
    # the recalled messages (Observational Memory's log and reminder, ids `om-...`, are context, not turns)
    memory = [m for m in enriched.messages if m.source == "memory" and not m.id.startswith("om-")]
    said_before = [_short(message_text(m.wire()), 50) for m in memory if m.role == "user"]
    now = [message_text(m.wire()) for m in enriched.messages if m.source == "input" and m.role == "user"]
    current = _short(now[-1], 50) if now else "(nothing)"
    if not memory and not enriched.history.observed:
        return f"Nice to meet you! This thread has no history yet. You said: '{current}'"
    quoted = " / ".join(f"'{s}'" for s in said_before)
    if enriched.history.observed:
        quoted += f", and observations of {enriched.history.observed} older ones"
    return (
        f"I remember {len(memory)} earlier messages ({len(said_before)} from you): {quoted}. "
        f"Now you say: '{current}'"
    )


def observations_of(work: ObserveRequest) -> str:
    """What the stub observer answers: one dated line per observed message (a real one calls a model)."""
    return "\n".join(
        f"- {iso(m.createdAt)[11:19]} {m.role} said: {_short(message_text(m.wire()), 60)}"
        for m in work.messages
    )


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a format-2 message (its text parts), or the legacy `content` string."""
    content = message.get("content")
    if isinstance(content, str):
        try:
            content = json.loads(content)  # mastra_messages stores content as a JSON string
        except ValueError:
            return content
    if not isinstance(content, dict):
        return ""
    parts = content.get("parts", [])
    texts = [str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    if texts:
        return " ".join(texts)
    return str(content.get("content") or "")


# --- printing ----------------------------------------------------------------------------------------------


def render_enriched(enriched: EnrichedRequest, turn: int | None, answer: str) -> str:
    """One block per enriched event: a header, one line per message in the context, the agent's answer."""
    turn_text = f"turn {turn}" if turn is not None else "turn ?"
    observed = enriched.history.observed
    om = (
        ""
        if observed is None
        else f" | observed {observed} (log {enriched.history.observationTokens} tokens)"
    )
    lines = [
        f"--- {turn_text} | thread {enriched.threadId} | resource {enriched.resourceId} | "
        f"recalled {enriched.history.recalled} (limit {enriched.history.limit}){om} ---"
    ]
    for m in enriched.messages:
        lines.append(f"  [{m.source}] {m.role}: {_short(message_text(m.wire()))}")
    lines.append(f"  [agent] assistant: {_short(answer, 160)}")
    return "\n".join(lines)


def render_stored_thread(
    thread: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], observations: Mapping[str, Any] | None
) -> list[str]:
    """A thread as stored: its mastra_threads row, its mastra_messages rows, its observational memory row."""
    lines = [
        f"thread {thread['id']} | resourceId {thread.get('resourceId')} | title {thread.get('title')!r} | "
        f"createdAt {iso(thread.get('createdAt'))} | updatedAt {iso(thread.get('updatedAt'))}"
    ]
    for n, message in enumerate(messages, start=1):
        lines.append(
            f"  {n}. {iso(message.get('createdAt'))} {message.get('role')}: "
            f"{_short(message_text(message))}  (id {message.get('id')})"
        )
    if observations is not None:
        generation, tokens = observations.get("generationCount"), observations.get("observationTokenCount")
        lines.append(
            f"  observations (generation {generation}, {tokens} tokens, "
            f"observing {observations.get('isObserving')}):"
        )
        log = str(observations.get("activeObservations") or "")
        lines.extend(f"    {_short(line)}" for line in log.splitlines())
    return lines


def iso(value: Any) -> str:
    """A stored or wire timestamp as the wire writes it (milliseconds, `Z`)."""
    if isinstance(value, datetime):
        moment: datetime = value if value.tzinfo else value.replace(tzinfo=UTC)  # pymongo reads naive UTC
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return str(value)


def _content(text: str) -> dict[str, Any]:
    return {"format": 2, "parts": [{"type": "text", "text": text}], "content": text}


def _now() -> str:
    return iso(datetime.now(UTC))


def _short(text: str, width: int = TEXT_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
