"""The parity table of docs/worker.md ("Parity: Python and TypeScript") stays true: it names exactly the
features the TypeScript package lists in `CAPABILITIES` (worker-ts/src/capabilities.ts), a side that lacks a
feature says why ("no: ..."), and every test the table cites exists (a pytest function under tests/, or a
`describe` block of the package's unit tests). Pure: reads files, needs neither Node nor Kafka."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "worker.md"
HEADING = "## Parity: Python and TypeScript"


def _rows() -> list[list[str]]:
    text = DOC.read_text()
    assert HEADING in text
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows


def _capabilities() -> list[str]:
    source = (ROOT / "worker-ts" / "src" / "capabilities.ts").read_text()
    listed = source.split("CAPABILITIES = [", 1)[1].split("]", 1)[0]
    return re.findall(r"'([a-z-]+)'", listed)


def _python_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), flags=re.MULTILINE))
    return names


def _describe_blocks() -> set[str]:
    source = (ROOT / "worker-ts" / "test" / "unit.test.ts").read_text()
    titles = re.findall(r"^describe\('((?:[^'\\]|\\.)*)'", source, re.M)
    return {title.replace("\\'", "'") for title in titles}


def test_the_table_names_exactly_the_capabilities_the_package_exports() -> None:
    keys = [row[0].strip("`") for row in _rows()]
    assert len(keys) == len(set(keys)), keys
    assert keys == _capabilities()


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row[0].strip("`"))
def test_each_row_says_why_where_a_side_lacks_it_and_cites_tests_that_exist(row: list[str]) -> None:
    assert len(row) == 4, row
    _, python, typescript, tests = row
    for side in (python, typescript):
        assert side, row
        if side.lower().startswith("no"):
            assert re.match(r"no: \S.{20,}", side), f"a 'no' without its reason: {side}"
    cited = re.findall(r"(unit: )?`([^`]+)`", tests)
    assert cited, f"no test cited for {row[0]}"
    python_tests, blocks = _python_tests(), _describe_blocks()
    for unit, name in cited:
        if unit:
            assert any(block.startswith(name) for block in blocks), f"no describe block {name!r}"
        else:
            assert name in python_tests, f"no test function {name}"
