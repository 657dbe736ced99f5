"""What is published with the project agrees with pyproject.toml: the license file is the license it declares,
dependencies are ranges (the exact versions are the lock's), the changelog has this version's section."""

from __future__ import annotations

import re
import tomllib
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from tests.unit.deploy_support import DEPLOY, REPO

# Headings of the Apache License 2.0's nine sections, in order (the standard text, as apache.org serves it).
APACHE_SECTIONS = [
    "Definitions",
    "Grant of Copyright License",
    "Grant of Patent License",
    "Redistribution",
    "Submission of Contributions",
    "Trademarks",
    "Disclaimer of Warranty",
    "Limitation of Liability",
    "Accepting Warranty or Additional Liability",
]
KEEP_A_CHANGELOG_KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project


def test_license_file_is_the_declared_license() -> None:
    """pyproject.toml declares Apache-2.0 and ships LICENSE, which holds the license's full standard text."""
    project = _project()
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    found = [int(n) for n in re.findall(r"^\s+(\d)\. \w", text, re.MULTILINE)]
    assert found == list(range(1, 10))
    for heading in APACHE_SECTIONS:
        assert f". {heading}." in text, heading
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


def test_the_image_ships_the_license() -> None:
    """The Docker build context allows LICENSE and the builder copies it, so the wheel in the image has it."""
    assert "!LICENSE" in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    copies = [
        line
        for line in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines()
        if line.startswith("COPY ")
    ]
    assert any("LICENSE" in line.split() for line in copies)


def test_runtime_dependencies_are_bounded_ranges() -> None:
    """Each runtime dependency has a lower and an upper bound and no exact pin (pins belong in the lock)."""
    for spec in _project()["dependencies"]:
        requirement = Requirement(spec)
        operators = {s.operator for s in requirement.specifier}
        assert "==" not in operators, spec
        assert ">=" in operators, spec
        assert "<" in operators, spec


def test_changelog_has_a_section_for_this_version() -> None:
    """CHANGELOG.md follows Keep a Changelog: a `## [version]` section for pyproject's version, with only the
    standard kinds of change as subsections."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "keepachangelog.com" in text
    versions = re.findall(r"^## \[([^\]]+)\]", text, re.MULTILINE)
    assert Version(_project()["version"]) in [Version(v) for v in versions if v != "Unreleased"]
    kinds = set(re.findall(r"^### (\w+)", text, re.MULTILINE))
    assert kinds
    assert kinds <= KEEP_A_CHANGELOG_KINDS
