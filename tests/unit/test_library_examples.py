"""The Python examples of docs/library.md (moved there from the README) run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "docs" / "library.md"
SECTION = "# Use it as a library"


def library_section(text: str) -> str:
    """The page from its title to the next first-level heading (the whole page: its `##` parts included)."""
    start = text.index(SECTION)
    following = re.search(r"^# ", text[start + len(SECTION) :], flags=re.MULTILINE)
    return text[start:] if following is None else text[start : start + len(SECTION) + following.start()]


def python_blocks(section: str) -> list[str]:
    """Every fenced ```python block of the section, in order."""
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


BLOCKS = python_blocks(library_section(LIBRARY.read_text(encoding="utf-8")))


def test_section_has_the_seed_examples() -> None:
    """The section holds at least the plain and the advanced example (and the extraction finds them)."""
    assert len(BLOCKS) >= 2
    assert any("MessageHistory(" in block and "last_messages=50" in block for block in BLOCKS)
    assert any("process_input" in block and "process_output_result" in block for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_example_runs(block: str) -> None:
    """Each example runs in a fresh interpreter and prints exactly what its `# -> ...` comments say."""
    # A fresh interpreter, as a reader would run it; it also keeps the examples' asyncio.run() away from the
    # event loop pytest-asyncio leaves installed in this process.
    done = subprocess.run(
        [sys.executable, "-c", block],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = re.findall(r"#\s*->\s*(.*?)\s*$", block, flags=re.MULTILINE)
    assert done.stdout.splitlines() == expected
