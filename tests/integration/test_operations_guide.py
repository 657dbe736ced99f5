"""The dead-letter re-drive recipe printed in docs/operations.md works as written, on the real broker."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.conftest import MakeTopic

pytestmark = pytest.mark.integration

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
CONSTANTS = re.compile(r"^DLQ, PARTITION, FIRST, LAST = .*$", re.MULTILINE)


def _redrive_script() -> str:
    """The Python the guide pipes into `kubectl run redrive ... python -`."""
    text = GUIDE.read_text(encoding="utf-8")
    match = re.search(r"--command -- python - <<'EOF'\n(.*?)\nEOF\n", text, re.DOTALL)
    assert match is not None, "re-drive recipe not found in docs/operations.md"
    return match.group(1)


async def test_redrive_recipe_copies_the_original_bytes_back(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """The guide's snippet re-produces the chosen dead letters' key and value bytes, untouched, to
    `source.topic`, keeping their own headers and dropping the service's."""
    dlq = await make_topic()
    source = await make_topic()
    values = [b'{"ok": 0}', b"\xff\x00 not json", b'{"ok": 2}\n{"second line": true}', b'{"ok": 3}']
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for index, value in enumerate(values):
            headers = [
                ("traceparent", f"00-{index:032x}-{index:016x}-01".encode()),
                ("error.type", b"EventValidationError"),
                ("error.message", b"not JSON"),
                ("source.topic", source.encode()),
                ("source.partition", b"0"),
                ("source.offset", str(index).encode()),
                ("failed.at", b"2026-01-01T00:00:00.000Z"),
                ("service.version", b"0.1.0"),
            ]
            await producer.send_and_wait(
                dlq, value, key=f"thread-{index}".encode(), partition=0, headers=headers
            )
    finally:
        await producer.stop()

    script = CONSTANTS.sub(f"DLQ, PARTITION, FIRST, LAST = {dlq!r}, 0, 1, 2", _redrive_script())
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(source, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        received: list[Any] = []
        async with asyncio.timeout(30):
            while len(received) < 2:
                batch = await consumer.getmany(partition, timeout_ms=500)
                received.extend(batch.get(partition, []))
        end = (await consumer.end_offsets([partition]))[partition]
    finally:
        await consumer.stop()

    assert end == 2  # only the two chosen records, each once
    assert [(r.key, r.value) for r in received] == [(b"thread-1", values[1]), (b"thread-2", values[2])]
    for index, record in zip((1, 2), received, strict=True):
        assert list(record.headers) == [("traceparent", f"00-{index:032x}-{index:016x}-01".encode())]
