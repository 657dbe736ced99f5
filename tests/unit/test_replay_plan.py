"""Replay's pure rules: the offset spec, timestamps, partition ranges, the token bucket, the tallies."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from message_history.app.replay.plan import (
    Counts,
    PartitionRange,
    TokenBucket,
    UsageError,
    format_offsets,
    parse_offsets,
    parse_timestamp,
    plan_ranges,
    resume_flag,
    to_millis,
)

# --- offset spec -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0:0", {0: 0}),
        ("0:120,3:7", {0: 120, 3: 7}),
        (" 2:5 , 1:9 ", {2: 5, 1: 9}),
        ("10:12345678901", {10: 12345678901}),
    ],
    ids=["one", "two", "spaces", "large"],
)
def test_parse_offsets_reads_partition_offset_pairs(spec: str, expected: dict[int, int]) -> None:
    """`P:O,...` becomes a partition -> offset mapping."""
    assert parse_offsets(spec) == expected


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("", "expected PARTITION:OFFSET"),
        ("0:1,", "expected PARTITION:OFFSET"),
        ("0", "is not PARTITION:OFFSET"),
        ("a:1", "two integers"),
        ("0:x", "two integers"),
        ("-1:4", "must not be negative"),
        ("0:-4", "must not be negative"),
        ("0:1,0:2", "partition 0 is given twice"),
    ],
    ids=[
        "empty",
        "trailing-comma",
        "no-colon",
        "bad-partition",
        "bad-offset",
        "neg-partition",
        "neg-offset",
        "dup",
    ],
)
def test_parse_offsets_refuses_malformed_specs(spec: str, complaint: str) -> None:
    """A malformed spec is a usage error that says what is wrong."""
    with pytest.raises(UsageError, match=complaint):
        parse_offsets(spec)


@pytest.mark.parametrize(
    "offsets", [{0: 0}, {3: 7, 0: 120}, {i: i * 1000 for i in range(12)}], ids=["one", "unordered", "twelve"]
)
def test_format_offsets_round_trips_through_parse(offsets: dict[int, int]) -> None:
    """The printed resume value parses back to the same offsets, partitions in order."""
    text = format_offsets(offsets)
    assert parse_offsets(text) == offsets
    assert [int(item.split(":")[0]) for item in text.split(",")] == sorted(offsets)


@pytest.mark.parametrize(
    ("offsets", "flag"),
    [({}, None), ({1: 40, 0: 12}, "--from-offsets 0:12,1:40")],
    ids=["nothing-left", "two-partitions"],
)
def test_resume_flag_is_ready_to_paste(offsets: dict[int, int], flag: str | None) -> None:
    """The resume flag names every partition with work left, or is absent when none has."""
    assert resume_flag(offsets) == flag


# --- timestamps --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-10T08:00:00Z", datetime(2026, 1, 10, 8, tzinfo=UTC)),
        ("2026-01-10T08:00:00.250Z", datetime(2026, 1, 10, 8, 0, 0, 250_000, tzinfo=UTC)),
        ("2026-01-10T09:00:00+01:00", datetime(2026, 1, 10, 8, tzinfo=UTC)),
        ("2026-01-10T08:00:00", datetime(2026, 1, 10, 8, tzinfo=UTC)),
        ("2026-01-10", datetime(2026, 1, 10, tzinfo=UTC)),
    ],
    ids=["zulu", "millis", "offset", "naive-is-utc", "date-only"],
)
def test_parse_timestamp_reads_iso_instants_as_utc(text: str, expected: datetime) -> None:
    """ISO-8601 instants parse to aware UTC datetimes; no offset means UTC."""
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01T00:00:00Z", ""], ids=["word", "month-13", "empty"])
def test_parse_timestamp_refuses_non_iso(text: str) -> None:
    """Anything but ISO-8601 is a usage error naming the flag."""
    with pytest.raises(UsageError, match="--until-timestamp"):
        parse_timestamp(text, "--until-timestamp")


def test_to_millis_is_kafka_time() -> None:
    """Kafka timestamps are milliseconds since the epoch."""
    assert to_millis(datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)) == 1500


# --- ranges ------------------------------------------------------------------------------------------------


BEGIN = {0: 0, 1: 10}
END = {0: 100, 1: 50}


@pytest.mark.parametrize(
    ("start", "until", "ranges"),
    [
        ({0: 0, 1: 10}, None, [PartitionRange(0, 0, 100), PartitionRange(1, 10, 50)]),
        ({1: 20}, None, [PartitionRange(1, 20, 50)]),
        ({0: None, 1: 30}, None, [PartitionRange(0, 100, 100), PartitionRange(1, 30, 50)]),
        ({0: 120}, None, [PartitionRange(0, 120, 120)]),
        ({0: 0, 1: 10}, {0: 40, 1: None}, [PartitionRange(0, 0, 40), PartitionRange(1, 10, 50)]),
        ({0: 50}, {0: 40}, [PartitionRange(0, 50, 50)]),
        ({0: 0}, {0: 500}, [PartitionRange(0, 0, 100)]),
    ],
    ids=[
        "from-beginning",
        "only-named-partitions",
        "no-record-after-start",
        "start-past-end",
        "until-lowers-end",
        "until-before-start",
        "until-never-raises-end",
    ],
)
def test_plan_ranges(
    start: dict[int, int | None], until: dict[int, int | None] | None, ranges: list[PartitionRange]
) -> None:
    """Each named partition runs from its start to the lower of the captured end and the until offset."""
    plan = plan_ranges(beginning=BEGIN, end=END, start=start, until=until)
    assert plan.ranges == ranges
    assert plan.total == sum(r.size for r in ranges)
    assert plan.notes == []


def test_plan_ranges_starts_at_the_beginning_when_retention_deleted_the_start() -> None:
    """A start below the first kept offset starts there, with a note saying which offsets are gone."""
    plan = plan_ranges(beginning=BEGIN, end=END, start={1: 3})
    assert plan.ranges == [PartitionRange(1, 10, 50)]
    assert plan.notes == ["partition 1: offsets 3..9 are no longer in the topic (retention); starting at 10"]


def test_plan_ranges_refuses_unknown_partitions() -> None:
    """Naming a partition the topic does not have is a usage error listing the real ones."""
    with pytest.raises(UsageError, match=r"no partition 7 in the topic \(it has 0, 1\)"):
        plan_ranges(beginning=BEGIN, end=END, start={0: 0, 7: 0})


# --- token bucket ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "burst", "takes", "delays"),
    [
        (10.0, None, [(0.0, 10)], [0.0]),
        (10.0, None, [(0.0, 10), (0.0, 5)], [0.0, 0.5]),
        (10.0, None, [(0.0, 10), (1.0, 10)], [0.0, 0.0]),
        (10.0, None, [(0.0, 10), (0.5, 10)], [0.0, 0.5]),
        (10.0, None, [(0.0, 30)], [2.0]),
        (10.0, None, [(0.0, 30), (2.0, 1)], [2.0, 0.1]),
        (100.0, 10.0, [(0.0, 10), (5.0, 20)], [0.0, 0.1]),
        (0.5, None, [(0.0, 1), (0.0, 1)], [0.0, 2.0]),
        (5.0, None, [(0.0, 0)], [0.0]),
    ],
    ids=[
        "first-burst-free",
        "over-burst-waits",
        "refilled-after-a-second",
        "half-refilled",
        "big-batch-goes-into-debt",
        "debt-is-paid-first",
        "idle-refill-capped-at-burst",
        "slower-than-one-per-second",
        "nothing-taken",
    ],
)
def test_token_bucket_delays(
    rate: float, burst: float | None, takes: list[tuple[float, int]], delays: list[float]
) -> None:
    """Takes within the rate are free; beyond it the delay is exactly what pays the tokens back."""
    bucket = TokenBucket(rate, burst=burst, now=0.0)
    got = [bucket.take(count, now) for now, count in takes]
    assert got == pytest.approx(delays)


def test_token_bucket_holds_the_average_rate_over_time() -> None:
    """Taking batches and waiting the returned delays on a fake clock gives `rate` events per second."""
    bucket = TokenBucket(50.0, now=0.0)
    now, taken = 0.0, 0
    while taken < 1000:
        now += bucket.take(7, now)
        taken += 7
    # The first burst (50) is free; the rest comes at 50/s.
    assert (taken - 50) / now == pytest.approx(50.0, rel=0.01)


@pytest.mark.parametrize(
    ("rate", "limit"), [(0.5, 1), (5.0, 5), (2000.0, 2000)], ids=["slow", "five", "fast"]
)
def test_token_bucket_batch_limit_is_one_burst(rate: float, limit: int) -> None:
    """A rate-limited replay fetches at most one burst at a time, so a stop never waits on a long debt."""
    assert TokenBucket(rate).batch_limit() == limit


@pytest.mark.parametrize(
    ("rate", "burst"), [(0.0, None), (-1.0, None), (1.0, 0.0)], ids=["zero", "neg", "burst0"]
)
def test_token_bucket_refuses_non_positive_settings(rate: float, burst: float | None) -> None:
    """A rate or burst that is not positive is refused."""
    with pytest.raises(ValueError, match="must be positive"):
        TokenBucket(rate, burst=burst)


# --- tallies -----------------------------------------------------------------------------------------------


def test_counts_tally_outcomes_and_keep_a_few_invalid_samples() -> None:
    """Each outcome is one event, skipped ones by reason; only the first invalid positions are kept."""
    counts = Counts()
    counts.add_persisted(None)
    counts.add_persisted("read-only")
    counts.add_persisted("read-only")
    counts.add_enriched(recalled=4)
    for offset in range(Counts.SAMPLES + 3):
        counts.add_invalid(
            partition=1, offset=offset, error="EventValidationError: x", dead_lettered=offset % 2 == 0
        )
    assert counts.events == 4 + Counts.SAMPLES + 3
    assert (counts.persisted, dict(counts.skipped), counts.enriched, counts.recalled) == (
        1,
        {"read-only": 2},
        1,
        4,
    )
    assert counts.invalid == Counts.SAMPLES + 3
    assert counts.dead_lettered == len([o for o in range(Counts.SAMPLES + 3) if o % 2 == 0])
    assert counts.invalid_samples[0] == "1/0: EventValidationError: x"
    assert len(counts.invalid_samples) == Counts.SAMPLES


@pytest.mark.parametrize("module", ["message_history.app.replay.plan", "message_history.app.replay.progress"])
def test_replay_rules_and_display_import_no_io(module: str) -> None:
    """The replay's pure rules and its progress display load neither Kafka, MongoDB nor asyncio."""
    from tests.unit.test_purity import FORBIDDEN, loaded_top_level_modules  # noqa: PLC0415

    loaded = loaded_top_level_modules(module)
    assert "message_history" in loaded
    assert sorted(loaded.intersection(FORBIDDEN)) == []
