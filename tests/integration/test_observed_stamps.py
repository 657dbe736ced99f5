"""`storage.observed_stamps` on the real MongoDB-wire server: the observed messages' places for
`lastObservedMessageCursor`, read projected (`id`, `thread_id`, `createdAt`), the answer's threads and
resource in the filter; rows of any shape skipped and counted, never raised."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidBSON
from pymongo.asynchronous.database import AsyncDatabase

from message_history import metrics
from message_history.core.observation_hints import StoredStamp, last_observed_cursors
from schemas.stored_rows import MESSAGES
from storage.observational import MongoObservationalStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Db = AsyncDatabase[dict[str, Any]]
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
FAR = DatetimeMS(568_971_820_800_000)  # year 20000: no Python datetime holds it


def _row(ident: Any, thread: str, minute: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": ident,
        "thread_id": thread,
        "resourceId": "u1",
        "role": "user",
        "type": "v2",
        "content": '{"format":2,"parts":[{"type":"text","text":"hi"}]}',
        "createdAt": T0.replace(minute=minute),
        **fields,
    }


def _counted(reason: str) -> float:
    value: float = metrics.UNREADABLE_ROWS.labels(
        path="other", collection=MESSAGES, reason=reason
    )._value.get()
    return value


async def _stamps(db: Db, ids: list[str], threads: list[str], resource: str = "u1") -> list[StoredStamp]:
    found = await MongoObservationalStore(db).message_stamps(ids, threads, resource)
    return sorted(found)


async def test_the_answers_threads_and_resource_only(mongo_db: Db) -> None:
    """Another owner's row in the thread (written around the service) is newer than every observed one:
    the filter leaves it on the server, so the cursor is the owner's newest. A row without a `resourceId`
    is its thread's (as resource scope's message read takes it); another thread's row is not asked for."""
    await mongo_db[MESSAGES].insert_many(
        [
            _row("m1", "t1", 1),
            _row("m2", "t1", 2),
            _row("x9", "t1", 9, resourceId="intruder"),
            _row("m3", "t1", 3, resourceId=None),
            _row("n1", "t2", 8),
        ]
    )
    ids = ["m1", "m2", "x9", "m3", "n1"]
    got = await _stamps(mongo_db, ids, ["t1"])
    assert got == [
        StoredStamp("m1", "t1", T0.replace(minute=1)),
        StoredStamp("m2", "t1", T0.replace(minute=2)),
        StoredStamp("m3", "t1", T0.replace(minute=3)),
    ]
    assert last_observed_cursors(ids, got) == {"t1": {"createdAt": "2025-03-01T09:03:00.000Z", "id": "m3"}}
    assert [s.id for s in await _stamps(mongo_db, ids, ["t1", "t2"])] == ["m1", "m2", "m3", "n1"]
    assert [s.id for s in await _stamps(mongo_db, ids, ["t1"], resource="intruder")] == ["m3", "x9"]
    assert await _stamps(mongo_db, [], ["t1"]) == []
    assert await _stamps(mongo_db, ids, []) == []


@pytest.mark.parametrize(
    ("odd", "reason"),
    [
        ({"createdAt": "yesterday"}, "createdAt"),
        ({"createdAt": None}, "createdAt"),
        ({"createdAt": FAR}, "createdAt"),  # undecodable: the driver would fail the whole reply
        ({"id": " "}, "id"),  # blank: no event may carry it
    ],
    ids=["not-a-date", "no-date", "year-20000", "blank-id"],
)
async def test_an_unreadable_row_is_skipped_and_counted(
    mongo_db: Db, odd: dict[str, Any], reason: str
) -> None:
    """The row no whole-row read would take for its id or date gives no place: skipped, counted, never
    raised; the readable rows beside it still answer."""
    bad = _row("bad", "t1", 5, **odd)
    await mongo_db[MESSAGES].insert_many([_row("m1", "t1", 1), bad])
    if odd.get("createdAt") is FAR:
        with pytest.raises(InvalidBSON):
            await mongo_db[MESSAGES].find({"thread_id": "t1"}).to_list()
    asked = ["m1", "bad", " "]
    before = _counted(reason)
    got = await _stamps(mongo_db, asked, ["t1"])
    assert got == [StoredStamp("m1", "t1", T0.replace(minute=1))]
    assert _counted(reason) == before + 1


async def test_only_the_stamp_is_read(mongo_db: Db) -> None:
    """Projected: a row unreadable only for its content (a date no Python datetime holds inside it, which
    fails the whole row's decoding) still gives its place, as its id and date are all the cursor needs."""
    await mongo_db[MESSAGES].insert_one(_row("m1", "t1", 4, content={"format": 2, "parts": [], "at": FAR}))
    with pytest.raises(InvalidBSON):
        await mongo_db[MESSAGES].find({"id": "m1"}).to_list()
    assert await _stamps(mongo_db, ["m1"], ["t1"]) == [StoredStamp("m1", "t1", T0.replace(minute=4))]
