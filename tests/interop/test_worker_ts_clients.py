"""The Kafka client adapters of the TypeScript worker package on the real broker (worker-ts/bench/clients.mjs
sends through the package's own `kafkajsClient` and `platformaticClient`, as the worker does).

The worker's responses must land where the service's Python producer (aiokafka's default partitioner:
Java's murmur2) puts the same key: the service's turn barrier and the read-back assume a thread's records
share a partition number across the topics. Both clients the package weighed write keyed records; each must
sit on the partition aiokafka picks. @platformatic/kafka needs its `compatibilityPartitioner` for that (its
default hashes differently); KafkaJS' `DefaultPartitioner` is Java's."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter

import pytest
from aiokafka.partitioner import DefaultPartitioner

from tests.conftest import MakeTopic
from tests.integration.stream_helpers import read_all
from tests.interop.node22 import PACKAGE, build_package, node22

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 6
KEYS = 2000


async def test_both_clients_put_each_key_where_the_services_producer_does(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    node = node22()
    if not (PACKAGE / "node_modules" / "@platformatic" / "kafka").is_dir():
        pytest.fail("worker-ts/node_modules/@platformatic/kafka is missing (stack install --all)")
    await asyncio.to_thread(build_package, node)
    topic = await make_topic(partitions=PARTITIONS)
    done = await asyncio.to_thread(
        subprocess.run,
        [node, "bench/clients.mjs", "partitions", kafka_bootstrap.split(",")[0], topic, str(KEYS)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    produced = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["client"] for line in produced] == ["kafkajs", "@platformatic/kafka"]

    records = await read_all(kafka_bootstrap, topic, settle_s=0.5)
    assert len(records) == 2 * KEYS
    partitions = list(range(PARTITIONS))
    java = DefaultPartitioner()
    wrong = [(r.key, r.partition) for r in records if r.partition != java(r.key, partitions, partitions)]
    assert wrong == []
    # the keys spread (a partitioner sending everything to one partition would pass the check above trivially)
    assert len(Counter(r.partition for r in records)) == PARTITIONS
