"""The pure modules import no I/O stack: checked in a fresh interpreter through sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("aiokafka", "pymongo", "bson", "motor", "asyncio", "kafka")

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def loaded_top_level_modules(module: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after importing `module`."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, module], check=True, capture_output=True, text=True, timeout=60
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(
    "module",
    [
        "message_history.core.rules",
        "message_history.app.dlq_plan",
        "worker.turn",
        "message_history.core.turn_rules",
        "message_history.core.recall_plan",
        "message_history.core.persist_plan",  # the one persist decision (`decide_turn`): sync and pure
    ],
)
def test_pure_rules_import_no_io(module: str) -> None:
    """Importing the rules (and the dlq selection rules) loads neither Kafka, MongoDB nor asyncio."""
    loaded = loaded_top_level_modules(module)
    assert module.split(".")[0] in loaded
    assert sorted(loaded.intersection(FORBIDDEN)) == []


@pytest.mark.parametrize(
    "module",
    [
        "message_history.processor",
        "message_history.processor.recall",
        "message_history.core.message_list",
        "storage.memory",
    ],
)
def test_library_imports_no_drivers(module: str) -> None:
    """The in-process library (processor, MessageList, in-memory storage) loads no Kafka or MongoDB driver."""
    loaded = loaded_top_level_modules(module)
    assert sorted(loaded.intersection({"aiokafka", "pymongo", "bson", "motor", "kafka"})) == []


def test_probe_sees_a_forbidden_import() -> None:
    """The probe does report an I/O module when one is imported (so the checks above can fail)."""
    assert "asyncio" in loaded_top_level_modules("asyncio")
