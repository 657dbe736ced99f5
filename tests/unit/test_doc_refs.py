"""Every document a product file, a test or a doc points at is in the repo, and so is every anchor it names.

The rules (R1-R12) and the event contract live in `docs/rules.md` and `docs/events.md`; code cites them as
`docs/rules.md#r6` or `docs/events.md#9-dead-letters`. This fails on a reference to a document outside the
repo (the design notes the project started from), on a bare rule tag without its anchor, on a link or a `*.md`
path that does not exist, and on an anchor that no heading (or `<a id>`) of its document defines. Anchors are
GitHub's: the heading's text, lower-cased, punctuation dropped, spaces as hyphens.

`bench/` is left out: it belongs to the benchmark harness, which cites its own notes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = frozenset(
    {".git", ".venv", "node_modules", ".cache", ".mypy_cache", ".ruff_cache", ".pytest_cache", "dist"}
    | {"bench"}  # the benchmark harness's own folder (see above)
)
SUFFIXES = (".py", ".md", ".ts", ".mjs")
CODE_SUFFIXES = (".py", ".ts", ".mjs")
RULES = ROOT / "docs" / "rules.md"

# Documents that are not in the repo, and the ways the code used to cite them.
OUTSIDE = [
    (re.compile(r"mastra-message-history\.md|mastra-1\.71-memory\.md|\bcontract\.md"), "a design note"),
    (re.compile(r"\.\./shared/|/work/shared|\bshared/(?:spec|notes)/|\bspec/(?:contract|mastra)"), "shared/"),
    (re.compile(r"\bcontract\s*(?:§|\(?section\s+\d)", re.IGNORECASE), "the design contract's sections"),
    (re.compile(r"\bspec\s*(?:§|\(?section\s+\d)|\(§\s?\d+\.\d+\)", re.IGNORECASE), "the spec's sections"),
]
RULE_TAG = re.compile(r"(?<![\w#/.-])R(?:1[0-2]|[1-9])\b")
MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
MD_PATH = re.compile(r"(?<![\w./:-])((?:\.\./)*[\w./-]*[\w-]\.md)(#[\w-]+)?")
RULE_ANCHOR_AFTER = re.compile(r"(?<![\w/.])#(r\d+(?:-to-r\d+)?)\b")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def repo_files() -> Iterator[Path]:
    """The product, test and doc files this check reads."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for name in files:
            if name.endswith(SUFFIXES):
                yield Path(folder) / name


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors_of(markdown: str) -> set[str]:
    """Every anchor a Markdown text defines: its headings (outside code fences) and its `<a id>`s."""
    found: set[str] = set(EXPLICIT_ANCHOR.findall(markdown))
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


@cache
def anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors_of(path.read_text(encoding="utf-8")))


def resolve(target: str, source: Path) -> Path | None:
    """The file a path names: relative to the citing file, the repo root, or `docs/`; None when none is."""
    for base in (source.parent, ROOT, ROOT / "docs"):
        candidate = (base / target).resolve()
        if candidate.exists():
            return candidate
    return None


def outside_refs(text: str) -> list[str]:
    """`line: text` of each reference to a document outside the repo."""
    return [
        f"{n}: {what}: {line.strip()[:120]}"
        for n, line in enumerate(text.splitlines(), 1)
        for pattern, what in OUTSIDE
        if pattern.search(line)
    ]


def bare_rule_tags(text: str, *, markdown: bool) -> list[str]:
    """Rule tags not pointing at their anchor: in code any `R6`; in Markdown one on a line without a rules.md
    link (link text such as `[R6](rules.md#r6)` is fine)."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if not RULE_TAG.search(line):
            continue
        if markdown and "rules.md" in line:
            continue
        problems.append(f"{n}: bare rule tag, cite docs/rules.md#rN: {line.strip()[:120]}")
    return problems


def dangling_refs(text: str, source: Path) -> list[str]:
    """Links, `*.md` paths and anchors in `text` that name no file, or no anchor of the file they name."""
    problems = []
    markdown = source.suffix == ".md"
    for n, line in enumerate(text.splitlines(), 1):
        targets = [m.group(1) for m in MD_LINK.finditer(line)] if markdown else []
        targets += [m.group(1) + (m.group(2) or "") for m in MD_PATH.finditer(line)]
        for target in dict.fromkeys(targets):  # a link's target is also a path: once each
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path = source if not path_part else resolve(path_part, source)
            if path is None:
                problems.append(f"{n}: no such file in the repo: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                problems.append(f"{n}: {path.relative_to(ROOT)} has no anchor #{anchor}")
        if "rules.md#" in line:  # `docs/rules.md#r4, #r7`: the later anchors are rules.md's too
            first = line.index("rules.md#")
            for m in RULE_ANCHOR_AFTER.finditer(line, first + len("rules.md")):
                if m.group(1) not in anchors(RULES):
                    problems.append(f"{n}: docs/rules.md has no anchor #{m.group(1)}")
    return problems


FILES = sorted(p for p in repo_files() if p != Path(__file__).resolve())


def _report(check: str, found: dict[str, list[str]]) -> str:
    lines = [f"{file}:{problem}" for file, problems in found.items() for problem in problems]
    return f"{check}: {len(lines)} reference(s):\n" + "\n".join(lines)


def _each(check: Callable[[Path, str], list[str]]) -> dict[str, list[str]]:
    found = {}
    for path in FILES:
        text = path.read_text(encoding="utf-8", errors="replace")
        problems = check(path, text)
        if problems:
            found[str(path.relative_to(ROOT))] = problems
    return found


def test_scans_the_tree() -> None:
    """The walk finds the product, test and doc files (so the checks below are not vacuous)."""
    names = {str(p.relative_to(ROOT)) for p in FILES}
    assert {"message_history/core/rules.py", "schemas/events.py", "docs/events.md", "README.md"} <= names
    assert not any(n.startswith(("bench/", ".venv/")) or "/node_modules/" in n for n in names)


def test_nothing_points_at_a_document_outside_the_repo() -> None:
    """No file cites the design notes, the spec or `../shared`: the rules and the contract are in `docs/`."""
    found = _each(lambda path, text: outside_refs(text))
    assert not found, _report("references to documents outside the repo", found)


def test_rule_tags_point_at_their_anchor() -> None:
    """Code cites a rule as `docs/rules.md#r6`, docs as `[R6](rules.md#r6)`; docs/rules.md alone says R6."""
    found = _each(
        lambda path, text: []
        if path == RULES
        else bare_rule_tags(text, markdown=path.suffix not in CODE_SUFFIXES)
    )
    assert not found, _report("rule tags without their docs/rules.md anchor", found)


def test_every_reference_resolves() -> None:
    """Every link, `*.md` path and anchor names a file of the repo and an anchor that file defines."""
    found = _each(lambda path, text: dangling_refs(text, path))
    assert not found, _report("dangling references", found)


def test_the_rules_and_the_contract_have_the_anchors_code_cites() -> None:
    """`#r1`..`#r12` exist in docs/rules.md; docs/events.md's sections are numbered 1, 2, 3, ... in order."""
    assert {f"r{i}" for i in range(1, 13)} | {"r1-to-r12"} <= anchors(RULES)
    text = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
    numbers = [int(m) for m in re.findall(r"^## (\d+)\. ", text, flags=re.MULTILINE)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    assert len(numbers) >= 10


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("1. Topics, keys and partitions", "1-topics-keys-and-partitions"),
        ("16. Turn ordering: the barrier and busy threads", "16-turn-ordering-the-barrier-and-busy-threads"),
        ("5. Errors ([R12](rules.md#r12))", "5-errors-r12"),
        ("Token budgets (Mastra 1.71 Memory)", "token-budgets-mastra-171-memory"),
        ("`message-history dlq`: **bold**", "message-history-dlq-bold"),
        ("R1 to R12", "r1-to-r12"),
        ("R1–R12", "r1r12"),
    ],
)
def test_slugs_are_githubs(heading: str, anchor: str) -> None:
    """Anchors are computed as GitHub renders them (en dash dropped, link text kept, code marks gone)."""
    assert slug(heading) == anchor


def test_anchors_skip_code_fences_and_number_duplicates() -> None:
    """A `#` line inside a fence is no heading; a repeated heading gets `-1`; `<a id>` counts."""
    text = '# Top\n```bash\n# not a heading\n```\n## Same\n## Same\n| <a id="r3"></a>**R3** |\n'
    assert anchors_of(text) == {"top", "same", "same-1", "r3"}


BAD_PY = """\
# a thread of another resource is refused (contract §4); see mastra-message-history.md section 2.8
# recalled messages are never saved again (R6)
# notes: ../shared/notes/peers.md
# dead letters: docs/events.md#3-dead-letter-headers; rules: docs/rules.md#r6, #r13
# storage: docs/nowhere.md
"""
GOOD_PY = """\
# recalled messages are never saved again (docs/rules.md#r6, #r7); shape: docs/events.md#9-dead-letters
# the whole table: docs/rules.md#r1-to-r12; the README: README.md; a link target: https://example.com/x.md
"""


def test_the_checks_catch_each_kind_of_bad_reference() -> None:
    """Fed known-bad text, each check reports it (so a green run means something); good text passes."""
    source = ROOT / "message_history" / "example.py"
    assert [p.split(":")[0] for p in outside_refs(BAD_PY)] == ["1", "1", "3"]
    assert [p.split(":")[0] for p in bare_rule_tags(BAD_PY, markdown=False)] == ["2"]
    dangling = dangling_refs(BAD_PY, source)
    assert any("#3-dead-letter-headers" in p for p in dangling), dangling
    assert any("#r13" in p for p in dangling), dangling
    assert any("docs/nowhere.md" in p for p in dangling), dangling
    assert outside_refs(GOOD_PY) == []
    assert bare_rule_tags(GOOD_PY, markdown=False) == []
    assert dangling_refs(GOOD_PY, source) == []
    markdown = "See [R6](rules.md#r6) and [the gone page](gone.md), and [x](events.md#no-such-section).\n"
    doc = dangling_refs(markdown, ROOT / "docs" / "example.md")
    assert [p.split(":", 1)[1].strip() for p in doc] == [
        "no such file in the repo: gone.md",
        "docs/events.md has no anchor #no-such-section",
    ]
