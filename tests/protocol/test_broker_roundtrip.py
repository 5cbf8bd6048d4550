"""protocol/ against the real broker: requests encoded by our codecs over a plain
socket, responses decoded by them, and the returned record batches walked."""

from __future__ import annotations

import datetime
import uuid
from collections import defaultdict

import pytest

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8, i32, i32Timedelta, i64
from tierproxy.protocol.apis import ApiKey, ErrorCode, OffsetSpec
from tierproxy.protocol.codecs import INTERCEPTED, request_schema
from tierproxy.protocol.records import Compression, ControlType, control_type, iter_batches
from tierproxy.client.connection import KafkaConnection
from tierproxy.protocol.requests import fetch_request
from tests.helpers.produce import produce_mixed

PARTITIONS = 3
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def produced_topic(kafka_cluster):
    """One topic with the mixed data set, shared by the tests of this module."""
    import asyncio

    name = f"roundtrip-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS)
    records = asyncio.run(produce_mixed(kafka_cluster.bootstrap_servers, name, PARTITIONS))
    yield name, records
    kafka_cluster.delete_topic(name)


async def _connect(kafka_cluster) -> KafkaConnection:
    _, host, port = kafka_cluster.brokers[0]
    return await KafkaConnection.open(host, port, client_id="roundtrip-test")


async def test_api_versions_lists_every_intercepted_api(kafka_cluster):
    async with await _connect(kafka_cluster) as conn:
        response = await conn.request(
            ApiVersionsRequest(client_software_name="tierproxy-test", client_software_version="0")
        )
    assert response.error_code == ErrorCode.none
    ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    for api_key, versions in INTERCEPTED.items():
        low, high = ranges[api_key]
        # The broker and kio overlap on every API the proxy decodes.
        assert low <= versions.stop - 1 and high >= versions.start, api_key.name


async def test_metadata_list_offsets_and_fetch(kafka_cluster, produced_topic):
    name, records = produced_topic
    async with await _connect(kafka_cluster) as conn:
        metadata = await conn.request(
            MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=name),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        (topic,) = metadata.topics
        assert topic.error_code == ErrorCode.none and topic.name == name
        assert isinstance(topic.topic_id, uuid.UUID)
        assert sorted(p.partition_index for p in topic.partitions) == list(range(PARTITIONS))
        assert {b.node_id for b in metadata.brokers} == {topic.partitions[0].leader_id}

        earliest = await _list_offsets(conn, name, OffsetSpec.EARLIEST)
        latest = await _list_offsets(conn, name, OffsetSpec.LATEST)
        assert earliest == {p: 0 for p in range(PARTITIONS)}

        by_partition = defaultdict(list)
        for record in records:
            by_partition[record.partition].append(record)
        for partition, expected in by_partition.items():
            # Every produced record is below the end, and the end is past the markers.
            assert latest[partition] > expected[-1].offset
            log = await _fetch_all(conn, name, partition, latest[partition])
            _check_log(log, expected, latest[partition])


async def test_fetch_with_topic_ids_matches_fetch_by_name(kafka_cluster, produced_topic):
    """The newest Fetch both sides know (topic ids, v13+) returns the same bytes as v12."""
    name, _ = produced_topic
    async with await _connect(kafka_cluster) as conn:
        versions = await conn.request(ApiVersionsRequest(client_software_name="t", client_software_version="0"))
        broker_max = next(k.max_version for k in versions.api_keys if k.api_key == ApiKey.FETCH)
        version = min(broker_max, INTERCEPTED[ApiKey.FETCH].stop - 1)
        assert version >= 13
        metadata = await conn.request(
            MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=name),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        topic_id = metadata.topics[0].topic_id
        schema = request_schema(ApiKey.FETCH, version)
        module = __import__(schema.__module__, fromlist=["FetchTopic", "FetchPartition"])
        request = schema(
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)),
            min_bytes=i32(1),
            max_bytes=i32(1 << 20),
            topics=(
                module.FetchTopic(
                    topic_id=topic_id,
                    partitions=(module.FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),),
                ),
            ),
            forgotten_topics_data=(),
        )
        by_id = await conn.request(request)
        (topic,) = by_id.responses
        assert topic.topic_id == topic_id
        (partition,) = topic.partitions
        assert partition.error_code == ErrorCode.none
        by_name = await _fetch(conn, name, 0, 0)
        assert partition.records == by_name.records


async def test_fetch_below_log_start_is_offset_out_of_range(kafka_cluster, produced_topic):
    name, _ = produced_topic
    async with await _connect(kafka_cluster) as conn:
        latest = await _list_offsets(conn, name, OffsetSpec.LATEST)
        beyond = await _fetch(conn, name, 0, latest[0] + 1000)
        assert beyond.error_code == ErrorCode.offset_out_of_range


async def _list_offsets(conn, topic: str, spec: int) -> dict[int, int]:
    response = await conn.request(
        list_offsets7.ListOffsetsRequest(
            replica_id=i32(-1),
            isolation_level=i8(0),
            topics=(
                list_offsets7.ListOffsetsTopic(
                    name=topic,
                    partitions=tuple(
                        list_offsets7.ListOffsetsPartition(partition_index=i32(p), timestamp=i64(spec))
                        for p in range(PARTITIONS)
                    ),
                ),
            ),
        )
    )
    (topic_response,) = response.topics
    assert all(p.error_code == ErrorCode.none for p in topic_response.partitions)
    return {p.partition_index: p.offset for p in topic_response.partitions}


async def _fetch(conn, topic: str, partition: int, offset: int, max_bytes: int = 64 * 1024):
    # READ_UNCOMMITTED: aborted data and markers included.
    response = await conn.request(fetch_request(topic, partition, offset, max_bytes))
    (topic_response,) = response.responses
    (partition_response,) = topic_response.partitions
    return partition_response


async def _fetch_all(conn, topic: str, partition: int, end_offset: int) -> bytes:
    """Whole batches from offset 0 to the end, fetched in small steps so responses
    end in partial batches that the walker must drop."""
    log = bytearray()
    offset = 0
    while offset < end_offset:
        response = await _fetch(conn, topic, partition, offset, max_bytes=8 * 1024)
        assert response.error_code == ErrorCode.none
        records = response.records or b""
        whole = list(iter_batches(records))
        assert whole, f"no whole batch at offset {offset}"
        log += records[: whole[-1].end_position]
        offset = whole[-1].next_offset
    return bytes(log)


def _check_log(log: bytes, expected, end_offset: int) -> None:
    batches = list(iter_batches(log, verify_crc=True))
    # Offsets are contiguous from 0 to the end: records and markers use every offset.
    assert batches[0].base_offset == 0 and batches[-1].next_offset == end_offset
    for previous, current in zip(batches, batches[1:]):
        assert current.base_offset == previous.next_offset
    # Every produced record sits in a batch of its own codec and transactional kind.
    batch_of = {}
    for header in batches:
        for offset in range(header.base_offset, header.next_offset):
            batch_of[offset] = header
    codec_of_source = {
        "aiokafka-none": Compression.NONE, "aiokafka-gzip": Compression.GZIP,
        "aiokafka-snappy": Compression.SNAPPY, "aiokafka-lz4": Compression.LZ4,
        "aiokafka-zstd": Compression.ZSTD,
    }
    for record in expected:
        header = batch_of[record.offset]
        assert not header.is_control
        if record.source.startswith("librdkafka-txn"):
            assert header.is_transactional and header.compression is Compression.LZ4
        else:
            assert not header.is_transactional and header.compression is codec_of_source[record.source]
    # One COMMIT and one ABORT marker per partition, after their transaction's records.
    markers = [(h.base_offset, control_type(log, h)) for h in batches if h.is_control]
    assert [m for _, m in markers] == [ControlType.COMMIT, ControlType.ABORT]
    committed = [r.offset for r in expected if r.source == "librdkafka-txn-commit"]
    aborted = [r.offset for r in expected if r.source == "librdkafka-txn-abort"]
    assert max(committed) < markers[0][0] < min(aborted) < max(aborted) < markers[1][0]
    # Data batches hold exactly the produced records (no more, no fewer).
    data_offsets = {o for h in batches if not h.is_control for o in range(h.base_offset, h.next_offset)}
    assert data_offsets == {r.offset for r in expected}
