"""The golden corpus (tests/golden.py): deterministic cases for the recall and the persist path.

Three sources, every case plain JSON (see tests/golden.py for the shape):

* `rule_table_cases`: the rule tables of tests/rule_cases.py (`RECALL_CASES`, `PERSIST_CASES`,
  `CONTINUE_CASES`) as a stored thread plus one request or response;
* `mastra_row_cases`: threads of `mastra_messages` documents as `@mastra/mongodb` writes them (and older
  writers left them: tests/recall_docs.py, the fixtures of the recall-row equivalence tests), read as the
  MongoDB storage reads them, then recalled;
* `generated_cases`: seeded random threads and turns (fixed seeds): ids, roles, content of every part kind
  incl. tool parts, unicode and escapes, equal `createdAt`, duplicate ids, non-canonical content, echoed
  inputs, `lastMessages` absent/null/false/0/1/N, readOnly, token budgets and stored boundaries,
  retainFullInput; for persist, responses folded into the latest stored assistant message, tool results,
  forgotten turns, legacy and derived ids, duplicates and several turns of a thread in one batch.

Only `python -m tests.golden record` runs this module; the replay reads the cases from the golden file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from message_history.core.budget import BOUNDARY_KEY
from message_history.errors import FatalStorageError
from message_history.processor import USE_DEFAULT
from schemas.ids import derived_message_id, legacy_message_id
from schemas.messages import Message
from storage.documents import message_from_doc
from tests.memory_cases import random_part, random_text, tool_part
from tests.recall_docs import request_for, stored_docs
from tests.rule_cases import CONTINUE_CASES, PERSIST_CASES, RECALL_CASES, RESOURCE, THREAD, msg

T0 = datetime(2025, 1, 1, 11, 0, tzinfo=UTC)
EVENT_AT = "2025-06-01T00:00:00.000Z"  # a turn's event time: after every stored message of the corpus

Json = dict[str, Any]


def _wire(message: Message) -> Json:
    return message.model_dump(mode="json", exclude_unset=True)


def _stored_json(messages: Sequence[Message]) -> list[str]:
    return [m.model_dump_json(exclude_unset=True) for m in messages]


def _record(event: Json, *, compact: bool = False) -> Json:
    """An input record: key = the event's thread, value = its JSON (ASCII-escaped, or compact UTF-8)."""
    text = json.dumps(event, ensure_ascii=False, separators=(",", ":")) if compact else json.dumps(event)
    return {"key": str(event.get("threadId", "")), "value": text}


def _request(
    thread: str, messages: Sequence[Json], *, request_id: str, resource: str = RESOURCE, memory: Any = None
) -> Json:
    event: Json = {
        "schemaVersion": 1,
        "requestId": request_id,
        "threadId": thread,
        "resourceId": resource,
        "createdAt": EVENT_AT,
        "messages": list(messages),
    }
    if memory is not None:
        event["memory"] = memory
    return event


def _response(
    thread: str,
    input: Sequence[Json],  # the event's field name
    output: Sequence[Json],
    *,
    request_id: str,
    resource: str = RESOURCE,
    finish_reason: str | None = "stop",
    memory: Any = None,
    created: str = EVENT_AT,
) -> Json:
    event: Json = {
        "schemaVersion": 1,
        "requestId": request_id,
        "threadId": thread,
        "resourceId": resource,
        "createdAt": created,
        "input": list(input),
        "response": list(output),
        "finishReason": finish_reason,
    }
    if memory is not None:
        event["memory"] = memory
    return event


# --- (a) the rule tables ------------------------------------------------------------------------------


def rule_table_cases() -> list[Json]:
    out: list[Json] = []
    for case in RECALL_CASES:
        thread = case.thread or "t-no-thread"
        memory: Json | None = None
        if case.last_messages is not USE_DEFAULT:
            memory = {"lastMessages": case.last_messages}
        settings: Json = {}
        if case.processor_last_messages is not None:
            settings["last_messages"] = case.processor_last_messages
        incoming = [_wire(m) for m in case.incoming]
        if case.thread is None:
            for m in incoming:
                m.pop("threadId", None)
        out.append(
            {
                "id": f"rules/recall/{case.id}",
                "settings": settings,
                "stored": [{"thread": THREAD, "resource": case.owner, "messages": _stored_json(case.stored)}],
                "batches": [
                    {
                        "path": "recall",
                        "records": [
                            _record(
                                _request(
                                    thread,
                                    incoming,
                                    request_id=f"q-{case.id}",
                                    resource=case.resource or RESOURCE,
                                    memory=memory,
                                )
                            )
                        ],
                    }
                ],
            }
        )
    for pcase in PERSIST_CASES:
        thread = pcase.thread or "t-no-thread"
        inputs, outputs = [_wire(m) for m in pcase.input], [_wire(m) for m in pcase.response]
        if pcase.thread is None:
            for m in [*inputs, *outputs]:
                m.pop("threadId", None)
        event = _response(
            thread,
            inputs,
            outputs,
            request_id=f"r-{pcase.id}",
            finish_reason=pcase.finish_reason,
            memory={"readOnly": True} if pcase.read_only else None,
        )
        out.append(
            {"id": f"rules/persist/{pcase.id}", "batches": [{"path": "persist", "records": [_record(event)]}]}
        )
    for ccase in CONTINUE_CASES:
        latest = msg("a1", "assistant", t=2, parts=ccase.latest)
        answer = msg("a1" if ccase.same_id else "a2", "assistant", t=5, parts=ccase.response)
        stored = [msg("u1", t=1, text="Go."), latest]
        event = _response(THREAD, [], [_wire(answer)], request_id=f"r-{ccase.id}")
        out.append(
            {
                "id": f"rules/continue/{ccase.id}",
                "stored": [{"thread": THREAD, "resource": RESOURCE, "messages": _stored_json(stored)}],
                "batches": [
                    {"path": "persist", "records": [_record(event)]},
                    {
                        "path": "recall",
                        "records": [_record(_request(THREAD, [], request_id=f"q-{ccase.id}"))],
                    },
                ],
            }
        )
    return out


# --- (b) rows as @mastra/mongodb (and older writers) left them ------------------------------------------


def mastra_row_cases(seeds: Sequence[int] = tuple(range(12))) -> list[Json]:
    out: list[Json] = []
    for seed in seeds:
        thread, resource = f"mt{seed}", f"mr{seed}"
        messages: list[Message] = []
        for doc in stored_docs(seed, 30, thread, resource):
            try:
                messages.append(message_from_doc(doc))
            except (FatalStorageError, ValueError):
                continue  # a row the model path refuses cannot be held by the in-memory storage
        messages = [m for m in messages if m.id and m.createdAt is not None]
        stored_ids = [m.id or "" for m in messages]
        request = request_for(seed, thread, resource, stored_ids)
        memory_choices: list[Json | None] = [
            None,
            {"lastMessages": 5},
            {"lastMessages": False},
            {"retainFullInput": True},
        ]
        body = request.model_dump(mode="json", exclude_unset=True)
        body["requestId"] = f"q-mastra-{seed}"
        memory = memory_choices[seed % len(memory_choices)]
        if memory is not None:
            body["memory"] = memory
        else:
            body.pop("memory", None)
        out.append(
            {
                "id": f"mastra-rows/{seed}",
                "stored": [{"thread": thread, "resource": resource, "messages": _stored_json(messages)}],
                "batches": [{"path": "recall", "records": [_record(body, compact=seed % 2 == 0)]}],
            }
        )
    return out


# --- (c) generated ------------------------------------------------------------------------------------

_ODD_TEXTS = [
    "",
    "é",
    "你好",
    "😀",
    "\u2028",
    "\x00",
    "\x1f",
    "tab\tnew\nline",
    '"quoted" \\ back',
    "</script>",
]
_WM = "<working_memory># User\n- name: Ada</working_memory>"


def _time(ms: int) -> str:
    return (T0 + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Gen:
    """One case's random thread and turns."""

    def __init__(self, seed: int, thread: str, resource: str) -> None:
        self.rng = random.Random(seed)
        self.thread, self.resource = thread, resource
        self.clock = 0
        self.count = 0

    def text(self) -> str:
        rng = self.rng
        text = random_text(rng, rng.randint(0, 25))
        if rng.random() < 0.25:
            text = rng.choice(_ODD_TEXTS) + text + rng.choice(_ODD_TEXTS)
        if rng.random() < 0.05:
            text = f"Hi {_WM} there "
        return text

    def parts(self, role: str) -> list[Json]:
        rng = self.rng
        if role == "user" or rng.random() < 0.4:
            return [{"type": "text", "text": self.text()}]
        return [random_part(rng, self.count) for _ in range(rng.randint(0, 4))] or [
            {"type": "text", "text": self.text()}
        ]

    def message(self, role: str, *, mid: str | None = None, tie: bool = False) -> Json:
        rng = self.rng
        if not tie:
            self.clock += rng.choice([1, 1, 7, 50, 1000])
        self.count += 1
        content: Json = {"format": 2, "parts": self.parts(role)}
        if rng.random() < 0.2:
            content["content"] = self.text()  # non-canonical: a content text beside the parts
        if rng.random() < 0.05:
            content["metadata"] = {"k": rng.choice([1, 2.5, "v", None, [1, {"a": True}]])}
        if rng.random() < 0.03:
            content["customKey"] = {"kept": True}
        out: Json = {
            "id": mid or f"{self.thread}-m{self.count}",
            "role": role,
            "createdAt": _time(self.clock),
            "content": content,
        }
        if rng.random() < 0.5:
            out["threadId"], out["resourceId"] = self.thread, self.resource
        if rng.random() < 0.03:
            out["customField"] = {"n": self.count}
        return out

    def thread_rows(self, n: int) -> list[Json]:
        rng = self.rng
        rows: list[Json] = []
        for i in range(n):
            role = rng.choices(["user", "assistant", "system", "signal"], [10, 10, 1, 1])[0]
            if role not in ("system", "signal"):
                role = "user" if i % 2 == 0 else "assistant"
            rows.append(self.message(role, tie=rng.random() < 0.15))
            if role == "signal" and rng.random() < 0.5:
                rows[-1]["content"]["metadata"] = {
                    "signal": {"type": "notification", "tagName": "notification", "transient": True}
                }
        return rows


def _as_stored(rows: Sequence[Json], thread: str, resource: str) -> list[str]:
    out = []
    for row in rows:
        full = {"threadId": thread, "resourceId": resource, **row}
        out.append(Message.model_validate(full).model_dump_json(exclude_unset=True))
    return out


def _memory(rng: random.Random) -> Json | None:
    choice = rng.randint(0, 11)
    memory: Json = {}
    if choice == 0:
        return None
    if choice == 1:
        memory["lastMessages"] = None
    elif choice == 2:
        memory["lastMessages"] = False
    elif choice == 3:
        memory["lastMessages"] = 0
    elif choice == 4:
        memory["lastMessages"] = 1
    elif choice in (5, 6):
        memory["lastMessages"] = rng.randint(2, 30)
    elif choice in (7, 8):
        memory["maxTokens"] = rng.choice([50, 200, 1000])
        memory["atMaxRemoveTokens"] = rng.choice([None, 10, 40])
        if memory["atMaxRemoveTokens"] is None:
            del memory["atMaxRemoveTokens"]
    if rng.random() < 0.25:
        memory["readOnly"] = rng.choice([True, False])
    if rng.random() < 0.25:
        memory["retainFullInput"] = rng.choice([True, False])
    return memory


def _recall_case(index: int) -> Json:
    thread, resource = f"g{index}", f"res{index % 3}"
    gen = _Gen(10_000 + index, thread, resource)
    rng = gen.rng
    rows = gen.thread_rows(rng.choice([0, 1, 2, 5, 12, 25, 45, 60]))
    if rows and rng.random() < 0.1:  # a duplicate id: the same message saved twice (the later copy wins)
        dup = dict(rows[rng.randrange(len(rows))])
        dup["content"] = {"format": 2, "parts": [{"type": "text", "text": "rewritten"}]}
        rows.append(dup)
    stored: Json = {"thread": thread, "resource": resource, "messages": _as_stored(rows, thread, resource)}
    if rows and rng.random() < 0.15:  # a boundary a token-limited recall stored earlier
        cut = rows[rng.randrange(len(rows))]
        stored["metadata"] = {
            BOUNDARY_KEY: {
                "createdAt": cut["createdAt"],
                "messageIds": [cut["id"]],
                "maxTokens": 200,
                "atMaxRemoveTokens": 0,
            }
        }
    settings: Json = {}
    if rng.random() < 0.1:
        settings["last_messages"] = rng.choice([0, 3, 10])
    if rng.random() < 0.05:
        settings["retain_full_input"] = True
    if rng.random() < 0.05:
        settings["max_tokens"] = 300

    records: list[Json] = []
    for turn in range(rng.choice([1, 1, 1, 2, 3])):
        incoming: list[Json] = []
        if rows and rng.random() < 0.3:  # a client resending stored messages (echo), as stored or edited
            for echoed in rows[-rng.randint(1, min(4, len(rows))) :]:
                copy = json.loads(json.dumps(echoed))
                if rng.random() < 0.2:
                    copy["content"] = {"format": 2, "parts": [{"type": "text", "text": "edited"}]}
                incoming.append(copy)
        if rng.random() < 0.1:
            incoming.append(gen.message("system"))
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            incoming.append(
                gen.message(
                    "user",
                    mid=None if rng.random() < 0.1 else f"{thread}-in{gen.count}",
                    tie=rng.random() < 0.2,
                )
            )
            if rng.random() < 0.1:
                incoming[-1].pop("id")
        owner = resource if rng.random() < 0.93 else "someone-else"
        if owner != resource and rng.random() < 0.8:  # mostly refused for the owner, not for a contradiction
            for m in incoming:
                m.pop("resourceId", None)
        event = _request(thread, incoming, request_id=f"q{index}-{turn}", resource=owner, memory=_memory(rng))
        if rng.random() < 0.1 and records:  # delivered twice
            records.append(records[-1])
        records.append(_record(event, compact=rng.random() < 0.5))
        if rng.random() < 0.15:  # another thread's request in the same batch
            stray = gen.message("user")
            stray.pop("threadId", None)
            other = _request(f"{thread}-other", [stray], request_id=f"q{index}-{turn}-o", resource=resource)
            records.append(_record(other))
    if rng.random() < 0.03:
        records.insert(0, {"key": thread, "value": {"b64": "/w=="}})  # unreadable bytes
    return {
        "id": f"generated/recall/{index}",
        "settings": settings,
        "stored": [stored],
        "batches": [{"path": "recall", "records": records}],
    }


def _persist_case(index: int) -> Json:
    thread, resource = f"p{index}", f"res{index % 3}"
    gen = _Gen(20_000 + index, thread, resource)
    rng = gen.rng
    rows = gen.thread_rows(rng.choice([0, 0, 1, 2, 6, 20]))
    pending_call: str | None = None
    if rng.random() < 0.4:  # the latest stored message an assistant one, maybe with a pending tool call
        gen.clock += 5
        latest = gen.message("assistant")
        if rng.random() < 0.6:
            pending_call = f"call-{index}"
            latest["content"]["parts"].append(tool_part(rng, pending_call, "call"))
        rows.append(latest)
    request_id = f"r{index}"
    legacy_pos = rng.random() < 0.1
    if legacy_pos:  # a row stored under the pre-0.1.0 id of this turn's first input message
        gen.clock += 1
        old = gen.message("user", mid=legacy_message_id(request_id, "input", 0))
        rows.append(old)
    stored = {"thread": thread, "resource": resource, "messages": _as_stored(rows, thread, resource)}
    gen.clock += 100

    inputs: list[Json] = []
    if rows and not legacy_pos and rng.random() < 0.3:  # the recalled history sent back, tagged memory
        for m in rows[-rng.randint(1, min(3, len(rows))) :]:
            inputs.append({**json.loads(json.dumps(m)), "source": "memory"})
    if legacy_pos or rng.random() < 0.7:
        new = gen.message("user")
        if not legacy_pos and rng.random() < 0.85:
            new["id"] = f"{thread}-u{gen.count}"
        else:
            new.pop("id")  # the service derives its id (and keeps a legacy row stored under the old one)
        inputs.append({**new, "source": "input"} if rng.random() < 0.5 else new)
    if pending_call and rng.random() < 0.5:  # the client's result for the pending call, echoed
        echo = json.loads(json.dumps(rows[-1] if not legacy_pos else rows[-2]))
        echo["content"]["parts"][-1] = tool_part(rng, pending_call, "result")
        inputs.append(echo)
    if not legacy_pos and rng.random() < 0.1:
        inputs.insert(0, gen.message("system"))

    outputs: list[Json] = []
    for step in range(rng.choice([0, 1, 1, 1, 2, 3])):
        gen.clock += 3
        m = gen.message("assistant", tie=rng.random() < 0.2)
        if pending_call and step == 0 and rng.random() < 0.5:
            m["content"]["parts"].insert(0, tool_part(rng, pending_call, "result"))
        if rng.random() < 0.15:
            m["content"]["parts"].append(
                tool_part(rng, f"call-{index}-{step}", rng.choice(["partial-call", "call", "result"]))
            )
        if rng.random() < 0.1:
            m["content"]["parts"].append(tool_part(rng, f"wm-{index}", "result") | {})
            m["content"]["parts"][-1]["toolInvocation"]["toolName"] = "updateWorkingMemory"
        if rng.random() < 0.2:
            m.pop("id")
        elif rows and rng.random() < 0.1:
            m["id"] = rows[-1]["id"]  # a response carrying a stored id
        outputs.append(m)
    finish = rng.choice(["stop", "stop", "stop", "error", None, "tool-calls"])
    memory = {"readOnly": True} if rng.random() < 0.07 else None
    event = _response(
        thread, inputs, outputs, request_id=request_id, resource=resource, finish_reason=finish, memory=memory
    )

    records = [_record(event, compact=rng.random() < 0.5)]
    if rng.random() < 0.1:
        records.append(records[0])  # delivered twice in one batch
    if rng.random() < 0.2:  # a second turn of the thread in the same batch
        gen.clock += 500
        follow = _response(
            thread,
            [gen.message("user", mid=f"{thread}-f{gen.count}")],
            [gen.message("assistant", mid=f"{thread}-fa{gen.count}")],
            request_id=f"{request_id}-2",
            resource=resource,
        )
        records.append(_record(follow))
    if rng.random() < 0.05:
        intruding = gen.message("user", mid=f"{thread}-x")
        intruding.pop("resourceId", None)
        foreign = _response(thread, [intruding], [], request_id=f"{request_id}-x", resource="intruder")
        records.insert(rng.randint(0, len(records)), _record(foreign))
    if rng.random() < 0.05:
        # an id already stored in another thread: a dead letter
        taken = {**gen.message("user"), "id": "shared-id"}
        taken.pop("threadId", None)
        records.append(
            _record(_response(f"{thread}-b", [taken], [], request_id=f"{request_id}-b", resource=resource))
        )
        stored_other = {
            "thread": f"{thread}-a",
            "resource": resource,
            "messages": _as_stored([{**gen.message("user"), "id": "shared-id"}], f"{thread}-a", resource),
        }
    else:
        stored_other = None
    case: Json = {
        "id": f"generated/persist/{index}",
        "stored": [stored] + ([stored_other] if stored_other else []),
        "batches": [{"path": "persist", "records": records}],
    }
    forget = rng.random()
    if forget < 0.05:
        case["forgotten_threads"] = {thread: rng.choice([0.0, 86400.0 * 365])}
    elif forget < 0.08:
        case["forgotten_resources"] = {resource: rng.choice([0.0, 86400.0 * 365])}
    if rng.random() < 0.5:  # what a recall sees afterwards
        case["batches"].append(
            {
                "path": "recall",
                "records": [_record(_request(thread, [], request_id=f"q-after-{index}", resource=resource))],
            }
        )
    return case


def generated_cases(recall: int = 220, persist: int = 180) -> list[Json]:
    return [_recall_case(i) for i in range(recall)] + [_persist_case(i) for i in range(persist)]


def derived_id_cases() -> list[Json]:
    """Messages without ids: the derived ids, and a replay that keeps the legacy row."""
    thread = "d1"
    old = legacy_message_id("r-derived", "input", 0)
    stored = _as_stored(
        [
            {
                "id": old,
                "role": "user",
                "createdAt": _time(1),
                "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]},
            }
        ],
        thread,
        RESOURCE,
    )
    turn = _response(
        thread,
        [
            {
                "role": "user",
                "createdAt": _time(1),
                "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]},
            }
        ],
        [
            {
                "role": "assistant",
                "createdAt": _time(2),
                "content": {"format": 2, "parts": [{"type": "text", "text": "yo"}]},
            }
        ],
        request_id="r-derived",
    )
    assert derived_message_id(RESOURCE, thread, "r-derived", "response", 0)  # the scheme the case pins
    return [
        {
            "id": "persist/derived-and-legacy-ids",
            "stored": [{"thread": thread, "resource": RESOURCE, "messages": stored}],
            "batches": [{"path": "persist", "records": [_record(turn), _record(turn)]}],
        }
    ]


def build_cases() -> list[Json]:
    return [*rule_table_cases(), *mastra_row_cases(), *derived_id_cases(), *generated_cases()]
