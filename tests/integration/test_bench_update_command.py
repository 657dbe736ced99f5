"""`python -m bench update-command` on the real server: both ways write every statement, and it says so."""

from __future__ import annotations

import pytest

from bench.extra import update_command


async def test_both_ways_write_the_same_batch(mongo_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    result = await update_command._run(turns=4, rounds=2, message_bytes=40)
    assert result["statements_per_batch"] == 12  # two messages and a thread a turn
    assert result["messages_stored"] == {"bulk_write": 16, "update_command": 16}
    for way in ("bulk_write", "update_command"):
        figures = result["cpu_us_per_statement"][way]
        assert 0 < figures["best"] <= figures["median"]
