"""Hypothesis generators of records for the three input topics (issue 23, item 3): valid turns, structural
garbage, semantic edge values, hostile headers, ownership attacks and keys that are not the thread id.

Every generated record is a `Fuzzed`: its key, value and headers as produced, a label naming the generator
(so a failure says which kind of input broke what), the id that finds its output, and what the contract
expects of it: `refuse` (a dead letter), `accept` (processed), or `either` (input the contract does not
decide, e.g. a BOM or duplicate keys: processed or dead-lettered are both fine, a crash or a silent loss is
not). Used by tests/unit/test_fuzz_decode.py (pure, decode only) and tests/integration/test_fuzz_stream.py
(the service on the real stack).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from hypothesis import strategies as st

from schemas.limits import Limits

Expect = Literal["refuse", "accept", "either"]
Topic = Literal["requests", "responses", "commands"]
Headers = tuple[tuple[str, bytes], ...]

T0: Final = "2025-03-01T10:00:00.000Z"
INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True)
class Fuzzed:
    """One input record and what the contract expects of it."""

    topic: Topic
    label: str
    key: bytes | None
    value: bytes | None
    expect: Expect
    request_id: str | None = None  # the eventId of its output when it is processed
    headers: Headers = ()
    thread_id: str | None = None  # the thread it would write to (None: it cannot write)

    def describe(self) -> str:
        """The record as a reproduction: topic, label, key, value (cut), header names."""
        value = self.value if self.value is None or len(self.value) <= 300 else self.value[:300] + b"..."
        names = [name[:20] for name, _ in self.headers]
        return f"[{self.topic}] {self.label}: key={self.key!r} value={value!r} headers={names}"


class Raw:
    """A literal written into the JSON text as is (`NaN`, `Infinity`, `1e309`): not expressible as a value."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text})"


DELETE: Final = object()  # as an edge value: remove the field


def not_json(value: bytes | None, limits: Limits) -> bool:
    """True for UTF-8 text within the size limit, not framed, that Python's parser refuses: its dead letter
    must say "not valid JSON" (bytes that are not UTF-8, or hold NUL bytes as UTF-16/32 text does, may name
    their encoding instead; a BOM and nesting too deep for Python are left out: not decided here)."""
    if (
        not value
        or len(value) > limits.max_event_bytes
        or b"\x00" in value
        or value.startswith(b"\xef\xbb\xbf")
    ):
        return False
    try:
        json.loads(value.decode("utf-8"))
    except json.JSONDecodeError:
        return True
    except (UnicodeDecodeError, RecursionError):
        return False
    return False


# --- valid events ------------------------------------------------------------------------------------------


def text_message(role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": {"format": 2, "parts": [{"type": "text", "text": text}]}, **extra}


def request(thread: str, resource: str, request_id: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": request_id,
        "threadId": thread,
        "resourceId": resource,
        "createdAt": T0,
        "messages": [text_message("user", text)],
        **extra,
    }


def response(
    thread: str, resource: str, request_id: str, inputs: Sequence[dict[str, Any]], answer: str = "ok"
) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "requestId": request_id,
        "threadId": thread,
        "resourceId": resource,
        "createdAt": "2025-03-01T10:00:00.500Z",
        "input": list(inputs),
        "response": [text_message("assistant", answer)],
        "finishReason": "stop",
    }


def forget_thread(
    thread: str, request_id: str, *, resource: str | None = None, dry_run: bool = True
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "schemaVersion": 1,
        "command": "ForgetThread",
        "requestId": request_id,
        "createdAt": T0,
        "threadId": thread,
        "dryRun": dry_run,
    }
    if resource is not None:
        event["resourceId"] = resource
    return event


def forget_resource(resource: str, request_id: str, *, dry_run: bool = True) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "command": "ForgetResource",
        "requestId": request_id,
        "createdAt": T0,
        "resourceId": resource,
        "dryRun": dry_run,
    }


def dumps(event: Any) -> bytes:
    """`event` as JSON bytes; `Raw` values are written as their literal text."""
    raws: list[str] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(event), ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{i}\x00"), raw)
    return text.encode("utf-8", errors="surrogatepass")


def key_of(event: dict[str, Any], topic: Topic) -> bytes | None:
    """The key the contract asks for: the thread id (a `ForgetResource`: the resource id)."""
    name = "resourceId" if topic == "commands" and event.get("command") == "ForgetResource" else "threadId"
    value = event.get(name)
    return value.encode("utf-8", errors="surrogatepass") if isinstance(value, str) else None


def base_event(topic: Topic, thread: str, resource: str, request_id: str) -> dict[str, Any]:
    """A valid event of `topic` for a thread nobody else writes to (hostile records start from it)."""
    if topic == "requests":
        return request(thread, resource, request_id)
    if topic == "responses":
        return response(thread, resource, request_id, [text_message("user", "hi")])
    return forget_thread(thread, request_id, dry_run=False)


# --- semantic edge values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """`path` of the event set to `value` (`DELETE`: removed); `expect` what the contract says of it."""

    path: tuple[str | int, ...]
    value: Any
    expect: Expect

    def label(self) -> str:
        value = "<deleted>" if self.value is DELETE else repr(self.value)
        if len(value) > 60:
            value = value[:60] + f"...({len(value)} chars)"
        return f"edge {'.'.join(map(str, self.path))}={value}"


def _id_edges(path: tuple[str | int, ...], limits: Limits) -> list[Edge]:
    n = limits.max_id_length
    return [
        Edge(path, "", "refuse"),
        Edge(path, "   ", "refuse"),
        Edge(path, "x" * (n + 1), "refuse"),
        Edge(path, "é" * (n + 1), "refuse"),
        Edge(path, "x" * 10_000, "refuse"),
        Edge(path, 5, "refuse"),
        Edge(path, None, "refuse"),
        Edge(path, ["a"], "refuse"),
        Edge(path, "x" * n, "either"),
        Edge(path, "nul\u0000byte", "either"),
        Edge(path, "$where", "either"),
        Edge(path, "a.b.c", "either"),
        Edge(path, "\U0001f600\u202e", "either"),
    ]


# "either" for instants Python or BSON may not hold once shifted to UTC or offset by a message's index: the
# contract does not say; the property is that they never stop the stream.
TIME_EDGES: Final[list[tuple[Any, Expect]]] = [
    ("9999-12-31T23:59:59.999Z", "either"),
    ("9999-12-31T23:59:59.999-01:00", "either"),
    ("0001-01-01T00:00:00+01:00", "either"),
    ("0001-01-01T00:00:00.000Z", "either"),
    ("2025-03-01T10:00:00.123456789Z", "either"),
    ("2025-03-01T10:00:00+14:00", "either"),
    ("2025-03-01", "either"),
    (0, "either"),
    (-62135596801, "either"),
    (253402300800000, "either"),
    (10**30, "either"),
    ("0000-01-01T00:00:00Z", "refuse"),
    ("10000-01-01T00:00:00Z", "refuse"),
    ("2025-02-30T00:00:00Z", "refuse"),
    ("not a date", "refuse"),
    ("", "refuse"),
    (None, "refuse"),
    (True, "refuse"),
    (Raw("NaN"), "refuse"),
    (Raw("Infinity"), "refuse"),
    (Raw("1e309"), "refuse"),
]


def _time_edges(path: tuple[str | int, ...], *, optional: bool) -> list[Edge]:
    edges = [Edge(path, value, expect) for value, expect in TIME_EDGES]
    if optional:  # a message's createdAt may be null or absent: the event's is used
        return [e if e.value is not None else Edge(path, None, "accept") for e in edges]
    return edges


NON_FINITE: Final = (Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e309"), Raw("-1e400"))


def _message_edges(where: tuple[str | int, ...], limits: Limits) -> list[Edge]:
    part = (*where, "content", "parts", 0)
    many = limits.max_parts_per_message
    ids = [
        e if e.value is not None else Edge(e.path, None, "accept") for e in _id_edges((*where, "id"), limits)
    ]
    edges = [
        *ids,  # a message id may be null: the event's derived one is used
        *_time_edges((*where, "createdAt"), optional=True),
        Edge((*where, "role"), "tool", "refuse"),
        Edge((*where, "role"), "USER", "refuse"),
        Edge((*where, "role"), "", "refuse"),
        Edge((*where, "role"), None, "refuse"),
        Edge((*where, "role"), DELETE, "refuse"),
        Edge((*where, "threadId"), "someone-else", "refuse"),
        Edge((*where, "resourceId"), "someone-else", "refuse"),
        Edge((*where, "content"), None, "refuse"),
        Edge((*where, "content"), "plain text, legacy format", "accept"),
        Edge((*where, "content"), {}, "refuse"),
        Edge((*where, "content"), {"format": 3, "parts": []}, "refuse"),
        Edge((*where, "content"), {"format": 2, "parts": "x"}, "refuse"),
        Edge((*where, "content"), {"format": 2, "parts": []}, "either"),
        Edge((*where, "content", "parts"), [{"type": "text", "text": "p"}] * (many + 1), "refuse"),
        Edge((*where, "content", "parts"), [{"type": "text", "text": "p"}] * many, "accept"),
        Edge(part, {"type": "x-future-kind", "payload": {"a": [1, 2]}}, "accept"),
        Edge(part, {"type": "data-custom", "data": {"$gt": "", "a.b": 1}}, "accept"),
        Edge(part, {"type": 5}, "refuse"),
        Edge(part, {}, "refuse"),
        Edge(part, "text", "refuse"),
        Edge(part, {"type": "text"}, "refuse"),
        Edge(part, {"type": "text", "text": "nul\u0000 and \U0001f600"}, "accept"),
        Edge(part, {"type": "text", "text": "lone \ud800 surrogate"}, "either"),
        Edge(part, {"type": "tool-invocation", "toolInvocation": {"state": "bogus"}}, "refuse"),
        Edge((*where, "$inc"), {"x": 1}, "either"),
        Edge((*where, "a.b"), 1, "either"),
        Edge((*where, "_id"), "forced", "either"),
        Edge((*where, "content", "metadata"), {"n": Raw("NaN")}, "refuse"),
        Edge((*where, "content", "metadata"), {"big": 2**70}, "either"),
    ]
    edges += [Edge((*where, "content", "metadata"), {"x": v}, "refuse") for v in NON_FINITE]
    return edges


def _common_edges(limits: Limits) -> list[Edge]:
    edges = [
        Edge(("schemaVersion",), 2, "refuse"),
        Edge(("schemaVersion",), "1", "refuse"),
        Edge(("schemaVersion",), 1.0, "refuse"),
        Edge(("schemaVersion",), True, "refuse"),
        Edge(("schemaVersion",), DELETE, "refuse"),
        *_id_edges(("requestId",), limits),
        Edge(("requestId",), DELETE, "refuse"),
        *_time_edges(("createdAt",), optional=False),
        Edge(("createdAt",), DELETE, "refuse"),
        Edge(("metadata",), "not an object", "refuse"),
        Edge(("metadata",), [1], "refuse"),
        Edge(("metadata",), {"$set": {"a": 1}, "a.b": 2, "": 3}, "either"),
        Edge(("metadata",), {"big": 2**70, "neg": -(2**70)}, "either"),
        Edge(("metadata",), {"nul": "\u0000"}, "either"),
        Edge(("$where",), "1 == 1", "either"),
        Edge(("unknownField",), {"deep": [None, True, 1.5]}, "either"),
    ]
    edges += [Edge(("metadata",), {"x": v}, "refuse") for v in NON_FINITE]
    return edges


def _memory_edges(limits: Limits) -> list[Edge]:
    last = ("memory", "lastMessages")
    edges = [
        Edge(last, 2**70, "refuse"),
        Edge(last, 2**63, "refuse"),
        Edge(last, INT64_MAX, "either"),
        Edge(last, -1, "refuse"),
        Edge(last, 1.5, "refuse"),
        Edge(last, True, "refuse"),
        Edge(last, "5", "refuse"),
        Edge(last, False, "accept"),
        Edge(last, 0, "accept"),
        Edge(last, None, "accept"),
        Edge(("memory", "maxTokens"), -1, "refuse"),
        Edge(("memory", "maxTokens"), "10", "refuse"),
        Edge(("memory", "maxTokens"), 0, "accept"),
        Edge(("memory", "maxTokens"), 1e300, "either"),
        Edge(("memory", "atMaxRemoveTokens"), -1, "refuse"),
        Edge(("memory", "readOnly"), "true", "refuse"),
        Edge(("memory", "readOnly"), 1, "refuse"),
        Edge(("memory", "readOnly"), True, "accept"),
        Edge(("memory", "retainFullInput"), "no", "refuse"),
        Edge(("memory",), "x", "refuse"),
        Edge(("memory",), [], "refuse"),
    ]
    for name in ("lastMessages", "maxTokens", "atMaxRemoveTokens"):
        edges += [Edge(("memory", name), v, "refuse") for v in NON_FINITE]
    return edges


def _list_edges(name: str, limits: Limits, *, may_be_empty: Expect) -> list[Edge]:
    many = limits.max_messages_per_event
    role = "assistant" if name == "response" else "user"
    return [
        Edge((name,), [], may_be_empty),
        Edge((name,), "x", "refuse"),
        Edge((name,), None, "refuse"),
        Edge((name,), [None], "refuse"),
        Edge((name,), [{}], "refuse"),
        Edge((name,), DELETE, "refuse"),
        Edge((name,), [text_message(role, "m")] * (many + 1), "refuse"),
        Edge((name,), [text_message(role, "m")] * many, "either"),  # ids repeat: dedupe decides
        *_message_edges((name, 0), limits),
    ]


def request_edges(limits: Limits) -> list[Edge]:
    return [
        *_common_edges(limits),
        *_id_edges(("threadId",), limits),
        *_id_edges(("resourceId",), limits),
        *_list_edges("messages", limits, may_be_empty="either"),
        *_memory_edges(limits),
    ]


def response_edges(limits: Limits) -> list[Edge]:
    return [
        *_common_edges(limits),
        *_id_edges(("threadId",), limits),
        *_id_edges(("resourceId",), limits),
        *_list_edges("input", limits, may_be_empty="accept"),
        *_list_edges("response", limits, may_be_empty="accept"),
        Edge(("input", 0, "source"), "memory", "accept"),
        Edge(("input", 0, "source"), "bogus", "refuse"),
        Edge(("finishReason",), "error", "accept"),
        Edge(("finishReason",), 5, "refuse"),
        Edge(("memory", "readOnly"), True, "accept"),
        Edge(("memory", "readOnly"), "yes", "refuse"),
    ]


def command_edges(limits: Limits) -> list[Edge]:
    return [
        *_common_edges(limits),
        *_id_edges(("threadId",), limits),
        Edge(("command",), "ForgetEverything", "refuse"),
        Edge(("command",), None, "refuse"),
        Edge(("command",), DELETE, "refuse"),
        Edge(("dryRun",), "true", "refuse"),
        Edge(("dryRun",), 1, "refuse"),
        Edge(("dryRun",), True, "accept"),
        Edge(("resourceId",), "x" * (limits.max_id_length + 1), "refuse"),
        Edge(("resourceId",), "", "refuse"),
    ]


EDGES: Final[dict[Topic, Callable[[Limits], list[Edge]]]] = {
    "requests": request_edges,
    "responses": response_edges,
    "commands": command_edges,
}


def _group(edge: Edge) -> str:
    if edge.path[-1] == "createdAt":
        return "time"
    if edge.path[0] == "memory":
        return "memory"
    if isinstance(edge.value, Raw) or "metadata" in edge.path:
        return "numbers and free-form"
    if edge.path[-1] in ("requestId", "threadId", "resourceId", "id"):
        return "ids"
    return "message" if any(isinstance(step, int) for step in edge.path) else "event"


@functools.cache
def edge_groups(topic: Topic, limits: Limits) -> dict[str, list[Edge]]:
    """`topic`'s edges by kind: a kind is drawn first, so the few time and number edges are not drowned by
    the many message ones."""
    groups: dict[str, list[Edge]] = {}
    for edge in EDGES[topic](limits):
        groups.setdefault(_group(edge), []).append(edge)
    return groups


def apply_edge(event: dict[str, Any], edge: Edge) -> dict[str, Any]:
    out = copy.deepcopy(event)
    node: Any = out
    for step in edge.path[:-1]:
        if isinstance(step, int):
            node = node[step]
        else:
            if not isinstance(node.get(step), dict | list):
                node[step] = {}  # e.g. `memory` absent
            node = node[step]
    last = edge.path[-1]
    if edge.value is DELETE:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(edge.value)
    return out


# --- structural garbage -----------------------------------------------------------------------------------

_INVALID_UTF8: Final = (b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80")
_FIXED_GARBAGE: Final[list[tuple[str, bytes | None]]] = [
    ("null value (tombstone)", None),
    ("empty value", b""),
    ("json null", b"null"),
    ("empty object", b"{}"),
    ("empty array", b"[]"),
    ("json string", b'"event"'),
    ("json number", b"0"),
    ("json true", b"true"),
    ("whitespace", b"  \n\t"),
    ("nul byte", b"\x00"),
    ("schema registry frame", b"\x00\x00\x00\x00\x02{}"),
]


def _with_text(event: dict[str, Any], topic: Topic, text: Any) -> dict[str, Any]:
    """The event with its first message's text (a command: its metadata) replaced by `text`."""
    out = copy.deepcopy(event)
    if topic == "commands":
        out["metadata"] = {"note": text}
    else:
        out["messages" if topic == "requests" else "response"][0]["content"]["parts"][0]["text"] = text
    return out


def _nested(depth: int) -> Raw:
    """`depth` nested arrays and objects, as text (a Python value this deep would overflow the recursion)."""
    opens = "".join('{"d":' if i % 2 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 else "]" for i in reversed(range(depth)))
    return Raw(opens + "0" + closes)


GARBAGE_KINDS: Final = (
    *("fixed", "random", "truncated", "invalid-utf8", "bom", "utf16", "utf32", "deep", "huge-string"),
    *("huge-array", "duplicate-keys", "trailing", "comment", "control-char", "concatenated"),
)


@st.composite
def garbage(
    draw: st.DrawFn, topic: Topic, event: dict[str, Any], limits: Limits
) -> tuple[str, bytes | None, Expect]:
    """(label, value, expect) for structural garbage made from `event`."""
    valid = dumps(event)
    kind = draw(st.sampled_from(GARBAGE_KINDS))
    if kind == "fixed":
        label, value = draw(st.sampled_from(_FIXED_GARBAGE))
        return label, value, "refuse"
    if kind == "random":
        return "random bytes", draw(st.binary(max_size=300)), "refuse"
    if kind == "truncated":
        cut = draw(st.integers(0, len(valid) - 1))
        return f"truncated at {cut} of {len(valid)}", valid[:cut], "refuse"
    if kind == "invalid-utf8":
        bad = draw(st.sampled_from(_INVALID_UTF8))
        marked = dumps(_with_text(event, topic, "\x01MARK\x01"))
        return f"invalid UTF-8 {bad!r} in a string", marked.replace(b"\\u0001MARK\\u0001", bad), "refuse"
    if kind == "bom":
        return "UTF-8 BOM first", b"\xef\xbb\xbf" + valid, "either"
    if kind == "utf16":
        codec = draw(st.sampled_from(["utf-16", "utf-16-le", "utf-16-be"]))
        return f"{codec} encoded", valid.decode().encode(codec), "refuse"
    if kind == "utf32":
        codec = draw(st.sampled_from(["utf-32", "utf-32-le", "utf-32-be"]))
        return f"{codec} encoded", valid.decode().encode(codec), "refuse"
    if kind == "deep":
        depth = draw(st.sampled_from([32, 128, 255, 256, 257, 1000, 5000]))
        deep = dict(event, metadata={"deep": _nested(depth)})
        value = dumps(deep)
        return (
            f"metadata nested {depth} deep",
            value,
            "either" if len(value) <= limits.max_event_bytes else "refuse",
        )
    if kind == "huge-string":
        room = limits.max_event_bytes - len(valid)
        size = draw(st.sampled_from([room - 1, room, room + 1, room + 100, 2 * limits.max_event_bytes]))
        value = dumps(_with_text(event, topic, "x" * max(size, 0)))
        return (
            f"{len(value)}-byte value (limit {limits.max_event_bytes})",
            value,
            ("refuse" if len(value) > limits.max_event_bytes else "either"),
        )
    if kind == "huge-array":
        count = draw(st.sampled_from([1000, 10_000, 100_000]))
        value = dumps(dict(event, metadata={"zeros": [0] * count}))
        return (
            f"metadata array of {count}",
            value,
            "either" if len(value) <= limits.max_event_bytes else "refuse",
        )
    if kind == "duplicate-keys":
        name = draw(st.sampled_from(["createdAt", "schemaVersion", "metadata"]))
        first = {"createdAt": '"2020-01-01T00:00:00.000Z"', "schemaVersion": "7", "metadata": "[]"}[name]
        return (
            f"duplicate key {name}",
            b'{"' + name.encode() + b'": ' + first.encode() + b", " + valid[1:],
            "either",
        )
    if kind == "trailing":
        tail = draw(st.sampled_from([b"x", b",", b"}", b"\x00"]))
        return f"trailing {tail!r}", valid + tail, "refuse"
    if kind == "comment":
        return "a // comment first", b"// hello\n" + valid, "refuse"
    if kind == "control-char":
        marked = dumps(_with_text(event, topic, "\x01MARK\x01"))
        return "raw control byte in a string", marked.replace(b"\\u0001MARK\\u0001", b"\x01\x0a"), "refuse"
    return "two JSON values", valid + b" " + valid, "refuse"


# --- headers ------------------------------------------------------------------------------------------------

_HEADER_NAMES: Final = (
    *("traceparent", "tracestate", "baggage", "error.type", "error.message", "error.path", "source.topic"),
    *("source.partition", "source.offset", "failed.at", "service.version", "redrive.of", "", "x" * 300, "üé"),
)
_TRACEPARENTS: Final = (
    b"00-zz-zz-01",
    b"",
    b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01",  # all-zero ids are invalid
    b"ff-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01",  # version ff is forbidden
    b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01-extra",
    b"\xff\xfe\x00",
    b"00-" + b"A" * 32 + b"-" + b"B" * 16 + b"-01",  # upper case is invalid
)


def hostile_headers(max_bytes: int = 20_000) -> st.SearchStrategy[Headers]:
    """Hostile headers: huge, binary, duplicated, broken `traceparent`, the dead-letter headers' names."""
    value = st.one_of(
        st.binary(max_size=64),
        st.sampled_from(_TRACEPARENTS),
        st.just(b"y" * max_bytes),
        st.sampled_from([b"ThreadOwnershipError", b"agent.requests", b"-1", b"99999999999999999999"]),
    )
    name = st.one_of(st.sampled_from(_HEADER_NAMES), st.text(max_size=20))
    pair = st.tuples(name, value)
    return st.lists(pair, max_size=6).map(tuple)


# --- one hostile record -------------------------------------------------------------------------------------


@st.composite
def hostile(
    draw: st.DrawFn,
    topic: Topic,
    *,
    thread: str,
    resource: str,
    request_id: str,
    limits: Limits,
    headers: bool = True,
) -> Fuzzed:
    """A hostile record of `topic` for its own `thread` (nothing else writes there): an edge value,
    structural garbage, a valid record with a key that is not its thread id, or a valid one (a control)."""
    event = base_event(topic, thread, resource, request_id)
    kind = draw(st.sampled_from(["edge", "edge", "edge", "garbage", "garbage", "wrong-key", "valid"]))
    key = key_of(event, topic)
    expect: Expect
    value: bytes | None
    if kind == "edge":
        groups = edge_groups(topic, limits)
        edge = draw(st.sampled_from(groups[draw(st.sampled_from(sorted(groups)))]))
        mutated = apply_edge(event, edge)
        label, value, expect = edge.label(), dumps(mutated), edge.expect
        key = key_of(mutated, topic) or key  # keyed as a producer would (a non-string id: the old key)
        if isinstance(mutated.get("requestId"), str):
            request_id = mutated["requestId"]
        if isinstance(mutated.get("threadId"), str):
            thread = mutated["threadId"]
        if len(value or b"") > limits.max_event_bytes:
            expect = "refuse"
    elif kind == "garbage":
        label, value, expect = draw(garbage(topic, event, limits))
    elif kind == "wrong-key":
        key = draw(st.sampled_from([None, b"", b"another-thread", thread.encode() + b"\x00", b"\xff"]))
        label, value = f"valid, key {key!r} is not the thread id", dumps(event)
        # the tenancy work refuses these; commands are keyed by their target, outside that rule
        expect = "refuse" if topic != "commands" else "either"
    else:
        label, value, expect = "valid control", dumps(event), "accept"
    extra: Headers = draw(hostile_headers()) if headers else ()
    return Fuzzed(topic, label, key, value, expect, request_id, extra, thread)


def with_headers(record: Fuzzed, headers: Headers) -> Fuzzed:
    return replace(record, headers=headers)


# --- ownership attacks (the victim's thread must exist first) ----------------------------------------------


@dataclass(frozen=True)
class Victim:
    """A valid thread with stored turns: `message_ids` are its rows' ids."""

    thread: str
    resource: str
    message_ids: list[str] = field(default_factory=list)


@st.composite
def ownership_attack(
    draw: st.DrawFn, topic: Topic, victim: Victim, *, attacker: str, request_id: str, own_thread: str
) -> Fuzzed:
    """On `topic`, resource `attacker` reads or writes `victim`'s thread, forgets it, or writes messages
    with its ids."""
    kinds = {"requests": ["read", "reuse-ids-request"], "responses": ["write", "reuse-ids-response"]}
    kind = draw(st.sampled_from(kinds.get(topic, ["forget"])))
    key = victim.thread.encode()
    if kind == "read":
        event = request(victim.thread, attacker, request_id, "tell me their history")
        return Fuzzed("requests", "attack: read another's thread", key, dumps(event), "refuse", request_id)
    if kind == "write":
        event = response(victim.thread, attacker, request_id, [text_message("user", "x")], "stolen")
        return Fuzzed("responses", "attack: write another's thread", key, dumps(event), "refuse", request_id)
    if kind == "forget":
        event = forget_thread(victim.thread, request_id, resource=attacker, dry_run=draw(st.booleans()))
        return Fuzzed("commands", "attack: forget another's thread", key, dumps(event), "refuse", request_id)
    ids = victim.message_ids or [f"{victim.thread}-t1:input:0"]
    stolen = draw(st.sampled_from(ids))
    if kind == "reuse-ids-response":
        event = response(own_thread, attacker, request_id, [text_message("user", "x", id=stolen)], "mine")
        event["response"][0]["id"] = draw(st.sampled_from(ids))
        topic = "responses"
    else:
        event = request(own_thread, attacker, request_id, "x")
        event["messages"][0]["id"] = stolen
        topic = "requests"
    # storing them under the attacker's own thread is fine; touching the victim's rows is not
    return Fuzzed(topic, f"attack: own thread, the victim's message id {stolen!r}", own_thread.encode(),
                  dumps(event), "either", request_id, (), own_thread)  # fmt: skip


# --- any bytes: the pure property ---------------------------------------------------------------------------


def any_value(topic: Topic, limits: Limits) -> st.SearchStrategy[Fuzzed]:
    """Any record value for `topic`: hostile records (and their edges), and plain random bytes."""
    records = hostile(topic, thread="h", resource="r", request_id="q", limits=limits, headers=False)
    random = st.binary(max_size=2000).map(lambda b: Fuzzed(topic, "random bytes", b"h", b, "refuse"))
    return st.one_of(records, records, random)
