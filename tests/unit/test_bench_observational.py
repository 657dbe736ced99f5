"""`python -m bench observational` on a short conversation: every line is measured, OM observes and
reflects, and with OM the last request carries less than the whole thread (the log stands for its start)."""

from __future__ import annotations

import argparse

from bench.extra import observational


def test_a_short_conversation() -> None:
    args = argparse.Namespace(
        turns=60,
        user_bytes=200,
        assistant_bytes=600,
        last_messages=10,
        max_tokens=2000,
        message_tokens=1500,
        observation_tokens=900,
        observed_share=0.3,
    )
    outcome = observational.run(args)
    sent = outcome["sent"]
    assert {len(values) for values in sent.values()} == {60}
    assert sent["observational"][-1] < sent["everything"][-1]
    assert max(sent["lastMessages"]) <= max(sent["everything"])
    work = outcome["work"]
    assert work["observe"] >= 2
    assert work["reflect"] >= 1
    assert work["bytes_out"] > work["bytes_in"] > 0
    text = observational.render(args, outcome)
    assert "observational (log + unobserved)" in text
    assert "events per turn" in text
