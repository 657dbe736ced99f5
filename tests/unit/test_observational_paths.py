"""The OM paths' decisions on an in-memory row (the real broker and MongoDB: tests/integration/
test_observational_stream.py): which observer answers the observed path applies, and what recall makes of
the log."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from consumers.contract import Refused, delivered
from consumers.observational import Unobserved, thread_hints
from consumers.observe_recall import ObservationRecall
from consumers.observe_results import ObserveResultsHandler
from message_history import metrics
from message_history.core.observation_hints import StoredStamp
from message_history.core.om_tokens import count_observations
from message_history.errors import FatalStorageError, InvalidInputError, RetriableError
from message_history.settings import Settings
from schemas.events import AgentRequest, EnrichedRequest
from schemas.limits import Limits
from schemas.observational import (
    EXTRACTED_MAX_BYTES,
    EXTRACTED_MAX_DEPTH,
    THREAD_TITLE_MAX_CHARS,
    ObserveResult,
)
from storage.observational import Claim, ObservationalRecord, ObservationUpdate
from storage.observational_resource import ThreadPage, ThreadRead
from storage.protocol import Thread
from tests.om_helpers import om_row
from tests.paths import no_emit

T0 = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)


def _row(**fields: Any) -> ObservationalRecord:
    return om_row(**{"_mh_cycle": 3, **fields})


class Rows:
    """One thread's newest row, and what was written to it."""

    def __init__(self, row: ObservationalRecord | None, stamps: Sequence[StoredStamp] = ()) -> None:
        self.row = row
        self.stamps = list(stamps)
        self.asked: list[tuple[list[str], list[str], str]] = []
        self.applied: list[dict[str, Any]] = []
        self.released: list[Claim] = []
        self.cursors: list[tuple[Any, ...]] = []
        self.titles: list[tuple[Any, ...]] = []
        self.thread_rows: dict[str, ThreadRead] = {}  # as read by `hint_rows` (the owner `u1`'s)
        self.threads: dict[str, datetime | None] = {}
        self.messages: list[dict[str, Any]] = []
        self.read_from: list[dict[str, datetime | None]] = []

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None:
        key = f"thread:{thread_id}" if thread_id else f"resource:{resource_id}"
        if self.row is None or self.row.lookup_key != key:  # as the store: by the key alone
            return None
        return self.row

    async def covered(self, record: ObservationalRecord) -> int:
        return 7

    async def resource_cursors(self, resource_id: str, max_threads: int) -> dict[str, datetime | None]:
        return dict(self.threads)

    async def resource_threads(
        self, resource_id: str, limit: int, after: Any, *, include: str | None = None
    ) -> ThreadPage:
        return ThreadPage(dict(self.threads), None)

    async def keep_threads_after(self, record_id: str, after: Any) -> None:
        raise AssertionError("one page holds every thread: no position to keep")

    async def resource_messages(
        self, resource_id: str, cursors: Mapping[str, datetime | None], limit: int
    ) -> list[dict[str, Any]]:
        self.read_from.append(dict(cursors))
        return [m for m in self.messages if m["threadId"] in cursors][-limit:]

    async def release(self, claim: Claim, now: datetime) -> bool:
        self.released.append(claim)
        return True

    async def apply_observation(self, claim: Claim, update: ObservationUpdate, now: datetime) -> bool:
        self.applied.append({"claim": claim, "log": update.observations, "tokens": update.token_count})
        return True

    async def apply_reflection(
        self, claim: Claim, *, reflection: str, token_count: int, now: datetime
    ) -> ObservationalRecord | None:
        self.applied.append({"claim": claim, "reflection": reflection, "tokens": token_count})
        return self.row

    async def hint_rows(self, resource_id: str, thread_ids: Sequence[str]) -> dict[str, ThreadRead]:
        if resource_id != "u1":
            return {}
        return {t: self.thread_rows[t] for t in thread_ids if t in self.thread_rows}

    async def write_threads(
        self,
        resource_id: str,
        cursors: Sequence[tuple[str, datetime | None, Mapping[str, object]]],
        titles: Sequence[tuple[str, str, object]],
        now: datetime,
    ) -> int:
        self.cursors.extend((resource_id, *cursor) for cursor in cursors)
        self.titles.extend((resource_id, *title) for title in titles)
        return len(cursors) + len(titles)

    async def message_stamps(
        self, message_ids: Sequence[str], thread_ids: Collection[str], resource_id: str
    ) -> list[StoredStamp]:
        self.asked.append((list(message_ids), list(thread_ids), resource_id))
        # the store's order is none in particular
        return [s for s in reversed(self.stamps) if s.id in message_ids and s.thread_id in thread_ids]


@dataclasses.dataclass
class Rec:
    value: bytes | None
    topic: str = "od"
    partition: int = 0
    offset: int = 0
    key: bytes | None = b"t1"
    headers: Sequence[tuple[str, bytes | None]] | None = None


def _result(**fields: Any) -> bytes:
    event = {
        "type": "ObserveResult",
        "schemaVersion": 1,
        "requestId": "r1",
        "createdAt": "2025-03-01T10:05:00.000Z",
        "scope": "thread",
        "threadId": "t1",
        "resourceId": "u1",
        "recordId": "row-1",
        "generation": 0,
        "cycle": 3,
        "observations": "- user plans a trip",
        "observedMessageIds": ["m1"],
        "lastObservedAt": "2025-03-01T10:00:00.000Z",
        **fields,
    }
    return json.dumps(event).encode()


async def _handle(rows: Rows, *values: bytes | None) -> list[object]:
    handler = ObserveResultsHandler(rows=rows, limits=Limits())
    outcomes: list[object] = []
    for result in await handler.handle([Rec(v) for v in values], no_emit):
        outcomes.append(result.error if isinstance(result, Refused) else await delivered(result))
    return outcomes


async def test_the_current_claims_answer_is_applied_after_a_boundary() -> None:
    rows = Rows(_row(activeObservations="- earlier", lastObservedAt=T0))
    await _handle(rows, _result())
    [applied] = rows.applied
    assert applied["claim"] == Claim("row-1", 0, 3, "observe")
    assert applied["log"].startswith("- earlier\n\n--- message boundary (2025-03-01T10:00:00.000Z) ---")
    assert applied["log"].endswith("- user plans a trip")
    assert applied["tokens"] == count_observations(applied["log"])


NO_HINTS: dict[str, object] = {
    "currentTask": None,
    "suggestedResponse": None,
    "threadTitle": None,
    "extracted": {},
}
"""The hints of an answer that carries none, on a thread without `extracted` (Mastra's `undefined`s: null)."""


def _resource_row(**fields: Any) -> ObservationalRecord:
    return _row(lookupKey="resource:u1", scope="resource", threadId=None, **fields)


def _threads(*entries: tuple[str, str, str]) -> list[dict[str, Any]]:
    return [
        {"threadId": t, "observations": text, "lastObservedAt": at, "currentTask": f"task {t}"}
        for t, text, at in entries
    ]


async def test_a_resource_answer_is_merged_per_thread_and_moves_each_threads_cursor() -> None:
    """Each thread's observations in its `<thread>` section; each thread's cursor its own newest message's;
    the row's `lastObservedAt` the newest of all, its observed ids the union (Mastra's resource strategy)."""
    rows = Rows(_resource_row(activeObservations='<thread id="a">\nDate: Mar 1, 2025\n* a0\n</thread>',
                              observedMessageIds=["old"]))  # fmt: skip
    result = _result(
        scope="resource",
        threadId=None,
        observations="",
        observedMessageIds=["m1", "m2"],
        threads=_threads(
            ("a", "Date: Mar 1, 2025\n* a1", "2025-03-01T09:00:00.000Z"),
            ("b", "* b1", "2025-03-01T09:30:00.000Z"),
        ),
    )
    assert await _handle(rows, result) == [None]
    [applied] = rows.applied
    assert applied["log"] == (
        '<thread id="a">\nDate: Mar 1, 2025\n* a0\n* a1\n</thread>'
        '\n\n--- message boundary (2025-03-01T09:30:00.000Z) ---\n\n<thread id="b">\n* b1\n</thread>'
    )
    assert rows.cursors == [
        ("u1", "a", datetime(2025, 3, 1, 9, 0, tzinfo=UTC), {**NO_HINTS, "currentTask": "task a"}),
        ("u1", "b", datetime(2025, 3, 1, 9, 30, tzinfo=UTC), {**NO_HINTS, "currentTask": "task b"}),
    ]


async def test_a_stale_resource_answer_moves_no_cursor() -> None:
    rows = Rows(_resource_row(_mh_cycle=4))
    result = _result(
        scope="resource", threadId=None, threads=_threads(("a", "* a1", "2025-03-01T09:00:00.000Z"))
    )
    await _handle(rows, result)
    assert rows.applied == []
    assert rows.cursors == []


@pytest.mark.parametrize(
    "fields",
    [
        {"scope": "resource", "threadId": None},  # no threads: which thread's observations?
        {"threads": _threads(("a", "x", "2025-03-01T09:00:00.000Z"))},  # threads with thread scope
        {"scope": "resource", "threadId": None, "threads": _threads(("", "x", "2025-03-01T09:00:00.000Z"))},
    ],
)
async def test_a_resource_answer_without_its_threads_is_a_dead_letter(fields: dict[str, Any]) -> None:
    rows = Rows(_resource_row())
    [outcome] = await _handle(rows, _result(**fields))
    assert isinstance(outcome, Exception)
    assert rows.applied == []


@pytest.mark.parametrize(
    ("row", "result"),
    [
        (_row(_mh_cycle=4), {}),  # the claim timed out and was taken again: a late answer
        (_row(isObserving=False), {}),  # already applied: a repeated answer
        (_row(generationCount=1), {}),  # reflected since
        (_row(id="row-2"), {}),  # another row of the key (recreated after a forget)
        (_row(), {"threadId": "t2"}),  # another thread's key: never reaches this row by its id
        (_row(), {"resourceId": "u2"}),  # another tenant's
        (None, {}),  # forgotten
    ],
)
async def test_an_answer_to_no_current_claim_writes_nothing(
    row: ObservationalRecord | None, result: dict[str, Any]
) -> None:
    rows = Rows(row)
    assert await _handle(rows, _result(**result)) == [None]  # acknowledged: not a dead letter
    assert rows.applied == []
    assert rows.released == []


async def test_an_observer_error_releases_the_claim() -> None:
    rows = Rows(_row())
    await _handle(rows, _result(error="model timed out"))
    assert rows.released == [Claim("row-1", 0, 3, "observe")]
    assert rows.applied == []


async def test_a_reflection_answers_its_own_claim() -> None:
    rows = Rows(_row(isObserving=False, isReflecting=True))
    reflect = {"type": "ReflectResult", "reflection": "- condensed"}
    value = json.loads(_result())
    for name in ("observations", "observedMessageIds", "lastObservedAt"):
        value.pop(name)
    await _handle(rows, json.dumps({**value, **reflect}).encode())
    [applied] = rows.applied
    assert applied["claim"] == Claim("row-1", 0, 3, "reflect")
    assert applied["tokens"] == count_observations("- condensed")


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"{not json",
        _result(cycle=-1),
        _result(type="Other"),
        _result(scope="resource"),  # a thread with resource scope
        json.dumps({k: v for k, v in json.loads(_result()).items() if k != "schemaVersion"}).encode(),
    ],
)
async def test_a_bad_answer_is_a_dead_letter(value: bytes | None) -> None:
    rows = Rows(_row())
    [outcome] = await _handle(rows, value)
    assert isinstance(outcome, InvalidInputError)
    assert rows.applied == []


def _message(ident: str, role: str, at: str, source: str, text: str) -> dict[str, Any]:
    return {
        "id": ident,
        "role": role,
        "createdAt": at,
        "threadId": "t1",
        "resourceId": "u1",
        "source": source,
        "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
    }


REQUEST = AgentRequest.model_validate(
    {
        "schemaVersion": 1,
        "requestId": "r9",
        "threadId": "t1",
        "resourceId": "u1",
        "createdAt": "2025-03-01T11:00:00.000Z",
        "messages": [{"role": "user", "content": "and now?"}],
        "memory": {"observationalMemory": True},
    }
)
ENRICHED = EnrichedRequest.model_validate(
    {
        **REQUEST.model_dump(mode="json"),
        "messages": [
            _message("m1", "user", "2025-03-01T09:59:00.000Z", "memory", "old question"),
            _message("m2", "assistant", "2025-03-01T10:00:00.000Z", "memory", "old answer"),
            _message("m3", "user", "2025-03-01T10:30:00.000Z", "memory", "newer question"),
            _message("m4", "user", "2025-03-01T11:00:00.000Z", "input", "and now?"),
        ],
        "history": {"recalled": 3, "limit": 40},
        "eventId": "r9",
    }
)


async def test_recall_puts_the_log_in_place_of_what_it_covers() -> None:
    rows = Rows(_row(activeObservations="- user plans a trip to Turin", lastObservedAt=T0, isObserving=False))
    event = await ObservationRecall(Settings(), rows).enrich(REQUEST, ENRICHED)
    assert isinstance(event, EnrichedRequest)
    ids = [m.id for m in event.messages]
    context = [i for i in ids if i.startswith("om-observations-")]
    assert context  # the log's system messages first, then the reminder
    assert ids == [*context, "om-continuation", "m3", "m4"]  # m1, m2: at or before lastObservedAt
    assert {m.role for m in event.messages if m.id in context} == {"system"}
    assert any("- user plans a trip to Turin" in p.text for m in event.messages for p in m.content.parts)  # type: ignore[union-attr]
    assert event.history.observed == 7
    assert event.history.observationTokens == count_observations("- user plans a trip to Turin")
    assert event.history.recalled == len(ids) - 1
    wire = json.loads(event.model_dump_json(exclude_unset=True))
    assert wire["history"]["observed"] == 7  # written on the wire


async def test_recall_without_a_log_says_nothing_is_observed() -> None:
    event = await ObservationRecall(Settings(), Rows(None)).enrich(
        REQUEST, ENRICHED.model_dump_json().encode()
    )
    assert isinstance(event, EnrichedRequest)
    assert [m.id for m in event.messages] == ["m1", "m2", "m3", "m4"]
    assert (event.history.observed, event.history.observationTokens) == (0, 0)


def test_recall_only_for_requests_with_om() -> None:
    recall = ObservationRecall(Settings(), Rows(None))
    assert recall.wants(REQUEST)
    assert not recall.wants(REQUEST.model_copy(update={"memory": None}))
    assert ObservationRecall(Settings(observational_memory=True), Rows(None)).wants(
        REQUEST.model_copy(update={"memory": None})
    )


class Broken(Rows):
    """A row read that meets a bug (or an outage)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(None)
        self.error = error

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None:
        raise self.error


async def test_a_failure_leaves_the_recall_as_it_was() -> None:
    """A bug in the observations' part never refuses the turn: the event goes out as recalled."""
    event = await ObservationRecall(Settings(), Broken(KeyError("bug"))).enrich(REQUEST, ENRICHED)
    assert event is ENRICHED


async def test_an_outage_is_not_swallowed() -> None:
    from message_history.errors import RetriableError  # noqa: PLC0415

    with pytest.raises(RetriableError):
        await ObservationRecall(Settings(), Broken(RetriableError("mongodb down"))).enrich(REQUEST, ENRICHED)


class Threads:
    def __init__(self, metadata: dict[str, Any]) -> None:
        self.metadata = metadata
        self.saved: list[tuple[str, dict[str, Any]]] = []

    async def get_thread(self, thread_id: str) -> Thread | None:
        return Thread(id=thread_id, resourceId="u1", metadata=self.metadata)

    async def save_thread_metadata(self, thread_id: str, update: dict[str, Any]) -> None:
        self.saved.append((thread_id, update))


async def test_recall_adds_the_threads_current_task_as_mastra_keeps_it() -> None:
    """`metadata.mastra.om.currentTask` / `suggestedResponse` (Mastra's `setThreadOMMetadata`) follow the
    log."""
    rows = Rows(_row(activeObservations="- a trip", lastObservedAt=T0, isObserving=False))
    hints = {"mastra": {"om": {"currentTask": "book the train", "suggestedResponse": "Ask for dates"}}}
    event = await ObservationRecall(Settings(), rows, Threads(hints)).enrich(REQUEST, ENRICHED)
    assert isinstance(event, EnrichedRequest)
    texts = [p.text for m in event.messages if m.role == "system" for p in m.content.parts]  # type: ignore[union-attr]
    assert "<current-task>\nbook the train\n</current-task>" in texts
    assert "<suggested-response>\nAsk for dates\n</suggested-response>" in texts


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({}, (None, None)),
        ({"mastra": "x"}, (None, None)),
        ({"mastra": {"om": {"currentTask": 3, "suggestedResponse": ""}}}, (None, None)),
        ({"mastra": {"om": {"currentTask": "t"}}}, ("t", None)),
    ],
)
def test_thread_hints_read_leniently(
    metadata: dict[str, Any], expected: tuple[str | None, str | None]
) -> None:
    assert thread_hints(metadata) == expected


async def test_the_observers_current_task_goes_to_the_thread() -> None:
    """Thread scope: the hints under the thread's `metadata.mastra.om` (no `lastObservedAt`: Mastra's thread
    scope keeps none in the thread), the owner the answer's (`u1`); the hints the answer lacks null."""
    rows = Rows(_row())
    handler = ObserveResultsHandler(rows=rows, limits=Limits())
    await handler.handle([Rec(_result(currentTask="book the train"))], no_emit)
    assert rows.cursors == [("u1", "t1", None, {**NO_HINTS, "currentTask": "book the train"})]
    stale_rows = Rows(_row(_mh_cycle=9))
    stale = ObserveResultsHandler(rows=stale_rows, limits=Limits())
    await stale.handle([Rec(_result(currentTask="late"))], no_emit)  # not applied: no hint written either
    assert (stale_rows.cursors, stale_rows.titles) == ([], [])


def _stored(ident: str, thread: str, at: str) -> StoredStamp:
    return StoredStamp(ident, thread, datetime.fromisoformat(at))


async def test_the_observers_title_and_the_newest_messages_cursor_go_to_the_thread() -> None:
    """As Mastra's `SyncObservationStrategy.persist`: `threadTitle` trimmed, `lastObservedMessageCursor` the
    newest observed message (as stored, this thread's only: `m9` is another thread's and not asked for)."""
    stored = [
        _stored("m1", "t1", "2025-03-01T09:00:00.000Z"),
        _stored("m2", "t1", "2025-03-01T09:30:00.000Z"),
        _stored("m9", "t2", "2025-03-01T11:00:00.000Z"),
    ]
    rows = Rows(_row(), stored)
    handler = ObserveResultsHandler(rows=rows, limits=Limits())
    result = _result(threadTitle="  Trip to Lyon ", observedMessageIds=["m1", "m2", "m9"])
    await handler.handle([Rec(result)], no_emit)
    assert rows.asked == [(["m1", "m2", "m9"], ["t1"], "u1")]
    assert rows.cursors == [
        (
            "u1",
            "t1",
            None,
            {
                **NO_HINTS,
                "threadTitle": "Trip to Lyon",
                "lastObservedMessageCursor": {"createdAt": "2025-03-01T09:30:00.000Z", "id": "m2"},
            },
        )
    ]
    assert rows.titles == []  # the thread was not read (missing, or another's): no title


@pytest.mark.parametrize(
    ("read", "title", "expected"),
    [
        (ThreadRead("Old", {}, None), " Trip to Lyon ", [("u1", "t1", "Trip to Lyon", "Old")]),
        (ThreadRead(None, None, None), "Lyon", [("u1", "t1", "Lyon", None)]),
        (ThreadRead("Old", {"titlePinned": True}, None), "Trip to Lyon", []),  # pinned: Mastra keeps it
        (
            ThreadRead("Old", {"titlePinned": "true"}, None),
            "Trip to Lyon",
            [("u1", "t1", "Trip to Lyon", "Old")],
        ),
        (ThreadRead(" Lyon ", {}, None), "Lyon", []),  # the same, trimmed
        (ThreadRead("Old", {}, None), "Ly", []),  # under 3 characters
        (ThreadRead("Old", {}, None), None, []),
    ],
)
async def test_the_threads_title_as_mastras_patch_thread(
    read: ThreadRead, title: str | None, expected: list[tuple[Any, ...]]
) -> None:
    """The title write (conditional on the title as read: `storage.observational_resource.write_threads`)
    follows Mastra's `resolveThreadTitleUpdate`; the metadata's `threadTitle` is written whatever it says."""
    rows = Rows(_row())
    rows.thread_rows["t1"] = read
    await _handle(rows, _result(threadTitle=title))
    assert rows.titles == expected
    assert len(rows.cursors) == 1


@pytest.mark.parametrize(
    ("was", "extracted", "expected"),
    [
        (None, None, {"extracted": {}}),  # Mastra's `{...undefined ?? {}, ...{}}`
        (None, {"mood": "calm", "skip": None, "empty": ""}, {"extracted": {"mood": "calm"}}),
        ({"mood": "tense", "topic": "trains"}, {"mood": "calm"}, {"extracted.mood": "calm"}),  # the rest kept
        ({"topic": "trains"}, {}, {}),
        ("not an object", {"mood": "calm"}, {"extracted": {"mood": "calm"}}),
    ],
)
async def test_extracted_is_merged_as_mastra_merges_it(
    was: object, extracted: dict[str, Any] | None, expected: dict[str, object]
) -> None:
    rows = Rows(_row())
    rows.thread_rows["t1"] = ThreadRead("T", {}, was)
    await _handle(rows, _result(extracted=extracted))
    [(_, _, _, hints)] = rows.cursors
    base = {k: v for k, v in NO_HINTS.items() if k != "extracted"}
    assert hints == {**base, **expected}


async def test_a_huge_title_is_a_dead_letter_and_writes_nothing() -> None:
    """The title's bound (`THREAD_TITLE_MAX_CHARS`): without it this answer would apply and put the megabyte
    in the thread row."""
    rows = Rows(_row(), [_stored("m1", "t1", "2025-03-01T09:00:00.000Z")])
    handler = ObserveResultsHandler(rows=rows, limits=Limits())
    [outcome] = await handler.handle([Rec(_result(threadTitle="x" * (THREAD_TITLE_MAX_CHARS + 1)))], no_emit)
    assert isinstance(outcome, Refused)
    assert "threadTitle" in str(outcome.error)
    assert (rows.applied, rows.cursors) == ([], [])
    ok = _result(threadTitle="x" * THREAD_TITLE_MAX_CHARS)
    [done] = await handler.handle([Rec(ok)], no_emit)
    assert not isinstance(done, Refused)


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    ("extracted", "why"),
    [
        ({"big": "x" * EXTRACTED_MAX_BYTES}, "bytes as JSON"),
        (_nested(EXTRACTED_MAX_DEPTH + 1), "deeper"),
        ({"a.b": 1}, "keys must be"),
        ({"$set": 1}, "keys must be"),
        ({"": 1}, "keys must be"),
        ({"ok": {"__proto__": {}}}, "Mastra refuses"),
        ({"n": 2**53}, "MAX_SAFE_INTEGER"),
        ("text", "should be an object"),
    ],
)
async def test_an_unbounded_extracted_is_a_dead_letter(extracted: Any, why: str) -> None:
    """`extracted` is merged into the thread row every recall reads: its size, depth and keys are bounded
    (`schemas.observational`), per thread with resource scope too."""
    rows = Rows(_row())
    raw = _result(extracted=extracted)
    [error] = await _handle(rows, raw)
    assert isinstance(error, InvalidInputError)
    assert why in str(error)
    assert "extracted" in str(error)
    assert (rows.applied, rows.cursors) == ([], [])
    entries = _threads(("a", "* a", "2025-03-01T09:00:00.000Z"))
    entries[0]["extracted"] = extracted
    resource = _result(scope="resource", threadId=None, threads=entries)
    [error] = await _handle(Rows(_resource_row()), resource)
    assert isinstance(error, InvalidInputError)
    assert "threads.0.extracted" in str(error)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), datetime(2025, 1, 1), b"x"])
def test_extracted_built_in_python_is_json_only(value: object) -> None:
    """An observer built in Python (the wire's decoder refuses non-finite numbers before the model): what
    `model_dump_json` would not write as the same JSON is refused when the answer is made."""
    fields = json.loads(_result())
    with pytest.raises(ValueError, match="extracted"):
        ObserveResult.model_validate({**fields, "extracted": {"v": [value]}})


async def test_extracted_at_its_bounds_applies() -> None:
    biggest = {"big": "x" * (EXTRACTED_MAX_BYTES - len('{"big":""}'))}
    for extracted in (
        biggest,
        _nested(EXTRACTED_MAX_DEPTH),
        {"n": -(2**53 - 1), "f": 0.5, "b": [True, None]},
    ):
        rows = Rows(_row())
        assert await _handle(rows, _result(extracted=extracted)) == [None]
        assert rows.cursors[0][3]["extracted"] == extracted


class Outage(Rows):
    """The messages' read fails once (MongoDB unreachable), then answers."""

    def __init__(self, row: ObservationalRecord | None, stamps: Sequence[StoredStamp] = ()) -> None:
        super().__init__(row, stamps)
        self.down = True

    async def message_stamps(
        self, message_ids: Sequence[str], thread_ids: Collection[str], resource_id: str
    ) -> list[StoredStamp]:
        if self.down:
            self.down = False
            raise RetriableError("mongodb down")
        return await super().message_stamps(message_ids, thread_ids, resource_id)


@pytest.mark.parametrize("scope", ["thread", "resource"])
async def test_an_outage_reading_the_cursor_applies_nothing_until_the_retry(scope: str) -> None:
    """The cursor is read before the apply: the outage raises (the loop retries the batch) with the row
    untouched, so the retry applies the answer with its hints. Read after the apply (as first written), the
    failed attempt applied the row, and the retry would find the claim taken and write no hints."""
    stored = [_stored("m1", "t1", "2025-03-01T09:00:00.000Z")]
    rows = Outage(_row() if scope == "thread" else _resource_row(), stored)
    handler = ObserveResultsHandler(rows=rows, limits=Limits())
    fields: dict[str, Any] = {"threadTitle": "Lyon"}
    if scope == "resource":
        fields = {
            "scope": "resource",
            "threadId": None,
            "threads": _threads(("t1", "* a", "2025-03-01T09:00:00.000Z")),
        }
    with pytest.raises(RetriableError):
        await handler.handle([Rec(_result(**fields))], no_emit)
    assert (rows.applied, rows.cursors) == ([], [])
    await handler.handle([Rec(_result(**fields))], no_emit)
    assert len(rows.applied) == 1
    cursor = {"createdAt": "2025-03-01T09:00:00.000Z", "id": "m1"}
    assert cursor in rows.cursors[0][3].values()


async def test_a_resource_answer_writes_each_threads_title_and_cursor() -> None:
    """Resource scope: each thread's hints and its own newest observed message (Mastra's
    `ResourceScopedObservationStrategy`: `getLastObservedMessageCursor(threadMessages)`)."""
    stored = [
        _stored("a1", "a", "2025-03-01T08:00:00.000Z"),
        _stored("a2", "a", "2025-03-01T09:00:00.000Z"),
        _stored("b1", "b", "2025-03-01T09:30:00.000Z"),
    ]
    rows = Rows(_resource_row(), stored)
    handler = ObserveResultsHandler(rows=rows, limits=Limits())
    entries = _threads(("a", "* a", "2025-03-01T09:00:00.000Z"), ("b", "* b", "2025-03-01T09:30:00.000Z"))
    entries[0]["threadTitle"] = "Lyon"
    result = _result(scope="resource", threadId=None, observedMessageIds=["a1", "a2", "b1"], threads=entries)
    await handler.handle([Rec(result)], no_emit)
    assert rows.asked == [(["a1", "a2", "b1"], ["a", "b"], "u1")]
    assert [c[3] for c in rows.cursors] == [
        {
            **NO_HINTS,
            "currentTask": "task a",
            "threadTitle": "Lyon",
            "lastObservedMessageCursor": {"createdAt": "2025-03-01T09:00:00.000Z", "id": "a2"},
        },
        {
            **NO_HINTS,
            "currentTask": "task b",
            "lastObservedMessageCursor": {"createdAt": "2025-03-01T09:30:00.000Z", "id": "b1"},
        },
    ]


async def _fails(error: Exception) -> str:
    raise error


def _outcomes(outcome: str) -> float:
    labels = {"path": "persist", "outcome": outcome}
    return metrics.REGISTRY.get_sample_value("message_history_outcomes_total", labels) or 0.0


async def test_om_work_that_fails_containably_is_logged_counted_and_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both hooks' guard (`Unobserved`): a bug gives the fallback, one count and one ERROR line naming the
    thread on the hook's own logger; the work's own result passes through untouched."""
    guard = Unobserved("persist", "test-unobserved", "om failed", logging.getLogger("test.hook"))
    before = _outcomes("test-unobserved")
    assert await guard.unless_failed(_answer("done"), "fallback", "t1") == "done"
    assert _outcomes("test-unobserved") == before
    with caplog.at_level(logging.ERROR, logger="test.hook"):
        assert await guard.unless_failed(_fails(KeyError("bug")), "fallback", "t1") == "fallback"
    assert _outcomes("test-unobserved") == before + 1
    [line] = [r for r in caplog.records if r.name == "test.hook"]
    assert (line.getMessage(), getattr(line, "thread_id", None), line.exc_info is not None) == (
        "om failed",
        "t1",
        True,
    )


@pytest.mark.parametrize("error", [RetriableError("mongodb down"), FatalStorageError("not authorized")])
async def test_om_work_that_meets_an_outage_or_a_systemic_refusal_raises(error: Exception) -> None:
    """An outage (the batch is retried) or a systemic refusal (the service stops) is never swallowed."""
    guard = Unobserved("persist", "test-unobserved-raise", "om failed", logging.getLogger("test.hook"))
    with pytest.raises(type(error)):
        await guard.unless_failed(_fails(error), "fallback", "t1")
    assert _outcomes("test-unobserved-raise") == 0.0


async def _answer(value: str) -> str:
    return value


async def test_resource_recall_cuts_at_the_threads_cursor_and_shows_the_other_threads() -> None:
    """Resource scope: the resource's row; the thread's messages cut at its own cursor (10:00), not the row's
    `lastObservedAt` (10:45, another thread's cycle); the other threads' unobserved messages as Mastra's
    `<other-conversation>` blocks after the instructions (a thread without a cursor from the row's
    `lastObservedAt`; observed ids left out)."""
    later = datetime(2025, 3, 1, 10, 45, tzinfo=UTC)
    rows = Rows(
        _row(lookupKey="resource:u1", scope="resource", threadId=None, activeObservations="- a trip",
             lastObservedAt=later, observedMessageIds=["o3"], isObserving=False)
    )  # fmt: skip
    rows.threads = {"t1": T0, "t2": None}

    def other(ident: str, minute: int, text: str) -> dict[str, Any]:
        return {
            **_message(ident, "user", f"2025-03-01T10:{minute:02d}:00.000Z", "memory", text),
            "threadId": "t2",
        }

    rows.messages = [other("o1", 30, "before the row's cursor"), other("o2", 50, "plans Turin"),
                     other("o3", 55, "observed already"), _message("m3", "user", "2025-03-01T10:30:00.000Z",
                                                                   "memory", "newer question")]  # fmt: skip
    request = REQUEST.model_copy(update={"memory": {"observationalMemory": {"scope": "resource"}}})
    cursor = {"mastra": {"om": {"lastObservedAt": "2025-03-01T10:00:00.000Z"}}}
    event = await ObservationRecall(Settings(), rows, Threads(cursor)).enrich(request, ENRICHED)
    assert isinstance(event, EnrichedRequest)
    ids = [m.id for m in event.messages]
    assert ids[-3:] == ["om-continuation", "m3", "m4"]  # m3 (10:30) kept: past t1's own cursor
    assert rows.read_from == [{"t2": later}]  # the other threads only, t2 from the row's lastObservedAt
    texts = [p.text for m in event.messages if m.role == "system" for p in m.content.parts]  # type: ignore[union-attr]
    assert texts[1] == (
        "The following content is from OTHER conversations different from the current conversation, they're "
        "here for reference,  but they're not necessarily your focus:\nSTART_OTHER_CONVERSATIONS_BLOCK\n"
        '<other-conversation id="t2">\nMar 1 2025:\nUser (10:50 AM): plans Turin\n</other-conversation>\n'
        "END_OTHER_CONVERSATIONS_BLOCK"
    )
    assert texts[2] == "<observations>"
