"""Every row of every recorded Mastra version (tests/data/mastra_versions/) is recalled or skipped and
counted, on both paths, never a stopped path: tests/paths.py over the stored documents
(tests/raw_storage.py reads them with the MongoDB storage's own reader). Fast, no server, no Node; the
comparison with Mastra 1.71's own recall is tests/interop/test_mastra_versions_recall.py.
"""

from __future__ import annotations

import pytest

from tests.mastra_versions import Corpus, labels, load
from tests.paths import Paths, assistant, request, response, user
from tests.raw_storage import RawRowStorage

ALL = 1000


def _paths(corpus: Corpus) -> Paths:
    storage = RawRowStorage()
    storage.add_threads(corpus.threads)
    storage.add_messages(corpus.messages)
    return Paths(storage=storage)


@pytest.mark.parametrize("label", labels())
async def test_every_row_of_every_version_is_recalled(label: str) -> None:
    """Each thread, every message: each of its rows is recalled under its own id (a v1 `tool` row as an
    assistant message, as Mastra 1.71 reads it: tests/interop/test_mastra_versions_recall.py), none skipped;
    one batch of every thread."""
    corpus = load(label)
    paths = _paths(corpus)
    threads = corpus.threads
    batch = await paths.recall(
        *(
            request(
                t["id"],
                [user(f"in-{i}", "next", 10**8)],
                resource=t["resourceId"],
                memory={"lastMessages": ALL},
            )
            for i, t in enumerate(threads)
        )
    )
    for i, thread in enumerate(threads):
        event = batch.event(i)
        recalled = [m for m in event["messages"] if m["source"] == "memory"]
        assert event["history"].get("skipped", 0) == 0, (label, thread["id"], event["history"])
        rows = corpus.thread_rows(thread["id"])
        assert sorted(m["id"] for m in recalled) == sorted(r["id"] for r in rows), (label, thread["id"])
        assert event["history"]["recalled"] == len(rows)
        for message in recalled:
            assert message["role"] in ("user", "assistant"), message  # v1 `tool` rows read as assistant


@pytest.mark.parametrize("label", labels())
async def test_a_turn_is_persisted_onto_every_version_s_threads(label: str) -> None:
    """A response on each thread is saved next to the version's rows, and the next recall has both."""
    corpus = load(label)
    paths = _paths(corpus)
    threads = corpus.threads
    turns = [
        response(
            t["id"],
            input=[user(f"u-{t['id']}", "more", 10**8)],
            output=[assistant(f"a-{t['id']}", "sure", 10**8 + 1)],
            resource=t["resourceId"],
        )
        for t in threads
    ]
    batch = await paths.persist(*turns)
    for i, thread in enumerate(threads):
        assert batch.event(i)["savedMessageIds"] == [f"u-{thread['id']}", f"a-{thread['id']}"]
        stored = await paths.stored_ids(thread["id"])
        assert stored[-2:] == [f"u-{thread['id']}", f"a-{thread['id']}"]
