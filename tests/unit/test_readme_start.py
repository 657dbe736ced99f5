"""The README starts from the user's job: the two commands first, who and why on the first screen, both
quick starts, the worker's role, and Mastra's versions as the interop tests pin them."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIRST_SCREEN_LINES = 30


def _commands(block: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_first_commands_are_the_local_stack_demo_and_test() -> None:
    """The README's first code block runs `deploy/local/stack demo` then `deploy/local/stack test`."""
    first = re.search(r"^```bash\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL)
    assert first is not None
    assert _commands(first.group(1)) == ["deploy/local/stack demo", "deploy/local/stack test"]


def test_the_first_screen_says_who_why_and_how() -> None:
    """Within the first screen: who it is for, why a stream, and the commands to try it."""
    screen = "\n".join(README.splitlines()[:FIRST_SCREEN_LINES])
    for words in ("Who it is for", "Why a stream", "deploy/local/stack demo"):
        assert words in screen, words


def test_both_quick_starts_are_there() -> None:
    """The quick start has the Docker Compose way and the local stack for those without Docker."""
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "docker compose -f deploy/compose.yaml up" in quick
    assert "deploy/local/stack" in quick
    assert (ROOT / "deploy" / "compose.yaml").is_file()


def test_worker_role_and_sdk_are_described() -> None:
    """The worker section names the topics, eventId deduplication, failed turns and the SDK's page."""
    worker = README.split("## Your agent worker", 1)[1].split("\n## ", 1)[0]
    for words in ("agent.requests.enriched", "agent.responses", "eventId", '"error"', "docs/worker.md"):
        assert words in worker, words


def _pinned(package_json: Path, name: str) -> str:
    """`major.minor` of `name` as a package.json pins it."""
    version = json.loads(package_json.read_text(encoding="utf-8"))["dependencies"][name]
    match = re.match(r"\D*(\d+\.\d+)", version)
    assert match is not None, version
    return match.group(1)


def test_mastra_section_names_the_tested_versions_and_memory_off() -> None:
    """The Mastra versions are the ones the interop tests run, and the agent is told to run without memory."""
    mastra = README.split("## Beside Mastra", 1)[1].split("\n## ", 1)[0]
    interop = ROOT / "tests" / "interop"
    core = _pinned(interop / "mastra-core" / "v1" / "package.json", "@mastra/core")
    mongodb = _pinned(interop / "mastra-mongodb" / "package.json", "@mastra/mongodb")
    assert f"`@mastra/core` {core}" in mastra
    assert f"`@mastra/mongodb` {mongodb}" in mastra
    assert "without `memory`" in mastra
    assert "twice" in mastra  # why: every turn would be saved a second time
