"""A recall batch's busy marks go out as one bulk write, and a parked request waits after them (issue 33).

The recall path on the real MongoDB-wire server's markers (`storage.turns.MongoTurnMarkers`), with the
history in memory. Before, each request's mark was written as its send went out, coalesced only within one
turn of the event loop: a batch of 500 made ~600 bulk writes of ~3 marks (a tenth of the recall path's CPU
in the bench). Now the batch's gate holds them and starts them together once the batch's requests are sent
(`BatchGate.write_marks`), so a request parked behind its thread's earlier turn of the same batch must not
look at the stored markers before that turn's mark is there: it would find its thread idle and go out
without the answer it waits for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from consumers.contract import delivered
from consumers.recall import RecallHandler
from consumers.turn_gate import TurnGate
from message_history.core.turn_rules import TurnMarker
from message_history.settings import Settings
from storage.turns import MongoTurnMarkers
from tests.integration.test_turn_markers import fresh_markers
from tests.paths import no_emit
from tests.unit.test_batch_stand_ins import _CountingPages, _message, _seed
from tests.unit.test_recall_once import _record, _Sent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

THREADS = 40


class _SpreadSent(_Sent):
    """Sends spread over time, as a loaded service's lanes are (each request's work takes CPU): the n-th send
    is handed over n x 2 ms in. With instant sends every lane would mark on the same turn of the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    async def _send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.started += 1
        await asyncio.sleep(0.002 * self.started)
        return await super()._send(*args, **kwargs)


class _Watched(MongoTurnMarkers):
    """The real markers, recording each bulk write's size and what a wait found stored when it began."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bulks: list[int] = []
        self.found_at_wait: list[TurnMarker | None] = []

    async def _write(self, ops: list[Any]) -> None:
        self.bulks.append(len(ops))
        await super()._write(ops)

    async def wait_answered(
        self, thread_id: str, awaited: str, timeout_s: float, stop: asyncio.Event | None = None
    ) -> TurnMarker | None:
        self.found_at_wait.append((await self.get_many([thread_id])).get(thread_id))
        return await super().wait_answered(thread_id, awaited, timeout_s, stop)


@pytest_asyncio.fixture
async def markers(mongo_uri: str) -> AsyncIterator[_Watched]:
    async with fresh_markers(mongo_uri, _Watched) as store:
        yield store


async def test_a_batch_marks_its_threads_in_one_write_and_a_parked_request_waits_after_it(
    markers: _Watched,
) -> None:
    """40 threads' requests and a second request on thread t0 in one batch: the 40 marks in one bulk write;
    t0's second request, parked behind the first, finds the first one's mark stored when its wait begins
    (and, never answered here, goes out incomplete after the turn timeout)."""
    storage = _CountingPages()
    threads = [f"t{i}" for i in range(THREADS)]
    for thread in threads:
        await _seed(storage, thread, "u", 3)
    records = [
        _record(i, thread, [_message(f"in{i}", "user", "hi", 1000 + i)], {})
        for i, thread in enumerate(threads)
    ]
    records.append(_record(THREADS, "t0", [_message("again", "user", "more?", 2000)], {}))
    gate = TurnGate(barrier=None, markers=markers, policy="enqueue", timeout_s=0.3)
    publisher = _SpreadSent()
    # a few threads at a time: later lanes start as earlier ones are sent, as in a batch past the cap
    handler = RecallHandler(Settings(max_in_flight_threads=4), storage, publisher, gate=gate)

    for ack in await handler.handle(records, no_emit):
        await delivered(ack)

    assert markers.bulks[0] == THREADS  # the batch's marks together
    assert [m.pending if m is not None else None for m in markers.found_at_wait] == ["r0"]
    events = [json.loads(v) for v in publisher.values]
    assert len(events) == THREADS + 1
    assert events[-1]["requestId"] == f"r{THREADS}"
    assert events[-1]["history"]["complete"] is False  # waited the whole (short) timeout for r0's answer
