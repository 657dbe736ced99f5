"""`message-history check` against the real stack: a round trip on each dependency, OK lines, exit 0."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest
from pymongo.asynchronous.database import AsyncDatabase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def test_check_passes_against_the_running_stack(
    kafka_bootstrap: str, mongo_uri: str, mongo_db: AsyncDatabase[dict[str, Any]]
) -> None:
    """With both endpoints reachable, `message-history check` prints OK for Kafka and MongoDB, exits 0, and
    leaves no probe document behind."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MESSAGE_HISTORY_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, MONGODB_URI=mongo_uri, MONGODB_DATABASE=mongo_db.name)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "message_history",
        "check",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(80):
        out, err = await proc.communicate()
    lines = out.decode().splitlines()
    assert proc.returncode == 0, (out + err).decode()
    assert [line.split()[:2] for line in lines] == [["OK", "kafka"], ["OK", "mongodb"]]
    assert await mongo_db["message_history_check"].count_documents({}) == 0
