"""The pure parts of `message-history replay`: offset specs, timestamps, ranges, the rate limit, the tallies.

No I/O and no asyncio here (the Kafka and MongoDB side is the rest of `message_history.app.replay`), so every
rule is unit-tested with plain values and a fake clock.

* `--from-offsets 0:120,3:7` names the partitions to replay and where each starts; `format_offsets` writes the
  same form, so the resume flag printed after an interrupt can be pasted back as is.
* A partition's range is `[start, end)`: `end` is the end offset captured when the replay starts (or the
  first offset at `--until-timestamp`, whichever is lower), so a replay finishes while producers keep writing.
* `TokenBucket` spreads `--rate` events per second over time; it only computes how long to wait.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar

RESUME_FLAG = "--from-offsets"


class UsageError(ValueError):
    """A command-line value that cannot be used (exit code 2)."""


# --- offsets and timestamps --------------------------------------------------------------------------------


def parse_offsets(spec: str) -> dict[int, int]:
    """`"0:120,3:7"` -> `{0: 120, 3: 7}`; spaces are ignored, a partition may appear once."""
    offsets: dict[int, int] = {}
    items = [item.strip() for item in spec.split(",")]
    if not spec.strip() or any(not item for item in items):
        raise UsageError(f"--from-offsets {spec!r}: expected PARTITION:OFFSET[,PARTITION:OFFSET...]")
    for item in items:
        partition_text, sep, offset_text = item.partition(":")
        if not sep:
            raise UsageError(f"--from-offsets: {item!r} is not PARTITION:OFFSET")
        try:
            partition, offset = int(partition_text), int(offset_text)
        except ValueError:
            raise UsageError(f"--from-offsets: {item!r} is not PARTITION:OFFSET (two integers)") from None
        if partition < 0 or offset < 0:
            raise UsageError(f"--from-offsets: {item!r}: partition and offset must not be negative")
        if partition in offsets:
            raise UsageError(f"--from-offsets: partition {partition} is given twice")
        offsets[partition] = offset
    return offsets


def format_offsets(offsets: Mapping[int, int]) -> str:
    """The `--from-offsets` value for `offsets`, partitions in order (the inverse of `parse_offsets`)."""
    return ",".join(f"{partition}:{offsets[partition]}" for partition in sorted(offsets))


def resume_flag(offsets: Mapping[int, int]) -> str | None:
    """The ready-to-paste flag resuming at `offsets`, or None when there is nothing left to do."""
    return f"{RESUME_FLAG} {format_offsets(offsets)}" if offsets else None


def parse_timestamp(text: str, flag: str = "timestamp") -> datetime:
    """An ISO-8601 instant (`Z` or an offset; no offset means UTC), as an aware UTC datetime."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: not an ISO-8601 timestamp (e.g. 2026-01-10T08:00:00Z)") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def to_millis(value: datetime) -> int:
    """Kafka's timestamp unit: milliseconds since the epoch."""
    return int(value.timestamp() * 1000)


# --- ranges ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Offsets `[start, end)` of one partition to replay."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class Plan:
    """The ranges to replay, and what was adjusted on the way (each a sentence for the log)."""

    ranges: list[PartitionRange]
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(r.size for r in self.ranges)


def plan_ranges(
    *,
    beginning: Mapping[int, int],
    end: Mapping[int, int],
    start: Mapping[int, int | None],
    until: Mapping[int, int | None] | None = None,
) -> Plan:
    """The range of each partition in `start` (None = nothing at or after the start timestamp).

    `beginning` / `end` are the partitions' first and end offsets now. A start below the beginning (deleted by
    retention) starts at the beginning, with a note saying how many offsets are gone; a start past the end
    replays nothing. `until` (first offset at `--until-timestamp`; None = none yet) can only lower the end.
    """
    unknown = sorted(set(start) - set(end))
    if unknown:
        known = ", ".join(str(p) for p in sorted(end))
        raise UsageError(f"no partition {', '.join(map(str, unknown))} in the topic (it has {known})")
    ranges: list[PartitionRange] = []
    notes: list[str] = []
    for partition in sorted(start):
        first, stop = beginning[partition], end[partition]
        wanted = start[partition]
        if wanted is None:
            wanted = stop
        elif wanted < first:
            notes.append(
                f"partition {partition}: offsets {wanted}..{first - 1} are no longer in the topic "
                f"(retention); starting at {first}"
            )
            wanted = first
        limit = until.get(partition) if until is not None else None
        if limit is not None and limit < stop:
            stop = limit
        ranges.append(PartitionRange(partition, wanted, max(stop, wanted)))  # start past the end: empty
    return Plan(ranges, notes)


# --- rate limit --------------------------------------------------------------------------------------------


class TokenBucket:
    """At most `rate` events per second on average, bursts up to `burst` events. Pure: the caller sleeps.

    Taking more tokens than there are is allowed and goes into debt: the returned delay is how long until the
    debt is paid back, so a batch larger than the burst is simply spread over more time.
    """

    def __init__(self, rate: float, *, burst: float | None = None, now: float = 0.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        if self.burst <= 0:
            raise ValueError("burst must be positive")
        self._tokens = self.burst
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def take(self, count: int, now: float) -> float:
        """Take `count` tokens at time `now`; returns the seconds to wait before going on (0 when free)."""
        if count < 0:
            raise ValueError("count must not be negative")
        self._refill(now)
        self._tokens -= count
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def batch_limit(self) -> int:
        """The largest batch worth fetching at once: one burst (so stopping never waits on a huge debt)."""
        return max(1, int(self.burst))


# --- tallies -----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Counts:
    """What a replay did, for the progress display and the summary."""

    events: int = 0  # records read and finished (persisted, skipped, enriched or invalid)
    persisted: int = 0  # responses whose turn was saved
    skipped: Counter[str] = field(default_factory=Counter)  # responses saved nothing, by reason
    enriched: int = 0  # requests re-enriched (recall path)
    recalled: int = 0  # messages recalled into those
    invalid: int = 0  # bad records: dead-lettered or reported
    dead_lettered: int = 0
    messages_inserted: int = 0  # message ids not in MongoDB before their write (or that would be inserted)
    messages_present: int = 0  # message ids already in MongoDB
    threads: int = 0  # distinct threads written (or that would be)
    threads_new: int = 0  # of those, not in MongoDB before (dry run only)
    lost_to_retention: int = 0  # offsets deleted by retention while the replay ran
    observations: int = 0  # `--observe`: observations (reflections) sent and waited for until settled
    observing: int = 0  # `--observe`: of those, being waited for now
    invalid_samples: list[str] = field(default_factory=list)  # "partition/offset: error", first few

    SAMPLES: ClassVar[int] = 10

    def add_invalid(self, *, partition: int, offset: int, error: str, dead_lettered: bool) -> None:
        self.events += 1
        self.invalid += 1
        self.dead_lettered += int(dead_lettered)
        if len(self.invalid_samples) < self.SAMPLES:
            self.invalid_samples.append(f"{partition}/{offset}: {error}")

    def add_persisted(self, skipped: str | None) -> None:
        self.events += 1
        if skipped is None:
            self.persisted += 1
        else:
            self.skipped[skipped] += 1

    def add_enriched(self, recalled: int) -> None:
        self.events += 1
        self.enriched += 1
        self.recalled += recalled


def distinct(ids: Iterable[str]) -> list[str]:
    """`ids` without repeats, first occurrence order."""
    return list(dict.fromkeys(ids))


# --- command line ------------------------------------------------------------------------------------------


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `message-history replay` (checked further by `replay.options_from_args`)."""
    parser.add_argument(
        "--topic",
        metavar="TOPIC",
        help="source topic (default: the responses topic; with --emit-to, the requests topic)",
    )
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-beginning", action="store_true", help="start at each partition's first offset")
    start.add_argument(
        "--from-timestamp",
        metavar="ISO",
        help="start at the first record at or after this instant (UTC if no offset)",
    )
    start.add_argument(
        "--from-offsets",
        metavar="P:O,...",
        help="start partition P at offset O; only the partitions named are replayed (the resume flag's form)",
    )
    parser.add_argument(
        "--until-timestamp",
        metavar="ISO",
        help="stop before the first record at or after this instant (default: the end offsets at start)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing; count threads and messages, and how many would be inserted vs already present",
    )
    parser.add_argument(
        "--emit-persisted",
        action="store_true",
        help="also send a HistoryPersisted per response (default: none)",
    )
    parser.add_argument(
        "--observe",
        action="store_true",
        help=(
            "responses only: send Observational Memory's work (ObserveRequest / ReflectRequest) for replayed "
            "threads whose unobserved messages pass their threshold, as the live persist path does, and wait "
            "for each answer (applied by the live service's observed path) before the partition's next "
            "record: the rebuilt logs do not depend on --batch-size or --concurrency (default: none)"
        ),
    )
    parser.add_argument(
        "--observe-wait-s",
        type=float,
        metavar="S",
        help=(
            "with --observe: stop (exit 1, resumable) when an observation is not settled within S seconds "
            "(default: MESSAGE_HISTORY_OBSERVATION_TIMEOUT_S)"
        ),
    )
    parser.add_argument(
        "--emit-to",
        metavar="TOPIC",
        help="re-enrich requests (recall path) into TOPIC; the source defaults to the requests topic",
    )
    parser.add_argument("--force", action="store_true", help="allow --emit-to the live enriched topic")
    parser.add_argument(
        "--rate", type=float, metavar="N", help="at most N events per second over all partitions"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        metavar="N",
        help="partitions replayed at once (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="records per batch (default: MESSAGE_HISTORY_MAX_BATCH_RECORDS)",
    )
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="do not dead-letter bad records; report them (log, summary, --invalid-report)",
    )
    parser.add_argument(
        "--invalid-report", metavar="FILE", help="append one JSON line per bad record to FILE"
    )
    parser.add_argument(
        "--max-retry-s",
        type=float,
        default=300.0,
        metavar="S",
        help="give up (exit 1, with the resume offsets) after S seconds of outage (default: %(default)s)",
    )
    parser.add_argument(
        "--progress",
        choices=["auto", "bar", "log", "none"],
        default="auto",
        help="progress bar on a terminal, log lines otherwise (default: %(default)s)",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between progress log lines (default: %(default)s)",
    )
