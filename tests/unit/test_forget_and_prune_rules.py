"""The pure parts of forget and prune: tombstone semantics, commands, durations, cut-offs, which paths run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from message_history.app.prune import cutoff_from, parse_duration
from message_history.app.service import selected_paths
from message_history.errors import EventValidationError
from message_history.settings import Settings
from schemas.commands import (
    MAX_LISTED_IDS,
    ForgetOutcome,
    ForgetResource,
    ForgetThread,
    command_key,
    decode_command,
    forgotten_event,
)
from schemas.limits import Limits
from storage.protocol import Tombstones

T = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("thread", "resource", "created", "forgotten"),
    [
        ("t", "r", T - timedelta(days=1), True),  # made before the thread was forgotten
        ("t", "r", T, True),  # at the same millisecond: the forget saw it
        ("t", "r", T + timedelta(milliseconds=1), False),  # new history after the forget
        ("other", "r", T - timedelta(days=1), False),
        ("other", "gone", T - timedelta(days=1), True),  # its resource was forgotten
        ("other", "gone", T + timedelta(days=2), False),
    ],
)
def test_tombstones_forget_turns_made_before_them(
    thread: str, resource: str, created: datetime, forgotten: bool
) -> None:
    """A turn is forgotten when made at or before its thread's or its resource's tombstone."""
    stones = Tombstones(threads={"t": T}, resources={"gone": T + timedelta(days=1)})
    assert stones.forgets(thread_id=thread, resource_id=resource, created_at=created) is forgotten


def _raw(**fields: Any) -> bytes:
    return json.dumps(
        {"schemaVersion": 1, "requestId": "c1", "createdAt": "2026-01-01T00:00:00.000Z", **fields}
    ).encode()


def test_commands_decode_by_their_name_and_are_keyed_like_the_events() -> None:
    """`command` picks the type; the key is the thread id, or the resource id."""
    thread = decode_command(_raw(command="ForgetThread", threadId="t1", resourceId="u"))
    resource = decode_command(_raw(command="ForgetResource", resourceId="u", dryRun=True))
    assert isinstance(thread, ForgetThread)
    assert isinstance(resource, ForgetResource)
    assert resource.dryRun is True
    assert (command_key(thread), command_key(resource)) == (b"t1", b"u")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (_raw(command="ForgetEverything", resourceId="u"), "command"),
        (_raw(command="ForgetThread"), "threadId"),
        (_raw(command="ForgetThread", threadId="  "), "empty"),
        (_raw(command="ForgetResource", resourceId="u" * 300), "limit"),
        (_raw(command="ForgetResource", resourceId="u", schemaVersion=2), "schemaVersion"),
        (b"\x00\x00\x00\x00\x01{}", "Schema Registry"),
        (b"{not json", "JSON|json"),
    ],
)
def test_bad_commands_are_refused_with_a_reason(raw: bytes, match: str) -> None:
    """Unknown command, missing or blank ids, over a limit, another version, framed, not JSON."""
    with pytest.raises(EventValidationError, match=match):
        decode_command(raw, Limits())


def test_the_answer_lists_at_most_so_many_ids_but_counts_them_all() -> None:
    """Ids are cut at `MAX_LISTED_IDS` (and say so); the counts are complete."""
    ids = [f"m{i}" for i in range(MAX_LISTED_IDS + 5)]
    outcome = ForgetOutcome("resource", "u", T, False, ids, ["t"], len(ids), 1)
    event = forgotten_event(outcome, None, request_id="r")
    assert (len(event.messageIds), event.deletedMessages, event.idsTruncated) == (
        MAX_LISTED_IDS,
        len(ids),
        True,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90d", timedelta(days=90)),
        ("12h", timedelta(hours=12)),
        ("30m", timedelta(minutes=30)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        (" 1.5d ", timedelta(hours=36)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    """A number and a unit (s, m, h, d, w)."""
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "90", "d", "-1d", "0d", "3y", "1 day"])
def test_bad_durations_are_refused(text: str) -> None:
    """No unit, no number, negative, zero or an unknown unit: a `ValueError` saying what is expected."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_cutoff_is_now_minus_the_age_or_the_instant_given() -> None:
    """`--older-than` counts back from now; `--before` is taken as is (UTC); exactly one of them."""
    now = datetime(2026, 3, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert cutoff_from(older_than="1d", before=None, now=now) == datetime(
        2026, 2, 28, 0, 0, 0, 123000, tzinfo=UTC
    )
    assert cutoff_from(older_than=None, before="2026-01-01T00:00:00Z", now=now) == datetime(
        2026, 1, 1, tzinfo=UTC
    )
    with pytest.raises(ValueError, match="exactly one"):
        cutoff_from(older_than=None, before=None, now=now)


@pytest.mark.parametrize(
    ("only", "commands_topic", "expected"),
    [
        (None, "agent.history.commands", ("recall", "persist", "commands")),
        ("persist", "agent.history.commands", ("persist", "commands")),
        ("recall", "agent.history.commands", ("recall",)),
        ("commands", "agent.history.commands", ("commands",)),
        (None, "", ("recall", "persist")),
        ("persist", "", ("persist",)),
    ],
)
def test_the_commands_path_runs_with_the_persist_path(
    only: Any, commands_topic: str, expected: tuple[str, ...]
) -> None:
    """`run` and `run --only persist` include the commands path, unless its topic is set empty."""
    settings = Settings(
        commands_topic=commands_topic, observe_results_topic=""
    )  # the observed path: its own test
    assert selected_paths(settings, only) == expected
