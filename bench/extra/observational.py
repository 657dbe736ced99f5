"""`python -m bench observational`: tokens sent to the model per request with Observational Memory, against
`lastMessages` and against a token budget, over one long conversation; and the observation work per turn.

    .venv/bin/python -m bench observational [--turns 500] [--user-bytes 300] [--assistant-bytes 1200]
        [--last-messages 40] [--max-tokens 8000] [--message-tokens 30000] [--observation-tokens 40000]
        [--observed-share 0.15]

In process, no Kafka, no MongoDB: the service's own rules decide (`core.observation`: the unobserved
messages, the thresholds; `core.observation_text`: the log's context messages; `core.om_tokens`: Mastra OM's
counter, used for every line so they compare). Each turn: the request is recalled three ways (the newest
`--last-messages` messages; the newest that fit `--max-tokens`; the log's context plus the unobserved
messages), then its turn is saved, and the persist path's decision runs: when due, an `ObserveRequest` is
built (its encoded bytes counted) and a stub observer answers at once with `--observed-share` of the
messages' text (its `ObserveResult` bytes counted; a real observer answers later, and the turns in between
are recalled with the log as it was); when the log passes the reflection threshold, a `ReflectRequest` and a
`ReflectResult` condensing it to half. Prints, per line, the mean, the median and the last request's tokens,
then the OM work: events and bytes, in total and per turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from message_history.core.observation import (
    ObservationSettings,
    ObservedState,
    Threshold,
    decide_observation,
    should_reflect,
    unobserved_messages,
)
from message_history.core.observation_text import append_observations, context_system_messages
from message_history.core.om_tokens import (
    OM_TOKENS_PER_CONVERSATION,
    count_observations,
    count_om_message,
    count_string,
)
from schemas.codec import encode
from schemas.observational import ObserveRequest, ObserveResult, ReflectRequest, ReflectResult

T0 = datetime(2025, 1, 1, tzinfo=UTC)
WORDS = "the traveller asked about night trains from Paris to Lisbon, the fares, the luggage rules; "


def _text(size: int, turn: int) -> str:
    return (f"[{turn}] " + WORDS * (size // len(WORDS) + 1))[:size]


def _message(turn: int, role: str, size: int) -> dict[str, Any]:
    at = T0 + timedelta(minutes=turn, seconds=0 if role == "user" else 30)
    return {
        "id": f"m{turn:04d}-{role[0]}",
        "role": role,
        "createdAt": at.isoformat().replace("+00:00", "Z"),
        "threadId": "bench",
        "resourceId": "bench-user",
        "content": {"format": 2, "parts": [{"type": "text", "text": _text(size, turn)}]},
    }


def _date(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value is not None else None


_COUNTS: dict[str, int] = {}


def count_om_messages(messages: list[dict[str, Any]]) -> int:
    """`core.om_tokens.count_om_messages`, each message counted once (the bench's messages never change)."""
    if not messages:
        return 0
    total = OM_TOKENS_PER_CONVERSATION
    for message in messages:
        ident = message["id"]
        if ident not in _COUNTS:
            _COUNTS[ident] = count_om_message(message)
        total += _COUNTS[ident]
    return total


def _newest_within(messages: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    kept, total = 0, OM_TOKENS_PER_CONVERSATION
    for message in reversed(messages):
        total += count_om_messages([message]) - OM_TOKENS_PER_CONVERSATION
        if total > budget:
            break
        kept += 1
    return messages[len(messages) - kept :]


def _claim() -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": "r",
        "createdAt": "2025-01-01T00:00:00.000Z",
        "scope": "thread",
        "threadId": "bench",
        "resourceId": "bench-user",
        "recordId": "row",
        "generation": 0,
        "cycle": 1,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = ObservationSettings(
        "thread", Threshold(args.message_tokens, args.message_tokens), args.observation_tokens
    )
    stored: list[dict[str, Any]] = []
    log, observed_ids = "", frozenset[str]()
    last_observed: str | None = None
    sent: dict[str, list[int]] = {"everything": [], "lastMessages": [], "maxTokens": [], "observational": []}
    work = {"observe": 0, "reflect": 0, "bytes_out": 0, "bytes_in": 0}
    for turn in range(1, args.turns + 1):
        question = _message(turn, "user", args.user_bytes)
        asked = count_om_messages([question])
        sent["everything"].append(count_om_messages(stored) + asked)
        sent["lastMessages"].append(count_om_messages(stored[-args.last_messages :]) + asked)
        sent["maxTokens"].append(count_om_messages(_newest_within(stored, args.max_tokens)) + asked)
        state = ObservedState(_date(last_observed), observed_ids, 0, count_observations(log))
        context = sum(count_string(text) for text in context_system_messages(log))
        sent["observational"].append(context + count_om_messages(unobserved_messages(stored, state)) + asked)

        stored += [question, _message(turn, "assistant", args.assistant_bytes)]
        state = ObservedState(_date(last_observed), observed_ids, 0, count_observations(log))
        if should_reflect(count_observations(log), settings):
            reflect = ReflectRequest.model_validate(
                {**_claim(), "type": "ReflectRequest", "activeObservations": log,
                 "observationTokenCount": count_observations(log),
                 "observationTokens": args.observation_tokens}
            )  # fmt: skip
            log = log[: len(log) // 2]
            reflected = ReflectResult.model_validate({**_claim(), "type": "ReflectResult", "reflection": log})
            work["reflect"] += 1
            work["bytes_out"] += len(encode(reflect))
            work["bytes_in"] += len(encode(reflected))
            continue
        decision = decide_observation(stored, state, settings)
        if not decision.observe:
            continue
        request = ObserveRequest.model_validate(
            {**_claim(), "type": "ObserveRequest", "messages": decision.messages, "activeObservations": log,
             "observationTokenCount": count_observations(log), "pendingTokens": decision.pending_tokens,
             "messageTokens": decision.threshold}
        )  # fmt: skip
        text = "\n".join(
            "- " + p["text"][: int(len(p["text"]) * args.observed_share)]
            for m in decision.messages
            for p in m["content"]["parts"]
        )
        newest = decision.messages[-1]["createdAt"]
        result = ObserveResult.model_validate(
            {**_claim(), "type": "ObserveResult", "observations": text,
             "observedMessageIds": [m["id"] for m in decision.messages], "lastObservedAt": newest}
        )  # fmt: skip
        work["observe"] += 1
        work["bytes_out"] += len(encode(request))
        work["bytes_in"] += len(encode(result))
        log = append_observations(log, text, _date(last_observed))
        last_observed, observed_ids = newest, frozenset(m["id"] for m in decision.messages)
    return {"sent": sent, "work": work, "log_tokens": count_observations(log)}


def render(args: argparse.Namespace, outcome: dict[str, Any]) -> str:
    lines = [
        f"Observational Memory vs lastMessages vs a token budget: {args.turns} turns, "
        f"user {args.user_bytes} B, assistant {args.assistant_bytes} B; "
        f"OM thresholds {args.message_tokens} / {args.observation_tokens} tokens "
        "(Mastra OM's counter for every line)",
        f"{'line':<34} {'mean':>8} {'median':>8} {'last':>8}   tokens sent to the model per request",
    ]
    names = {
        "everything": "the whole thread (no limit)",
        "lastMessages": f"lastMessages {args.last_messages}",
        "maxTokens": f"maxTokens {args.max_tokens}",
        "observational": "observational (log + unobserved)",
    }
    for key, values in outcome["sent"].items():
        mean, median = statistics.mean(values), statistics.median(values)
        lines.append(f"{names[key]:<34} {mean:>8.0f} {median:>8.0f} {values[-1]:>8}")
    work = outcome["work"]
    events = work["observe"] * 2 + work["reflect"] * 2
    lines.append(
        f"OM work: {work['observe']} observations, {work['reflect']} reflections; {events} events, "
        f"{work['bytes_out']} B out (requests) + {work['bytes_in']} B in (results) = "
        f"{(work['bytes_out'] + work['bytes_in']) / args.turns:.0f} B per turn, "
        f"{events / args.turns:.3f} events per turn; final log {outcome['log_tokens']} tokens"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench observational", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=500)
    p.add_argument("--user-bytes", type=int, default=300)
    p.add_argument("--assistant-bytes", type=int, default=1200)
    p.add_argument("--last-messages", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=8000)
    p.add_argument("--message-tokens", type=int, default=30_000)
    p.add_argument("--observation-tokens", type=int, default=40_000)
    p.add_argument("--observed-share", type=float, default=0.15, help="the stub's text per message's text")
    args = p.parse_args(argv)
    print(render(args, run(args)), file=sys.stdout)
    return 0
