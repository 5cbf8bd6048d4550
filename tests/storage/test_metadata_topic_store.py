"""TopicRemoteLogMetadataManager against the real broker from testbed/."""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tierproxy.storage.errors import IllegalStateTransition, RemoteLogMetadataError
from tierproxy.storage.metadata.cache import RemoteLogMetadataCache
from tierproxy.storage.metadata.serde import MetadataDecodeError, encode_entry, serialize
from tierproxy.storage.metadata.topic_store import (
    COMMITTED_OFFSETS_FILE,
    TopicRemoteLogMetadataManager,
    decode_flat_file,
    encode_flat_file,
    flat_file_name,
    metadata_partition,
    topic_id_partition_of_file,
)
from tierproxy.storage.model import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.model import RemotePartitionDeleteMetadata, RemotePartitionDeleteState
from tests.helpers.metadata import segment

S = RemoteLogSegmentState


def state_of(rlmm, tps):
    return {tp: (rlmm.list_segments(tp), rlmm.partition_delete_state(tp), rlmm.log_end_offset(tp)) for tp in tps}


# Values computed by Kafka 4.3.1's RemoteLogMetadataTopicPartitioner (jshell).
@pytest.mark.parametrize("topic_id, partition, in_50, in_7", [
    ("01234567-89ab-cdef-0fed-cba987654321", 0, 11, 0),
    ("11234567-89ab-cdf0-0fed-cba987654320", 13, 22, 2),
    ("21234567-89ab-cdf1-0fed-cba98765431f", 26, 49, 3),
    ("31234567-89ab-cdf2-0fed-cba98765431e", 39, 24, 3),
])
def test_metadata_partition_is_kafkas(topic_id, partition, in_50, in_7):
    tp = TopicIdPartition(uuid.UUID(topic_id), "t", partition)
    assert metadata_partition(tp, 50) == in_50
    assert metadata_partition(tp, 7) == in_7


def cache_of(entries):
    cache = RemoteLogMetadataCache()
    for entry in entries:
        cache.restore(entry)
    return cache


def test_flat_file_round_trip():
    tp = TopicIdPartition(uuid.uuid4(), "a-b-c", 12)
    entries = [segment(tp, 0, 9), RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 3, 4)]
    data = encode_flat_file(cache_of(entries).partition_state(tp), 1234)
    assert data[0] == 1 and data[1:17] == tp.topic_id.bytes and int.from_bytes(data[17:25], "big") == 1234
    offset, state = decode_flat_file(data, tp)
    assert offset == 1234 and state.tp == tp
    restored = RemoteLogMetadataCache()
    restored.install(state)
    assert restored.snapshot(tp) == entries
    assert flat_file_name(tp) == f"a-b-c-12-{tp.topic_id.hex}.metadata"
    assert topic_id_partition_of_file(flat_file_name(tp)) == tp
    with pytest.raises(MetadataDecodeError):  # another partition's file
        decode_flat_file(data, TopicIdPartition(uuid.uuid4(), "a-b-c", 12))
    for broken in (data[:-1], data[:30] + bytes([data[30] ^ 1]) + data[31:], data + b"\0"):
        with pytest.raises(MetadataDecodeError):
            decode_flat_file(broken, tp)


def test_flat_files_of_the_earlier_format_still_load():
    """Magic 0 (seed 003): one length-prefixed record per live segment, then the delete state."""
    tp = TopicIdPartition(uuid.uuid4(), "orders", 2)
    entries = [segment(tp, 0, 9), segment(tp, 10, 19),
               RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 3, 4)]
    data = struct.pack(">b16sq", 0, tp.topic_id.bytes, 77) + b"".join(encode_entry(serialize(e)) for e in entries)
    offset, state = decode_flat_file(data, tp)
    restored = RemoteLogMetadataCache()
    restored.install(state)
    assert offset == 77 and restored.snapshot(tp) == entries


@pytest.fixture
def metadata_topic(kafka_cluster):
    name = f"rlmm-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        kafka_cluster.delete_topic(name)
    except Exception:  # noqa: BLE001 - a test that never created it
        pass


async def until(condition, timeout=20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_restart_reads_only_new_records_and_instances_converge(bootstrap_servers, metadata_topic, tmp_path):
    tps = [TopicIdPartition(uuid.uuid4(), "orders", p) for p in range(4)]
    kwargs = dict(topic=metadata_topic, num_partitions=3)
    segments = [segment(tp, i * 100, i * 100 + 99) for tp in tps for i in range(3)]
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "a", **kwargs) as a:
        for m in segments:
            await a.add_remote_log_segment_metadata(m)
            # Read-your-writes: the record came back through the topic before the call returned.
            assert a.list_segments(m.topic_id_partition)[-1] == m
            await a.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(m.segment_id, 3, S.COPY_SEGMENT_FINISHED, 0))
        with pytest.raises(IllegalStateTransition):
            await a.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(segments[0].segment_id, 3, S.DELETE_SEGMENT_FINISHED, 0))
        await a.put_partition_delete(
            RemotePartitionDeleteMetadata(tps[0], RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 5, 0))
        await a.record_truncation(tps[1], 150, leader_epoch=1)
        written = 2 * len(segments) + 2
        assert a.records_fetched == written
        expected = state_of(a, tps)
        assert a.segment_for(tps[1], 120, 0).end_offset == 149
    assert (tmp_path / "a" / COMMITTED_OFFSETS_FILE).exists()
    assert len(list((tmp_path / "a").glob("*.metadata"))) == len(tps)

    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "a", **kwargs) as a2, \
            TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "b", **kwargs) as b:
        for tp in tps:
            await a2.wait_until_ready(tp, timeout=20)
            await b.wait_until_ready(tp, timeout=20)
        assert a2.records_fetched == 0  # everything came from its flat files
        assert b.records_fetched == written  # a fresh directory reads the whole topic
        assert state_of(a2, tps) == expected
        assert state_of(b, tps) == expected

        extra = segment(tps[2], 300, 399)
        await b.add_remote_log_segment_metadata(extra)
        await until(lambda: a2.list_segments(tps[2])[-1:] == [extra])
        assert a2.records_fetched == 1
        await a2.update_remote_log_segment_metadata(
            RemoteLogSegmentMetadataUpdate(extra.segment_id, 4, S.COPY_SEGMENT_FINISHED, 0))
        await until(lambda: b.segment_for(tps[2], 350, 0) is not None)
        assert state_of(a2, tps) == state_of(b, tps)
        assert a2.log_end_offset(tps[2]) == 399


async def test_a_write_that_loses_a_race_is_reported(bootstrap_servers, metadata_topic, tmp_path):
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    kwargs = dict(topic=metadata_topic, num_partitions=1)
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "a", **kwargs) as a, \
            TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "b", **kwargs) as b:
        m = segment(tp, 0, 9)
        await a.add_remote_log_segment_metadata(m)
        await until(lambda: b.list_segments(tp) == [m])
        delete_a = RemoteLogSegmentMetadataUpdate(m.segment_id, 3, S.DELETE_SEGMENT_STARTED, 0)
        delete_b = RemoteLogSegmentMetadataUpdate(m.segment_id, 4, S.DELETE_SEGMENT_STARTED, 1)
        # Both may pass their local check; the topic orders them and the second one is refused
        # (by the local check, or when read back: the record was dropped by every reader).
        results = await asyncio.gather(a.update_remote_log_segment_metadata(delete_a),
                                       b.update_remote_log_segment_metadata(delete_b), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], RemoteLogMetadataError), results
        await until(lambda: a.list_segments(tp) == b.list_segments(tp))
        assert a.list_segments(tp)[0].state == S.DELETE_SEGMENT_STARTED


async def test_topic_is_created_like_kafkas(bootstrap_servers, metadata_topic, tmp_path):
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path, topic=metadata_topic):
        pass
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        [described] = await admin.describe_topics([metadata_topic])
        assert len(described["partitions"]) == 50
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, metadata_topic)])
        configs = {c[0]: c[1] for c in response.resources[0][4]}
        assert configs["retention.ms"] == "-1"
        assert configs["cleanup.policy"] == "delete"
    finally:
        await admin.close()
    # The partitioner depends on the count: another count is refused.
    with pytest.raises(RemoteLogMetadataError, match="50 partitions"):
        await TopicRemoteLogMetadataManager(
            bootstrap_servers, directory=tmp_path / "x", topic=metadata_topic, num_partitions=3).start()


async def test_a_read_only_instance_creates_nothing_and_writes_nothing(bootstrap_servers, metadata_topic, tmp_path):
    """The proxy's and status's instances: no CreateTopics, no producer, no write."""
    with pytest.raises(RemoteLogMetadataError, match="first `tierproxy tier` creates it"):
        async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "r0", topic=metadata_topic,
                                                 num_partitions=3, read_only=True):
            pass
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        assert metadata_topic not in await admin.list_topics()
    finally:
        await admin.close()

    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    kwargs = dict(topic=metadata_topic, num_partitions=3)
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "w", **kwargs) as writer, \
            TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "r", read_only=True,
                                          **kwargs) as reader:
        m = segment(tp, 0, 99)
        await writer.add_remote_log_segment_metadata(m)
        await until(lambda: reader.list_segments(tp) == [m])
        assert reader._producer is None
        with pytest.raises(RemoteLogMetadataError, match="read-only"):
            await reader.add_remote_log_segment_metadata(segment(tp, 100, 199))


async def test_a_flat_file_that_does_not_load_is_rebuilt_from_the_topic(bootstrap_servers, metadata_topic, tmp_path,
                                                                       caplog):
    tps = [TopicIdPartition(uuid.uuid4(), "orders", p) for p in range(4)]
    kwargs = dict(topic=metadata_topic, num_partitions=3)
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "a", **kwargs) as a:
        for tp in tps:
            for i in range(2):
                m = segment(tp, i * 100, i * 100 + 99)
                await a.add_remote_log_segment_metadata(m)
                await a.update_remote_log_segment_metadata(
                    RemoteLogSegmentMetadataUpdate(m.segment_id, 3, S.COPY_SEGMENT_FINISHED, 0))
        expected = state_of(a, tps)
    broken = tmp_path / "a" / flat_file_name(tps[0])
    data = broken.read_bytes()
    broken.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    damaged = metadata_partition(tps[0], 3)
    records_there = 4 * sum(metadata_partition(tp, 3) == damaged for tp in tps)

    async def started(directory):
        rlmm = TopicRemoteLogMetadataManager(bootstrap_servers, directory=directory, read_only=True, **kwargs)
        await rlmm.start()
        for tp in tps:
            await rlmm.wait_until_ready(tp, timeout=20)
        return rlmm

    again = await started(tmp_path / "a")
    try:
        assert "does not load" in caplog.text
        assert again.records_fetched == records_there  # only its metadata partition, from the beginning
        assert state_of(again, tps) == expected
    finally:
        await again.close()
    # Rewritten, like the files of a directory that read the whole topic at its first start.
    fresh = await started(tmp_path / "b")
    await fresh.close()
    for directory in (tmp_path / "a", tmp_path / "b"):
        third = await started(directory)
        try:
            assert third.records_fetched == 0
            assert state_of(third, tps) == expected
        finally:
            await third.close()


async def test_a_manager_for_some_partitions_reads_only_their_metadata_partition(bootstrap_servers, metadata_topic,
                                                                                 tmp_path):
    mine = TopicIdPartition(uuid.uuid4(), "orders", 0)
    others = []
    while len({metadata_partition(tp, 3) for tp in others} - {metadata_partition(mine, 3)}) < 1 or len(others) < 4:
        others.append(TopicIdPartition(uuid.uuid4(), "orders", len(others) + 1))
    tps = [mine, *others]
    kwargs = dict(topic=metadata_topic, num_partitions=3)
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "all", **kwargs) as writer:
        for tp in tps:
            m = segment(tp, 0, 99)
            await writer.add_remote_log_segment_metadata(m)
            await writer.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(m.segment_id, 3, S.COPY_SEGMENT_FINISHED, 0))
        expected = state_of(writer, tps)
    sharing = sum(metadata_partition(tp, 3) == metadata_partition(mine, 3) for tp in tps)
    async with TopicRemoteLogMetadataManager(bootstrap_servers, directory=tmp_path / "task", partitions=[mine],
                                             **kwargs) as task:
        await task.wait_until_ready(mine, timeout=20)
        assert task.records_fetched == 2 * sharing < 2 * len(tps)
        assert task.partitions() == [mine]
        assert state_of(task, [mine]) == {mine: expected[mine]}
        with pytest.raises(RemoteLogMetadataError, match="keeps only"):
            task.list_segments(others[0])
        m = segment(mine, 100, 199)
        await task.add_remote_log_segment_metadata(m)
        assert task.list_segments(mine)[-1] == m
