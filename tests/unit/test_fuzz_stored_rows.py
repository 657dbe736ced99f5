"""The store-side fuzzer (issue 31, item 3) on both paths: stored rows of any shape never stop a path.

Each example stores, next to a calm thread (well-formed rows), an odd thread holding generated documents
(tests/store_fuzzing.py: every field's type, range and absence, v1 and v2 shapes, unknown parts, huge and
deep values, ids colliding across threads) and, sometimes, a generated thread document. One batch of
requests (recall) and one of responses (persist) for both threads go through tests/paths.py over
tests/raw_storage.py (the stored documents, read by the MongoDB storage's own reader). The property:

* the handler returns: nothing raises out of it (a raise is a systemic failure, the loop stops);
* the calm thread's output is what it is when the odd thread holds only well-formed rows;
* the odd thread's request is enriched (an unreadable row skipped and counted in `history.skipped`, the
  rest recalled) or dead-lettered with a reason naming the row (`UnreadableRowError`: "stored row ... of
  thread ..."), or refused for ownership, which a generated thread document or a colliding id may decide.

`STORE_FUZZ_EXAMPLES` (default 40) sizes a run, `STORE_FUZZ_SIZES=long` uses the long run's huge and deep
values; `STORE_FUZZ_REPORT=<file>` writes the run's figures as JSON
(docs/fuzzing.md#stored-rows-the-store-side-fuzzer).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from message_history.errors import InvalidInputError, ThreadOwnershipError, UnreadableRowError
from schemas.limits import MAX_ID_LENGTH
from tests.paths import Batch, Paths, assistant, request, response, user
from tests.raw_storage import RawRowStorage
from tests.store_fuzzing import (
    COLLIDING,
    LONG,
    QUICK,
    RAW_ODD,
    T0,
    StoredRow,
    message_rows,
    raw_message,
    thread_rows,
)

EXAMPLES: Final = int(os.environ.get("STORE_FUZZ_EXAMPLES", "40"))
SIZES: Final = LONG if os.environ.get("STORE_FUZZ_SIZES") == "long" else QUICK
REPORT: Final = os.environ.get("STORE_FUZZ_REPORT")

CALM, CALM_OWNER = "t-calm", "u-calm"
ODD, ODD_OWNER = "t-odd", "u-odd"
SIDE, SIDE_OWNER = "t-side", "u-side"

pytestmark = pytest.mark.timeout(1800)


@dataclass
class Figures:
    examples: int = 0
    rows: int = 0
    thread_docs: int = 0
    skipped: int = 0
    dead_letters: int = 0
    dead_letter_types: dict[str, int] = field(default_factory=dict)
    stopped: int = 0
    started: float = field(default_factory=time.monotonic)


FIGURES: Final = Figures()


def good_row(thread: str, owner: str, ident: str, role: str, seconds: int, text: str) -> dict[str, Any]:
    """A row as @mastra/mongodb 1.19 writes it."""
    content = {"format": 2, "parts": [{"type": "text", "text": text}]}
    return {
        "id": ident,
        "thread_id": thread,
        "content": json.dumps(content),
        "role": role,
        "type": "v2",
        "createdAt": T0 + timedelta(seconds=seconds),
        "resourceId": owner,
    }


def good_rows(thread: str, owner: str) -> list[dict[str, Any]]:
    return [
        good_row(
            thread, owner, f"{thread}-g{i}", "user" if i % 2 == 0 else "assistant", i * 10, f"{thread} {i}"
        )
        for i in range(4)
    ]


@dataclass(frozen=True)
class Case:
    odd: list[StoredRow]
    raw: list[str]  # raw BSON rows no Python value builds (`RAW_ODD`: invalid UTF-8, dates out of range)
    thread: StoredRow | None
    memory: dict[str, Any]
    turn_ids: tuple[str, str]  # the odd thread's response's input and output ids


def _storage(case: Case | None) -> RawRowStorage:
    """Calm, odd and side threads; `case` None: the odd thread with its well-formed rows only."""
    storage = RawRowStorage()
    threads = [
        {"id": t, "resourceId": o, "title": "", "metadata": {}, "createdAt": T0, "updatedAt": T0}
        for t, o in ((CALM, CALM_OWNER), (SIDE, SIDE_OWNER))
    ]
    if case is None or case.thread is None:
        threads.append({"id": ODD, "resourceId": ODD_OWNER, "title": "", "metadata": {}, "createdAt": T0})
    else:
        assert case.thread.doc is not None
        threads.append(case.thread.doc)
    storage.add_threads(threads)
    storage.add_messages(good_rows(CALM, CALM_OWNER))
    storage.add_messages(good_row(SIDE, SIDE_OWNER, c, "user", 5, "side") for c in COLLIDING)
    storage.add_messages(good_rows(ODD, ODD_OWNER))
    if case is not None:
        storage.add_messages(row.bson() for row in case.odd)
        storage.add_messages(
            raw_message(ODD, ODD_OWNER, f"{ODD}-raw{i}", odd=o).bson() for i, o in enumerate(case.raw)
        )
    return storage


def _requests(case: Case) -> list[dict[str, Any]]:
    return [
        request(CALM, [user("calm-in", "hi", 10**6)], resource=CALM_OWNER, memory=case.memory),
        request(ODD, [user("odd-in", "hi", 10**6)], resource=ODD_OWNER, memory=case.memory),
    ]


def _responses(case: Case) -> list[dict[str, Any]]:
    asked, answered = case.turn_ids
    return [
        response(
            CALM,
            input=[user("calm-u", "q", 10**6)],
            output=[assistant("calm-a", "a", 10**6 + 1)],
            resource=CALM_OWNER,
        ),
        response(
            ODD,
            input=[user(asked, "q", 10**6)],
            output=[assistant(answered, "a", 10**6 + 1)],
            resource=ODD_OWNER,
        ),
    ]


async def _run(storage: RawRowStorage, case: Case) -> tuple[Batch, Batch]:
    paths = Paths(storage=storage)
    recalled = await paths.recall(*_requests(case))
    persisted = await paths.persist(*_responses(case))
    return recalled, persisted


def _check_odd(outcome: dict[str, Any] | InvalidInputError, case: Case) -> None:
    if isinstance(outcome, InvalidInputError):
        FIGURES.dead_letters += 1
        kind = type(outcome).__name__
        FIGURES.dead_letter_types[kind] = FIGURES.dead_letter_types.get(kind, 0) + 1
        assert isinstance(outcome, UnreadableRowError | ThreadOwnershipError), (
            f"dead letter of an odd thread must name the row (or be an ownership refusal): {outcome!r}"
        )
        if isinstance(outcome, UnreadableRowError):
            assert str(outcome).startswith("stored row "), str(outcome)
            assert ODD in str(outcome) or outcome.thread_id == ODD, str(outcome)
        return
    history = outcome.get("history")
    if history is not None:  # an enriched request
        skipped = history.get("skipped", 0)
        assert isinstance(skipped, int), history
        assert 0 <= skipped <= len(case.odd) + len(case.raw) + 4, history
        FIGURES.skipped += skipped
        for message in outcome["messages"]:
            assert message["threadId"] == ODD or message["source"] == "input", message


MAX_ID: Final = MAX_ID_LENGTH  # the longest id an event may carry


cases = st.builds(
    Case,
    odd=st.lists(message_rows(ODD, ODD_OWNER, sizes=SIZES), min_size=1, max_size=4),
    raw=st.lists(st.sampled_from(RAW_ODD), max_size=2),
    thread=st.one_of(st.none(), st.none(), thread_rows(ODD, ODD_OWNER)),
    memory=st.fixed_dictionaries(
        {},
        optional={
            "lastMessages": st.sampled_from([1, 3, 1000]),
            "maxTokens": st.sampled_from([5, 500, 100_000]),
        },
    ),
    turn_ids=st.tuples(
        st.sampled_from(["odd-u", "dup-a", f"{ODD}-g0"]), st.sampled_from(["odd-a", "dup-b", f"{ODD}-g3"])
    ),
)


def _calm(batch: Batch) -> Any:
    """The calm thread's outcome, without the wall clock (`threadUpdatedAt` moves to now when a budgeted
    recall wrote the thread's token boundary)."""
    outcome = batch.outcomes[0]
    if isinstance(outcome, InvalidInputError):
        return repr(outcome)
    return {k: v for k, v in outcome.items() if k != "threadUpdatedAt"}


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each failure already names its rows
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(case=cases)
def test_stored_rows_never_stop_a_path_nor_touch_another_thread(case: Case) -> None:
    FIGURES.examples += 1
    FIGURES.rows += len(case.odd) + len(case.raw)
    FIGURES.thread_docs += case.thread is not None
    try:
        recalled, persisted = asyncio.run(_run(_storage(case), case))
    except BaseException:
        FIGURES.stopped += 1
        raise
    base_recalled, base_persisted = asyncio.run(_run(_storage(None), case))
    assert _calm(recalled) == _calm(base_recalled), "the calm thread's recall changed"
    assert _calm(persisted) == _calm(base_persisted), "the calm thread's persist changed"
    _check_odd(recalled.outcomes[1], case)
    _check_odd(persisted.outcomes[1], case)


@pytest.mark.parametrize("ident", ["", "   ", "i" * (MAX_ID + 1)], ids=["empty", "blank", "too-long"])
async def test_a_stored_id_no_event_can_carry_is_skipped(ident: str) -> None:
    """The smallest row: a Mastra 1.19-shaped row whose `id` is empty, blank or longer than an event's ids
    may be. The recall must skip and count it, not send an enriched event no worker can decode."""
    storage = RawRowStorage()
    storage.add_threads([{"id": ODD, "resourceId": ODD_OWNER, "title": "", "metadata": {}, "createdAt": T0}])
    storage.add_messages([{**good_row(ODD, ODD_OWNER, ident, "user", 1, "hi")}])
    batch = await Paths(storage=storage).recall(
        request(ODD, [user("odd-in", "hi", 10**6)], resource=ODD_OWNER)
    )
    assert batch.event(0)["history"].get("skipped") == 1


def test_report_the_figures() -> None:
    """Writes the run's figures (`STORE_FUZZ_REPORT`), after the property test of this module ran."""
    figures = {
        "examples": FIGURES.examples,
        "rows_generated": FIGURES.rows,
        "thread_docs_generated": FIGURES.thread_docs,
        "rows_skipped": FIGURES.skipped,
        "dead_letters": FIGURES.dead_letters,
        "dead_letter_types": FIGURES.dead_letter_types,
        "stopped": FIGURES.stopped,
        "seconds": round(time.monotonic() - FIGURES.started, 1),
    }
    if REPORT:
        Path(REPORT).write_text(json.dumps(figures, indent=1) + "\n")
    assert FIGURES.stopped == 0
