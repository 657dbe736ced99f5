"""The interop corpus: rows real Mastra versions wrote (tests/data/mastra_versions/, recorded by
tests/interop/record_mastra_rows.py), loaded as the documents PyMongo would insert.

Each file is canonical extended JSON `{mastra: {package: version}, threads: [...], messages: [...]}`: the
`mastra_threads` and `mastra_messages` documents exactly as that version stored them (`_id` included, dates
as BSON Date or, for the 0.x stores, ISO strings).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from bson import json_util

CORPUS: Final = Path(__file__).parent / "data" / "mastra_versions"
_OPTIONS: Final = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True)


@dataclass(frozen=True)
class Corpus:
    """One version's rows."""

    label: str
    mastra: dict[str, str]
    threads: list[dict[str, Any]]
    messages: list[dict[str, Any]]

    def thread_rows(self, thread_id: str) -> list[dict[str, Any]]:
        """The messages stored on `thread_id`, in file order."""
        return [m for m in self.messages if m.get("thread_id") == thread_id]


def labels() -> list[str]:
    """The recorded versions, oldest first (`0.10`, `0.24`, `1.0`, `1.71`)."""
    found = [p.stem.removeprefix("mastra-") for p in CORPUS.glob("mastra-*.json")]
    return sorted(found, key=lambda label: tuple(int(part) for part in label.split(".")))


@cache
def _text(label: str) -> str:
    return (CORPUS / f"mastra-{label}.json").read_text()


def load(label: str) -> Corpus:
    """A fresh copy of one version's rows (callers may insert or change them)."""
    data = json_util.loads(_text(label), json_options=_OPTIONS)
    return Corpus(label, dict(data["mastra"]), list(data["threads"]), list(data["messages"]))
