"""`message-history demo --observational` against the real stack: the observation log grows with the
conversation (a stub observer on the Python SDK), each turn says how much of the thread it covers, and the
dump shows the `mastra_observational_memory` row."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

HEADER = re.compile(r"^--- turn (\d+) \| .* \| observed (\d+) \(log (\d+) tokens\) ---$")


@pytest.fixture(scope="module")
def demo_run(kafka_bootstrap: str, mongo_uri: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri)
    command = ["demo", "--observational", "--threads", "1", "--turns", "8"]
    return subprocess.run(
        [sys.executable, "-m", "message_history", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_log_grows_with_the_conversation(demo_run: subprocess.CompletedProcess[str]) -> None:
    assert demo_run.returncode == 0, demo_run.stderr[-2000:]
    lines = demo_run.stdout.splitlines()
    seen = [(int(m[1]), int(m[2]), int(m[3])) for line in lines if (m := HEADER.match(line))]
    assert [turn for turn, _, _ in seen] == list(range(1, 9))  # every turn says what the log covers
    observed = [count for _, count, _ in seen]
    assert observed[0] == 0
    assert observed == sorted(observed)  # never shrinks
    assert observed[-1] >= 4  # observed at least once before the last turn (120 tokens, ~30 per message)
    assert any(line.startswith("  [memory] system: <observations>") for line in lines)
    assert any(line.startswith("  [observer] ") for line in lines)
    assert any(line.startswith("  observations (generation 0,") for line in lines)
