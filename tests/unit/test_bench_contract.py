"""B4, the contract's floor (`bench.contract`): the commands its lines issue, in their trips (pure parts, and
the trips against a recording stand-in for the raw-coded database: which commands, on which collections,
which of them together)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pymongo import UpdateOne

from bench import contract, mongo_lines, passthrough, targets
from bench.idle import contract_header
from bench.stats import LineResult, ratios
from bench.workload import Workload, request_event

AT = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class _Db:
    """Records each command's start and end as ("start" | "end", command, collection); a command yields to
    the loop once in between, so commands issued together all start before the first one ends."""

    events: list[tuple[str, str, str]] = field(default_factory=list)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)

    def __getitem__(self, name: str) -> _Collection:
        return _Collection(self, name)

    async def run(self, command: str, collection: str, found: list[Any]) -> list[Any]:
        self.events.append(("start", command, collection))
        await asyncio.sleep(0)
        self.events.append(("end", command, collection))
        return found

    def trips(self) -> list[list[str]]:
        """The commands in sequence: a trip is the commands started before the first of them ended."""
        out: list[list[str]] = []
        current: list[str] = []
        running = 0
        for kind, command, collection in self.events:
            if kind == "start":
                if running == 0 and current:
                    out.append(current)
                    current = []
                current.append(f"{command} {collection}")
                running += 1
            else:
                running -= 1
        return [*out, current] if current else out


@dataclass
class _Collection:
    db: _Db
    name: str

    def find(self, query: dict[str, Any], projection: Any = None, **options: Any) -> _Cursor:
        self.db.calls.append(("find", self.name, {"query": query, "projection": projection, **options}))
        return _Cursor(self.db, self.name)

    async def bulk_write(self, ops: list[UpdateOne], *, ordered: bool) -> None:
        self.db.calls.append(("bulk_write", self.name, {"ops": ops, "ordered": ordered}))
        await self.db.run("bulk_write", self.name, [])


@dataclass
class _Cursor:
    db: _Db
    name: str

    def sort(self, *_: Any) -> _Cursor:
        return self

    def limit(self, n: int) -> _Cursor:
        self.db.calls.append(("limit", self.name, n))
        return self

    def batch_size(self, _: int) -> _Cursor:
        return self

    async def to_list(self) -> list[Any]:
        return await self.db.run("find", self.name, [{}, {}] if self.name == "mastra_messages" else [])


def _doc(op: UpdateOne) -> dict[str, Any]:
    return cast("dict[str, Any]", op._doc)


def _turns(n: int) -> list[contract.Turn]:
    return [contract.Turn(f"t{i}", f"r{i}", f"t{i}:t7", AT) for i in range(n)]


async def test_recall_trips_are_the_three_finds_together_then_the_busy_marks() -> None:
    """B2's two finds and the busy markers' find in one trip, the marks' ordered bulk after: a line that
    stops issuing one of them (or issues them in sequence) fails here."""
    db = _Db()
    rows = await contract.recall_trips(cast("Any", db), contract.recall_plan(_turns(3), 40, AT))
    assert db.trips() == [
        ["find mastra_threads", "find mastra_messages", "find message_history_turns"],
        ["bulk_write message_history_turns"],
    ]
    assert rows == 2  # the messages' find's rows
    finds = {name: spec for kind, name, spec in db.calls if kind == "find"}
    assert finds["mastra_messages"]["query"] == {"thread_id": {"$in": ["t0", "t1", "t2"]}}  # B2's
    assert ("limit", "mastra_messages", 3 * 40 + 1) in db.calls
    assert finds["message_history_turns"]["query"] == {"_id": {"$in": ["t0", "t1", "t2"]}}
    [marks] = [spec for kind, _, spec in db.calls if kind == "bulk_write"]
    assert marks["ordered"] is True
    assert [op._filter for op in marks["ops"]] == [{"_id": "t0"}, {"_id": "t1"}, {"_id": "t2"}]
    assert marks["ops"][0]._doc == {"$set": {"pending": "t0:t7", "enrichedAt": AT, "resourceId": "r0"}}


async def test_recall_of_one_thread_is_the_storages_page_query() -> None:
    """One thread (the idle forwarder's): the page filtered on its resource, `limit` rows, as
    `MongoRecall._find_page`; the thread by equality."""
    db = _Db()
    await contract.recall_trips(cast("Any", db), contract.recall_plan(_turns(1), 40, AT))
    finds = {name: spec for kind, name, spec in db.calls if kind == "find"}
    assert finds["mastra_messages"]["query"] == {"thread_id": "t0", "resourceId": "r0"}
    assert finds["mastra_threads"]["query"] == {"id": "t0"}
    assert ("limit", "mastra_messages", 40) in db.calls


async def test_persist_trips_are_three_finds_together_then_two_bulks_together() -> None:
    """Homes and copies, threads, tombstones in one trip; the messages' and the threads' bulks in the next,
    unordered, the threads keyed by their stored `_id`."""
    db = _Db()
    keys = {"t0": "oid-0"}
    trips = contract.persist_plan(_turns(2), [("u", "a")] * 2, keys)
    await contract.persist_trips(cast("Any", db), trips)
    assert db.trips() == [
        ["find mastra_messages", "find mastra_threads", "find message_history_forgotten"],
        ["bulk_write mastra_messages", "bulk_write mastra_threads"],
    ]
    finds = {name: spec for kind, name, spec in db.calls if kind == "find"}
    assert finds["mastra_messages"]["query"] == {
        "id": {"$in": ["t0:t7:in", "t0:t7:out", "t1:t7:in", "t1:t7:out"]}
    }
    assert finds["message_history_forgotten"]["query"] == {
        "_id": {"$in": ["thread:t0", "thread:t1", "resource:r0", "resource:r1"]}
    }
    bulks = {name: spec for kind, name, spec in db.calls if kind == "bulk_write"}
    assert all(spec["ordered"] is False for spec in bulks.values())
    assert [op._filter for op in bulks["mastra_threads"]["ops"]] == [{"_id": "oid-0"}, {"_id": "t1"}]
    assert [op._filter for op in bulks["mastra_messages"]["ops"]][:2] == [
        {"_id": "t0:t7:in"},
        {"_id": "t0:t7:out"},
    ]


def test_persist_plan_shapes_the_writes_as_the_storage() -> None:
    """`$set` of the fields, `createdAt` on insert, the extra field unset; a thread's `$max updatedAt` over
    its turns; a `suffix` makes ids of one's own."""
    turns = [*_turns(1), contract.Turn("t0", "r0", "t0:t8", AT.replace(hour=5))]
    trips = contract.persist_plan(turns, [("u", "a"), ("u2", "a2")], {}, suffix=":fwd")
    first = _doc(trips.messages[0])
    assert first["$set"] == {
        "id": "t0:t7:in:fwd",
        "thread_id": "t0",
        "content": "u",
        "role": "user",
        "type": "v2",
        "resourceId": "r0",
    }
    assert first["$setOnInsert"] == {"createdAt": AT}
    assert "$unset" in first
    [thread] = trips.threads
    assert _doc(thread)["$max"] == {"updatedAt": AT.replace(hour=5)}
    assert _doc(thread)["$setOnInsert"]["createdAt"] == AT
    assert trips.thread_ids == ["t0"]


async def test_b4_lines_issue_the_contracts_commands() -> None:
    """The lines' batches (`mongo_lines`) are the contract's trips, with B2's page and B3's ids; other kinds
    have none."""
    w = Workload(threads=4, history=6, message_bytes=64, batch=4, partitions=1, run_id="abc")
    db = _Db()
    assert mongo_lines._contract_trips(cast("Any", db), "b2", w, range(4), 3, {}) is None
    recall = mongo_lines._contract_trips(cast("Any", db), "b4_recall", w, range(4), 3, {})
    assert recall is not None
    assert await recall() == 2
    assert ("limit", "mastra_messages", 4 * 6 + 1) in db.calls
    persist = mongo_lines._contract_trips(cast("Any", db), "b4_persist", w, range(4), 3, {})
    assert persist is not None
    db.events.clear()
    await persist()
    assert len(db.trips()) == 2
    b3_messages, _ = mongo_lines._raw_writes(w, range(4), 3)
    [written] = [spec for kind, name, spec in db.calls if kind == "bulk_write" and name == "mastra_messages"]
    assert [op._filter for op in written["ops"]] == [op._filter for op in b3_messages]
    assert [_doc(op)["$set"] for op in written["ops"]] == [_doc(op)["$set"] for op in b3_messages]


def test_the_idle_header_names_the_requests_turn() -> None:
    """The contract forwarder reads the turn the harness names: the request's own ids and time."""
    w = Workload(threads=4, history=6, message_bytes=64, batch=4, partitions=1, run_id="abc")
    key, value = contract_header(w, 2, 9)
    turn = contract.turn_from_header([("bench-seq", b"1"), (key, value)])
    event = request_event(w, 2, 9)
    assert turn is not None
    assert (turn.thread_id, turn.resource_id, turn.request_id) == (
        event["threadId"],
        event["resourceId"],
        event["requestId"],
    )
    assert turn.created_at == datetime.fromisoformat(event["createdAt"])
    assert contract.turn_from_header([("bench-seq", b"1")]) is None


async def test_the_contract_forwarder_makes_the_trips_before_the_output() -> None:
    """A recall record: the three finds done before it is sent, the busy marks returned to run beside the
    send; a persist record: all five commands done before it is sent, its messages ids of its own."""
    db = _Db()
    client = SimpleNamespace(__getitem__=None)
    trips = object.__new__(passthrough._ContractTrips)
    trips._client = cast("Any", client)
    trips._db = cast("Any", db)
    trips._recall_topic = "in-recall"
    trips._limit = 40
    trips._keys = {}
    trips._contents = ("u", "a")
    turn = contract.Turn("t0", "r0", "t0:t7", AT)
    headers = [(contract.CONTRACT_HEADER, contract.turn_header(turn))]
    after = await trips.before_send([SimpleNamespace(topic="in-recall", headers=headers)])
    assert [kind for kind, _, _ in db.events].count("end") == 3  # the finds, before the send
    assert len(after) == 1
    await asyncio.gather(*after)
    assert db.trips()[-1] == ["bulk_write message_history_turns"]
    db.events.clear()
    assert await trips.before_send([SimpleNamespace(topic="in-persist", headers=headers)]) == []
    assert db.trips() == [
        ["find mastra_messages", "find mastra_threads", "find message_history_forgotten"],
        ["bulk_write mastra_messages", "bulk_write mastra_threads"],
    ]
    written = [spec for kind, name, spec in db.calls if kind == "bulk_write" and name == "mastra_messages"]
    assert [op._filter["_id"] for op in written[-1]["ops"]] == ["t0:t7:in:fwd", "t0:t7:out:fwd"]


def _line(name: str, cpu_per_1k: float | None = None, p50: float | None = None) -> LineResult:
    result = LineResult(name, 1000, 1.0, cpu_per_1k, None)
    if p50 is not None:
        result.latencies_ms = [p50]
    return result


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("recall_cpu_vs_contract_floor", 0.9 / (0.3 + 0.3)),
        ("recall_contract_floor_vs_floor", (0.3 + 0.3) / (0.3 + 0.2)),
        ("persist_cpu_vs_contract_floor", 0.2 / (0.03 + 0.05)),
        ("persist_contract_floor_vs_floor", (0.03 + 0.05) / (0.03 + 0.03)),
        ("recall_idle_p50_vs_contract", 5.0 / 4.0),
        ("recall_idle_contract_vs_forwarder", 4.0 / 2.0),
        ("persist_idle_p50_vs_contract", 6.0 / 3.0),
        ("persist_idle_contract_vs_forwarder", 3.0 / 2.0),
    ],
)
def test_contract_ratios(key: str, expected: float) -> None:
    lines = {
        line.name: line
        for line in (
            _line("service_recall", 0.9),
            _line("b1_recall", 0.3),
            _line("b2_recall_queries", 0.2),
            _line("b4_recall_contract", 0.3),
            _line("service_persist", 0.2),
            _line("b1_persist", 0.03),
            _line("b3_bulk_upserts", 0.03),
            _line("b4_persist_contract", 0.05),
            _line("idle_service_recall", p50=5.0),
            _line("idle_contract_recall", p50=4.0),
            _line("idle_forwarder_recall", p50=2.0),
            _line("idle_service_persist", p50=6.0),
            _line("idle_contract_persist", p50=3.0),
            _line("idle_forwarder_persist", p50=2.0),
        )
    }
    assert ratios(lines)[key] == pytest.approx(expected, rel=1e-3)
    del lines["b4_recall_contract"], lines["idle_contract_persist"]
    missing = ratios(lines)
    assert missing["recall_cpu_vs_contract_floor"] is None
    assert missing["persist_idle_p50_vs_contract"] is None


@pytest.mark.parametrize(
    ("floors", "service", "expected"),
    [
        (1.8, 2.2, "beyond the floor: the contract's floor alone is 1.8x the issue's (bound 1.5)"),
        (1.2, 1.6, "within the floor: the service may be 1.25x the contract's floor, is 1.6x"),
        (None, 1.6, "not measured"),
        (1.8, None, "beyond the floor: the contract's floor alone is 1.8x the issue's (bound 1.5)"),
        (1.2, None, "not measured"),
    ],
)
def test_contract_verdict(floors: float | None, service: float | None, expected: str) -> None:
    """A bound over the issue's floor, read against the contract's: beyond it when the contract's floor
    alone passes the bound (whether the service was measured or not); else the room left to the service over
    the contract's floor."""
    assert targets.contract_verdict(1.5, floors, service) == expected


def test_render_contract_has_the_floor_targets() -> None:
    text = targets.render_contract(
        {
            "persist_cpu_vs_floor": 3.5,
            "persist_cpu_vs_contract_floor": 1.4,
            "persist_contract_floor_vs_floor": 2.5,
        }
    )
    rows = [r for r in text.splitlines() if r.startswith("| ") and "figure" not in r]
    assert [r.split(" | ")[0] for r in rows] == [
        "| recall CPU per event",
        "| persist CPU per event",
        "| recall CPU per event, contract stream",
        "| persist CPU per event, contract stream",
        "| idle recall p50",
        "| idle persist p50",
        "| recall p99 at half capacity",
        "| persist p99 at half capacity",
    ]
    assert rows[1].startswith("| persist CPU per event | 3.5 | 1.4 | 2.5 | <= 2 | beyond the floor")
    assert {targets._goal(r.key).at_most for r in targets.CONTRACT_ROWS} == {True}
