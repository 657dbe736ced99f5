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
