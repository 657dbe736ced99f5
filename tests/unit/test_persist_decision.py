"""The one persist decision (`core.persist_plan.decide_turn`): sync and pure, it asks for what it lacks, and
the library and the persist path both decide with it (issue 32 item 4)."""

from __future__ import annotations

from message_history.core.persist_plan import (
    Decided,
    NeedsRead,
    OneTurnReads,
    TurnWrite,
    decide_turn,
    turn_write,
)
from message_history.core.rules import select_for_persistence
from schemas.messages import Message
from tests.rule_cases import RESOURCE, THREAD, msg, tool


def _write(input: list[Message], response: list[Message]) -> TurnWrite:
    decision = select_for_persistence(input, response, finish_reason=None, read_only=False, has_thread=True)
    return turn_write(decision, thread_id=THREAD, owner=RESOURCE, response=response)


def test_a_turn_with_user_input_asks_for_its_copies_only() -> None:
    write = _write([msg("u1", t=1, text="Hi")], [msg("a1", "assistant", t=2, text="Hello")])
    reads = OneTurnReads()
    assert decide_turn(write, reads) == NeedsRead(copies=("u1", "a1"))
    reads.copies = []
    decided = decide_turn(write, reads)
    assert isinstance(decided, Decided)
    assert [m.id for m in decided.messages] == ["u1", "a1"]


def test_a_continuation_asks_for_the_newest_row_and_folds_into_it() -> None:
    """A response without user input may continue the thread's latest assistant message: the decision asks
    for that row after the copies, and folds the response into it once it has it."""
    pending = msg(
        "a1", "assistant", t=2, parts=[{"type": "text", "text": "Asking."}, tool("ask", "call", "c1")]
    )
    write = _write([], [msg("a2", "assistant", t=5, text="More.")])
    reads = OneTurnReads(copies=[])
    assert decide_turn(write, reads) == NeedsRead(latest=True)
    reads.latest, reads.latest_read = pending, True
    decided = decide_turn(write, reads)
    assert isinstance(decided, Decided)
    assert [m.id for m in decided.messages] == ["a1"]  # folded into the stored assistant message
    reads.latest = None  # an empty thread: the response is saved as it is
    decided = decide_turn(write, reads)
    assert isinstance(decided, Decided)
    assert [m.id for m in decided.messages] == ["a2"]
