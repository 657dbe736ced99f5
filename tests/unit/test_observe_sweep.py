"""The stale-claim sweep's decisions on in-memory rows (the real broker and MongoDB: tests/integration/
test_observational_faults.py): what is sent again, what is released, what is left alone."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from consumers.observe_sweep import ObservationSweep
from message_history.settings import Settings
from schemas.messages import Message
from schemas.observational import ObserveRequest, ReflectRequest
from storage.observational import Claim, Kind, ObservationalRecord
from storage.observational_resource import ThreadPage
from storage.protocol import Page, PageQuery
from tests.om_helpers import om_row

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(hours=1)


def _row(**fields: Any) -> ObservationalRecord:
    """A row claimed an hour ago (cycle 2, by turn-6) with a log, its thresholds in its config."""
    claimed = {
        "activeObservations": "- earlier",
        "observationTokenCount": 3,
        "config": {"observation": {"messageTokens": 500}, "reflection": {"observationTokens": 900}},
        "_mh_cycle": 2,
        "_mh_claimed_at": OLD,
        "_mh_claimed_by": "turn-6",
    }
    return om_row(**{**claimed, **fields})


class Rows:
    """Stale rows, each key's newest row, and what the sweep wrote."""

    def __init__(self, stale: list[ObservationalRecord], newest: ObservationalRecord | None = None) -> None:
        self.stale = stale
        self.newest = newest if newest is not None else (stale[0] if stale else None)
        self.claims: list[tuple[str, Kind, str | None]] = []
        self.released: list[Claim] = []
        self.dropped: list[tuple[str, int]] = []
        self.cutoffs: list[datetime] = []
        self.taken = False  # another replica took the claim first

    async def stale_claims(self, cutoff: datetime, limit: int) -> list[ObservationalRecord]:
        self.cutoffs.append(cutoff)
        return self.stale[:limit]

    async def get(self, thread_id: str | None, resource_id: str) -> ObservationalRecord | None:
        return self.newest

    async def claim(
        self, record: ObservationalRecord, kind: Kind, now: datetime, *, by: str | None = None
    ) -> Claim | None:
        if self.taken:
            return None
        self.claims.append((record.id, kind, by))
        return Claim(record.id, record.generation, record.cycle + 1, kind)

    async def release(self, claim: Claim, now: datetime) -> bool:
        self.released.append(claim)
        return True

    async def drop_claim_time(self, record_id: str, cycle: int) -> bool:
        self.dropped.append((record_id, cycle))
        return True


@dataclasses.dataclass
class Messages:
    """The thread's stored messages (newest first, as a page is)."""

    rows: list[Message]
    queries: list[PageQuery] = dataclasses.field(default_factory=list)

    async def list_page(self, query: PageQuery) -> Page:
        self.queries.append(query)
        return Page(self.rows, has_more=False)


def _message(ident: str, minute: int) -> Message:
    return Message.model_validate(
        {
            "id": ident,
            "role": "user",
            "createdAt": f"2025-03-01T10:{minute:02d}:00.000Z",
            "threadId": "t1",
            "resourceId": "u1",
            "content": {"format": 2, "parts": [{"type": "text", "text": f"message {ident} " * 20}]},
        }
    )


class Sent:
    def __init__(self) -> None:
        self.events: list[ObserveRequest | ReflectRequest] = []

    async def __call__(self, event: ObserveRequest | ReflectRequest) -> asyncio.Future[Any]:
        self.events.append(event)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def _sweep(rows: Rows, messages: Messages, sent: Sent) -> ObservationSweep:
    settings = Settings(observation_timeout_s=60.0)
    return ObservationSweep(settings, rows, messages, sent)  # type: ignore[arg-type]


async def test_a_stale_observation_is_claimed_again_and_its_unobserved_messages_sent() -> None:
    row = _row(lastObservedAt=datetime(2025, 3, 1, 10, 1, tzinfo=UTC), observedMessageIds=["m2"])
    rows, sent = Rows([row]), Sent()
    messages = Messages([_message("m4", 4), _message("m3", 3), _message("m2", 2), _message("m1", 0)])
    assert await _sweep(rows, messages, sent).round(NOW) == 1
    assert rows.cutoffs == [NOW - timedelta(seconds=60)]
    assert rows.claims == [("row-1", "observe", "turn-6")]  # the maker kept: its turn redelivered resends
    assert messages.queries[0].start == row.last_observed_at
    [event] = sent.events
    assert isinstance(event, ObserveRequest)
    assert [m.id for m in event.messages] == ["m3", "m4"]  # oldest first; observed ones left out
    assert (event.requestId, event.recordId, event.generation, event.cycle) == ("turn-6", "row-1", 0, 3)
    assert event.messageTokens == 500  # the row's own threshold, not the service default
    assert event.activeObservations == "- earlier"


async def test_a_stale_reflection_is_sent_again_with_the_whole_log() -> None:
    rows, sent = Rows([_row(isObserving=False, isReflecting=True)]), Sent()
    assert await _sweep(rows, Messages([]), sent).round(NOW) == 1
    [event] = sent.events
    assert isinstance(event, ReflectRequest)
    assert (event.activeObservations, event.observationTokens, event.cycle) == ("- earlier", 900, 3)
    assert rows.claims == [("row-1", "reflect", "turn-6")]


async def test_nothing_left_to_observe_releases_the_claim() -> None:
    rows, sent = Rows([_row()]), Sent()
    assert await _sweep(rows, Messages([]), sent).round(NOW) == 0
    assert sent.events == []
    assert rows.released == [Claim("row-1", 0, 2, "observe")]
    assert rows.claims == []


async def test_an_old_generations_flag_is_released_not_sent() -> None:
    newer = _row(id="row-2", generationCount=1, isObserving=False, _mh_claimed_at=None)
    rows, sent = Rows([_row()], newest=newer), Sent()
    assert await _sweep(rows, Messages([_message("m1", 0)]), sent).round(NOW) == 0
    assert rows.released == [Claim("row-1", 0, 2, "observe")]
    assert sent.events == []


async def test_a_flag_cleared_by_another_writer_only_drops_the_claim_time() -> None:
    rows, sent = Rows([_row(isObserving=False)]), Sent()
    assert await _sweep(rows, Messages([_message("m1", 0)]), sent).round(NOW) == 0
    assert rows.dropped == [("row-1", 2)]
    assert rows.released == []
    assert sent.events == []


async def test_a_claim_taken_first_elsewhere_sends_nothing() -> None:
    rows, sent = Rows([_row()]), Sent()
    rows.taken = True
    assert await _sweep(rows, Messages([_message("m1", 0)]), sent).round(NOW) == 0
    assert sent.events == []


async def test_a_row_that_fails_is_counted_and_the_round_goes_on() -> None:
    class Failing(Messages):
        async def list_page(self, query: PageQuery) -> Page:
            if query.thread_id == "t1":
                raise KeyError("a bug on this row")
            return await super().list_page(query)

    second = _row(id="row-2", lookupKey="thread:t2", threadId="t2")
    rows, sent = Rows([_row(), second]), Sent()
    newest = {"t1": rows.stale[0], "t2": second}

    async def get(thread_id: str | None, resource_id: str) -> ObservationalRecord | None:
        return newest[thread_id or ""]

    rows.get = get  # type: ignore[method-assign]
    assert await _sweep(rows, Failing([_message("m1", 0)]), sent).round(NOW) == 1
    assert [e.threadId for e in sent.events] == ["t2"]
    assert [c.record_id for c in rows.released] == ["row-1"]  # off the stale page: it cannot starve others


class ResourceRows(Rows):
    """`Rows` with a resource's threads: their cursors and messages (as `storage.observational_resource`)."""

    def __init__(self, stale: list[ObservationalRecord], cursors: dict[str, datetime | None]) -> None:
        super().__init__(stale)
        self.cursors = cursors
        self.asked: list[str] = []

    async def resource_cursors(self, resource_id: str, max_threads: int) -> dict[str, datetime | None]:
        self.asked.append(resource_id)
        return self.cursors

    async def resource_threads(
        self, resource_id: str, limit: int, after: Any, *, include: str | None = None
    ) -> ThreadPage:
        return ThreadPage(await self.resource_cursors(resource_id, limit), None)

    async def keep_threads_after(self, record_id: str, after: Any) -> None:
        raise AssertionError("one page holds every thread: no position to keep")

    async def resource_messages(self, resource_id: str, cursors: Any, limit: int) -> list[dict[str, Any]]:
        def wire(ident: str, thread: str, minute: int) -> dict[str, Any]:
            return {**_message(ident, minute).wire(), "threadId": thread}

        return [wire("a1", "ta", 1), wire("b1", "tb", 2), wire("a2", "ta", 3), wire("b0", "tb", 0)][:limit]


async def test_a_stale_resource_observation_sends_every_threads_unobserved_messages() -> None:
    """A resource row's stale claim: its work again, all its threads' messages past their own cursors,
    oldest thread first, scope "resource" and no thread (the resource's key)."""
    row = _row(lookupKey="resource:u1", scope="resource", threadId=None, observedMessageIds=["a1"])
    rows = ResourceRows([row], {"ta": None, "tb": datetime(2025, 3, 1, 10, 1, tzinfo=UTC)})
    sent = Sent()
    assert await _sweep(rows, Messages([]), sent).round(NOW) == 1
    assert rows.asked == ["u1"]
    [event] = sent.events
    assert isinstance(event, ObserveRequest)
    assert (event.scope, event.threadId, event.resourceId) == ("resource", None, "u1")
    # tb's cursor hides b0 (10:00); a1 is observed already; ta's oldest (a2, 10:03) is newer than b1 (10:02)
    assert [m.id for m in event.messages] == ["b1", "a2"]
