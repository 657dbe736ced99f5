"""The recall and the persist path give, byte for byte, the outputs recorded from main's handlers before the
issue-25 rewrite (tests/golden.py; the corpus: tests/golden_cases.py).

A difference is either a regression or a deliberate change of behaviour: then say so in the commit and
re-record (`.venv/bin/python -m tests.golden record`), never to make a rewrite pass.
"""

from __future__ import annotations

from collections import Counter

from tests.golden import GOLDEN_FILE, first_difference, load, run_case, summary


def test_the_corpus_covers_what_it_claims() -> None:
    """The goldens hold the rule tables, the Mastra-written rows and the generated threads, with refusals and
    skips among them (so a replay that passes is not a replay of trivial cases)."""
    entries = load()
    families = Counter(
        e["case"]["id"].split("/")[0]
        if e["case"]["id"].startswith("mastra-rows/")
        else "/".join(e["case"]["id"].split("/")[:2])
        for e in entries
    )
    assert families["rules/recall"] >= 20
    assert families["rules/persist"] >= 20
    assert families["rules/continue"] >= 10
    assert families["mastra-rows"] >= 10
    assert families["generated/recall"] >= 200
    assert families["generated/persist"] >= 150
    outputs = GOLDEN_FILE.read_bytes()
    assert len(outputs) < 2_000_000
    dead = Counter(
        d["type"] for e in entries for b in e["output"]["batches"] for d in b.get("dead", {}).values()
    )
    assert {"EventValidationError", "ThreadOwnershipError", "MessageIdTakenError"} <= set(dead)


def test_every_case_gives_the_recorded_bytes() -> None:
    entries = load()
    differing: list[tuple[str, str]] = []
    for entry in entries:
        found = first_difference(entry["output"], run_case(entry["case"]))
        if found is not None:
            differing.append((entry["case"]["id"], found))
    assert not differing, summary(differing, len(entries))
