"""The contract stream lines (`bench.lines`): B1's forwarder making the contract's MongoDB trips per batch,
fed B1's records with the turn of each in a header; their ratios against B1 and the service, and their rows
in the contract table (`bench.targets.render_contract`). Pure parts: no Kafka, no MongoDB."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bench import contract, targets
from bench.cli import options_from, parser
from bench.context import Budget, RunContext
from bench.kafka_io import SEQ_HEADER, record_parts
from bench.lines import stream_lines
from bench.procstat import Servers
from bench.run import ALL_LINES
from bench.stats import LINES, RATIOS, LineResult, ratios
from bench.stream_line import StreamLine
from bench.workload import Turns, Workload, encode_json, enriched_event, response_event
from message_history.settings import Settings

STREAMS = ("contract_recall_stream", "contract_persist_stream")


def _ctx(threads: int = 4) -> RunContext:
    w = Workload(threads=threads, history=6, message_bytes=64, batch=4, partitions=1, run_id="abc")
    return RunContext(
        settings=Settings(),
        workload=w,
        db="bench_abc",
        servers=Servers(None, None),
        budget=Budget(),
        log_dir=Path("/nonexistent"),
        turns=Turns(w),
    )


def _line(ctx: RunContext, name: str) -> StreamLine:
    path = "recall" if "recall" in name else "persist"
    [line] = [line for line in stream_lines(ctx, path, ctx.workload.threads) if line.name == name]
    return line


def _sent(line: StreamLine, j: int, *, latency: bool = False) -> tuple[bytes, bytes, contract.Turn]:
    """What the harness sends for record `j`: key, value, and the turn its header names."""
    key, value, headers = record_parts((line.latency_record if latency else line.record)(j), 1000 + j)
    assert headers[0] == (SEQ_HEADER, str(1000 + j).encode())  # the harness's own header stays first
    turn = contract.turn_from_header(headers)
    assert turn is not None, headers
    return key, value, turn


def test_the_lines_are_selectable_and_in_the_default_selection() -> None:
    """`--lines` takes them; a run without `--lines` runs them (each costs about one B1 line)."""
    args = parser().parse_args(["--lines", ",".join(STREAMS)])
    assert options_from(args, []).lines == list(STREAMS)
    assert set(STREAMS) <= set(ALL_LINES)
    assert set(STREAMS) <= set(options_from(parser().parse_args([]), []).lines)
    assert {LINES[name][1] for name in STREAMS} == {"recall", "persist"}


def test_the_recall_stream_sends_b1s_records_naming_the_recall_turn() -> None:
    """B1's enriched-size records, each naming its thread's recall turn (the turn the service line reads)."""
    ctx = _ctx()
    w, recall = ctx.workload, ctx.turns.recall
    line = _line(ctx, "contract_recall_stream")
    assert not line.writes
    for j in (0, 3):
        key, value, turn = _sent(line, j)
        assert key == w.thread_id(j).encode()
        assert value == encode_json(enriched_event(w, j, recall, w.history))  # b1_recall's bytes
        assert (turn.thread_id, turn.resource_id, turn.request_id) == (
            w.thread_id(j),
            w.resource_id(j),
            f"{w.thread_id(j)}:t{recall}",
        )


def test_the_persist_stream_sends_b1s_records_naming_fresh_turns() -> None:
    """B1's response-size records, each naming the response's own turn: fresh ones, other than every other
    persist line's, another for the latency phase, the next one after a wrap around the threads."""
    ctx = _ctx()
    w = ctx.workload
    lines = stream_lines(ctx, "persist", w.threads)
    line = next(x for x in lines if x.name == "contract_persist_stream")
    assert line.writes
    _, value, turn = _sent(line, 1)
    event = json.loads(value)
    assert value == encode_json(response_event(w, 1, int(event["requestId"].rsplit(":t", 1)[1])))
    assert turn.request_id == event["requestId"]
    assert turn.created_at == datetime.fromisoformat(event["createdAt"])  # the rows' time is the turn's
    others = {json.loads(x.record(1)[1])["requestId"] for x in lines if x is not line}
    assert turn.request_id not in others  # new rows, not another line's
    _, latency_value, latency_turn = _sent(line, 1, latency=True)
    assert latency_turn.request_id == json.loads(latency_value)["requestId"] != turn.request_id
    _, wrapped_value, wrapped = _sent(line, 1 + w.threads)
    assert wrapped.request_id == json.loads(wrapped_value)["requestId"] != turn.request_id


@pytest.mark.parametrize(
    ("name", "recall_in"), [("contract_recall_stream", True), ("contract_persist_stream", False)]
)
def test_the_launch_is_b1s_forwarder_with_the_contracts_trips(name: str, recall_in: bool) -> None:
    """The pass-through worker with `contract`: the recall line's in-topic is its recall topic, the persist
    line's is not; the threads as the workload (10,000 thread ids would pass one argv's 128 KiB)."""
    ctx = _ctx(threads=10_000)
    launch = _line(ctx, name).launch("in-topic", "out-topic", "main")
    assert launch.argv[1:4] == ["-m", "bench.worker", "passthrough"]
    assert len(launch.argv[4].encode()) < 128 * 1024
    config = json.loads(launch.argv[4])
    assert (config["in_topic"], config["out_topic"]) == ("in-topic", "out-topic")
    assert "linger_ms" not in config  # B1's: the service's linger
    trips = config["contract"]
    assert (trips["recall_topic"] == "in-topic") is recall_in
    assert trips["limit"] == ctx.workload.history  # the service's page (`child_env`'s lastMessages)
    assert Workload(**trips["workload"]) == ctx.workload


def _result(name: str, cpu_per_1k: float | None = None, p99: float | None = None) -> LineResult:
    result = LineResult(name, 1000, 1.0, cpu_per_1k, None)
    if p99 is not None:
        result.latencies_ms = [p99]
    return result


FIGURES = {
    line.name: line
    for line in (
        _result("b1_recall", 0.3, p99=20.0),
        _result("b2_recall_queries", 0.2),
        _result("contract_recall_stream", 0.6, p99=30.0),
        _result("service_recall", 0.9, p99=45.0),
        _result("b1_persist", 0.03, p99=10.0),
        _result("b3_bulk_upserts", 0.03),
        _result("contract_persist_stream", 0.1, p99=35.0),
        _result("service_persist", 0.2, p99=70.0),
    )
}


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("recall_contract_stream_p99_vs_b1", 30.0 / 20.0),
        ("persist_contract_stream_p99_vs_b1", 35.0 / 10.0),
        ("recall_p99_vs_contract_stream", 45.0 / 30.0),
        ("persist_p99_vs_contract_stream", 70.0 / 35.0),
        ("recall_cpu_vs_contract_stream", 0.9 / 0.6),
        ("persist_cpu_vs_contract_stream", 0.2 / 0.1),
        ("recall_contract_stream_cpu_vs_floor", 0.6 / (0.3 + 0.2)),
        ("persist_contract_stream_cpu_vs_floor", 0.1 / (0.03 + 0.03)),
    ],
)
def test_contract_stream_ratios(key: str, expected: float) -> None:
    assert key in RATIOS
    assert ratios(FIGURES)[key] == pytest.approx(expected, rel=1e-3)
    without = {name: line for name, line in FIGURES.items() if "contract" not in name}
    assert ratios(without)[key] is None


def _record_lines() -> dict[str, dict[str, Any]]:
    return {name: line.to_json() for name, line in FIGURES.items()}


def test_the_contract_table_reads_the_p99_target_against_the_contract_stream() -> None:
    """The p99 rows: the service over B1 (the target), over the contract stream, the stream over B1 and the
    verdict, with the three p99s; a floor over the bound is beyond it whether the service ran or not."""
    values = ratios(FIGURES)
    rows = [r for r in targets.render_contract(values, _record_lines()).splitlines() if r.startswith("| ")]
    by_label = {r.split(" | ")[0][2:]: r for r in rows[1:]}
    assert list(by_label) == [r.label for r in targets.CONTRACT_ROWS]
    assert by_label["persist p99 at half capacity"] == (
        "| persist p99 at half capacity | 7 | 2 | 3.5 | <= 2 | beyond the floor: the contract's floor alone "
        "is 3.5x the issue's (bound 2) | 70 / 35 / 10 ms p99 |"
    )
    assert by_label["recall p99 at half capacity"] == (
        "| recall p99 at half capacity | 2.25 | 1.5 | 1.5 | <= 2 | within the floor: the service may be "
        "1.33x the contract's floor, is 1.5x | 45 / 30 / 20 ms p99 |"
    )
    assert by_label["persist CPU per event, contract stream"].endswith("| 0.2 / 0.1 CPU-ms per event |")
    alone = {k: v for k, v in values.items() if "p99_vs_contract_stream" not in k}
    persist = [r for r in targets.render_contract(alone).splitlines() if r.startswith("| persist p99")]
    assert "beyond the floor" in persist[0]
    assert targets.contract_verdict(2.0, None, 1.5) == "not measured"
