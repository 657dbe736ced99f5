"""The README's "where to change what" table and settings table stay true.

Each row names modules and the first-party packages or third-party libraries they may import; the standard
library is always allowed. A module that starts importing something its row does not allow (pymongo in the
pure rules, aiokafka in the processor) fails here, and so does a row naming a file that no longer exists.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_PARTY = {"message_history", "schemas", "storage", "consumers", "producers", "worker"}
ANYTHING = "anything"


def _rows() -> list[tuple[str, list[str], str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Where to change what", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in {"job", "---"} or set(cells[0]) <= {"-"}:
            continue
        modules = re.findall(r"`([\w/]+\.py)`", cells[1])
        rows.append((cells[0], modules, cells[2]))
    return rows


def _allowed_for(module: str, allowed_cell: str) -> set[str] | None:
    """The allowed import prefixes for `module`; None means anything is allowed."""
    # A cell may carry per-module clauses: "`command.py`: anything; `plan.py`: nothing of ours; ..."
    name = Path(module).name
    clauses = [c.strip() for c in allowed_cell.split(";")]
    for clause in clauses:
        if clause.startswith(f"`{name}`:"):
            allowed_cell = clause.split(":", 1)[1]
            break
    if ANYTHING in allowed_cell:
        return None
    return set(re.findall(r"`([\w.]+)`", allowed_cell))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in FIRST_PARTY:  # `from message_history import metrics` imports a submodule
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
    return names


def _is_allowed(name: str, own_package: str, allowed: set[str]) -> bool:
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return True
    if name == "message_history.__version__":
        return True  # the package's version string, not a job's module
    if top == "pydantic_core":
        top, name = "pydantic", "pydantic"  # pydantic's own engine: allowed wherever pydantic is
    own_module = own_package != "message_history" and name.startswith(f"{own_package}.")
    if name == "message_history" or own_module:
        return True  # a package's own modules (message_history is several jobs, so it is listed per row)
    return any(name == a or name.startswith(f"{a}.") for a in allowed)


ROWS = _rows()
CASES = [(module, cell) for _, modules, cell in ROWS for module in modules]


def test_table_is_parsed() -> None:
    """The table exists and names the service's main modules."""
    named = {module for module, _ in CASES}
    assert {"message_history/rules.py", "consumers/loop.py", "storage/mongodb.py"} <= named


@pytest.mark.parametrize(("module", "allowed_cell"), CASES, ids=[m for m, _ in CASES])
def test_module_imports_only_what_its_row_allows(module: str, allowed_cell: str) -> None:
    """Every import of the module is the standard library or listed in its row of the README table."""
    path = ROOT / module
    assert path.is_file(), f"README names {module}, which does not exist"
    allowed = _allowed_for(module, allowed_cell)
    if allowed is None:
        return
    own = module.split("/")[0]
    extra = sorted(n for n in _imports(path) if not _is_allowed(n, own, allowed))
    assert not extra, f"{module} imports {extra}, not allowed by its README row: {allowed_cell}"


def test_every_service_module_is_in_the_table() -> None:
    """No module of the service's packages is missing from the table (a new job gets a row)."""
    named = {module for module, _ in CASES}
    present = {
        str(p.relative_to(ROOT))
        for package in FIRST_PARTY
        for p in (ROOT / package).glob("*.py")
        if p.name not in {"__init__.py", "__main__.py"}
    }
    unlisted = {
        "message_history/check.py",  # a command's own module, described under Commands
        "message_history/demo.py",
    }
    assert sorted(present - named - unlisted) == []


def test_readme_settings_table_matches_the_generated_one() -> None:
    """The README's settings table is the generated one of docs/configuration.md (kept true by its test)."""
    marker = re.compile(r"<!-- settings:begin.*?<!-- settings:end -->", re.S)
    readme_block = marker.search(README.read_text(encoding="utf-8"))
    doc_block = marker.search((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert readme_block is not None
    assert doc_block is not None
    assert readme_block.group(0) == doc_block.group(0)
