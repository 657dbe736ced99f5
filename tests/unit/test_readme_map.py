"""The README's "where to change what" table and settings table stay true.

The table has one row per folder, each with its layer number: a module imports only from its own layer or
below (the ground modules, layer 0, from anywhere), and only the third-party libraries its row names (the
standard library is always allowed). A module that starts importing upwards (the rules importing the
storage, the storage importing the stream loop) or a library its layer does not allow (pymongo in the
rules, aiokafka in the processor) fails here, and so does a row naming a file that no longer exists, or a
module that belongs to no row.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_PARTY = ("message_history", "schemas", "storage", "consumers", "producers", "worker")
ENTRY_POINTS = {"message_history/__main__.py"}  # `python -m message_history`: the top, above every layer
ALIASES = {"pydantic_core": "pydantic"}  # pydantic's own engine: allowed wherever pydantic is


@dataclass(frozen=True)
class Row:
    layer: int
    places: tuple[str, ...]  # folders ("storage/") or, for the ground, files
    named: tuple[str, ...]  # the files and folders the row's jobs name, relative to its folder
    libraries: frozenset[str]


_NOT_LIBRARIES = ("__future__", "_typeshed")  # the stdlib's type-only stubs are not a dependency


def _rows() -> list[Row]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Where to change what", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not re.match(r"\d+ ", cells[0]):
            continue
        places = tuple(re.findall(r"`([\w/.]+)`", cells[1]))
        named = tuple(re.findall(r"`([\w/]+(?:\.py|/))`", cells[2]))
        libraries = frozenset(re.findall(r"`([\w.]+)`", cells[3]))
        rows.append(Row(int(cells[0].split()[0]), places, named, libraries))
    return rows


ROWS = _rows()


def _modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for package in FIRST_PARTY for p in (ROOT / package).rglob("*.py"))


def _row_of(module: str) -> Row | None:
    """The row whose place holds `module`, the most specific first (a file, then the deepest folder)."""
    best: tuple[int, Row] | None = None
    for row in ROWS:
        for place in row.places:
            holds = module == place or (place.endswith("/") and module.startswith(place))
            if holds and (best is None or len(place) > best[0]):
                best = (len(place), row)
    return best[1] if best else None


def _layer_of(module: str) -> int | None:
    if module in ENTRY_POINTS:
        return max(row.layer for row in ROWS) + 1
    if module == "message_history/__init__.py":
        return 0  # the package's version string
    row = _row_of(module)
    return row.layer if row else None


def _file_of(dotted: str) -> str | None:
    """The repository file that a first-party dotted name comes from (a module, or a package's __init__)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = "/".join(parts[:end])
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if (ROOT / candidate).is_file():
                return candidate
    return None


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            # a relative import would slip past the layer check: the house writes absolute ones
            raise AssertionError(
                f"{path.relative_to(ROOT)}: relative import (level {node.level}); write it absolute"
            )
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FIRST_PARTY:  # `from message_history import metrics`: a submodule
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
    return names


def test_table_is_parsed() -> None:
    """The table exists, its layers run from the ground up, and it names the service's main modules."""
    assert sorted({row.layer for row in ROWS}) == list(range(max(row.layer for row in ROWS) + 1))
    places = {place for row in ROWS for place in row.places}
    assert {"message_history/core/", "consumers/", "storage/", "message_history/app/"} <= places


@pytest.mark.parametrize("row", ROWS, ids=[",".join(r.places) for r in ROWS])
def test_every_named_file_exists(row: Row) -> None:
    """A row names only files and folders that exist in its folder."""
    for place in row.places:
        assert (ROOT / place).exists(), f"README names {place}, which does not exist"
    folders = [p for p in row.places if p.endswith("/")]
    for name in row.named:
        if folders:
            assert any((ROOT / folder / name).exists() for folder in folders), f"{name} is not in {folders}"
        else:
            assert (ROOT / Path(row.places[0]).parent / name).exists(), f"{name} does not exist"


@pytest.mark.parametrize("module", _modules())
def test_module_belongs_to_a_layer_and_imports_only_below(module: str) -> None:
    """Every first-party import stays in the module's layer or below; every library is in its row."""
    layer = _layer_of(module)
    assert layer is not None, f"{module} belongs to no row of the README table (a new folder gets a row)"
    row = _row_of(module)
    upward = []
    libraries = set()
    for name in _imports(ROOT / module):
        top = name.split(".")[0]
        if top in FIRST_PARTY:
            target = _file_of(name)
            target_layer = _layer_of(target) if target else None
            if target_layer is not None and target_layer != 0 and target_layer > layer:
                upward.append(f"{name} (layer {target_layer})")
        elif top not in sys.stdlib_module_names and top not in _NOT_LIBRARIES:
            libraries.add(ALIASES.get(top, top))
    assert not upward, f"{module} (layer {layer}) imports upwards: {sorted(upward)}"
    if module in ENTRY_POINTS or row is None:
        return
    extra = sorted(lib for lib in libraries if lib not in row.libraries)
    assert not extra, f"{module} imports {extra}, not allowed by its README row"


def test_every_job_module_is_named_in_its_row() -> None:
    """Each module is named in its row's jobs (or sits in a sub-folder the row names): a new job is listed."""
    unnamed = []
    for module in _modules():
        row = _row_of(module)
        if row is None or Path(module).name in {"__init__.py", "__main__.py"} or module in row.places:
            continue
        folder = next(p for p in sorted(row.places, key=len, reverse=True) if module.startswith(p))
        inside = module[len(folder) :]
        if inside not in row.named and not any(inside.startswith(n) for n in row.named if n.endswith("/")):
            unnamed.append(module)
    assert unnamed == []


def test_readme_settings_table_matches_the_generated_one() -> None:
    """The README's settings table is the generated one of docs/configuration.md (kept true by its test)."""
    marker = re.compile(r"<!-- settings:begin.*?<!-- settings:end -->", re.S)
    readme_block = marker.search(README.read_text(encoding="utf-8"))
    doc_block = marker.search((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert readme_block is not None
    assert doc_block is not None
    assert readme_block.group(0) == doc_block.group(0)
