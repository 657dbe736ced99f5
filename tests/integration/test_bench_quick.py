"""`python -m bench --quick` against the real stack: every line and every ratio comes out measured.

Speed is not asserted (the figures go to the log); what is asserted is that each line did work and that
each figure the report promises is there and positive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.stats import LINES, RATIOS

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_quick_run_measures_every_line(kafka_bootstrap: str, mongo_uri: str, tmp_path: Path) -> None:
    """A quick run writes a JSON record with every line measured and every ratio positive."""
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri)
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    print(done.stdout)  # the table, for the CI log
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("*.json")
    record = json.loads(path.read_text())

    assert set(record["lines"]) == set(LINES)
    for name, line in record["lines"].items():
        assert "error" not in line, (name, line.get("error"))
        assert line["events"] > 0, name
        assert line["events_per_s"] > 0, name
        for q in ("p50", "p95", "p99"):
            assert line["latency_ms"][q] > 0, (name, q)
        assert line["cpu_s"] is not None, name
        assert line["cpu_s"] >= 0, name  # a short window can round to 0 ticks (10 ms)
        assert line["peak_rss_mb"] > 0, name
    assert set(record["ratios"]) == set(RATIOS)
    for key, value in record["ratios"].items():
        assert value is not None, key
        assert value > 0, key
    assert record["machine"]["nproc"] >= 1
    assert record["environment"]["seeded"]["messages"] > 0


@pytest.mark.timeout(300)
def test_failover_quick_run_answers_every_turn(kafka_bootstrap: str, mongo_uri: str, tmp_path: Path) -> None:
    """`python -m bench failover --quick`: three instances, one SIGKILLed, every turn answered; the figures
    of both sides are there (not their size: that is the bench's report)."""
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri)
    out = tmp_path / "failover.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "failover", "--quick", "--json", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["unanswered"] == 0
    assert summary["latency_ms"]["others/before"]["n"] > 0
    assert summary["latency_ms"]["others/after"]["n"] > 0
    assert set(summary["targets"]) == {"others_not_slowed", "dead_within_session_plus_5s", "none_incomplete"}
    assert summary["stops"]["instance-1"]["exit"] == -9  # the SIGKILLed one
    # the others stop by SIGTERM within their grace (1 only if a final commit met the group mid-rebalance)
    assert all(s["exit"] in (0, 1) for name, s in summary["stops"].items() if name != "instance-1")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["recall", "persist"])
def test_short_soak_measures_rss_flatness(
    path: str, kafka_bootstrap: str, mongo_uri: str, tmp_path: Path
) -> None:
    """`python -m bench --quick --soak 20000`: the CI-sized soak of a path runs to its end and reports the
    RSS figures the soak target reads (their size is the bench's report, not a test's)."""
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--soak",
            "20000",
            "--soak-path",
            path,
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    [record_path] = tmp_path.glob("*.json")
    soak = json.loads(record_path.read_text())["soak"]
    assert soak["path"] == path
    assert soak["events"] >= 20000
    assert soak["rss_mb_after_10pct"] > 0
    assert soak["rss_end_over_10pct"] > 0


def _bench(
    args: list[str], kafka_bootstrap: str, mongo_uri: str, timeout: int
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri)
    done = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.timeout(300)
def test_steps_split_every_idle_step(kafka_bootstrap: str, mongo_uri: str, tmp_path: Path) -> None:
    """`python -m bench steps`: every timed step is found in its process's trace (its fetch and its output),
    the service's steps read MongoDB before their output and the forwarder's never; the segments add up to
    no more than the step (their size is the bench's report)."""
    args = ["steps", "--threads", "6", "--history", "6", "--message-bytes", "256", "--partitions", "2"]
    _bench([*args, "--idle-turns", "6", "--out", str(tmp_path)], kafka_bootstrap, mongo_uri, 240)
    [path] = tmp_path.glob("*.json")
    steps = json.loads(path.read_text())["environment"]["steps"]
    assert steps["unmatched_steps"] == 0
    assert set(steps["steps"]) == {
        "service_recall",
        "forwarder_recall",
        "service_persist",
        "forwarder_persist",
    }
    for name, figures in steps["steps"].items():
        assert figures["steps"] == 6, name
        assert figures["kafka_in_ms"] > 0, name
        assert figures["kafka_out_ms"] > 0, name
        assert figures["kafka_in_ms"] + figures["kafka_out_ms"] <= figures["total_ms"] * 1.01, name
        assert (figures["db_trips"] >= 1) is name.startswith("service"), name
    persist = steps["steps"]["service_persist"]["db_before_output"]["sequence"]
    assert any("update mastra_messages" in c["command"] for c in persist)


@pytest.mark.timeout(400)
def test_instances_line_measures_each_count(kafka_bootstrap: str, mongo_uri: str, tmp_path: Path) -> None:
    """`--instances 1,2`: each path's service line at one and two instances on one group, every event
    through, a CPU figure for each and its ratio to one instance's."""
    _bench(["--quick", "--instances", "1,2", "--out", str(tmp_path)], kafka_bootstrap, mongo_uri, 360)
    [path] = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert set(record["lines"]) == {f"service_{p}_x{n}" for p in ("recall", "persist") for n in (1, 2)}
    for name, line in record["lines"].items():
        assert "error" not in line, (name, line.get("error"))
        assert line["details"]["completed"], name
    for path_rows in record["coordination"].values():
        assert [row["instances"] for row in path_rows] == [1, 2]
        assert all(row["cpu_ms_per_event"] > 0 for row in path_rows)
        assert path_rows[0]["cpu_vs_first"] == 1
    assert record["environment"]["load_average"]["samples"]
