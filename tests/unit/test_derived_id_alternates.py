"""A derived message id another thread holds yields to its keyed alternate (issue 31 item 4), pure and
through the persist path over the in-memory storage. The attack against the real stack:
tests/integration/test_tenancy.py::test_derived_ids_another_tenant_stores_first_do_not_fail_the_turn."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from message_history.errors import MessageIdTakenError
from schemas.ids import alternate_message_id, derived_for_turn, derived_message_id
from tests.paths import Paths, assistant, response, user

A, B = "tenant-a", "tenant-b"
KEY, OLD_KEY = b"the deployment's key", b"the key before the rotation"


def _derived(kind: str, position: int, request_id: str = "a-2") -> str:
    return derived_message_id(A, "ta", request_id, kind, position)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("candidate", "found"),
    [
        pytest.param(_derived("input", 0), True, id="input-0"),
        pytest.param(_derived("input", 999), True, id="input-at-the-bound"),
        pytest.param(_derived("input", 1000), False, id="input-past-the-bound"),
        pytest.param(_derived("response", 2), True, id="response-2"),
        pytest.param(_derived("response", 3), False, id="response-past-the-list"),
        pytest.param(_derived("input", 0, "a-3"), False, id="another-request"),
        pytest.param(derived_message_id(B, "ta", "a-2", "input", 0), False, id="another-resource"),
        pytest.param(str(uuid.uuid4()), False, id="a-client-uuid"),
        pytest.param("msg-0001", False, id="not-a-uuid"),
        pytest.param(_derived("input", 0).upper(), False, id="not-the-derived-text"),
    ],
)
def test_derived_for_turn(candidate: str, found: bool) -> None:
    got = derived_for_turn([candidate], A, "ta", "a-2", inputs=1000, responses=3)
    assert got == ({candidate} if found else set())


@given(
    resource=st.text(max_size=8),
    thread=st.text(min_size=1, max_size=8),
    request=st.text(min_size=1, max_size=8),
    kind=st.sampled_from(["input", "response"]),
    position=st.integers(0, 20),
)
def test_derived_for_turn_agrees_with_the_derivation(
    resource: str, thread: str, request: str, kind: str, position: int
) -> None:
    """The fast scan (prefix hashed once, digests compared as bytes) finds what `derived_message_id` gives."""
    mid = derived_message_id(resource, thread, request, kind, position)  # type: ignore[arg-type]
    assert derived_for_turn([mid], resource, thread, request, inputs=21, responses=21) == {mid}


def test_an_alternate_is_keyed_stable_and_not_a_derived_id() -> None:
    derived = _derived("input", 0)
    alternate = alternate_message_id(KEY, derived)
    assert alternate == alternate_message_id(KEY, derived)  # the same on every replay
    assert alternate != alternate_message_id(OLD_KEY, derived)  # unpredictable without the key
    assert alternate != alternate_message_id(KEY, _derived("input", 1))
    parsed = uuid.UUID(alternate)
    assert (parsed.version, parsed.variant, str(parsed)) == (8, uuid.RFC_4122, alternate)


def _squat() -> dict[str, object]:
    """B's turn storing, in B's own thread, the ids the service will derive for A's turn a-2."""
    return response(
        "tb",
        resource=B,
        request_id="b-1",
        input=[user(_derived("input", 0), "squat", 1)],
        output=[assistant(_derived("response", 0), "squat", 2)],
    )


def _a_turn() -> dict[str, object]:
    """A's turn a-2 as its worker answers it: the input with the id the recall path derived, the response
    without one (the persist path derives it)."""
    return response(
        "ta",
        resource=A,
        request_id="a-2",
        input=[user(_derived("input", 0), "mine", 10)],
        output=[assistant(None, "my answer", 11)],
    )


async def test_without_keys_the_squatted_turn_is_refused() -> None:
    """The failure the alternates prevent: with no key, A's turn is refused for B's rows."""
    paths = Paths()
    await paths.persist(_squat())
    batch = await paths.persist(_a_turn())
    assert isinstance(batch.dead[0], MessageIdTakenError)


@pytest.mark.parametrize("one_batch", [False, True], ids=["squat-stored-first", "squat-earlier-in-the-batch"])
async def test_a_squatted_derived_id_yields_to_its_alternate(one_batch: bool) -> None:
    paths = Paths(id_keys=[KEY])
    if one_batch:
        batch = await paths.persist(_squat(), _a_turn())
        assert batch.dead == {}
        saved = batch.event(1)["savedMessageIds"]
    else:
        await paths.persist(_squat())
        saved = (await paths.persist(_a_turn())).event(0)["savedMessageIds"]
    alternates = [alternate_message_id(KEY, _derived(kind, 0)) for kind in ("input", "response")]
    assert saved == alternates
    assert await paths.stored_ids("ta") == alternates
    assert await paths.stored_ids("tb") == [_derived("input", 0), _derived("response", 0)]
    again = await paths.persist(_a_turn())  # redelivered: the same rows, nothing added
    assert again.event(0)["savedMessageIds"] == alternates
    assert await paths.stored_ids("ta") == alternates


async def test_a_client_chosen_id_another_thread_holds_still_refuses_the_turn() -> None:
    """Only ids the service derived for the turn yield; a client's own id is the client's to make unique."""
    paths = Paths(id_keys=[KEY])
    await paths.persist(response("tb", resource=B, request_id="b-1", input=[user("msg-1", "x", 1)]))
    mine = response(
        "ta", resource=A, request_id="a-1", input=[user("msg-1", "y", 2)], output=[assistant(None, "z", 3)]
    )
    assert isinstance((await paths.persist(mine)).dead[0], MessageIdTakenError)


async def test_after_a_key_rotation_the_old_alternate_is_kept() -> None:
    """Saved under the old key's alternate; the key rotated (the old one kept as previous): a redelivery
    updates the rows it made instead of adding copies under the new key's alternates."""
    before = Paths(id_keys=[OLD_KEY])
    await before.persist(_squat(), _a_turn())
    old = await before.stored_ids("ta")
    assert old == [alternate_message_id(OLD_KEY, _derived(kind, 0)) for kind in ("input", "response")]
    rotated = Paths(id_keys=[KEY, OLD_KEY], storage=before.persist_handler.storage)
    batch = await rotated.persist(_a_turn())
    assert batch.event(0)["savedMessageIds"] == old
    assert await rotated.stored_ids("ta") == old
