"""`message-history demo` end to end against the real stack: the history visibly grows turn by turn."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

pytestmark = pytest.mark.integration

THREADS = 2
TURNS = 3

HEADER = re.compile(r"^--- turn (\d+) \| thread (\S+) \| resource (\S+) \| recalled (\d+) ")
CONTEXT_LINE = re.compile(r"^  \[(memory|input|agent)\] (user|assistant|system): (.*)$")
STORED_THREAD = re.compile(r"^thread (\S+) \| resourceId (\S+) \|")
STORED_MESSAGE = re.compile(r"^  (\d+)\. (\S+) (user|assistant|system): (.*?)  \(id (\S+)\)$")


@dataclass
class Turn:
    number: int
    thread: str
    recalled: int
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # (source, role, text)

    def of(self, source: str) -> list[tuple[str, str]]:
        return [(role, text) for s, role, text in self.lines if s == source]


def parse(stdout: str) -> tuple[list[Turn], dict[str, list[tuple[str, str, str]]]]:
    """The enriched blocks, and the stored messages per thread (role, text, id) from the MongoDB dump."""
    turns: list[Turn] = []
    stored: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    current: Turn | None = None
    in_dump = False
    thread: str | None = None
    for line in stdout.splitlines():
        if line.startswith("=== stored in MongoDB"):
            in_dump, current = True, None
            continue
        if in_dump:
            if m := STORED_THREAD.match(line):
                thread = m.group(1)
                stored[thread] = []
            elif (m := STORED_MESSAGE.match(line)) and thread is not None:
                stored[thread].append((m.group(3), m.group(4), m.group(5)))
            continue
        if m := HEADER.match(line):
            current = Turn(int(m.group(1)), m.group(2), int(m.group(4)))
            turns.append(current)
        elif (m := CONTEXT_LINE.match(line)) and current is not None:
            current.lines.append((m.group(1), m.group(2), m.group(3)))
        else:
            current = None
    return turns, stored


@pytest.fixture(scope="module")
def demo_run(kafka_bootstrap: str, mongo_uri: str) -> subprocess.CompletedProcess[str]:
    """One run of the demo as a subprocess against the test stack (bounded by a timeout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGE_HISTORY_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri)
    return subprocess.run(
        [sys.executable, "-m", "message_history", "demo", "--threads", str(THREADS), "--turns", str(TURNS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_demo_exits_zero(demo_run: subprocess.CompletedProcess[str]) -> None:
    """The demo completes and says so."""
    assert demo_run.returncode == 0, f"stdout:\n{demo_run.stdout}\nstderr:\n{demo_run.stderr}"
    assert "demo finished" in demo_run.stdout


def test_every_thread_and_turn_is_shown_once(demo_run: subprocess.CompletedProcess[str]) -> None:
    """The stand-in agent prints exactly one enriched block per (thread, turn): 2 threads x 3 turns."""
    turns, _ = parse(demo_run.stdout)
    seen = sorted((t.thread, t.number) for t in turns)
    threads = sorted({t.thread for t in turns})
    assert len(threads) == THREADS
    assert seen == sorted((thread, k) for thread in threads for k in range(1, TURNS + 1))


def test_history_grows_turn_by_turn(demo_run: subprocess.CompletedProcess[str]) -> None:
    """Turn k recalls 2(k-1) messages: the thread's earlier user inputs and the agent's answers, in order."""
    turns, _ = parse(demo_run.stdout)
    assert turns, demo_run.stdout
    by_thread: dict[str, dict[int, Turn]] = defaultdict(dict)
    for turn in turns:
        by_thread[turn.thread][turn.number] = turn
    for thread, numbered in by_thread.items():
        for k, turn in sorted(numbered.items()):
            memory = turn.of("memory")
            assert turn.recalled == 2 * (k - 1), (thread, k)
            assert len(memory) == 2 * (k - 1), (thread, k, memory)
            assert [role for role, _ in memory] == ["user", "assistant"] * (k - 1)
            assert len(turn.of("input")) == 1
            earlier_inputs = [numbered[j].of("input")[0][1] for j in range(1, k)]
            assert [text for role, text in memory if role == "user"] == earlier_inputs
            # The agent's answer shows it saw the memory.
            (answer,) = turn.of("agent")
            assert (f"I remember {2 * (k - 1)} earlier messages" in answer[1]) is (k > 1)


def test_mongodb_dump_has_the_whole_conversation(demo_run: subprocess.CompletedProcess[str]) -> None:
    """The final dump lists each thread with 6 messages, user and assistant alternating, inputs in order."""
    turns, stored = parse(demo_run.stdout)
    assert sorted(stored) == sorted({t.thread for t in turns})
    for thread, messages in stored.items():
        assert len(messages) == 2 * TURNS, (thread, messages)
        assert [role for role, _, _ in messages] == ["user", "assistant"] * TURNS
        inputs = {t.number: t.of("input")[0][1] for t in turns if t.thread == thread}
        assert [text for role, text, _ in messages if role == "user"] == [
            inputs[k] for k in range(1, TURNS + 1)
        ]
        assert len({message_id for _, _, message_id in messages}) == 2 * TURNS
