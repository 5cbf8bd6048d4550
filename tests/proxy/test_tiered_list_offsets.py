"""ListOffsets through the proxy over a log whose oldest part is remote only: EARLIEST is
the remote log start, LATEST the broker's, times inside the remote part are answered
from the remote time indexes, -4 is the broker's local log start and -5 the highest
remote offset; through aiokafka, confluent-kafka, Kafka's GetOffsetShell and raw
ListOffsets requests of several versions."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as ConfluentPartition
from kio.schema.list_offsets.v7 import request as v7
from kio.schema.list_offsets.v8 import request as v8
from kio.schema.list_offsets.v9 import request as v9
from kio.static.primitive import i8, i32, i64

from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.client.connection import KafkaConnection
from tierproxy.config.addresses import parse_host_port
from tests.helpers.fixtures import proxy_fixture
from tests.helpers.tiered import TieredTopic, TWO_TIMED_PARTITIONS

PARTITIONS = TWO_TIMED_PARTITIONS.partitions
PER_PARTITION = TWO_TIMED_PARTITIONS.produce.per_partition
# Partition 1 has one record early in its remote part with a timestamp beyond every other:
# its MAX_TIMESTAMP answer must come from the remote tier.
((_, _, OUTLIER_SHIFT_MS),) = TWO_TIMED_PARTITIONS.produce.outliers
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tiered(kafka_cluster, tiered_topics) -> TieredTopic:
    data = tiered_topics(TWO_TIMED_PARTITIONS, kafka_cluster)
    assert all(0 < data.boundary[p] < PER_PARTITION for p in range(PARTITIONS))
    # Timestamps grow with the offset (but for the outlier), the premise of the answers below.
    base = data.of(0)[0].timestamp_ms
    for partition in range(PARTITIONS):
        times = [r.timestamp_ms for r in data.of(partition) if r.timestamp_ms < base + OUTLIER_SHIFT_MS]
        assert times == sorted(times)
    return data


proxy = proxy_fixture()


def _first_at_or_after(records, timestamp):
    return min((r for r in records if r.timestamp_ms >= timestamp), key=lambda r: r.offset)


async def test_aiokafka_offsets(proxy, tiered):
    data = tiered
    consumer = AIOKafkaConsumer(bootstrap_servers=proxy.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(data.topic, p) for p in range(PARTITIONS)]
        assert await consumer.beginning_offsets(tps) == {tp: 0 for tp in tps}
        assert await consumer.end_offsets(tps) == {tp: PER_PARTITION for tp in tps}
        p0 = data.of(0)
        remote_target = p0[data.boundary[0] // 2]
        local_target = p0[data.boundary[0] + (PER_PARTITION - data.boundary[0]) // 2]
        for target in (remote_target, local_target):
            # Between two records: the answer is the first one at or after the time.
            found = await consumer.offsets_for_times({tps[0]: target.timestamp_ms - 5})
            assert found[tps[0]].offset == target.offset
            assert found[tps[0]].timestamp == target.timestamp_ms
        assert remote_target.offset < data.boundary[0] <= local_target.offset
        beyond = await consumer.offsets_for_times({tps[0]: p0[-1].timestamp_ms + 1})
        assert beyond[tps[0]] is None
    finally:
        await consumer.stop()


def test_confluent_offsets(proxy, tiered):
    data = tiered
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}"})
    try:
        for partition in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(ConfluentPartition(data.topic, partition), timeout=30)
            assert (low, high) == (0, PER_PARTITION)
        p0 = data.of(0)
        targets = [p0[10], p0[data.boundary[0] - 1], p0[data.boundary[0]], p0[-3]]
        for target in targets:  # one time per partition and call
            (answered,) = consumer.offsets_for_times([ConfluentPartition(data.topic, 0, target.timestamp_ms - 3)],
                                                     timeout=30)
            assert (answered.error, answered.offset) == (None, target.offset)
    finally:
        consumer.close()


def _get_offset_shell(kafka_cluster, bootstrap: str, topic: str, time_spec: str) -> dict[int, int]:
    result = kafka_cluster.java_tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", bootstrap,
                                     "--topic", topic, "--time", time_spec, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = {}
    for line in result.stdout.splitlines():
        name, partition, offset = line.rsplit(":", 2)
        assert name == topic
        out[int(partition)] = int(offset)
    return out


@pytest.mark.parametrize("spec", ["-2", "-1", "-4", "-5"])
def test_get_offset_shell(kafka_cluster, proxy, tiered, spec):
    data = tiered
    expected = {
        "-2": {p: 0 for p in range(PARTITIONS)},
        "-1": {p: PER_PARTITION for p in range(PARTITIONS)},
        "-4": dict(data.boundary),  # the broker's local log start: where it was trimmed
        "-5": {p: data.boundary[p] - 1 for p in range(PARTITIONS)},  # the highest remote offset
    }[spec]
    assert _get_offset_shell(kafka_cluster, proxy.bootstrap_servers, data.topic, spec) == expected


def _request(module, topic: str, specs: dict[int, int]):
    partitions = tuple(module.ListOffsetsPartition(partition_index=i32(p), timestamp=i64(t)) for p, t in specs.items())
    return module.ListOffsetsRequest(replica_id=i32(-1), isolation_level=i8(0),
                                     topics=(module.ListOffsetsTopic(name=topic, partitions=partitions),))


async def test_raw_list_offsets_versions(proxy, tiered):
    data = tiered
    async with await KafkaConnection.open(*parse_host_port(proxy.bootstrap_servers)) as conn:
        # v8 knows -4 but not -5: that partition alone gets UNSUPPORTED_VERSION.
        response = await conn.request(_request(v8, data.topic, {0: OffsetSpec.LATEST_TIERED_TIMESTAMP,
                                                                1: OffsetSpec.EARLIEST_LOCAL_TIMESTAMP}))
        answers = {p.partition_index: p for p in response.topics[0].partitions}
        assert answers[0].error_code == ErrorCode.unsupported_version
        assert (answers[1].error_code, answers[1].offset, answers[1].timestamp) == (ErrorCode.none,
                                                                                      data.boundary[1], -1)

        response = await conn.request(_request(v9, data.topic, {0: OffsetSpec.LATEST_TIERED_TIMESTAMP,
                                                                1: OffsetSpec.EARLIEST}))
        answers = {p.partition_index: p for p in response.topics[0].partitions}
        assert (answers[0].error_code, answers[0].offset) == (ErrorCode.none, data.boundary[0] - 1)
        assert (answers[1].error_code, answers[1].offset) == (ErrorCode.none, 0)
        assert answers[0].leader_epoch >= 0

        # v7: -4 is not known yet; MAX_TIMESTAMP over remote and local.
        response = await conn.request(_request(v7, data.topic, {0: OffsetSpec.EARLIEST_LOCAL_TIMESTAMP}))
        assert response.topics[0].partitions[0].error_code == ErrorCode.unsupported_version
        response = await conn.request(_request(v7, data.topic, {0: OffsetSpec.MAX_TIMESTAMP,
                                                                1: OffsetSpec.MAX_TIMESTAMP}))
        answers = {p.partition_index: p for p in response.topics[0].partitions}
        newest_local = data.of(0)[-1]  # timestamps grow: the last record of partition 0
        assert (answers[0].offset, answers[0].timestamp) == (newest_local.offset, newest_local.timestamp_ms)
        outlier = next(r for r in data.of(1) if r.timestamp_ms == max(r.timestamp_ms for r in data.of(1)))
        assert outlier.offset < data.boundary[1]  # in the remote part
        assert (answers[1].offset, answers[1].timestamp) == (outlier.offset, outlier.timestamp_ms)
