"""The texts Mastra's Observational Memory puts in the model's context, and how it shapes the log (pure).

Copied from `@mastra/memory` 1.31.0 (`processors/observational-memory/constants.ts`, `observer-agent.ts`,
`anchor-ids.ts`, `observational-memory.ts`); tests/interop/test_mastra_om_interop.py checks them against the
package's exports. JavaScript regular expressions are reproduced where Python's differ (`\\s`, `\\d`, `trim`).

The context Mastra builds for a thread with observations (`formatObservationsForContext`, thread scope,
no retrieval mode): system messages `[PROMPT + "\\n\\n" + INSTRUCTIONS, "<observations>", *chunks,
"<current-task>…", "<suggested-response>…"]`, where the chunks are the optimized log split at its message
boundaries; then one user message, the continuation reminder, before the unobserved messages.
Before splitting, the dates get their distance from the request's time (`core/observation_dates.py`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Final

from message_history.core.observation_dates import JS_SPACE, JS_SPACE_CHARS, add_relative_time

__all__ = [
    "CONTINUATION_MESSAGE_ID",
    "OBSERVATION_CONTEXT_INSTRUCTIONS",
    "OBSERVATION_CONTEXT_PROMPT",
    "OBSERVATION_CONTINUATION_HINT",
    "OTHER_CONVERSATIONS_PREFIX",
    "append_observations",
    "context_system_messages",
    "continuation_message",
    "js_trim",
    "message_boundary",
    "optimize_for_context",
    "split_context_chunks",
    "strip_anchor_ids",
]

OBSERVATION_CONTEXT_PROMPT: Final = (
    "The following observations block contains your memory of past conversations with this user."
)
"""Mastra's preamble of the observation context (`OBSERVATION_CONTEXT_PROMPT`)."""

OBSERVATION_CONTEXT_INSTRUCTIONS: Final = (
    "IMPORTANT: When responding, reference specific details from these observations. Do not give "
    "generic advice - personalize your response based on what you know about this user's "
    "experiences, preferences, and interests. If the user asks for recommendations, connect them "
    "to their past experiences mentioned above.\n\nKNOWLEDGE UPDATES: When asked about current "
    'state (e.g., "where do I currently...", "what is my current..."), always prefer the MOST '
    "RECENT information. Observations include dates - if you see conflicting information, the "
    'newer observation supersedes the older one. Look for phrases like "will start", "is '
    'switching", "changed to", "moved to" as indicators that previous information has been '
    "updated.\n\nPLANNED ACTIONS: If the user stated they planned to do something (e.g., \"I'm "
    'going to...", "I\'m looking forward to...", "I will...") and the date they planned to do it '
    'is now in the past (check the relative time like "3 weeks ago"), assume they completed the '
    "action unless there's evidence they didn't. For example, if someone said \"I'll start my "
    'new diet on Monday" and that was 2 weeks ago, assume they started the diet.\n\nMOST RECENT '
    "USER INPUT: Treat the most recent user message as the highest-priority signal for what to do "
    "next. Earlier messages may contain constraints, details, or context you should still honor, "
    "but the latest message is the primary driver of your response.\n\nSYSTEM REMINDERS: Messages "
    "wrapped in <system-reminder>...</system-reminder> contain internal continuation guidance, not "
    "user-authored content. Use them to maintain continuity, but do not mention them or treat them "
    "as part of the user's message."
)
"""How the model is told to use the log (`OBSERVATION_CONTEXT_INSTRUCTIONS`), after the preamble."""

OBSERVATION_CONTINUATION_HINT: Final = (
    "Please continue naturally with the conversation so far and respond to the latest message.\n\n"
    "Use the earlier context only as background. If something appears unfinished, continue only "
    "when it helps answer the latest request. If a suggested response is provided, follow it "
    "naturally.\n\nDo not mention internal instructions, memory, summarization, context handling, "
    "or missing messages.\n\nAny messages following this reminder are newer and should take "
    "priority."
)
"""The continuation reminder (`OBSERVATION_CONTINUATION_HINT`) Mastra adds as a user message."""

OTHER_CONVERSATIONS_PREFIX: Final = (
    "The following content is from OTHER conversations different from the current conversation, they're "
    "here for reference,  but they're not necessarily your focus:\nSTART_OTHER_CONVERSATIONS_BLOCK"
)
"""What precedes the other threads' `<other-conversation>` blocks (resource scope), two spaces and all."""

CONTINUATION_MESSAGE_ID: Final = "om-continuation"
"""The id of the continuation reminder message (`injectObservationContextMessages`)."""

# JavaScript's \s: WhiteSpace + LineTerminator (Python's differs at U+001C..U+001F, U+0085, U+FEFF).
_JS_SPACE: Final = JS_SPACE
_JS_SPACE_NOT_NL: Final = _JS_SPACE.replace("\n", "")
_ANCHOR: Final = re.compile(
    f"(^|\\n)([{_JS_SPACE_NOT_NL}]*)\\[(O[0-9]+(?:-N[0-9]+)?)\\][{_JS_SPACE_NOT_NL}]*"
)
_YELLOW: Final = re.compile(f"\U0001f7e1[{_JS_SPACE}]*")
_GREEN: Final = re.compile(f"\U0001f7e2[{_JS_SPACE}]*")
_COLLAPSED_PREFIX: Final = frozenset("0123456789" + JS_SPACE_CHARS)
_SPACES: Final = re.compile("  +")
_NEWLINES: Final = re.compile("\n{3,}")
_BOUNDARY: Final = re.compile(
    r"(?<!\n)\n{2,}+--- message boundary "
    r"\([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?Z\) ---\n{2,}"
)


def js_trim(text: str) -> str:
    """JavaScript's `String.prototype.trim`."""
    return text.strip(JS_SPACE_CHARS)


def strip_anchor_ids(observations: str) -> str:
    """`stripEphemeralAnchorIds`: the `[O12]` / `[O3-N2]` anchors at line starts removed."""
    if not observations:
        return observations
    return _ANCHOR.sub(r"\1\2", observations)


def optimize_for_context(observations: str) -> str:
    """`optimizeObservationsForContext`: anchors, 🟡/🟢 marks, `[tags]` and arrows out; spaces tightened."""
    optimized = strip_anchor_ids(observations)
    optimized = _YELLOW.sub("", optimized)
    optimized = _GREEN.sub("", optimized)
    optimized = _strip_tags(optimized)
    optimized = _replace_arrows(optimized)
    optimized = _SPACES.sub(" ", optimized)
    optimized = _NEWLINES.sub("\n\n", optimized)
    return js_trim(optimized)


def _replace_arrows(text: str) -> str:
    """JavaScript's `text.replace(/\\s*->\\s*/g, " ")`, in one pass: each `->` with the spaces around it (not
    reaching back into the previous replacement) becomes one space."""
    out: list[str] = []
    last = 0
    index = text.find("->")
    while index != -1:
        start = index
        while start > last and text[start - 1] in JS_SPACE_CHARS:
            start -= 1
        end = index + 2
        while end < len(text) and text[end] in JS_SPACE_CHARS:
            end += 1
        out.append(text[last:start])
        out.append(" ")
        last = end
        index = text.find("->", end)
    out.append(text[last:])
    return "".join(out)


def _strip_tags(text: str) -> str:
    """JavaScript's `text.replace(/\\[(?![\\d\\s]*items collapsed)[^\\]]+\\](?!\\()/g, "")`, in one pass.

    A `[` matches up to the first `]` after it (a tag holds no `]`), unless that `]` is next to it, a `(`
    follows it (a Markdown link's label), or `items collapsed` follows the `[` after digits and spaces.
    """
    out: list[str] = []
    start = 0
    close = -1  # the first `]` after the current `[`: found again only once passed (linear)
    index = text.find("[")
    while index != -1:
        if close <= index:
            close = text.find("]", index + 1)
            if close == -1:
                break
        if close > index + 1 and text[close + 1 : close + 2] != "(" and not _collapsed(text, index + 1):
            out.append(text[start:index])
            start = close + 1
            index = text.find("[", start)
        else:
            index = text.find("[", index + 1)
    out.append(text[start:])
    return "".join(out)


def _collapsed(text: str, at: int) -> bool:
    while at < len(text) and text[at] in _COLLAPSED_PREFIX:
        at += 1
    return text.startswith("items collapsed", at)


def split_context_chunks(observations: str) -> list[str]:
    """`splitObservationContextChunks`: the log cut at its message boundaries, each chunk trimmed."""
    trimmed = js_trim(observations)
    if not trimmed:
        return []
    return [chunk for chunk in (js_trim(c) for c in _BOUNDARY.split(trimmed)) if chunk]


def message_boundary(last_observed_at: datetime) -> str:
    """`createMessageBoundary`: the delimiter between two cycles, with the newest observed time."""
    return f"\n\n--- message boundary ({_iso(last_observed_at)}) ---\n\n"


def append_observations(existing: str, new: str, last_observed_at: datetime | None) -> str:
    """Thread scope's `wrapObservations` (no retrieval mode): the new cycle after a boundary, or alone."""
    if not existing:
        return new
    boundary = message_boundary(last_observed_at) if last_observed_at is not None else "\n\n"
    return f"{existing}{boundary}{new}"


def context_system_messages(
    observations: str,
    current_task: str | None = None,
    suggested_response: str | None = None,
    *,
    now: datetime | None = None,
    other_conversations: str | None = None,
) -> list[str]:
    """The system messages Mastra adds for a thread's log at `now` (none for an empty log); with resource
    scope, `other_conversations` (`core.observation_others`) after the instructions."""
    if not observations:
        return []
    messages = [f"{OBSERVATION_CONTEXT_PROMPT}\n\n{OBSERVATION_CONTEXT_INSTRUCTIONS}"]
    if other_conversations:
        messages.append(f"{OTHER_CONVERSATIONS_PREFIX}\n{other_conversations}\nEND_OTHER_CONVERSATIONS_BLOCK")
    optimized = optimize_for_context(observations)
    if now is not None:
        optimized = add_relative_time(optimized, now)
    chunks = split_context_chunks(optimized)
    if chunks:
        messages.extend(["<observations>", *chunks])
    if current_task:
        messages.append(f"<current-task>\n{current_task}\n</current-task>")
    if suggested_response:
        messages.append(f"<suggested-response>\n{suggested_response}\n</suggested-response>")
    return messages


def continuation_message(thread_id: str, resource_id: str | None) -> dict[str, Any]:
    """The reminder Mastra adds as the first `memory` message when the log is in the context."""
    message: dict[str, Any] = {
        "id": CONTINUATION_MESSAGE_ID,
        "role": "user",
        "createdAt": "1970-01-01T00:00:00.000Z",
        "content": {
            "format": 2,
            "parts": [
                {
                    "type": "text",
                    "text": f"<system-reminder>{OBSERVATION_CONTINUATION_HINT}</system-reminder>",
                }
            ],
        },
        "threadId": thread_id,
    }
    if resource_id is not None:
        message["resourceId"] = resource_id
    return message


def _iso(moment: datetime) -> str:
    """JavaScript's `Date.prototype.toISOString` (UTC, milliseconds, `Z`)."""
    utc = moment.astimezone(UTC) if moment.tzinfo is not None else moment
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
