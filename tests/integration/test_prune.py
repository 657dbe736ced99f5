"""`message-history prune`: messages older than the cut-off and the threads they leave empty are deleted, the
rest kept; an interrupted prune resumed with the same cut-off ends where an uninterrupted one ends."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from message_history.app.prune import add_prune_arguments, iso, run_prune
from schemas.messages import Message
from storage.mongodb import MongoHistoryStorage
from storage.protocol import SaveTurn
from tests import infra
from tests.integration.service_harness import fresh_settings, running_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CUTOFF = datetime(2026, 6, 1, tzinfo=UTC)
OLD = CUTOFF - timedelta(days=30)
NEW = CUTOFF + timedelta(days=1)


def _message(message_id: str, at: datetime) -> Message:
    return Message.model_validate(
        {
            "id": message_id,
            "role": "user",
            "createdAt": at,
            "content": {"format": 2, "parts": [{"type": "text", "text": message_id}]},
        }
    )


async def seed(db: AsyncDatabase[dict[str, Any]]) -> None:
    """Old threads (only old messages), a mixed thread, a new thread, and Mastra-style oddities."""
    store = MongoHistoryStorage(db)
    await store.ensure_indexes()
    turns = [
        SaveTurn(f"old{t}", "u", [_message(f"old{t}-{i}", OLD + timedelta(minutes=i)) for i in range(9)])
        for t in range(4)
    ]
    turns.append(
        SaveTurn("mixed", "u", [_message(f"mixed-{i}", OLD + timedelta(days=i * 10)) for i in range(6)])
    )
    turns.append(SaveTurn("new", "u", [_message(f"new-{i}", NEW + timedelta(minutes=i)) for i in range(3)]))
    await store.save_many(turns)
    # a thread Mastra created without messages long ago (empty: pruned) and one whose updatedAt lags behind a
    # newer message (not empty: kept)
    await db["mastra_threads"].insert_many(
        [
            {
                "id": "empty",
                "resourceId": "u",
                "title": "",
                "metadata": {},
                "createdAt": OLD,
                "updatedAt": OLD,
            },
            {
                "id": "lagging",
                "resourceId": "u",
                "title": "",
                "metadata": {},
                "createdAt": OLD,
                "updatedAt": OLD,
            },
        ]
    )
    await store.save_many([SaveTurn("lagging", "u", [_message("lagging-0", NEW)])])
    await db["mastra_threads"].update_one({"id": "lagging"}, {"$set": {"updatedAt": OLD}})


async def state(db: AsyncDatabase[dict[str, Any]]) -> tuple[list[str], list[str]]:
    messages = sorted(d["id"] for d in await db["mastra_messages"].find({}, {"id": 1}).to_list())
    threads = sorted(d["id"] for d in await db["mastra_threads"].find({}, {"id": 1}).to_list())
    return messages, threads


async def prune(
    db: AsyncDatabase[dict[str, Any]], mongo_uri: str, *argv: str
) -> tuple[int, dict[str, Any], str]:
    parser = argparse.ArgumentParser()
    add_prune_arguments(parser)
    settings = fresh_settings("127.0.0.1:1", mongo_uri, MONGODB_DATABASE=db.name)
    out, err = io.StringIO(), io.StringIO()
    code = await run_prune(settings, parser.parse_args(list(argv)), out=out, err=err, db=db)
    return code, json.loads(out.getvalue()), err.getvalue()


async def test_prune_deletes_old_messages_and_emptied_threads_and_keeps_the_rest(
    mongo_db: AsyncDatabase[dict[str, Any]], mongo_uri: str
) -> None:
    """Old messages gone, newer kept; threads left empty gone, threads with a message kept; progress shown."""
    await seed(mongo_db)
    code, dry, _ = await prune(mongo_db, mongo_uri, "--before", iso(CUTOFF), "--dry-run")
    assert (code, dry["messages"], dry["dryRun"]) == (0, 4 * 9 + 3, True)
    assert len((await state(mongo_db))[0]) == 4 * 9 + 6 + 3 + 1  # nothing deleted

    code, summary, progress = await prune(mongo_db, mongo_uri, "--before", iso(CUTOFF), "--batch-size", "7")
    assert code == 0
    assert (summary["done"], summary["deletedMessages"], summary["deletedThreads"]) == (True, 4 * 9 + 3, 5)
    assert summary["cutoff"] == "2026-06-01T00:00:00.000Z"
    assert "messages, " in progress
    messages, threads = await state(mongo_db)
    assert messages == sorted(
        [f"mixed-{i}" for i in (3, 4, 5)] + [f"new-{i}" for i in range(3)] + ["lagging-0"]
    )
    assert threads == ["lagging", "mixed", "new"]

    code, again, _ = await prune(mongo_db, mongo_uri, "--before", iso(CUTOFF))
    assert (code, again["deletedMessages"], again["deletedThreads"]) == (0, 0, 0)


async def test_an_interrupted_prune_resumed_with_the_same_cutoff_ends_like_one_run(
    mongo_client: AsyncMongoClient[dict[str, Any]], mongo_uri: str
) -> None:
    """`--max-batches 2` stops part-way (exit 3, the resume command printed); running it again finishes the
    job: the same rows remain as after one uninterrupted prune of a twin database."""
    once, twice = mongo_client[infra.unique_name("t_")], mongo_client[infra.unique_name("t_")]
    try:
        await asyncio.gather(seed(once), seed(twice))
        code, _, _ = await prune(once, mongo_uri, "--before", iso(CUTOFF), "--batch-size", "5")
        assert code == 0

        code, partial, err = await prune(
            twice, mongo_uri, "--before", iso(CUTOFF), "--batch-size", "5", "--max-batches", "2"
        )
        assert (code, partial["done"], partial["deletedMessages"]) == (3, False, 10)
        assert f"resume with: message-history prune --before {iso(CUTOFF)}" in err
        assert await state(twice) != await state(once)
        code, rest, _ = await prune(twice, mongo_uri, "--before", iso(CUTOFF), "--batch-size", "5")
        assert (code, rest["done"], partial["deletedMessages"] + rest["deletedMessages"]) == (0, True, 39)
        assert await state(twice) == await state(once)
    finally:
        await mongo_client.drop_database(once.name)
        await mongo_client.drop_database(twice.name)


async def test_the_service_prunes_periodically_when_asked(
    kafka_bootstrap: str, mongo_uri: str, mongo_client: AsyncMongoClient[dict[str, Any]]
) -> None:
    """With `prune_older_than` set, `run` prunes in the background (off by default)."""
    settings = fresh_settings(kafka_bootstrap, mongo_uri, prune_older_than="1d", prune_interval_s=0.5)
    db = mongo_client[settings.mongodb_database]
    try:
        await seed(db)
        async with running_service(settings, only="persist"):
            for _ in range(100):
                if "old0-0" not in (await state(db))[0]:
                    break
                await asyncio.sleep(0.2)
        messages, threads = await state(db)
        # the seed is dated mid-2026, more than one day ago: the service prunes its old rows
        assert "old0-0" not in messages
        assert "old0" not in threads
    finally:
        await mongo_client.drop_database(settings.mongodb_database)
