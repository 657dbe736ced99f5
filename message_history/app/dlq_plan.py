"""`message-history dlq`: which dead letters a command selects, and what a redriven record looks like (pure).

A dead letter (docs/events.md#9-dead-letters) is the refused record's key and value bytes with headers saying
why and where it came from (`schemas.dead_letters`). Selection is by `error.type`, by `failed.at` and by
offset range on the dead-letter topic; everything here is data in, data out, so the I/O module
(`message_history.app.dlq`) only reads, produces and reports.

Idempotence of a redrive: every redriven record carries `redrive.of` = `<dlq topic>:<partition>:<offset>`, the
dead letter it came from. Before producing, the redrive reads the target topics from the earliest selected
`failed.at` on (nothing older can be a redriven copy) and skips the dead letters whose marker is already
there: running the same redrive twice produces nothing the second time. The service's own idempotence
(upserts by message id, `eventId` on enriched requests) covers what is left, such as two redrives at once.

Where a redrive sends (`redrive_target`): each dead-letter topic's own input topic (the configured pair, else
its name minus `.dlq`), never a topic named only by the dead letter's `source.topic` header, which anyone able
to write to the dead-letter topic controls; `--to` names another target on purpose.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from message_history.app.replay.plan import UsageError, parse_timestamp
from schemas.dead_letters import DEAD_LETTER_HEADERS, DeadLetterInfo

REDRIVE_OF = "redrive.of"
REDRIVE_AT = "redrive.at"
REDRIVE_HEADERS = (REDRIVE_OF, REDRIVE_AT)

# How far before the earliest selected `failed.at` the redrive looks for markers: clocks of the service and
# of the machine running the redrive may disagree a little.
MARKER_CLOCK_SKEW = timedelta(minutes=5)
PREVIEW_BYTES = 200


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets `first`..`last` (inclusive) of one partition of the dead-letter topic."""

    partition: int
    first: int
    last: int

    def contains(self, partition: int, offset: int) -> bool:
        return partition == self.partition and self.first <= offset <= self.last


def parse_offset_ranges(spec: str) -> tuple[OffsetRange, ...]:
    """`"0:100-120,3:7"` -> ranges (`P:O` is one offset); a partition may repeat, a range may not be empty."""
    ranges: list[OffsetRange] = []
    items = [item.strip() for item in spec.split(",")]
    if not spec.strip() or any(not item for item in items):
        raise UsageError(f"--offsets {spec!r}: expected PARTITION:FIRST-LAST[,PARTITION:FIRST-LAST...]")
    for item in items:
        partition_text, sep, span = item.partition(":")
        first_text, dash, last_text = span.partition("-")
        try:
            partition, first = int(partition_text), int(first_text)
            last = int(last_text) if dash else first
        except ValueError:
            raise UsageError(f"--offsets: {item!r} is not PARTITION:FIRST-LAST (integers)") from None
        if not sep or partition < 0 or first < 0:
            raise UsageError(f"--offsets: {item!r}: expected PARTITION:FIRST-LAST, none negative")
        if last < first:
            raise UsageError(f"--offsets: {item!r}: the last offset is before the first")
        ranges.append(OffsetRange(partition, first, last))
    return tuple(ranges)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a command applies to; an empty field does not filter."""

    error_types: frozenset[str] = frozenset()
    since: datetime | None = None
    until: datetime | None = None
    ranges: tuple[OffsetRange, ...] = ()
    source_topics: frozenset[str] = frozenset()

    @property
    def filters(self) -> bool:
        return bool(self.error_types or self.since or self.until or self.ranges or self.source_topics)

    def partitions(self) -> frozenset[int] | None:
        """The dead-letter partitions worth reading (None: all of them)."""
        return frozenset(r.partition for r in self.ranges) if self.ranges else None

    def bounds(self, partition: int) -> tuple[int, int] | None:
        """(first, last) offsets worth reading in `partition`, or None when no range restricts it."""
        spans = [r for r in self.ranges if r.partition == partition]
        if not spans:
            return None
        return min(r.first for r in spans), max(r.last for r in spans)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record of a dead-letter topic: where it is, its bytes, and its parsed headers (None: not ours)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    info: DeadLetterInfo | None
    problem: str = ""

    @property
    def ref(self) -> str:
        """`<topic>:<partition>:<offset>`: the `redrive.of` marker of this dead letter."""
        return f"{self.topic}:{self.partition}:{self.offset}"


def failed_at(info: DeadLetterInfo) -> datetime | None:
    """`failed.at` as a datetime, None when the header does not parse."""
    try:
        return parse_timestamp(info.failed_at)
    except UsageError:
        return None


def _in_time(info: DeadLetterInfo, selection: Selection) -> bool:
    if selection.since is None and selection.until is None:
        return True
    when = failed_at(info)
    if when is None:
        return False  # a time filter cannot vouch for a dead letter whose time does not parse
    return (selection.since is None or when >= selection.since) and (
        selection.until is None or when < selection.until
    )


def selected(letter: DeadLetter, selection: Selection) -> bool:
    """Whether `letter` passes every filter of `selection` (a record without our headers never does)."""
    info = letter.info
    if info is None:
        return False
    return (
        (not selection.ranges or any(r.contains(letter.partition, letter.offset) for r in selection.ranges))
        and (not selection.error_types or info.error_type in selection.error_types)
        and (not selection.source_topics or info.source_topic in selection.source_topics)
        and _in_time(info, selection)
    )


def redrive_headers(letter: DeadLetter, *, now: str) -> list[tuple[str, bytes]]:
    """The original headers (such as `traceparent`), without the service's and any earlier redrive marker,
    plus this redrive's `redrive.of` and `redrive.at`."""
    ours = set(DEAD_LETTER_HEADERS) | set(REDRIVE_HEADERS)
    kept = [(k, v) for k, v in letter.headers if k not in ours]
    return [*kept, (REDRIVE_OF, letter.ref.encode()), (REDRIVE_AT, now.encode())]


DLQ_SUFFIX = ".dlq"


def own_input(dlq_topic: str, inputs: Mapping[str, str]) -> str | None:
    """The input topic whose refusals `dlq_topic` holds: the configured pair (`inputs`: dead-letter topic ->
    input topic, from the settings), else the name minus `.dlq`; None when neither says."""
    if dlq_topic in inputs:
        return inputs[dlq_topic]
    if dlq_topic.endswith(DLQ_SUFFIX) and len(dlq_topic) > len(DLQ_SUFFIX):
        return dlq_topic[: -len(DLQ_SUFFIX)]
    return None


@dataclass(frozen=True, slots=True)
class Refused:
    """A selected dead letter that a redrive does not send, and why."""

    reason: str


def redrive_target(letter: DeadLetter, override: str | None, inputs: Mapping[str, str]) -> str | Refused:
    """Where the dead letter goes back to: `--to` when given, else its dead-letter topic's own input topic.

    `source.topic` is only a header: whoever can write to a dead-letter topic can make it name any topic (the
    commands topic, say, where a planted `ForgetResource` would erase a tenant under the service's
    credentials). So without `--to` a dead letter is sent only to the input topic its dead-letter topic
    belongs to, and one whose `source.topic` names another topic is refused (reported, counted, not sent).
    """
    if override is not None:
        return override
    assert letter.info is not None  # only selected letters are redriven
    own = own_input(letter.topic, inputs)
    if own is None:
        return Refused(
            f"no input topic is known for {letter.topic!r} (not configured, no .dlq suffix): use --to"
        )
    if letter.info.source_topic != own:
        return Refused(
            f"source.topic {letter.info.source_topic!r} is not {letter.topic!r}'s input topic {own!r}"
            " (not sent; --to sends it elsewhere on purpose)"
        )
    return own


def marker(headers: Iterable[tuple[str, bytes | None]]) -> str | None:
    """The `redrive.of` header of a record of a target topic, if it has one."""
    for key, value in headers:
        if key == REDRIVE_OF and value:
            return value.decode("utf-8", errors="replace")
    return None


def earliest_failure(letters: Sequence[DeadLetter]) -> datetime | None:
    """The earliest parseable `failed.at` among `letters`, minus the clock-skew margin."""
    times = [t for t in (failed_at(d.info) for d in letters if d.info is not None) if t is not None]
    return min(times) - MARKER_CLOCK_SKEW if times else None


@dataclass
class Tally:
    """What a dlq command has done so far, for the progress lines and the summary."""

    total: int = 0  # records of the dead-letter topics within the bounds
    read: int = 0
    selected: int = 0
    not_dead_letters: int = 0
    redriven: int = 0
    already_redriven: int = 0
    refused: int = 0  # source.topic not the dead-letter topic's own input: never sent
    by_error_type: dict[str, int] = field(default_factory=dict)

    def count(self, letter: DeadLetter, *, is_selected: bool) -> None:
        self.read += 1
        if letter.info is None:
            self.not_dead_letters += 1
        if is_selected and letter.info is not None:
            self.selected += 1
            self.by_error_type[letter.info.error_type] = self.by_error_type.get(letter.info.error_type, 0) + 1


def printable(text: str) -> str:
    """`text` with every character a terminal would act on escaped as Python writes it (`\\x1b`, `\\r`,
    `\\x00`, `\\u202e`): control characters, format characters (bidi overrides), line and paragraph
    separators. Whoever can write to a dead-letter topic writes its headers, and `dlq inspect` prints them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def preview(value: bytes | None, limit: int = PREVIEW_BYTES) -> str:
    """A printable start of a value: text as text, anything else escaped; `…` when cut."""
    if value is None:
        return "(null)"
    head = value[:limit]
    text = printable(head.decode("utf-8", errors="backslashreplace"))
    return text + ("…" if len(value) > limit else "")


def describe(letter: DeadLetter) -> dict[str, object]:
    """One dead letter as the JSON line of `dlq inspect --json`."""
    info = letter.info
    out: dict[str, object] = {
        "topic": letter.topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "key": None if letter.key is None else letter.key.decode("utf-8", errors="backslashreplace"),
        "bytes": 0 if letter.value is None else len(letter.value),
    }
    if info is None:
        return {**out, "deadLetter": False, "problem": letter.problem}
    return {
        **out,
        "errorType": info.error_type,
        "errorMessage": info.error_message,
        "errorPath": info.error_path,
        "source": {
            "topic": info.source_topic,
            "partition": info.source_partition,
            "offset": info.source_offset,
        },
        "failedAt": info.failed_at,
        "serviceVersion": info.service_version,
        "headers": {k: v.decode("utf-8", errors="backslashreplace") for k, v in info.headers},
    }


def line(letter: DeadLetter, *, show_value: bool = False) -> str:
    """One dead letter as a line of `dlq inspect`."""
    head = printable(letter.ref)
    info = letter.info
    if info is None:
        return f"{head}  not a dead letter: {printable(letter.problem)}"
    text = (
        f"{head}  {printable(info.failed_at)}  {printable(info.error_type)}"
        f"  from {printable(info.source_topic)}:{info.source_partition}:{info.source_offset}"
        f"  key={preview(letter.key, 64)}  {printable(info.error_message)}"
    )
    if info.error_path:
        text += f" (at {printable(info.error_path)})"
    if show_value:
        text += f"\n    value: {preview(letter.value)}"
    return text


def summary(tally: Tally, *, command: str, dry_run: bool = False) -> list[str]:
    """The closing lines of a dlq command."""
    lines = [
        f"{command}: read {tally.read:,} record(s), {tally.selected:,} selected"
        + (f", {tally.not_dead_letters:,} without dead-letter headers" if tally.not_dead_letters else "")
    ]
    for error_type, count in sorted(tally.by_error_type.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {printable(error_type)}: {count:,}")
    if command == "redrive":
        verb = "would redrive" if dry_run else "redriven"
        lines.append(
            f"{command}: {verb} {tally.redriven:,}, skipped {tally.already_redriven:,} already redriven"
            f", refused {tally.refused:,} (source.topic not the dead-letter topic's input)"
        )
    return lines


def selection_from_args(args: argparse.Namespace) -> Selection:
    """The filters of the command line, checked (`UsageError` for unusable values)."""
    since = parse_timestamp(args.since, "--since") if args.since else None
    until = parse_timestamp(args.until, "--until") if args.until else None
    if since is not None and until is not None and until <= since:
        raise UsageError("--until must be later than --since")
    return Selection(
        error_types=frozenset(args.error_type or ()),
        since=since,
        until=until,
        ranges=parse_offset_ranges(args.offsets) if args.offsets else (),
        source_topics=frozenset(args.source_topic or ()),
    )


def default_topics(args: argparse.Namespace, dlq_topics: Mapping[str, str]) -> list[str]:
    """`--topic` values, else the dead-letter topic of `--path`, else both of the service's."""
    if args.topic:
        return list(dict.fromkeys(args.topic))
    if args.path:
        return [dlq_topics[args.path]]
    return list(dict.fromkeys(dlq_topics.values()))


def add_dlq_arguments(parser: argparse.ArgumentParser) -> None:
    """`dlq inspect` and `dlq redrive`, with the filters both share."""
    sub = parser.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    inspect = sub.add_parser("inspect", help="list dead letters with their reasons (assign(), no group)")
    redrive = sub.add_parser(
        "redrive", help="produce selected dead letters back to their input topic (bounded, idempotent)"
    )
    for command in (inspect, redrive):
        where = command.add_argument_group("which dead-letter topics")
        where.add_argument(
            "--topic", action="append", help="a dead-letter topic (repeatable; default: the service's two)"
        )
        where.add_argument("--path", choices=["recall", "persist"], help="only this path's dead-letter topic")
        filters = command.add_argument_group("filters (all must match)")
        filters.add_argument(
            "--error-type", action="append", metavar="TYPE", help="error.type, e.g. EventValidationError"
        )
        filters.add_argument("--since", metavar="TIMESTAMP", help="failed.at at or after this instant")
        filters.add_argument("--until", metavar="TIMESTAMP", help="failed.at before this instant (ISO-8601)")
        filters.add_argument(
            "--offsets", metavar="P:FIRST-LAST[,...]", help="offset ranges in the dead-letter topic"
        )
        filters.add_argument(
            "--source-topic", action="append", metavar="TOPIC", help="source.topic (repeatable)"
        )
        command.add_argument("--limit", type=int, metavar="N", help="stop after N selected dead letters")
        command.add_argument(
            "--progress-interval", type=float, default=2.0, metavar="S", help="seconds between progress lines"
        )
    inspect.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    inspect.add_argument("--show-value", action="store_true", help="also print the start of each value")
    redrive.add_argument(
        "--to",
        metavar="TOPIC",
        help="produce here instead of each dead-letter topic's own input topic (source.topic must name it)",
    )
    redrive.add_argument("--dry-run", action="store_true", help="list what would be redriven; send nothing")
    redrive.add_argument(
        "--all", action="store_true", help="allow a redrive without any filter (every dead letter)"
    )
    redrive.add_argument(
        "--force", action="store_true", help="redrive also dead letters already redriven (no marker check)"
    )
