"""The TypeScript worker reads enriched requests in every codec the service may write them in.

`MESSAGE_HISTORY_OUTPUT_COMPRESSION` (`none`, `gzip`, `snappy`, `lz4`, `zstd`) compresses every record the
service produces, the enriched requests included. Each request here is written by aiokafka (the service's
producer) in one codec; the package's test worker on its default client (@platformatic/kafka) must answer
every one. KafkaJS 2.2.4 reads only gzip without extra codecs (docs/events.md), so its case covers gzip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MakeTopic
from tests.infra import unique_name
from tests.integration.service_harness import encoded, fresh_settings, values
from tests.integration.stream_helpers import produce, read_all
from tests.interop.test_worker_ts import _enriched, node, node_worker  # noqa: F401 -- `node`: the fixture

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize(
    ("client", "codec"),
    [
        ("platformatic", "gzip"),
        ("platformatic", "snappy"),
        ("platformatic", "lz4"),
        ("platformatic", "zstd"),
        ("kafkajs", "gzip"),
    ],
)
async def test_the_worker_answers_requests_in_each_output_codec(
    node: str,  # noqa: F811 -- the fixture
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    client: str,
    codec: str,
) -> None:
    run = unique_name("")
    settings = fresh_settings(
        kafka_bootstrap, "mongodb://unused", enriched_topic=f"en-{run}", responses_topic=f"rs-{run}"
    )
    for name in (settings.enriched_topic, settings.responses_topic):
        await make_topic(partitions=1, name=name)
    rids = [f"t:{codec}:{n}" for n in range(5)]
    await produce(
        kafka_bootstrap,
        settings.enriched_topic,
        [encoded(_enriched("t", rid, f"hello in {codec}")) for rid in rids],
        compression_type=codec,
    )
    async with node_worker(node, settings, tmp_path / "worker.log", KAFKA_CLIENT=client) as worker:
        await worker.wait_for("every request answered", lambda: len(worker.events("answered")) == len(rids))
        assert await worker.terminate() == 0, worker.tail()
    answered = [r["requestId"] for r in values(await read_all(kafka_bootstrap, settings.responses_topic))]
    assert answered == rids
