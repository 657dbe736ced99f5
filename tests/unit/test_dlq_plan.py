"""`dlq` selection and redrive rules (pure): offset ranges, filters, the redriven headers, markers."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from message_history.app.dlq import options_from_args
from message_history.app.dlq_plan import (
    REDRIVE_AT,
    REDRIVE_OF,
    DeadLetter,
    OffsetRange,
    Refused,
    Selection,
    Tally,
    add_dlq_arguments,
    describe,
    earliest_failure,
    line,
    marker,
    own_input,
    parse_offset_ranges,
    preview,
    redrive_headers,
    redrive_target,
    selected,
    summary,
)
from message_history.app.replay.plan import UsageError
from message_history.settings import Settings
from schemas.dead_letters import DEAD_LETTER_HEADERS, parse_dead_letter_headers


def letter(
    offset: int = 5,
    *,
    partition: int = 0,
    error_type: str = "EventValidationError",
    failed_at: str = "2026-01-10T09:00:00.000Z",
    source_topic: str = "agent.requests",
    extra: tuple[tuple[str, bytes], ...] = (("traceparent", b"00-abc-def-01"),),
) -> DeadLetter:
    headers = (
        *extra,
        ("error.type", error_type.encode()),
        ("error.message", b"too big"),
        ("source.topic", source_topic.encode()),
        ("source.partition", b"2"),
        ("source.offset", b"41"),
        ("failed.at", failed_at.encode()),
        ("service.version", b"0.1.0"),
    )
    return DeadLetter(
        topic="agent.requests.dlq",
        partition=partition,
        offset=offset,
        key=b"thread-1",
        value=b'{"x": 1}',
        headers=headers,
        info=parse_dead_letter_headers(headers),
    )


NOT_OURS = DeadLetter(
    "agent.requests.dlq", 0, 9, b"k", b"v", (), None, "not a dead letter: missing header(s)"
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0:100-120", (OffsetRange(0, 100, 120),)),
        ("0:7", (OffsetRange(0, 7, 7),)),
        (" 0:1-2, 3:5-5 ,0:9-10", (OffsetRange(0, 1, 2), OffsetRange(3, 5, 5), OffsetRange(0, 9, 10))),
    ],
)
def test_offset_ranges_parse(spec: str, expected: tuple[OffsetRange, ...]) -> None:
    """`P:FIRST-LAST` lists parse into inclusive ranges; a single offset is a range of one."""
    assert parse_offset_ranges(spec) == expected


@pytest.mark.parametrize("spec", ["", "0", "0:", "0:5-3", "-1:2", "a:1-2", "0:1-2,", "0:x-3"])
def test_bad_offset_ranges_are_usage_errors(spec: str) -> None:
    """Anything but `P:FIRST-LAST` with non-negative, ordered integers is refused."""
    with pytest.raises(UsageError):
        parse_offset_ranges(spec)


T9 = datetime(2026, 1, 10, 9, 0, tzinfo=UTC)
T10 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("selection", "record", "expected"),
    [
        (Selection(), letter(), True),
        (Selection(), NOT_OURS, False),
        (Selection(error_types=frozenset({"EventValidationError"})), letter(), True),
        (Selection(error_types=frozenset({"ThreadOwnershipError"})), letter(), False),
        (Selection(ranges=(OffsetRange(0, 5, 5),)), letter(5), True),
        (Selection(ranges=(OffsetRange(0, 6, 9),)), letter(5), False),
        (Selection(ranges=(OffsetRange(1, 0, 9),)), letter(5), False),  # another partition
        (Selection(since=T9), letter(failed_at="2026-01-10T09:00:00.000Z"), True),  # since is inclusive
        (Selection(until=T9), letter(failed_at="2026-01-10T09:00:00.000Z"), False),  # until is exclusive
        (Selection(since=T9, until=T10), letter(failed_at="2026-01-10T09:59:59.999Z"), True),
        (Selection(since=T9), letter(failed_at="not a time"), False),
        (Selection(source_topics=frozenset({"agent.responses"})), letter(), False),
        (
            Selection(error_types=frozenset({"EventValidationError"}), ranges=(OffsetRange(0, 0, 3),)),
            letter(5),
            False,  # every filter must match
        ),
    ],
)
def test_selection(selection: Selection, record: DeadLetter, expected: bool) -> None:
    """A dead letter is selected when it passes every filter; a record without our headers never is."""
    assert selected(record, selection) is expected


def test_redrive_headers_keep_the_original_ones_and_mark_the_dead_letter() -> None:
    """The redriven record keeps its own headers (traceparent), loses the service's and any earlier marker,
    and names the dead letter it came from."""
    earlier = (("traceparent", b"00-abc-def-01"), (REDRIVE_OF, b"old:0:1"), (REDRIVE_AT, b"then"))
    headers = redrive_headers(letter(extra=earlier), now="2026-01-11T00:00:00.000Z")
    assert headers == [
        ("traceparent", b"00-abc-def-01"),
        (REDRIVE_OF, b"agent.requests.dlq:0:5"),
        (REDRIVE_AT, b"2026-01-11T00:00:00.000Z"),
    ]
    assert not {k for k, _ in headers} & set(DEAD_LETTER_HEADERS)


INPUTS = {"custom-refusals": "agent.requests", "agent.history.commands.dlq": "agent.history.commands"}


@pytest.mark.parametrize(
    ("dlq_topic", "source_topic", "to", "expected"),
    [
        # its own input: the name minus .dlq, or the configured pair
        ("agent.requests.dlq", "agent.requests", None, "agent.requests"),
        ("custom-refusals", "agent.requests", None, "agent.requests"),
        ("agent.history.commands.dlq", "agent.history.commands", None, "agent.history.commands"),
        # a header naming another topic: refused, whatever it names
        ("agent.requests.dlq", "agent.history.commands", None, None),
        ("agent.responses.dlq", "agent.requests", None, None),
        ("custom-refusals", "agent.history.commands", None, None),
        # a topic with no known input: nothing is trusted
        ("refusals", "refusals", None, None),
        (".dlq", "", None, None),
        # --to is the operator's explicit choice
        ("agent.requests.dlq", "agent.requests", "staging.requests", "staging.requests"),
        ("agent.requests.dlq", "agent.history.commands", "agent.requests", "agent.requests"),
    ],
)
def test_redrive_target_is_the_dead_letter_topics_own_input(
    dlq_topic: str, source_topic: str, to: str | None, expected: str | None
) -> None:
    """Without `--to`, a dead letter goes back only to its dead-letter topic's own input topic; a
    `source.topic` header naming anything else (planted by whoever can write the dead-letter topic) is
    refused with a reason, never followed."""
    target = redrive_target(replace(letter(source_topic=source_topic or "x"), topic=dlq_topic), to, INPUTS)
    if expected is None:
        assert isinstance(target, Refused)
        assert repr(dlq_topic) in target.reason
    else:
        assert target == expected


def test_own_input_prefers_the_configured_pair() -> None:
    """A configured pair wins over the name; the suffix rule needs something before `.dlq`."""
    assert own_input("agent.requests.dlq", {"agent.requests.dlq": "requests-v2"}) == "requests-v2"
    assert own_input("agent.requests.dlq", {}) == "agent.requests"
    assert own_input(".dlq", {}) is None
    assert own_input("refusals", {}) is None


def test_marker_reads_redrive_of() -> None:
    """Only `redrive.of` counts as a marker."""
    assert marker([("traceparent", b"x"), (REDRIVE_OF, b"t:0:5")]) == "t:0:5"
    assert marker([("traceparent", b"x"), (REDRIVE_OF, None)]) is None
    assert marker([]) is None


def test_earliest_failure_allows_for_clock_skew() -> None:
    """Markers are looked for from a few minutes before the earliest selected failure."""
    letters = [letter(failed_at="2026-01-10T10:00:00.000Z"), letter(failed_at="2026-01-10T09:00:00.000Z")]
    assert earliest_failure(letters) == datetime(2026, 1, 10, 8, 55, tzinfo=UTC)
    assert earliest_failure([letter(failed_at="?")]) is None


def test_line_and_json_name_the_reason_and_the_source() -> None:
    """The listing says where the dead letter is, why it was refused and where it came from."""
    text = line(letter(), show_value=True)
    assert text.startswith("agent.requests.dlq:0:5  2026-01-10T09:00:00.000Z  EventValidationError")
    assert "from agent.requests:2:41" in text
    assert "too big" in text
    assert 'value: {"x": 1}' in text
    doc = describe(letter())
    assert doc["errorType"] == "EventValidationError"
    assert doc["source"] == {"topic": "agent.requests", "partition": 2, "offset": 41}
    assert doc["headers"] == {"traceparent": "00-abc-def-01"}
    assert describe(NOT_OURS)["deadLetter"] is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "(null)"), (b"plain", "plain"), (b"\xff\x00a", "\\xff\\x00a"), (b"x" * 5, "xxx…")],
)
def test_preview(value: bytes | None, expected: str) -> None:
    """Values print as text where they are text, escaped otherwise, cut with an ellipsis."""
    assert preview(value, limit=3 if value == b"x" * 5 else 200) == expected


def test_summary_counts_by_reason() -> None:
    """The summary gives the totals and one line per error.type, most frequent first."""
    tally = Tally()
    for record in (letter(1), letter(2, error_type="ThreadOwnershipError"), letter(3)):
        tally.count(record, is_selected=True)
    tally.count(NOT_OURS, is_selected=False)
    tally.redriven, tally.already_redriven, tally.refused = 2, 1, 1
    assert summary(tally, command="redrive") == [
        "redrive: read 4 record(s), 3 selected, 1 without dead-letter headers",
        "  EventValidationError: 2",
        "  ThreadOwnershipError: 1",
        "redrive: redriven 2, skipped 1 already redriven,"
        " refused 1 (source.topic not the dead-letter topic's input)",
    ]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_dlq_arguments(parser)
    return parser.parse_args(argv)


def test_redrive_without_a_filter_needs_all() -> None:
    """A redrive of every dead letter must be asked for explicitly; inspect lists everything by default."""
    settings = Settings()
    with pytest.raises(UsageError, match="--all"):
        options_from_args(_args("redrive"), settings)
    assert options_from_args(_args("redrive", "--all"), settings).selection == Selection()
    assert options_from_args(_args("inspect"), settings).topics == (
        settings.requests_dlq,
        settings.responses_dlq,
    )


def test_topics_follow_path_or_topic() -> None:
    """`--path` picks that path's dead-letter topic; `--topic` names them outright."""
    settings = Settings()
    assert options_from_args(_args("inspect", "--path", "persist"), settings).topics == (
        settings.responses_dlq,
    )
    assert options_from_args(_args("inspect", "--topic", "a", "--topic", "b"), settings).topics == ("a", "b")


def test_since_must_precede_until() -> None:
    """An empty time window is a usage error, not an empty result."""
    with pytest.raises(UsageError, match="later"):
        options_from_args(
            _args("inspect", "--since", "2026-01-10T10:00Z", "--until", "2026-01-10T09:00Z"), Settings()
        )


def test_input_pairs_come_from_the_settings() -> None:
    """Configured dead-letter topics pair with their own input topics (the commands, observed paths' too)."""
    settings = Settings(
        requests_dlq_topic="req-refusals",
        commands_topic="cmds",
    )
    assert options_from_args(_args("inspect"), settings).inputs == {
        "req-refusals": settings.requests_topic,
        settings.responses_dlq: settings.responses_topic,
        "cmds.dlq": "cmds",
        settings.observe_results_dlq: settings.observe_results_topic,
    }


_FORGED = {
    "esc": "\x1b[2J\x1b[31mred\x1b]0;title\x07",
    "cr": "ok\rEVIL",
    "nul": "a\x00b",
    "bidi": "abc\u202edcba\u2066x\u2069",
    "newline": "one\ntwo\u2028three",
}
_HEADERS = ("error.type", "error.message", "error.path", "source.topic", "failed.at", "service.version")


@pytest.mark.parametrize("header", _HEADERS)
@pytest.mark.parametrize("forged", sorted(_FORGED))
def test_inspect_escapes_every_header_field(header: str, forged: str) -> None:
    """A forged dead letter's header cannot drive the terminal: every character a terminal acts on is printed
    escaped (`\\x1b`, `\\r`, `\\x00`, `\\u202e`), in the line, the summary and the JSON form."""
    base = dict(letter().headers)
    base["error.path"] = b"content.parts.0"
    base[header] = f"{header}-{_FORGED[forged]}".encode()
    headers = tuple(base.items())
    forged_letter = DeadLetter(
        "agent.requests.dlq", 0, 5, b"k\x1b", b"v", headers, parse_dead_letter_headers(headers)
    )
    tally = Tally()
    tally.count(forged_letter, is_selected=True)
    outputs = [
        line(forged_letter, show_value=True),
        *summary(tally, command="inspect"),
        json.dumps(describe(forged_letter), sort_keys=True),
    ]
    for text in outputs:
        assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    assert "\n" not in line(forged_letter)  # one dead letter, one line
    shown = line(forged_letter)
    assert f"{header}-" in shown or header in ("service.version",)  # the field is shown, escaped


def test_a_problem_line_is_escaped() -> None:
    """What is said about a record that is not a dead letter is escaped too."""
    letter_ = DeadLetter("agent.requests.dlq", 0, 9, b"k", b"v", (), None, "bad header \x1b[31m")
    assert line(letter_) == "agent.requests.dlq:0:9  not a dead letter: bad header \\x1b[31m"
