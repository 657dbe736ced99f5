"""`message-history topics`: create the service's topics with one partition count, or check the counts.

The turn barrier needs the requests and responses topics to have the same partition count (a thread's
responses sit on the partition number of its requests). `--partitions N` creates every missing topic of the
settings (requests, responses, enriched, persisted, both dead-letter topics) with N partitions; without it,
nothing is created. Either way the input topics' counts are compared, one line per topic, and the exit code
is 1 when they differ (or when a topic exists with another count than N). Existing topics are never altered:
adding partitions moves threads between partitions, see docs/operations.md section 2.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from message_history.settings import Settings
from producers.connection import kafka_options, topic_partitions

_TIMEOUT_MS = 30_000


def service_topics(settings: Settings) -> list[str]:
    """Every topic the service reads or writes, inputs first."""
    return [
        settings.requests_topic,
        settings.responses_topic,
        settings.enriched_topic,
        settings.persisted_topic,
        settings.requests_dlq,
        settings.responses_dlq,
    ]


def verdict(counts: dict[str, int | None], inputs: tuple[str, str], wanted: int | None) -> list[str]:
    """The problems with `counts` (topic -> partitions, None = missing); empty when all is well. Pure."""
    problems: list[str] = []
    requests, responses = (counts.get(t) for t in inputs)
    if requests is not None and responses is not None and requests != responses:
        problems.append(
            f"{inputs[0]!r} has {requests} partitions and {inputs[1]!r} has {responses}: the turn barrier "
            "needs equal counts (add partitions to the smaller one, or set MESSAGE_HISTORY_BARRIER=off)"
        )
    if wanted is not None:
        problems.extend(
            f"{topic!r} exists with {count} partitions, not {wanted} (left unchanged)"
            for topic, count in counts.items()
            if count is not None and count != wanted
        )
    return problems


async def ensure_topics(
    settings: Settings, *, partitions: int | None, replication: int
) -> tuple[dict[str, int | None], list[str]]:
    """(partition count per topic after creating the missing ones when `partitions` is set, problems)."""
    names = service_topics(settings)
    admin = AIOKafkaAdminClient(**kafka_options(settings, client_id="message-history-topics"))
    await admin.start()
    try:
        counts = await _counts(admin, names)
        missing = [name for name, count in counts.items() if count is None]
        if partitions is not None and missing:
            await admin.create_topics(
                [NewTopic(name, partitions, replication) for name in missing], timeout_ms=_TIMEOUT_MS
            )
            counts = await _created(admin, names, missing)
    finally:
        await admin.close()
    return counts, verdict(counts, (settings.requests_topic, settings.responses_topic), partitions)


async def _created(admin: AIOKafkaAdminClient, names: list[str], missing: list[str]) -> dict[str, int | None]:
    """The counts once the new topics show in the metadata (a broker answers before every node knows)."""
    deadline = time.monotonic() + _TIMEOUT_MS / 1000
    while True:
        counts = await _counts(admin, names)
        if all(counts[name] is not None for name in missing) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.2)


async def _counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int | None]:
    existing = set(await admin.list_topics())
    present = [name for name in names if name in existing]
    described: list[dict[str, Any]] = await admin.describe_topics(present) if present else []
    by_name = {str(t["topic"]): len(t["partitions"]) for t in described if t.get("error_code", 0) == 0}
    return {name: by_name.get(name) for name in names}


async def existing_partitions(
    settings: Settings, topics: Sequence[str], *, client_id: str
) -> dict[str, list[int]]:
    """Partitions of those of `topics` that exist (one metadata read, with an admin client of its own)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings, client_id=client_id))
    await admin.start()
    try:
        # All topics' metadata: naming a topic would make a broker with auto-create create it.
        described = await admin.describe_topics()
    finally:
        await admin.close()
    found = topic_partitions(described)
    return {topic: sorted(found[topic]) for topic in topics if topic in found}


def main(*, partitions: int | None, replication: int) -> int:
    """Entry point of `message-history topics`; prints one line per topic, returns the exit code."""
    settings = Settings()
    try:
        counts, problems = asyncio.run(
            ensure_topics(settings, partitions=partitions, replication=replication)
        )
    except (KafkaError, OSError) as exc:
        print(f"FAIL kafka {settings.kafka_bootstrap_servers}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for topic, count in counts.items():
        print(f"{topic}: {'missing' if count is None else f'{count} partitions'}")
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1 if problems else 0
