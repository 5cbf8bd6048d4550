"""The remote path on the three-broker testbed cluster: a replication-3 topic whose six
partitions are led by different nodes, tiered and trimmed, read from offset 0 through
the proxy (one listener per node) by aiokafka and confluent-kafka."""

from __future__ import annotations

import pytest

from tests.helpers.consume import confluent_key, consume_aiokafka, consume_confluent, expected_by_partition
from tests.helpers.consume import in_partition_order, record_keys
from tests.helpers.fixtures import proxy_fixture, tiered_fixture
from tests.helpers.tiered import Timed, TopicSpec

PARTITIONS = 6
PER_PARTITION = 500
SPEC = TopicSpec(Timed(PER_PARTITION), partitions=PARTITIONS, replication=3, segment_bytes=16 * 1024)
pytestmark = pytest.mark.timeout(240)


tiered = tiered_fixture(SPEC, cluster="kafka_cluster_3")
proxy = proxy_fixture()  # a listener per node


def test_partitions_are_led_by_different_nodes(tiered):
    data = tiered
    assert len(set(data.leaders.values())) > 1, data.leaders


async def test_aiokafka_reads_every_record_once_in_order(proxy, tiered):
    data = tiered
    consumed = await consume_aiokafka(proxy.bootstrap_servers, data.topic, len(data.records))
    assert in_partition_order(record_keys(consumed)) == expected_by_partition(data.records)
    assert proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": data.topic}) > 0
    # Clients reached every node through its own listener.
    for node in set(data.leaders.values()):
        assert proxy.metrics.value("tierproxy_connections_total", {"listener": f"node-{node}"}) >= 1


def test_confluent_kafka_reads_every_record_once_in_order(proxy, tiered):
    data = tiered
    messages = consume_confluent(proxy.bootstrap_servers, data.topic, len(data.records))
    consumed = [confluent_key(m) for m in messages]
    assert in_partition_order(consumed) == expected_by_partition(data.records)
