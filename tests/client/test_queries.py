"""The cluster queries over a small transport of the test's own that answers like a
broker and records how many requests are in flight at once. (tests/client/test_cluster.py
runs the same queries against the real broker, through Cluster.)"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any

from kio.schema.delete_records.v2 import response as delete_records
from kio.schema.fetch.v12 import response as fetch
from kio.schema.list_offsets.v7 import response as list_offsets
from kio.schema.metadata.v12 import response as metadata
from kio.static.primitive import i32, i64

from tierproxy.client.queries import ClusterQueries, ListedOffset, LogOffsets
from tierproxy.protocol.apis import ApiKey, ErrorCode, OffsetSpec
from tierproxy.protocol.requests import READ_COMMITTED, READ_UNCOMMITTED

TOPIC_ID = uuid.UUID(int=7)
EARLIEST, LATEST, STABLE = 10, 100, 90
REFUSED = ("secret", 0)  # a partition the broker refuses (no DESCRIBE)


class RecordingBroker:
    """`send` of a broker answering ListOffsets, Metadata, Fetch and DeleteRecords a
    round trip after each request; records what was sent and the most in flight."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def send(self, request: Any) -> Any:
        self.sent.append(request)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            for _ in range(3):  # a round trip: several turns of the event loop
                await asyncio.sleep(0)
            return self._answer(request)
        finally:
            self.in_flight -= 1

    def _answer(self, request: Any) -> Any:
        if request.__api_key__ == ApiKey.LIST_OFFSETS:
            return self._list_offsets(request)
        if request.__api_key__ == ApiKey.METADATA:
            return self._metadata(request)
        if request.__api_key__ == ApiKey.FETCH:
            return self._fetch(request)
        assert request.__api_key__ == ApiKey.DELETE_RECORDS
        return delete_records.DeleteRecordsResponse(throttle_time=datetime.timedelta(0), topics=tuple(
            delete_records.DeleteRecordsTopicResult(name=t.name, partitions=tuple(
                delete_records.DeleteRecordsPartitionResult(
                    partition_index=p.partition_index, low_watermark=i64(p.offset if p.offset < 1000 else -1),
                    error_code=ErrorCode.none if p.offset < 1000 else ErrorCode.offset_out_of_range)
                for p in t.partitions))
            for t in request.topics))

    @staticmethod
    def _list_offsets(request: Any) -> Any:
        def partition(topic: str, p: Any) -> Any:
            if (topic, p.partition_index) == REFUSED:
                return list_offsets.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=ErrorCode.topic_authorization_failed)
            if p.timestamp == OffsetSpec.EARLIEST:
                offset = EARLIEST
            else:
                offset = STABLE if request.isolation_level == READ_COMMITTED else LATEST
            return list_offsets.ListOffsetsPartitionResponse(
                partition_index=p.partition_index, error_code=ErrorCode.none, timestamp=i64(-1), offset=i64(offset),
                leader_epoch=i32(3))

        return list_offsets.ListOffsetsResponse(throttle_time=datetime.timedelta(0), topics=tuple(
            list_offsets.ListOffsetsTopicResponse(name=t.name, partitions=tuple(partition(t.name, p)
                                                                                for p in t.partitions))
            for t in request.topics))

    @staticmethod
    def _metadata(request: Any) -> Any:
        def topic(name: str) -> Any:
            if name == "t":
                return metadata.MetadataResponseTopic(
                    error_code=ErrorCode.none, name=name, topic_id=TOPIC_ID, partitions=(
                        metadata.MetadataResponsePartition(error_code=ErrorCode.none, partition_index=i32(0),
                                                           leader_id=i32(2), leader_epoch=i32(5)),))
            code = ErrorCode.topic_authorization_failed if name == "secret" else ErrorCode.unknown_topic_or_partition
            return metadata.MetadataResponseTopic(error_code=code, name=name, topic_id=None, partitions=())

        return metadata.MetadataResponse(
            throttle_time=datetime.timedelta(0), topics=tuple(topic(t.name) for t in request.topics),
            brokers=(metadata.MetadataResponseBroker(node_id=i32(2), host="broker-2", port=i32(9092)),))

    @staticmethod
    def _fetch(request: Any) -> Any:
        (topic,) = request.topics
        (partition,) = topic.partitions
        aborted = (fetch.AbortedTransaction(producer_id=i64(4), first_offset=i64(partition.fetch_offset + 1)),)
        return fetch.FetchResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, responses=(
            fetch.FetchableTopicResponse(topic=topic.topic, partitions=(fetch.PartitionData(
                partition_index=partition.partition, error_code=ErrorCode.none, high_watermark=i64(LATEST),
                aborted_transactions=aborted if request.isolation_level == READ_COMMITTED else None,
                records=None),)),))


async def test_log_offsets_asks_all_three_in_one_round_trip():
    broker = RecordingBroker()
    answers = await ClusterQueries(broker.send).log_offsets({"t": [0, 1], "secret": [0]}, READ_COMMITTED)
    assert len(broker.sent) == 3
    assert broker.most_in_flight == 3  # not one after the other
    assert sorted((r.isolation_level, r.topics[0].partitions[0].timestamp) for r in broker.sent) == [
        (READ_UNCOMMITTED, OffsetSpec.EARLIEST), (READ_UNCOMMITTED, OffsetSpec.LATEST),
        (READ_COMMITTED, OffsetSpec.LATEST)]
    assert answers == {
        ("t", 0): LogOffsets(EARLIEST, LATEST, STABLE),
        ("t", 1): LogOffsets(EARLIEST, LATEST, STABLE),
        REFUSED: ErrorCode.topic_authorization_failed,
    }


async def test_log_offsets_read_uncommitted_needs_two_requests():
    broker = RecordingBroker()
    answers = await ClusterQueries(broker.send).log_offsets({"t": [0]})
    assert len(broker.sent) == 2 and broker.most_in_flight == 2
    assert answers == {("t", 0): LogOffsets(EARLIEST, LATEST, LATEST)}


async def test_list_offsets_by_spec():
    broker = RecordingBroker()
    answers = await ClusterQueries(broker.send).list_offsets({"t": [0], "secret": [0]}, OffsetSpec.EARLIEST)
    assert answers == {("t", 0): ListedOffset(EARLIEST, -1, 3), REFUSED: ErrorCode.topic_authorization_failed}


async def test_metadata_and_topic_ids_leave_out_what_the_broker_refuses():
    broker = RecordingBroker()
    queries = ClusterQueries(broker.send)
    answer = await queries.metadata(["t", "secret", "gone"])
    assert answer.brokers == {2: ("broker-2", 9092)}
    assert answer.topics["t"].topic_id == TOPIC_ID and answer.topics["t"].partitions[0].leader == 2
    assert answer.errors == {"secret": ErrorCode.topic_authorization_failed,
                             "gone": ErrorCode.unknown_topic_or_partition}
    assert await queries.topic_ids({"t", "secret", "gone"}) == {"t": TOPIC_ID}
    assert broker.sent[-1].allow_auto_topic_creation is False


async def test_aborted_transactions_come_from_a_read_committed_fetch():
    broker = RecordingBroker()
    assert await ClusterQueries(broker.send).aborted_transactions("t", 0, 50) == [(4, 51)]
    (request,) = broker.sent
    assert request.isolation_level == READ_COMMITTED
    assert request.topics[0].partitions[0].fetch_offset == 50
    assert request.max_wait == datetime.timedelta(0) and request.min_bytes == 0


async def test_delete_records_gives_low_watermarks_or_errors():
    broker = RecordingBroker()
    answers = await ClusterQueries(broker.send).delete_records({"t": [(0, 40), (1, 5000)]}, 1000)
    assert answers == {("t", 0): 40, ("t", 1): ErrorCode.offset_out_of_range}
