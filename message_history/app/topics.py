"""`message-history topics`: create the service's topics with one partition count, or check the counts.

The turn barrier needs the requests and responses topics to have the same partition count (a thread's
responses sit on the partition number of its requests). `--partitions N` creates every missing topic the
service reads or writes (requests, responses, enriched, persisted, both path dead-letter topics, and, unless
`MESSAGE_HISTORY_COMMANDS_TOPIC` is empty, the commands, forgotten and commands dead-letter topics; unless
`MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC` is empty, Observational Memory's observe, observed and observed
dead-letter topics) with N
partitions; without it, nothing is created. One line per topic says whether it was created, existed or is
missing; the input topics' counts are compared, and the exit code is 1 when they differ (or when a topic
exists with another count than N). Existing topics are never altered: adding partitions moves threads
between partitions, see docs/operations.md section 2. Running it twice creates nothing the second time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from message_history.logs import scrub
from message_history.settings import Settings
from producers.connection import all_topic_partitions, kafka_options, topic_partitions

_TIMEOUT_MS = 30_000


def service_topics(settings: Settings) -> list[str]:
    """Every topic the service reads or writes, inputs first; the commands path's only when it runs."""
    topics = [
        settings.requests_topic,
        settings.responses_topic,
        settings.enriched_topic,
        settings.persisted_topic,
        settings.requests_dlq,
        settings.responses_dlq,
    ]
    if settings.commands_topic:  # empty = no commands path (service.selected_paths)
        topics += [settings.commands_topic, settings.forgotten_topic, settings.commands_dlq]
    if settings.observe_results_topic:  # empty = no observed path (Observational Memory's results)
        topics += [
            settings.observe_requests_topic,
            settings.observe_results_topic,
            settings.observe_results_dlq,
        ]
    return list(dict.fromkeys(topics))


@dataclass(frozen=True, slots=True)
class TopicsReport:
    """What `ensure_topics` found and did: partitions per topic (None = missing), created, problems."""

    counts: dict[str, int | None]
    created: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per topic: created, existed or missing, with its partition count."""
        return [f"{topic}: {_state(topic, count, self.created)}" for topic, count in self.counts.items()]


def _state(topic: str, count: int | None, created: list[str]) -> str:
    if count is None:
        return "missing"
    return f"{'created' if topic in created else 'exists'}, {count} partitions"


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


async def ensure_topics(settings: Settings, *, partitions: int | None, replication: int) -> TopicsReport:
    """The partition count per topic after creating the missing ones (when `partitions` is set)."""
    names = service_topics(settings)
    admin = AIOKafkaAdminClient(**kafka_options(settings, client_id="message-history-topics"))
    await admin.start()
    created: list[str] = []
    try:
        counts = await _counts(admin, names)
        missing = [name for name, count in counts.items() if count is None]
        if partitions is not None and missing:
            created = await _create(admin, missing, partitions, replication)
            counts = await _created(admin, names, missing)
    finally:
        await admin.close()
    inputs = (settings.requests_topic, settings.responses_topic)
    return TopicsReport(counts, created, verdict(counts, inputs, partitions))


async def _create(
    admin: AIOKafkaAdminClient, names: list[str], partitions: int, replication: int
) -> list[str]:
    """Create `names`; the ones this call created. One created meanwhile by someone else (a second `topics`
    job, a broker auto-creating it) is not an error: it existed."""
    response = await admin.create_topics(
        [NewTopic(name, partitions, replication) for name in names], timeout_ms=_TIMEOUT_MS
    )
    created: list[str] = []
    refused: list[tuple[int, str]] = []
    for topic, code, *rest in response.topic_errors:
        if code == 0:
            created.append(str(topic))
        elif code != TopicAlreadyExistsError.errno:
            reason = rest[0] if rest and rest[0] else for_code(code).__name__  # the broker says why, or not
            refused.append((code, f"{topic!r}: {reason}"))
    if refused:
        # every refusal at once, and what was created beside them (a second run creates only the rest)
        done = f" (created: {', '.join(map(repr, created))})" if created else ""
        raise for_code(refused[0][0])(f"create topic {'; '.join(r for _, r in refused)}{done}")
    return created


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
    found = topic_partitions(await admin.describe_topics(present) if present else [])
    return {name: len(found[name]) if name in found else None for name in names}


async def existing_partitions(
    settings: Settings, topics: Sequence[str], *, client_id: str
) -> dict[str, list[int]]:
    """Partitions of those of `topics` that exist (one metadata read, with an admin client of its own)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings, client_id=client_id))
    await admin.start()
    try:
        found = await all_topic_partitions(admin)
    finally:
        await admin.close()
    return {topic: sorted(found[topic]) for topic in topics if topic in found}


def main(*, partitions: int | None, replication: int) -> int:
    """Entry point of `message-history topics`; prints one line per topic, returns the exit code."""
    settings = Settings()
    try:
        report = asyncio.run(ensure_topics(settings, partitions=partitions, replication=replication))
    except (KafkaError, OSError) as exc:
        print(
            f"FAIL kafka {settings.kafka_bootstrap_servers}: {type(exc).__name__}: {scrub(str(exc))}",
            file=sys.stderr,
        )
        return 1
    for line in report.lines():
        print(line)
    for problem in report.problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1 if report.problems else 0
