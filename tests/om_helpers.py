"""Observational Memory rows for the in-memory tests of the OM paths
(`tests/unit/test_observational_paths.py`, `tests/unit/test_observe_sweep.py`): one builder, so both start
from the same stored-row shape."""

from __future__ import annotations

from typing import Any

from storage.observational import ObservationalRecord, record_from_doc


def om_row(**fields: Any) -> ObservationalRecord:
    """Thread t1's (owner u1) generation-0 row, being observed; `fields` are stored fields that replace or
    add to it (by their MongoDB names, e.g. `_mh_cycle`)."""
    doc = {
        "id": "row-1",
        "lookupKey": "thread:t1",
        "scope": "thread",
        "threadId": "t1",
        "resourceId": "u1",
        "generationCount": 0,
        "activeObservations": "",
        "isObserving": True,
        **fields,
    }
    return record_from_doc(doc)
