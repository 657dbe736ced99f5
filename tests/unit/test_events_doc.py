"""docs/events.md names every field of every event model, and every dead-letter header, in its section.

The page is the contract the code is read against; a field added to a model without a word there fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from schemas.commands import ForgetResource, ForgetThread, HistoryForgotten
from schemas.dead_letters import DEAD_LETTER_HEADERS
from schemas.events import (
    AgentRequest,
    AgentResponse,
    EnrichedRequest,
    HistoryInfo,
    HistoryPersisted,
    MemoryBoundary,
    MemoryOptions,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"
TEXT = DOC.read_text(encoding="utf-8")
COMMON = 3  # "Fields every event carries"


def section(number: int) -> str:
    """The text of `## <number>. ...` up to the next numbered section."""
    match = re.search(rf"^## {number}\. .*?(?=^## \d+\. |\Z)", TEXT, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, f"docs/events.md has no section {number}"
    return match.group(0)


def missing(text: str, names: list[str]) -> list[str]:
    """The names that `text` never mentions as a word."""
    return [name for name in names if not re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text)]


@pytest.mark.parametrize(
    ("model", "sections"),
    [
        (AgentRequest, [COMMON, 4]),
        (MemoryOptions, [4]),
        (EnrichedRequest, [COMMON, 5]),
        (HistoryInfo, [5]),
        (MemoryBoundary, [5]),
        (AgentResponse, [COMMON, 6]),
        (HistoryPersisted, [COMMON, 7]),
        (ForgetThread, [8]),
        (ForgetResource, [8]),
        (HistoryForgotten, [8]),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_every_field_is_named_in_its_section(model: type[BaseModel], sections: list[int]) -> None:
    """Each declared field of the model is a word of the event's section (or of the common fields)."""
    text = "".join(section(n) for n in sections)
    assert missing(text, list(model.model_fields)) == []


def test_every_dead_letter_header_is_named() -> None:
    """The dead-letter section names every header `schemas.dead_letters` writes."""
    assert missing(section(9), list(DEAD_LETTER_HEADERS)) == []


def test_a_field_the_page_does_not_name_is_reported() -> None:
    """The check can fail: an unnamed field is reported, a field named only as part of another word is too."""
    assert missing(section(7), ["savedMessageIds", "noSuchField", "savedMessage"]) == [
        "noSuchField",
        "savedMessage",
    ]
