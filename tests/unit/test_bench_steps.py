"""`python -m bench steps`: the segments of an idle step out of a process's trace (pure parts)."""

from __future__ import annotations

import pytest

from bench import traces as steps
from bench.stepwatch import seq_of

MS = 0.001


def _trace(seq: int, base: float, *, overlap: bool) -> list[dict[str, object]]:
    """A persist step: fetched at +1 ms, two finds (overlapping or one after the other), a bulk write, the
    output handed over at +9 ms and acknowledged at +10, then a busy-mark write and a commit."""
    second = base + (2.5 if overlap else 3.5) * MS
    return [
        {"k": "mongo", "cmd": "find", "coll": "old", "t0": base - 5 * MS, "dt": MS},  # an earlier step's
        {"k": "in", "seq": seq, "t": base + 1 * MS},
        {"k": "mongo", "cmd": "find", "coll": "mastra_messages", "t0": base + 2 * MS, "dt": 1.5 * MS},
        {"k": "mongo", "cmd": "find", "coll": "mastra_threads", "t0": second, "dt": 1 * MS},
        {"k": "mongo", "cmd": "update", "coll": "mastra_messages", "t0": base + 6 * MS, "dt": 2 * MS},
        {"k": "send", "seq": seq, "topic": "out", "t": base + 9 * MS},
        {"k": "ack", "seq": seq, "topic": "out", "t": base + 10 * MS},
        {"k": "mongo", "cmd": "update", "coll": "message_history_turns", "t0": base + 11 * MS, "dt": MS},
        {"k": "commit", "t0": base + 12 * MS, "dt": MS},
    ]


@pytest.mark.parametrize(("overlap", "trips", "wall"), [(False, 3, 4.5), (True, 2, 3.5)])
def test_step_segments(overlap: bool, trips: int, wall: float) -> None:
    """Each segment of a step, the MongoDB commands before its output in sequence (overlapping ones are one
    trip, counted once in the wall time) and those after it."""
    base = 1000.0
    row = steps.step_segments(base, base + 12 * MS, base + 50 * MS, _trace(7, base, overlap=overlap), 7)
    assert row is not None
    assert row["kafka_in"] == pytest.approx(1 * MS)
    assert row["before_db"] == pytest.approx(1 * MS)
    assert row["db_trips"] == trips
    assert row["db_wall"] == pytest.approx(wall * MS)
    assert row["other"] == pytest.approx((7 - wall) * MS)  # from the first command (+2 ms) to the output (+9)
    parts = ("kafka_in", "before_db", "db_wall", "other", "kafka_out")
    assert sum(row[p] for p in parts) == pytest.approx(row["total"])
    assert row["ack"] == pytest.approx(1 * MS)
    assert row["kafka_out"] == pytest.approx(3 * MS)
    assert row["total"] == pytest.approx(12 * MS)
    assert [name for name, _ in row["db_on_path"]] == (
        ["1: find mastra_messages", "1: find mastra_threads", "2: update mastra_messages"]
        if overlap
        else ["1: find mastra_messages", "2: find mastra_threads", "3: update mastra_messages"]
    )
    assert [name for name, _ in row["db_after"]] == ["1: update message_history_turns"]
    assert row["commits_after"] == 1


def test_a_step_missing_from_the_trace_is_none() -> None:
    assert steps.step_segments(0.0, 1.0, 2.0, _trace(7, 0.0, overlap=False), 8) is None


def test_analyse_and_render() -> None:
    """Steps are matched to their process's trace by seq; medians per kind; the commonest command sequence."""
    timeline = []
    service = []
    for k in range(3):
        base = 100.0 + k
        service += _trace(k, base, overlap=k == 2)
        timeline.append({"name": "service_persist", "seq": k, "sent": base, "read": base + 12 * MS})
    timeline.append({"name": "forwarder_persist", "seq": 99, "sent": 200.0, "read": 200.003})
    forwarder = [
        {"k": "in", "seq": 99, "t": 200.001},
        {"k": "send", "seq": 99, "topic": "o", "t": 200.0012},
    ]
    out = steps.analyse(timeline, {"service": service, "forwarder": forwarder})
    persist = out["steps"]["service_persist"]
    assert persist["steps"] == 3
    assert persist["db_trips"] == 3
    assert persist["total_ms"] == pytest.approx(12)
    assert persist["db_before_output"]["share"] == 0.667  # one of the three overlapped
    assert persist["db_before_output"]["sequence"][0]["command"] == "1: find mastra_messages"
    assert persist["db_before_output"]["sequence"][0]["ms"] == pytest.approx(1.5)
    assert out["steps"]["forwarder_persist"]["kafka_out_ms"] == pytest.approx(1.8)
    assert out["unmatched_steps"] == 0
    text = steps.render(out)
    assert "| service_persist | 3 | 1 | 1 |" in text  # the means: kafka in, before db
    assert persist["total_p50_ms"] == pytest.approx(12)
    assert (
        "service_persist, MongoDB before output (67% of the turns): [find mastra_messages 1.50 ms], then "
        "[find mastra_threads 1.00 ms], then [update mastra_messages 2.00 ms]"
    ) in text


def test_seq_header() -> None:
    assert seq_of([("a", b"1"), ("bench-seq", b"42")]) == 42
    assert seq_of([("bench-seq", b"x")]) is None
    assert seq_of(None) is None


def test_tail_splits_each_latency_event() -> None:
    """Per event: fetch, service, MongoDB and the wait behind the batch before it; the slowest 5% apart."""
    events: list[dict[str, object]] = []
    sent: dict[int, float] = {}
    read: dict[int, float] = {}
    for seq in range(40):  # batches of two: fetched together, one trip of 10 ms, both handed at +12 ms
        fetch = 10.0 + (seq // 2) * 0.020
        sent[seq] = fetch - 0.002
        events += [{"k": "in", "seq": seq, "t": fetch}, {"k": "send", "seq": seq, "t": fetch + 0.012}]
        events.append({"k": "ack", "seq": seq, "t": fetch + 0.013})
        read[seq] = fetch + 0.015
        if seq % 2 == 0:
            events.append({"k": "mongo", "cmd": "find", "coll": "x", "t0": fetch + 0.001, "dt": 0.010})
    sent[39] = 10.0 + 19 * 0.020 - 0.015  # sent while the batch before it was still being worked
    out = steps.tail(sent, read, events)
    assert out["events"] == 40
    every = out["all"]
    assert every["service_ms"] == pytest.approx(12)
    assert every["db_wall_ms"] == pytest.approx(10)
    assert every["db_trips"] == 1
    assert every["fetched_with"] == 2
    assert every["kafka_in_ms"] == pytest.approx(2)
    assert every["behind_batch_ms"] == 0
    slow = out["slowest_5pct"]
    assert slow["events"] == 2  # 5% of 40: seq 39 and one more
    assert slow["kafka_in_ms"] == pytest.approx((15 + 2) / 2)
    assert slow["behind_batch_ms"] == pytest.approx(7 / 2)  # seq 39 waited 7 ms for the batch before it
    assert steps.tail({1: 1.0}, {}, []) == {"events": 0}


def test_span_durations_since_the_timed_steps() -> None:
    events = [
        {"k": "span", "name": "persist batch", "t0": 1.0, "t1": 1.004},
        {"k": "span", "name": "persist batch", "t0": 2.0, "t1": 2.002},
        {"k": "span", "name": "persist batch", "t0": 0.5, "t1": 0.9},  # a warm-up turn's
        {"k": "in", "seq": 1, "t": 1.0},
    ]
    assert steps.span_durations(events, since=0.95) == {
        "persist batch": {"count": 2, "mean_ms": 3.0, "p50_ms": 3.0}
    }
    text = steps.render({"steps": {}, "spans_ms": steps.span_durations(events, 0.95)})
    assert "- the service's spans, ms (mean / p50): persist batch 3.00 / 3.00" in text
