"""`python -m bench codec`: the event codec alone: decode + encode of a typical EnrichedRequest, events/s.

    .venv/bin/python -m bench codec [--messages 40] [--seconds 3]

The event is what an agent worker receives: 40 messages of about 1 KB each (user questions, assistant turns
with reasoning, a tool call and its result, text), each with an unknown field, so the lossless path is
exercised. Printed figures are single-threaded on this machine; compare runs, not machines.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.codec import decode_enriched, decode_request, encode
from schemas.events import EnrichedRequest
from schemas.messages import format_timestamp

T0 = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
FILLER = "The quick brown fox jumps over the lazy dog; "  # 46 characters


def _message(i: int) -> dict[str, Any]:
    common = {
        "id": f"msg-{i:04d}",
        "createdAt": format_timestamp(T0 + timedelta(seconds=i)),
        "threadId": "thread-1",
        "resourceId": "user-1",
        "source": "memory",
        "clientTag": {"ui": "web", "n": i},
    }
    if i % 2 == 0:
        text = (FILLER * 20)[:440]
        content = {"format": 2, "content": text, "parts": [{"type": "text", "text": text}]}
        return {"role": "user", "content": content, **common}
    call = {
        "state": "result",
        "toolCallId": f"call-{i}",
        "toolName": "searchDocs",
        "args": {"query": "fox", "limit": 3},
        "result": {"hits": [{"id": "d1", "score": 0.9}, {"id": "d2", "score": 0.7}]},
    }
    content = {
        "format": 2,
        "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "reasoning": FILLER * 2, "details": [{"type": "text", "text": FILLER * 2}]},
            {"type": "tool-invocation", "toolInvocation": {**call, "step": 0}},
            {"type": "step-start"},
            {"type": "text", "text": FILLER * 4, "providerMetadata": {"openai": {"itemId": f"it-{i}"}}},
        ],
        "toolInvocations": [call],
        "metadata": {"logicalMessageId": f"L{i}"},
    }
    return {"role": "assistant", "content": content, **common}


def enriched_event(messages: int) -> bytes:
    history = [_message(i) for i in range(messages - 1)]
    question = _message(messages - 1) | {"source": "input", "role": "user"}
    return json.dumps(
        {
            "schemaVersion": 1,
            "requestId": "req-1",
            "threadId": "thread-1",
            "resourceId": "user-1",
            "createdAt": format_timestamp(T0 + timedelta(hours=1)),
            "metadata": {"tenant": "acme"},
            "messages": [*history, question],
            "history": {"recalled": len(history), "limit": 40},
            "eventId": "req-1",
        },
        separators=(",", ":"),
    ).encode()


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of `fn`, measured for about `seconds` after a short warm-up."""
    for _ in range(20):
        fn()
    calls, started = 0, time.perf_counter()
    deadline = started + seconds
    while True:
        for _ in range(20):
            fn()
        calls += 20
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - started)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench codec", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)

    raw = enriched_event(args.messages)
    event = decode_enriched(raw)
    assert json.loads(encode(event)) == json.loads(raw), "the codec must be lossless"
    document = json.loads(raw)
    request_raw = json.dumps(
        {k: v for k, v in document.items() if k not in ("history", "eventId")}
        | {"messages": [{k: v for k, v in m.items() if k != "source"} for m in document["messages"][-1:]]}
    ).encode()
    request = decode_request(request_raw)
    context = [(m, m.source) for m in event.messages]

    size = len(raw)
    print(f"EnrichedRequest: {args.messages} messages, {size} bytes ({size / args.messages:.0f} B/message)")
    results = {
        "decode+encode (EnrichedRequest)": rate(lambda: encode(decode_enriched(raw)), args.seconds),
        "decode only": rate(lambda: decode_enriched(raw), args.seconds),
        "encode only": rate(lambda: encode(event), args.seconds),
        "from_request + encode (recall path output)": rate(
            lambda: encode(EnrichedRequest.from_request(request, context, recalled=39, limit=40)),
            args.seconds,
        ),
        "baseline json.loads + json.dumps (no validation)": rate(
            lambda: json.dumps(json.loads(raw)).encode(), args.seconds
        ),
    }
    for name, per_second in results.items():
        print(f"{name:<50} {per_second:>9.0f} events/s  {per_second * len(raw) / 1e6:>7.1f} MB/s")
    return 0
