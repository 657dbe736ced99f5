"""The benchmark's pure parts: the workload's events are valid contract events, and the figures add up."""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable

import pytest
from aiokafka.partitioner import DefaultPartitioner

from bench import targets
from bench.cli import SIDE
from bench.cli import main as bench_main
from bench.context import SERVICE_RUNTIME_ENV, parse_env
from bench.extra import failover, persist_batch, persist_steps, update_command
from bench.idle import stage_ms_per_turn
from bench.procstat import cpu_seconds, cpu_seconds_fine, minor_faults
from bench.profile import summarize as summarize_profile
from bench.soak import summarize
from bench.stats import LINES, RATIOS, LineResult, median_round, percentile, ratios, render_table
from bench.stream_line import parse_metrics
from bench.workload import (
    Turns,
    Workload,
    encode_json,
    enriched_event,
    request_event,
    response_event,
    seed_documents,
    text,
)
from schemas.codec import decode_enriched, decode_request, decode_response
from storage.documents import message_from_doc

W = Workload(threads=3, history=6, message_bytes=200, batch=2, partitions=2, run_id="unit")


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([7.0], 99, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
        ([float(v) for v in range(1, 101)], 95, 95.05),
    ],
    ids=["empty", "single", "median-even", "min-unsorted", "max-unsorted", "p95-of-100"],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    """Percentiles interpolate between closest ranks, whatever the input order; none of an empty list."""
    assert percentile(values, q) == pytest.approx(expected)


def _line(name: str, events: int, wall: float, cpu: float | None, p99: float | None = None) -> LineResult:
    latencies = [p99] if p99 is not None else [1.0, 2.0]
    return LineResult(name, events, wall, cpu, 10 * 2**20, latencies_ms=latencies)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("recall_vs_limit", 100 / 200),  # min(B1 400/s, B2 200/s) = 200
        ("persist_vs_limit", 50 / 100),  # min(B1 100/s, B3 300/s) = 100
        ("recall_service_vs_naive", 100 / 5),
        ("persist_service_vs_naive", 50 / 2),
        ("turn_service_vs_naive", (1 / (1 / 100 + 1 / 50)) / (1 / (1 / 5 + 1 / 2))),
        ("recall_service_vs_mastra_per_core", (1000 / 2) / (1000 / 20)),
        ("persist_service_vs_mastra_per_core", (1000 / 4) / (1000 / 10)),
        ("turn_service_vs_mastra_per_core", (1 / (2 / 1000 + 4 / 1000)) / (1 / (20 / 1000 + 10 / 1000))),
        ("recall_service_vs_mastra_wall", 100 / 25),
        ("persist_service_vs_mastra_wall", 50 / 10),
        ("recall_cpu_vs_b1", (2 / 1000) / (1 / 4000)),  # CPU per event: service 2 ms, B1 0.25 ms
        ("persist_cpu_vs_b1", (4 / 1000) / (1 / 1000)),
        ("recall_vs_limit_models", 100 / 50),  # min(B1 400/s, B2 with models 50/s) = 50
        ("persist_vs_limit_models", 50 / 80),  # min(B1 100/s, B3 save_many 80/s) = 80
        ("turn_service_vs_mastra_memory_per_core", (1 / (2 / 1000 + 4 / 1000)) / (1000 / 5)),
        ("recall_p99_vs_b1", 30.0 / 10.0),  # p99 of [30] / p99 of [10]
        ("persist_p99_vs_b1", 8.0 / 4.0),
        ("recall_cpu_vs_floor", 2 / (0.25 + 1)),  # CPU ms per event: service 2, B1 0.25 + B2 raw 1
        ("persist_cpu_vs_floor", 4 / (1 + 1 / 3)),  # service 4, B1 1 + B3 raw 1/3
        ("recall_idle_p50_vs_forwarder", 20 / 10),  # p50 of [10, 20, 90] / p50 of [5, 10, 30]
        ("recall_idle_p99_vs_forwarder", (20 + 70 * 0.98) / (10 + 20 * 0.98)),
        ("persist_idle_p50_vs_forwarder", 30 / 10),
        ("persist_idle_p99_vs_forwarder", 30 / 10),
    ],
    ids=lambda v: v if isinstance(v, str) else "x",
)
def test_ratios(key: str, expected: float) -> None:
    """Each ratio divides the service's figure by its baseline's (throughput, events per CPU second, CPU per
    event, p99 latency)."""
    lines = {
        "b1_recall": _line("b1_recall", 4000, 10, 1, p99=10),
        "b2_recall_queries": _line("b2_recall_queries", 1000, 5, 1),
        "b2_recall_models": _line("b2_recall_models", 500, 10, 5),
        "service_recall": _line("service_recall", 1000, 10, 2, p99=30),
        "naive_recall": _line("naive_recall", 50, 10, 1),
        "mastra_recall": _line("mastra_recall", 1000, 40, 20),
        "b1_persist": _line("b1_persist", 1000, 10, 1, p99=4),
        "b3_bulk_upserts": _line("b3_bulk_upserts", 3000, 10, 1),
        "b3_save_many": _line("b3_save_many", 800, 10, 2),
        "service_persist": _line("service_persist", 1000, 20, 4, p99=8),
        "naive_persist": _line("naive_persist", 20, 10, 1),
        "mastra_persist": _line("mastra_persist", 1000, 100, 10),
        "mastra_memory": _line("mastra_memory", 1000, 10, 5),  # 200 turns per CPU second
        "idle_service_recall": LineResult("idle_service_recall", 3, 1, 0.1, None, latencies_ms=[10, 20, 90]),
        "idle_forwarder_recall": LineResult(
            "idle_forwarder_recall", 3, 1, 0.1, None, latencies_ms=[5, 10, 30]
        ),
        "idle_service_persist": _line("idle_service_persist", 1, 1, 0.1, p99=30),
        "idle_forwarder_persist": _line("idle_forwarder_persist", 1, 1, 0.1, p99=10),
    }
    assert ratios(lines)[key] == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize(
    ("key", "value", "passed"),
    [
        ("recall_cpu_vs_floor", 1.5, True),  # at the bound passes
        ("recall_cpu_vs_floor", 1.51, False),
        ("persist_cpu_vs_floor", 2.0, True),
        ("persist_cpu_vs_floor", 2.1, False),
        ("turn_service_vs_mastra_memory_per_core", 1.25, True),
        ("turn_service_vs_mastra_memory_per_core", 1.2, False),
        ("recall_idle_p50_vs_forwarder", 1.5, True),
        ("recall_idle_p50_vs_forwarder", 3.8, False),
        ("persist_idle_p50_vs_forwarder", 1.1, True),
        ("persist_idle_p50_vs_forwarder", 1.6, False),
        ("turn_service_vs_mastra_per_core", 3.5, True),
        ("turn_service_vs_mastra_per_core", 1.2, False),
        ("recall_vs_limit", 0.85, True),
        ("recall_vs_limit", 0.64, False),
        ("persist_vs_limit", 0.9, True),
        ("persist_vs_limit", 0.61, False),
        ("recall_p99_vs_b1", 1.1, True),
        ("persist_p99_vs_b1", 2.5, False),
        ("recall_vs_limit", None, None),  # not measured: neither passed nor failed
    ],
)
def test_targets_against_ratios(key: str, value: float | None, passed: bool | None) -> None:
    """Each target compares its ratio with its bound (at most / at least, the bound included)."""
    [outcome] = [o for o in targets.evaluate({key: value}) if o.goal.key == key]
    assert outcome.value == value
    assert outcome.passed is passed


@pytest.mark.parametrize(
    ("soak", "passed"),
    [(None, None), ({"rss_end_over_10pct": 1.019}, True), ({"rss_end_over_10pct": 1.06}, False)],
    ids=["no-soak", "flat", "growing"],
)
def test_soak_target(soak: dict[str, float] | None, passed: bool | None) -> None:
    """The RSS target reads the soak's end / 10% figure (<= 1.05), and is not measured without a soak."""
    [outcome] = [o for o in targets.evaluate({}, soak) if o.goal.key == "rss_end_over_10pct"]
    assert outcome.passed is passed


def test_every_target_is_a_ratio_or_the_soak() -> None:
    """A target names a ratio the run computes (or the soak figure), so none is silently never measured."""
    for goal in targets.GOALS:
        assert goal.key in (RATIOS if goal.source == "ratios" else {"rss_end_over_10pct": ""}), goal.key


def test_targets_render_every_verdict() -> None:
    """The printed targets carry each label, its value and PASS / FAIL / not measured."""
    outcomes = targets.evaluate({"recall_cpu_vs_floor": 1.5, "persist_cpu_vs_floor": 4.0})
    text = targets.render(outcomes)
    for goal in targets.GOALS:
        assert goal.label in text
    assert "1.5" in text
    assert "PASS" in text
    assert "FAIL" in text
    assert "not measured" in text


def test_ratios_missing_lines_are_none() -> None:
    """A ratio whose lines were not run (or measured nothing) is None, never zero or an error."""
    values = ratios(
        {"service_recall": _line("service_recall", 10, 1, 0.1), "b1_recall": _line("b1_recall", 0, 1, 0)}
    )
    assert set(values) == set(RATIOS)
    assert all(value is None for value in values.values())


def test_table_lists_every_line_and_ratio() -> None:
    """The printed table has a row per measured line and a row per ratio label."""
    lines = {name: _line(name, 100, 1.0, 0.5) for name in LINES}
    rendered = render_table(lines, ratios(lines))
    for name in LINES:
        assert f"| {name} " in rendered
    for label in RATIOS.values():
        assert label in rendered


def test_line_json_figures() -> None:
    """A line's JSON carries throughput, latency percentiles, CPU per 1,000 events and peak RSS."""
    line = LineResult("service_recall", 500, 2.0, 1.5, 64 * 2**20, latencies_ms=[1, 2, 3, 4, 5])
    line.server_cpu_s = {"mongo": 3.0}
    out = line.to_json()
    assert out["events_per_s"] == 250
    assert out["latency_ms"]["p50"] == 3
    assert out["cpu_s_per_1k_events"] == 3
    assert out["peak_rss_mb"] == 64
    assert out["server_cpu_s_per_1k_events"] == {"mongo": 6}


@pytest.mark.parametrize("i", [0, 2], ids=["first-thread", "last-thread"])
def test_workload_events_decode_as_contract_events(i: int) -> None:
    """The requests, responses and pass-through payloads are valid events of the contract."""
    turn = Turns(W).recall
    request = decode_request(encode_json(request_event(W, i, turn)))
    assert request.threadId == W.thread_id(i)
    assert [m.id for m in request.messages] == [f"{W.thread_id(i)}:t{turn}:in"]
    response = decode_response(encode_json(response_event(W, i, turn)))
    assert [m.role for m in response.response] == ["assistant"]
    enriched = decode_enriched(encode_json(enriched_event(W, i, turn, W.history)))
    assert [m.source for m in enriched.messages] == ["memory"] * W.history + ["input"]


def test_seeded_rows_read_as_messages_oldest_first() -> None:
    """Seeded rows are in Mastra's layout (JSON-string content, `thread_id`); a new turn sorts last."""
    thread, rows = seed_documents(W, 1)
    assert thread["id"] == W.thread_id(1)
    assert len(rows) == W.history
    messages = [message_from_doc(row) for row in rows]
    assert [m.role for m in messages[:2]] == ["user", "assistant"]
    assert all(len(json.loads(row["content"])["parts"][0]["text"]) == W.message_bytes for row in rows)
    turn_time = decode_request(encode_json(request_event(W, 1, Turns(W).recall))).messages[0].createdAt
    assert turn_time is not None
    assert all(m.createdAt is not None and m.createdAt < turn_time for m in messages)


def test_turns_are_distinct() -> None:
    """Every writing phase gets a turn of its own, after the recall turn."""
    turns = Turns(W)
    handed = [turns.fresh() for _ in range(5)]
    assert len(set(handed)) == 5
    assert min(handed) > turns.recall >= W.history // 2


@pytest.mark.parametrize(("seed", "size"), [(0, 16), (7, 1024), (123, 999)], ids=["tiny", "1k", "odd"])
def test_text_has_the_requested_size(seed: int, size: int) -> None:
    """Message text is exactly `size` ASCII characters, and varies with the seed."""
    body = text(seed, size)
    assert len(body.encode()) == size
    assert body != text(seed + 1, size)


def test_soak_summary() -> None:
    """The soak compares RSS once 10% of the events are done with RSS at the end."""
    mb = 2**20
    series = [(0, 0.0, 50 * mb), (100, 1.0, 80 * mb), (500, 2.0, 84 * mb), (1000, 3.0, 88 * mb)]
    out = summarize("recall", 1000, series, wall=4.0, cpu=2.0, peak=90 * mb)
    assert out["rss_mb_after_10pct"] == 80
    assert out["rss_mb_at_end"] == 88
    assert out["rss_end_over_10pct"] == pytest.approx(1.1)
    assert out["events_per_s"] == 250
    assert out["cpu_s_per_1k_events"] == 2


def test_parse_metrics_stages_and_batches() -> None:
    """Stage seconds and the mean batch size come out of the service's /metrics text."""
    body = "\n".join(
        [
            "# HELP message_history_stage_seconds Time spent per batch in each stage",
            'message_history_stage_seconds_sum{path="recall",stage="recall"} 12.5',
            'message_history_stage_seconds_sum{path="recall",stage="build"} 0.5',
            'message_history_stage_seconds_count{path="recall",stage="build"} 9.0',
            'message_history_batch_size_sum{path="recall"} 900.0',
            'message_history_batch_size_count{path="recall"} 10.0',
            'message_history_batch_size_bucket{le="1.0",path="recall"} 1.0',
        ]
    )
    assert parse_metrics(body) == {
        "recall/recall": 12.5,
        "recall/build": 0.5,
        "recall/batches": 10.0,
        "recall/mean_batch": 90.0,
    }


def test_profile_summary_shares() -> None:
    """py-spy stacks fold into shares by innermost package, per stage (inclusive) and by function."""
    rows = [
        "thread (0x1);run (consumers/loop.py:1);decode_request (schemas/events.py:9) 3",
        "thread (0x1);run (consumers/loop.py:1);load (message_history/batch_storage.py:5);"
        "decode_all (site-packages/bson/__init__.py:1) 6",
        "thread (0x1);run (consumers/loop.py:1) 1",
        "not a row",
    ]
    out = summarize_profile(rows)
    assert out["samples"] == 10
    assert out["share_by_package"] == {"bson": 0.6, "schemas": 0.3, "consumers": 0.1}
    assert out["inclusive_share"] == {"load": 0.6, "decode_request": 0.3}
    assert out["top_self"][0] == {"frame": "decode_all (site-packages/bson/__init__.py:1)", "share": 0.6}


@pytest.mark.parametrize(
    ("rates", "expected"),
    [([5.0], 5.0), ([9.0, 3.0, 6.0], 6.0), ([4.0, 8.0], 4.0)],
    ids=["one", "odd", "even-takes-lower"],
)
def test_median_round(rates: list[float], expected: float) -> None:
    """With repeated rounds a line keeps its median round by throughput, and lists every round."""
    results = [_line("service_recall", int(rate * 10), 10.0, 1.0) for rate in rates]
    chosen = median_round(results)
    assert chosen.events_per_s == expected
    assert len(chosen.details.get("rounds", [])) == (len(rates) if len(rates) > 1 else 0)


@pytest.mark.parametrize("name", sorted(SIDE))
def test_side_measurements_are_subcommands(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each side measurement runs as `python -m bench NAME`, with its own flags (`--help` lists them)."""
    with pytest.raises(SystemExit) as exited:
        bench_main([name, "--help"])
    assert exited.value.code == 0
    assert f"python -m bench {name}" in capsys.readouterr().out


def test_main_help_lists_the_side_measurements(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench --help` names every side measurement."""
    with pytest.raises(SystemExit):
        bench_main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in SIDE)


def test_failover_summary_splits_threads_by_the_dead_instance_and_the_kill() -> None:
    """A turn counts `before` only when answered before the kill (one in flight at the kill is `after`), on
    the dead side when its partition was the dead instance's; the targets compare as the issue states."""
    run = failover.Run(killed_at=100.0, dead_partitions={1})
    turns = [
        ("a", 0, 10.0, 10.1, True),  # others, before: 100 ms
        ("b", 0, 99.9, 100.3, True),  # others, in flight at the kill: after, 400 ms
        ("c", 1, 50.0, 50.2, True),  # dead, before: 200 ms
        ("d", 1, 99.0, 111.0, False),  # dead, after: 12 s, and incomplete
        ("e", 1, 101.0, None, None),  # never answered
    ]
    for rid, partition, sent, answered, complete in turns:
        run.turns[rid] = failover.Turn(rid, partition, sent, answered, complete)
    summary = failover.summarize(run, session_s=10.0)
    figures = summary["latency_ms"]
    assert figures["others/before"]["max"] == pytest.approx(100)
    assert figures["others/after"]["max"] == pytest.approx(400)
    assert figures["dead/before"]["max"] == pytest.approx(200)
    assert figures["dead/after"]["max"] == pytest.approx(12_000)
    assert (summary["incomplete"], summary["unanswered"]) == (1, 1)
    assert summary["targets"] == {
        "others_not_slowed": False,  # 400 ms after > 100 ms p99 before
        "dead_within_session_plus_5s": True,  # 12 s <= 15 s
        "none_incomplete": False,
    }
    assert "dead/after" in failover.render(summary)


def test_idle_stage_ms_per_turn_subtracts_the_warm_up() -> None:
    """The idle line's per-stage figures are the timed turns' own: the warm-up's sums are subtracted, batch
    counts are not stages, and a stage first seen after the warm-up counts from zero."""
    before = {"recall/recall": 0.010, "recall/batches": 3.0, "recall/mean_batch": 1.0}
    after = {"recall/recall": 0.41, "persist/persist": 0.2, "recall/batches": 103.0}
    assert stage_ms_per_turn(before, after, 100) == {"persist/persist": 2.0, "recall/recall": 4.0}
    assert stage_ms_per_turn(before, after, 0) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("none", {}),
        ("", {}),
        ("MALLOC_ARENA_MAX=2", {"MALLOC_ARENA_MAX": "2"}),
        ("A=1, B=x=y", {"A": "1", "B": "x=y"}),
        ("image", dict(SERVICE_RUNTIME_ENV)),
    ],
)
def test_service_env_option(text: str, expected: dict[str, str]) -> None:
    """`--service-env`: the image's runtime environment by default, none, or K=V pairs for an A/B."""
    assert parse_env(text) == expected


def test_service_env_option_refuses_a_bare_name() -> None:
    with pytest.raises(ValueError, match="not K=V"):
        parse_env("MALLOC_ARENA_MAX")


def test_minor_faults_count_fresh_pages() -> None:
    """The page-fault figure of the lines moves when a process touches fresh memory (64 MiB of an anonymous
    mapping of its own, zero pages until written), and is None for a process that is gone. Not a `bytearray`:
    in a long test process malloc may serve it from memory already touched (0 faults, seen once in CI)."""
    size = 64 << 20
    region = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per 4 KiB page, not per huge page
    before = minor_faults(os.getpid())
    assert before is not None
    for offset in range(0, size, 4096):
        region[offset] = 1
    after = minor_faults(os.getpid())
    region.close()
    assert after is not None
    assert after - before >= size // 4096 // 2  # at least half the pages
    assert minor_faults(2**22 + 12345) is None


def test_fine_cpu_seconds_see_a_few_milliseconds() -> None:
    """The lines' CPU figure resolves less than a clock tick (10 ms), so a short window (the quick run's B1:
    ~10 ms for 120 records) is not read as 0; and it agrees with the tick count to within a tick or two."""
    before = cpu_seconds_fine(os.getpid())
    assert before is not None
    total = 0
    for i in range(20_000):  # a couple of milliseconds of work, well under a tick
        total += i * i
    after = cpu_seconds_fine(os.getpid())
    assert after is not None
    assert after > before
    ticks = cpu_seconds(os.getpid())
    assert ticks is not None
    assert abs(after - ticks) < 0.05
    assert cpu_seconds_fine(2**22 + 12345) is None


@pytest.mark.parametrize(("count", "partitions"), [(6, 3), (4, 3), (24, 6), (1, 3)])
def test_failover_threads_cover_every_partition(count: int, partitions: int) -> None:
    """Ids from a random topic name alone once put a quick run's 4 threads on 2 of 3 partitions, both the
    dead instance's, so the run had no "others" to compare with; the ids are chosen by the partitioner."""
    every = list(range(partitions))
    threads = failover._spread_threads("mh-requests-0123abcd", count, partitions)
    homes = [DefaultPartitioner()(t.encode(), every, every) for t in threads]
    assert len(set(threads)) == count
    per = -(-count // partitions)
    assert all(homes.count(p) <= per for p in every)
    assert len(set(homes)) == min(count, partitions)


def test_persist_steps_times_every_step_over_every_turn() -> None:
    """`persist-steps` runs each pure step over every turn (each saved, three writes a turn: two messages and
    the thread), and its sum is its steps'."""
    result = persist_steps.run(turns=6, rounds=1, message_bytes=40)
    steps = result["cpu_us_per_turn"]
    assert list(steps) == ["decode", "select", "plan", "ops", "bson", "marker_op", "outcome"]
    assert result["saved_turns"] == 6
    assert result["writes"] == 18
    assert result["sum_us_per_turn"] == pytest.approx(sum(steps.values()), abs=0.05)


@pytest.mark.parametrize("command", [persist_steps.main, persist_batch.main, update_command.main])
@pytest.mark.parametrize("flags", [["--turns", "0"], ["--rounds", "0"], ["--message-bytes", "-1"]])
def test_the_persist_batch_family_refuses_an_empty_measurement(
    command: Callable[[list[str]], int], flags: list[str]
) -> None:
    """No turns or no rounds would time nothing: a usage error, not an assertion deep in the run (one
    parser for the three: `bench.extra.persist_batch.batch_args`)."""
    with pytest.raises(SystemExit) as exited:
        command(flags)
    assert exited.value.code == 2
