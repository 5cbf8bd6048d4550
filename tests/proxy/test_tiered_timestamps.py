"""ListOffsets by timestamp over remote data is exact, as Kafka's own answer: the first
record at or after the target with its own offset and timestamp, inside compressed
batches too (each codec) and on a LOG_APPEND_TIME topic. The broker is asked first,
while it still has every record; then the oldest part is tiered and trimmed, and the
proxy must give the very same answers."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest
from confluent_kafka import Producer

from tierproxy.client.cluster import Cluster
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tests.helpers.produce import produce_timed
from tests.helpers.proxy import running_proxy
from tests.helpers.tiered import local_store, tier_and_trim

PER_PARTITION = 1500
TARGETS = 60
pytestmark = pytest.mark.timeout(240)


def _produce_log_append_time(client_config: dict, topic: str) -> None:
    """Rounds of 100 lz4 records a few ms apart: batches with distinct append times."""
    producer = Producer({**client_config, "linger.ms": 2, "compression.type": "lz4", "enable.idempotence": True})
    for round_ in range(PER_PARTITION // 100):
        for i in range(100):
            producer.produce(topic, key=b"%d-%d" % (round_, i), value=bytes(100), partition=0)
        assert producer.flush(30) == 0
        time.sleep(0.005)


async def _answers(bootstrap: str, topic: str, targets: list[int]) -> list[tuple[int, int]]:
    """(offset, timestamp) of ListOffsets for each target timestamp, one request each."""
    async with Cluster(bootstrap.split(",")) as cluster:
        topics = await cluster.topics([topic])
        out = []
        for target in targets:
            listed = (await cluster.list_offsets(topics, [(topic, 0)], target))[(topic, 0)]
            out.append((listed.offset, listed.timestamp))
        return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd", "log-append-time"])
def test_timestamp_lookups_in_remote_batches_equal_the_brokers(kafka_cluster, tmp_path, codec):
    topic = f"times-{codec}-{uuid.uuid4().hex[:6]}"
    append_time = codec == "log-append-time"
    kafka_cluster.create_topic(topic, partitions=1,
                               config={"message.timestamp.type": "LogAppendTime"} if append_time else None)
    try:
        start = int(time.time() * 1000)
        if append_time:
            _produce_log_append_time(kafka_cluster.client_config(), topic)
            records = []  # the broker chose the timestamps
            first, last = start, int(time.time() * 1000)
        else:
            records = produce_timed(kafka_cluster.client_config(), topic, 1, PER_PARTITION, base_timestamp_ms=start,
                                    step_ms=3, compression=codec)
            first, last = start, start + 3 * PER_PARTITION
        rng = random.Random(codec)
        targets = sorted(rng.randint(first - 5, last) for _ in range(TARGETS))
        expected = asyncio.run(_answers(kafka_cluster.bootstrap_servers, topic, targets))

        async def build():
            async with LocalRemoteStorageManager(tmp_path / "remote") as rsm, \
                    FileRemoteLogMetadataManager(tmp_path / "metadata") as rlmm:
                return await tier_and_trim(kafka_cluster.bootstrap_servers, topic, records, rsm=rsm, rlmm=rlmm,
                                           work_dir=tmp_path / "work")

        boundary = asyncio.run(build()).boundary[0]
        remote = [answer for answer in expected if 0 <= answer[0] < boundary]
        assert len(remote) >= TARGETS // 3, (boundary, expected)  # most targets fall in the remote part

        with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **local_store(tmp_path)) as proxy:
            through_proxy = asyncio.run(_answers(proxy.bootstrap_servers, topic, targets))
        wrong = [(t, want, got) for t, want, got in zip(targets, expected, through_proxy) if want != got]
        print(f"{codec}: {len(wrong)} of {len(targets)} lookups differ from the broker's "
              f"({len(remote)} answered from the remote tier)")
        assert not wrong, wrong[:5]
    finally:
        kafka_cluster.delete_topic(topic)
