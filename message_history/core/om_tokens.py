"""Mastra Observational Memory's token counter, reproduced number for number (pure, no I/O).

`@mastra/memory` 1.31's OM does not count like Memory's token limiter (`core/tokens.py`): its own
`TokenCounter` (`processors/observational-memory/token-counter.ts`) estimates each piece alone with tokenx
1.3.0 and adds them, so the thresholds it compares (`observation.messageTokens`,
`reflection.observationTokens`) are on this scale:

* a message: `tokenx(role)` + 3.8, plus per part: text → `tokenx(text)`; a tool invocation → its name and
  arguments (a non-string `args` as `JSON.stringify`, 12 off), plus for an outcome one more 3.8 and the
  result (`providerMetadata.mastra.modelOutput` first; a non-string as `JSON.stringify(v, null, 2)` with long
  `encryptedContent` strings stripped, 12 off), the error text, or the denial reason; `reasoning` and `data-*`
  parts → 0; any other part → `tokenx(JSON.stringify(part))` without its cached estimate; then
  `Math.round` of the whole message;
* a list: 24 + the messages' rounded counts, or 0 when empty;
* observations: `tokenx(text)`.

Exact for every text, tool and structural part. Attachments (`image` / `file` parts, tool results holding
inline media) depend on the model's provider and on decoding the image's header in Mastra; here an image is
Mastra's estimate without a model context or dimensions, a file without a measurable body its descriptor,
and a tool result's media its JSON (`attachment_free` says whether a message holds any, so a caller can tell
an exact count from an estimate). A caller-stamped estimate
(`providerMetadata.mastra.tokenEstimate` with `source: "client"`) wins, as in Mastra.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from message_history.core.observer_parts import pretty_json
from message_history.core.tokens import (
    STRINGIFIED_DISCOUNT,
    TOKENS_PER_CONVERSATION,
    TOKENS_PER_MESSAGE,
    estimate_token_count,
    js_stringify,
    js_truthy,
)

__all__ = [
    "OM_TOKENS_PER_CONVERSATION",
    "OM_TOKENS_PER_MESSAGE",
    "attachment_free",
    "count_observations",
    "count_om_message",
    "count_om_messages",
]

OM_TOKENS_PER_MESSAGE: Final = TOKENS_PER_MESSAGE  # the same overheads and discount as Memory's counter
OM_TOKENS_PER_CONVERSATION: Final = TOKENS_PER_CONVERSATION
_OUTCOME_STATES: Final = frozenset({"result", "approval-responded", "output-denied", "output-error"})
_CALL_STATES: Final = frozenset({"call", "partial-call", "approval-requested"})
# Mastra's fallback image estimator (no model context, no dimensions, no size): 'auto' detail → 'low'.
_IMAGE_BASE_TOKENS: Final = 85
_IMAGE_TILE_TOKENS: Final = 170
_IMAGE_FALLBACK_TILES: Final = 4
_MISSING: Final = object()


def count_string(text: Any) -> int:
    """`TokenCounter.countString`: 0 for an empty (or missing) text, else tokenx's estimate."""
    if not isinstance(text, str) or not text:
        return 0
    return estimate_token_count(text)


def count_observations(observations: str) -> int:
    """`TokenCounter.countObservations`: the log's tokens, as `observationTokenCount` stores them."""
    return count_string(observations)


def _serialize_result(value: Any) -> str:
    """`serializeToolResultForTokenCounting`: a string as it is, anything else as
    `JSON.stringify(sanitizeToolResultValue(v), null, 2)`, here without its indentation (the same count,
    see `pretty_json`): no recursion and linear in the value, so any stored row counts, never raises."""
    if isinstance(value, str):
        return value
    return pretty_json(value, indent="", limit=None) or ""


def _mastra_metadata(part: Mapping[str, Any]) -> Mapping[str, Any] | None:
    provider = part.get("providerMetadata")
    if isinstance(provider, Mapping):
        mastra = provider.get("mastra")
        if isinstance(mastra, Mapping):
            return mastra
    return None


def _client_estimate(part: Mapping[str, Any]) -> int | float | None:
    """`getClientPartTokenEstimate`: a finite, non-negative estimate stamped with `source: "client"`."""
    mastra = _mastra_metadata(part)
    cache = mastra.get("tokenEstimate") if mastra else None
    if not isinstance(cache, Mapping):
        return None

    def tokens(entry: Any) -> int | float | None:
        if not isinstance(entry, Mapping) or entry.get("source") != "client":
            return None
        if not (isinstance(entry.get("v"), int | float) and isinstance(entry.get("key"), str)):
            return None
        value = entry.get("tokens")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer past every float: JavaScript's Infinity, not finite
            return None
        return value if finite and value >= 0 else None

    found = tokens(cache)
    if found is not None:
        return found
    for entry in cache.values():
        found = tokens(entry)
        if found is not None:
            return found
    return None


def _attachment_tokens(part: Mapping[str, Any]) -> int | float:
    """An `image` / `file` part as Mastra counts it without a model context (see the module's note)."""
    client = _client_estimate(part)
    if client is not None:
        return client
    if part.get("type") == "file" and not _image_like(part):
        filename = part.get("filename")
        descriptor = {
            "type": "file",
            "mimeType": part.get("mimeType"),
            "filename": filename.strip() if isinstance(filename, str) and filename.strip() else None,
        }
        return count_string(js_stringify(descriptor))
    return _IMAGE_BASE_TOKENS


def _image_like(part: Mapping[str, Any]) -> bool:
    mime = part.get("mimeType")
    data = part.get("data")
    return (isinstance(mime, str) and mime.lower().startswith("image/")) or (
        isinstance(data, str) and data.startswith("data:image/")
    )


def _without_estimate(part: Mapping[str, Any]) -> dict[str, Any]:
    """`serializePartForTokenCounting`'s copy: the cached estimate left out, emptied holders dropped."""
    mastra = _mastra_metadata(part)
    if mastra is None or not mastra.get("tokenEstimate"):
        return dict(part)
    clone = dict(part)
    provider = dict(part["providerMetadata"])
    rest = {k: v for k, v in mastra.items() if k != "tokenEstimate"}
    if rest:
        provider["mastra"] = rest
    else:
        del provider["mastra"]
    if provider:
        clone["providerMetadata"] = provider
    else:
        del clone["providerMetadata"]
    return clone


def _signature(invocation: Mapping[str, Any]) -> tuple[int, float]:
    """`countToolCallSignature`: the tool's name and arguments, and the overhead change."""
    tokens = count_string(invocation.get("toolName")) if js_truthy(invocation.get("toolName")) else 0
    overhead = 0.0
    args = invocation.get("args", _MISSING)
    if args is not _MISSING:
        if isinstance(args, str):
            tokens += count_string(args)
        else:
            tokens += count_string(js_stringify(args))
            overhead -= STRINGIFIED_DISCOUNT
    return tokens, overhead


def _tool_tokens(part: Mapping[str, Any]) -> tuple[float, float, int]:
    """A `tool-invocation` part: (tokens, overhead change, extra messages)."""
    invocation = part.get("toolInvocation")
    state = invocation.get("state") if isinstance(invocation, Mapping) else None
    if not isinstance(invocation, Mapping) or state not in _CALL_STATES | _OUTCOME_STATES:
        # an unknown state (or no invocation) falls through to Mastra's generic serializer
        return count_string(js_stringify(_without_estimate(part))), 0.0, 0
    tokens, overhead = _signature(invocation)
    if state in _CALL_STATES:
        return tokens, overhead, 0
    outcome, outcome_overhead = _outcome_tokens(part, invocation, state)
    return tokens + outcome, overhead + outcome_overhead, 1


def _outcome_tokens(part: Mapping[str, Any], invocation: Mapping[str, Any], state: str) -> tuple[int, float]:
    """What a terminal state adds to its call's signature: (tokens, overhead change)."""
    approval = invocation.get("approval")
    reason = approval.get("reason") if isinstance(approval, Mapping) else None
    if state == "approval-responded":
        return (count_string(reason) if js_truthy(reason) else 0), 0.0
    if state == "output-denied":
        if not (isinstance(reason, str) and reason.strip()):
            reason = "Tool call was not approved by the user"
        return count_string(reason), 0.0
    if state == "output-error":
        return count_string(_error_text(invocation)), 0.0
    mastra = _mastra_metadata(part)
    if mastra is not None and "modelOutput" in mastra:
        result = mastra["modelOutput"]
    else:
        result = invocation.get("result", _MISSING)
    if result is not _MISSING and (not isinstance(result, str) or result.strip()):
        return count_string(_serialize_result(result)), (
            0.0 if isinstance(result, str) else -STRINGIFIED_DISCOUNT
        )
    if js_truthy(invocation.get("isError")):
        return count_string(_error_text(invocation)), 0.0
    return count_string("[empty result]"), 0.0


def _error_text(invocation: Mapping[str, Any]) -> str:
    text = invocation.get("errorText")
    return text if isinstance(text, str) and text.strip() else "Tool execution failed"


def _part_tokens(part: Any) -> tuple[float, float, int]:
    if not isinstance(part, Mapping):
        return count_string(js_stringify(part)), 0.0, 0
    kind = part.get("type")
    if kind in ("image", "file"):
        return _attachment_tokens(part), 0.0, 0
    if kind == "text":
        return count_string(part.get("text")), 0.0, 0
    if kind == "tool-invocation":
        return _tool_tokens(part)
    if kind == "reasoning" or (isinstance(kind, str) and kind.startswith("data-")):
        return 0, 0.0, 0
    return count_string(js_stringify(_without_estimate(part))), 0.0, 0


def count_om_message(message: Mapping[str, Any]) -> int:
    """`TokenCounter.countMessage(message)` for a stored message (`MastraDBMessage` as JSON data)."""
    payload: float = count_string(message.get("role"))
    overhead = OM_TOKENS_PER_MESSAGE
    extra = 0
    content = message.get("content")
    if isinstance(content, str):
        payload += count_string(content)
    elif isinstance(content, Mapping):
        parts = content.get("parts")
        if js_truthy(content.get("content")) and not isinstance(parts, list):
            payload += count_string(content.get("content"))
        elif isinstance(parts, list):
            for part in parts:
                tokens, overhead_change, extra_messages = _part_tokens(part)
                payload += tokens
                overhead += overhead_change
                extra += extra_messages
    if extra > 0:
        overhead += extra * OM_TOKENS_PER_MESSAGE
    return _js_round(payload + overhead)


def count_om_messages(messages: Sequence[Mapping[str, Any]]) -> int:
    """`TokenCounter.countMessages(messages)`: 24 plus each message's count; 0 for no messages."""
    if not messages:
        return 0
    return OM_TOKENS_PER_CONVERSATION + sum(count_om_message(m) for m in messages)


def attachment_free(message: Mapping[str, Any]) -> bool:
    """True when no part holds an attachment (an `image` / `file` part, or a tool result whose content
    carries inline media), so `count_om_message` is exactly Mastra's count, whatever the model."""
    content = message.get("content")
    if not isinstance(content, Mapping) or not isinstance(content.get("parts"), list):
        return True
    return not any(_holds_attachment(p) for p in content["parts"])


_MEDIA_KINDS: Final = frozenset({"image", "image-data", "media", "audio", "file-data"})


def _holds_attachment(part: Any) -> bool:
    if not isinstance(part, Mapping):
        return False
    if part.get("type") in ("image", "file"):
        return True
    invocation = part.get("toolInvocation")
    if part.get("type") != "tool-invocation" or not isinstance(invocation, Mapping):
        return False
    mastra = _mastra_metadata(part)
    result = (
        mastra.get("modelOutput")
        if mastra is not None and "modelOutput" in mastra
        else invocation.get("result")
    )
    if not isinstance(result, Mapping):
        return False
    items = result.get("value") if result.get("type") == "content" else result.get("content")
    return isinstance(items, list) and any(
        isinstance(i, Mapping) and i.get("type") in _MEDIA_KINDS and isinstance(i.get("data"), str)
        for i in items
    )


def _js_round(value: float) -> int:
    """JavaScript's `Math.round`: halves go up (towards +∞), unlike Python's banker's rounding."""
    return math.floor(value + 0.5)
