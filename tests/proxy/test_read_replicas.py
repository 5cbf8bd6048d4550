"""Which origin partition serves a read replica partition, without a broker: a small
remote log metadata manager whose load the test completes, behind the same interface.
(The whole replica against real clusters: tests/pipeline/test_read_replica.py.)"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from kio.schema.list_offsets.v9 import response as list_offsets9
from kio.schema.offset_for_leader_epoch.v4 import request as epoch4_request
from kio.schema.offset_for_leader_epoch.v4 import response as epoch4_response
from kio.static.primitive import i32, i64
from prometheus_client import CollectorRegistry

from tierproxy.config import parse
from tierproxy.protocol.apis import ApiKey, ErrorCode, OffsetSpec
from tierproxy.protocol.codecs import encode_payload, encode_request
from tierproxy.protocol.headers import peek_request_header
from tierproxy.protocol.requests import list_offsets_request
from tierproxy.proxy.filters import ClientRequest, ConnectionContext, FilterChains, ProxyServices, run_chain
from tierproxy.proxy.filters.list_offsets import ListOffsetsFilter
from tierproxy.proxy.filters.offset_for_leader_epoch import OffsetForLeaderEpochFilter
from tierproxy.proxy.filters.replica import ReadReplicas
from tierproxy.proxy.tiered import RemoteTier
from tierproxy.storage.errors import MetadataNotReady
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.serde import RemoteLogMetadata
from tierproxy.storage.model import (
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierproxy.storage.local import LocalRemoteStorageManager
from tests.helpers.metadata import segment

TOPIC = "orders"
ORIGIN_ID = uuid.uuid4()


class LoadingMetadata(RemoteLogMetadataManager):
    """Metadata that loads as the test says: `tier` adds a partition's finished segment,
    `loaded` says whether every partition is in. Counts the index builds (`partitions()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = False
        self.listed = 0

    def tier(self, tp: TopicIdPartition, start: int = 0, end: int = 9) -> None:
        metadata = segment(tp, start, end)
        self._cache.apply(metadata)
        self._cache.apply(RemoteLogSegmentMetadataUpdate(metadata.segment_id, 1,
                                                         RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0))

    def delete(self, tp: TopicIdPartition) -> None:
        self._cache.apply(RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1, 0))

    def partitions(self) -> list[TopicIdPartition]:
        self.listed += 1
        return super().partitions()

    def is_loaded(self) -> bool:
        return self.loaded

    def _is_ready(self, tp: TopicIdPartition) -> bool:
        return self.loaded

    async def _publish(self, record: RemoteLogMetadata) -> None:
        raise NotImplementedError

    async def start(self) -> None: ...

    async def wait_until_ready(self, tp: TopicIdPartition, timeout: float) -> None: ...

    async def close(self) -> None: ...


def origin(partition: int, topic_id: uuid.UUID = ORIGIN_ID) -> TopicIdPartition:
    return TopicIdPartition(topic_id, TOPIC, partition)


def test_while_the_metadata_loads_a_partition_it_does_not_know_yet_is_not_ready():
    """Not "nothing tiered": a replica partition would be answered empty, without an error."""
    rlmm = LoadingMetadata()
    replicas = ReadReplicas([TOPIC], rlmm)
    rlmm.tier(origin(0))
    assert replicas.origin_partition(TOPIC, 0) == origin(0)
    with pytest.raises(MetadataNotReady):
        replicas.origin_partition(TOPIC, 1)
    rlmm.tier(origin(1))
    rlmm.loaded = True
    assert replicas.origin_partition(TOPIC, 1) == origin(1)


def test_a_partition_the_loaded_metadata_does_not_name_is_not_ready():
    """Loaded, and still no partition 2 (or no topic at all: another bucket or prefix):
    REPLICA_NOT_AVAILABLE, never an empty log whose end, 0, a consumer would commit."""
    rlmm = LoadingMetadata()
    rlmm.loaded = True
    replicas = ReadReplicas([TOPIC, "other"], rlmm)
    rlmm.tier(origin(0))
    assert replicas.origin_partition(TOPIC, 0) == origin(0)
    for name, partition in ((TOPIC, 2), ("other", 0)):
        with pytest.raises(MetadataNotReady, match=f"names no partition {partition} of {name}"):
            replicas.origin_partition(name, partition)
        assert replicas.named_partition(name, partition) is None


def test_the_index_is_rebuilt_when_the_partitions_change_and_only_then():
    rlmm = LoadingMetadata()
    rlmm.loaded = True
    replicas = ReadReplicas([TOPIC], rlmm)
    rlmm.tier(origin(0))
    for _ in range(3):
        assert replicas.origin_partition(TOPIC, 0) == origin(0)
        assert replicas.named_partition(TOPIC, 1) is None
    assert rlmm.listed == 1
    rlmm.tier(origin(0), 10, 19)  # a segment of a known partition changes no partition
    assert replicas.named_partition(TOPIC, 1) is None
    assert rlmm.listed == 1
    rlmm.tier(origin(1))  # seen at once, not after an index's age
    assert replicas.origin_partition(TOPIC, 1) == origin(1)
    assert rlmm.listed == 2


def test_a_topic_deleted_and_created_again_at_the_origin_is_served_from_its_new_id():
    rlmm = LoadingMetadata()
    rlmm.loaded = True
    replicas = ReadReplicas([TOPIC], rlmm)
    old, new = origin(0), origin(0, uuid.uuid4())
    rlmm.tier(old)
    assert replicas.origin_partition(TOPIC, 0) == old
    rlmm.tier(new)
    rlmm.delete(old)
    assert replicas.origin_partition(TOPIC, 0) == new


def test_a_manager_that_reads_its_store_again_from_scratch_shows_a_new_version():
    rlmm = LoadingMetadata()
    rlmm.loaded = True
    replicas = ReadReplicas([TOPIC], rlmm)
    rlmm.tier(origin(0))
    assert replicas.origin_partition(TOPIC, 0) == origin(0)
    fresh = LoadingMetadata()
    fresh.tier(origin(0, uuid.uuid4()))
    rlmm._cache = fresh._cache  # as a bucket read from its first object does
    assert replicas.origin_partition(TOPIC, 0) == fresh.partitions()[0]


async def test_list_offsets_of_a_replica_partition_still_loading_is_replica_not_available(tmp_path):
    """The retriable error the proxy answers for metadata not loaded yet, as for any remote
    partition; once loaded, the remote log's end."""
    rlmm = LoadingMetadata()
    config = parse({"bootstrap.servers": "127.0.0.1:9092", f"topic.{TOPIC}.remote.log.read.replica": "true"})
    tier = RemoteTier(config, rsm=LocalRemoteStorageManager(tmp_path), rlmm=rlmm, registry=CollectorRegistry())
    filters = FilterChains([ListOffsetsFilter(tier)])

    async def forward(frame_body: Any) -> memoryview:  # the replica cluster's empty topic
        return memoryview(encode_payload(list_offsets9.ListOffsetsResponse(
            throttle_time=datetime.timedelta(0), topics=(list_offsets9.ListOffsetsTopicResponse(name=TOPIC, partitions=(
                list_offsets9.ListOffsetsPartitionResponse(partition_index=i32(1), error_code=ErrorCode.none,
                                                           timestamp=i64(-1), offset=i64(0), leader_epoch=i32(0)),)),))))

    services = ProxyServices(config=config, metrics=None, nodes=None, filters=filters)  # type: ignore[arg-type]
    ctx = ConnectionContext(peer="127.0.0.1:5000", node_id=None, broker=("broker", 9092), services=services,
                            forward=forward)

    async def latest() -> tuple[int, int]:
        body = memoryview(encode_request(list_offsets_request({TOPIC: [1]}, OffsetSpec.LATEST), 7, "client"))
        response = await run_chain(filters.chain(ApiKey.LIST_OFFSETS, 9), ctx,
                                   ClientRequest(peek_request_header(body), body))
        (answer,) = response.body.topics[0].partitions
        return answer.error_code, answer.offset

    try:
        rlmm.tier(origin(0))
        assert (await latest())[0] == ErrorCode.replica_not_available
        rlmm.loaded = True  # loaded, without partition 1: not the empty topic's 0
        assert (await latest())[0] == ErrorCode.replica_not_available
        rlmm.tier(origin(1))
        assert await latest() == (ErrorCode.none, 10)
    finally:
        await tier.engine.close()


async def test_offset_for_leader_epoch_of_a_replica_partition_still_loading_is_replica_not_available(tmp_path):
    """Not the empty topic's end offset (a consumer would see truncation and reset): the
    retriable error while the origin's partition is not known yet; once loaded, the end
    offset of the asked epoch in the remote log."""
    rlmm = LoadingMetadata()
    config = parse({"bootstrap.servers": "127.0.0.1:9092", f"topic.{TOPIC}.remote.log.read.replica": "true"})
    tier = RemoteTier(config, rsm=LocalRemoteStorageManager(tmp_path), rlmm=rlmm, registry=CollectorRegistry())
    replicas = ReadReplicas.of(tier)
    filters = FilterChains([OffsetForLeaderEpochFilter(tier, replicas)])

    async def forward(frame_body: Any) -> memoryview:  # the replica cluster's empty topic
        return memoryview(encode_payload(epoch4_response.OffsetForLeaderEpochResponse(
            throttle_time=datetime.timedelta(0), topics=(epoch4_response.OffsetForLeaderTopicResult(
                topic=TOPIC, partitions=(epoch4_response.EpochEndOffset(
                    error_code=ErrorCode.none, partition=i32(1), leader_epoch=i32(0), end_offset=i64(0)),)),))))

    services = ProxyServices(config=config, metrics=None, nodes=None, filters=filters)  # type: ignore[arg-type]
    ctx = ConnectionContext(peer="127.0.0.1:5000", node_id=None, broker=("broker", 9092), services=services,
                            forward=forward)
    request = epoch4_request.OffsetForLeaderEpochRequest(
        replica_id=i32(-1), topics=(epoch4_request.OffsetForLeaderTopic(topic=TOPIC, partitions=(
            epoch4_request.OffsetForLeaderPartition(partition=i32(1), current_leader_epoch=i32(0),
                                                    leader_epoch=i32(0)),)),))

    async def end_of_epoch_0() -> tuple[int, int, int]:
        body = memoryview(encode_request(request, 7, "client"))
        response = await run_chain(filters.chain(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4), ctx,
                                   ClientRequest(peek_request_header(body), body))
        (answer,) = response.body.topics[0].partitions
        return answer.error_code, answer.leader_epoch, answer.end_offset

    try:
        rlmm.tier(origin(0))
        assert await end_of_epoch_0() == (ErrorCode.replica_not_available, -1, -1)
        rlmm.loaded = True  # loaded, without partition 1: no answer of an empty log
        assert await end_of_epoch_0() == (ErrorCode.replica_not_available, -1, -1)
        rlmm.tier(origin(1))
        assert await end_of_epoch_0() == (ErrorCode.none, 0, 10)
    finally:
        await tier.engine.close()
