"""The OM work both senders build from a row (`consumers.observe_work`): the page they read, the state they
count against, and the two events."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from consumers.observe_work import (
    observe_request,
    observed_state,
    reflect_request,
    since_observed,
    work_fields,
)
from storage.observational import Claim
from tests.unit.test_observe_sweep import Messages, _message, _row

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_the_page_read_is_the_newest_since_the_last_observation_given_oldest_first() -> None:
    row = _row(lastObservedAt="2025-03-01T10:00:00.000Z", observedMessageIds=["m1"])
    stored = Messages([_message("m3", 3), _message("m2", 2), _message("m1", 1)])  # newest first

    wire = asyncio.run(since_observed(stored, "t1", row, 7))  # type: ignore[arg-type]

    (query,) = stored.queries
    assert (query.thread_id, query.resource_id, query.start, query.end) == (
        "t1",
        None,
        row.last_observed_at,
        None,
    )
    assert (query.page, query.per_page) == (0, 7)
    assert [m["id"] for m in wire] == ["m1", "m2", "m3"]


def test_the_observed_state_is_the_rows() -> None:
    row = _row(
        lastObservedAt="2025-03-01T10:00:00.000Z",
        observedMessageIds=["m1", "m2"],
        pendingMessageTokens=40,
        observationTokenCount=12,
    )

    state = observed_state(row)

    assert state.last_observed_at == row.last_observed_at
    assert state.observed_message_ids == frozenset({"m1", "m2"})
    assert (state.pending_message_tokens, state.observation_token_count) == (40, 12)


def test_both_events_carry_the_claim_and_the_rows_log() -> None:
    row = _row()
    claim = Claim(row.id, row.generation, 5, "observe")
    work = work_fields(claim, NOW, request_id="turn-6", scope="thread", thread_id="t1", resource_id="u1")
    message = _message("m1", 1).wire()

    observe = observe_request(work, row, [message], pending=30, threshold=500)
    reflect = reflect_request(work, row, 900)

    for event in (observe, reflect):
        assert (event.requestId, event.recordId, event.generation, event.cycle) == ("turn-6", row.id, 0, 5)
        assert (event.threadId, event.resourceId, event.scope) == ("t1", "u1", "thread")
        assert (event.activeObservations, event.observationTokenCount) == ("- earlier", 3)
    assert [m.id for m in observe.messages] == ["m1"]
    assert (observe.pendingTokens, observe.messageTokens) == (30, 500)
    assert reflect.observationTokens == 900


def test_a_row_never_observed_is_read_from_the_threads_start() -> None:
    stored = Messages([])

    assert asyncio.run(since_observed(stored, "t1", _row(), 10)) == []  # type: ignore[arg-type]
    assert stored.queries[0].start is None
