"""The remote path on the three-broker testbed cluster: a replication-3 topic whose six
partitions are led by different nodes, tiered and trimmed, read from offset 0 through
the proxy (one listener per node) by aiokafka and confluent-kafka."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tests.proxy.test_passthrough import ProxyThread, consume_aiokafka, consume_confluent, proxy_config
from tests.proxy.tiered_helpers import (
    TieredTopic,
    expected_by_partition,
    in_partition_order,
    local_proxy_settings,
    produce_timed,
    record_keys,
    tier_and_trim,
)

PARTITIONS = 6
PER_PARTITION = 500
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tiered(kafka_cluster_3, tmp_path_factory) -> Iterator[tuple[TieredTopic, Path]]:
    topic = f"three-{uuid.uuid4().hex[:8]}"
    kafka_cluster_3.create_topic(topic, partitions=PARTITIONS, replication=3)
    root = tmp_path_factory.mktemp("three")
    records = produce_timed({**kafka_cluster_3.client_config(), "acks": "all"}, topic, PARTITIONS, PER_PARTITION)

    async def build() -> TieredTopic:
        async with LocalRemoteStorageManager(root / "remote") as rsm, \
                FileRemoteLogMetadataManager(root / "metadata") as rlmm:
            return await tier_and_trim(kafka_cluster_3.bootstrap_servers, topic, records, rsm=rsm, rlmm=rlmm,
                                       work_dir=root / "work", segment_bytes=16 * 1024)

    data = asyncio.run(build())
    assert all(data.boundary[p] > 0 for p in range(PARTITIONS))
    yield data, root
    kafka_cluster_3.delete_topic(topic)


@pytest.fixture(scope="module")
def proxy(kafka_cluster_3, tiered) -> Iterator[ProxyThread]:
    _, root = tiered
    proxy = ProxyThread(proxy_config(kafka_cluster_3.bootstrap_servers, nodes=3,
                                     **local_proxy_settings(root))).start()
    yield proxy
    proxy.stop()


def test_partitions_are_led_by_different_nodes(tiered):
    data, _ = tiered
    assert len(set(data.leaders.values())) > 1, data.leaders


async def test_aiokafka_reads_every_record_once_in_order(proxy, tiered):
    data, _ = tiered
    consumed = await consume_aiokafka(proxy.bootstrap_servers, data.topic, len(data.records))
    assert in_partition_order(record_keys(consumed)) == expected_by_partition(data)
    assert proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": data.topic}) > 0
    # Clients reached every node through its own listener.
    for node in set(data.leaders.values()):
        assert proxy.metrics.value("tierproxy_connections_total", {"listener": f"node-{node}"}) >= 1


def test_confluent_kafka_reads_every_record_once_in_order(proxy, tiered):
    data, _ = tiered
    messages = consume_confluent(proxy.bootstrap_servers, data.topic, len(data.records))
    consumed = [(m.partition(), m.offset(), m.key(), m.value()) for m in messages]
    assert in_partition_order(consumed) == expected_by_partition(data)
