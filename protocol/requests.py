"""The few requests tierproxy sends on its own behalf, built in one place.

Fixed versions that every Kafka 3.x and 4.x broker accepts: Metadata v12, ListOffsets
v7, Fetch v12 (topic names, not ids), DeleteRecords v2.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from kio.schema.delete_records.v2 import request as delete_records
from kio.schema.fetch.v12 import request as fetch
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


def milliseconds(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def metadata_request(names: Iterable[str] | None) -> MetadataRequest:
    """Metadata of the named topics, or of every topic when `names` is None; never creates one."""
    topics = None if names is None else tuple(MetadataRequestTopic(topic_id=None, name=TopicName(n)) for n in names)
    return MetadataRequest(topics=topics, allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def list_offsets_request(
    partitions: Mapping[str, Iterable[int]], timestamp: int, isolation_level: int = READ_UNCOMMITTED
) -> list_offsets.ListOffsetsRequest:
    """One timestamp (or special offset spec) for every listed partition."""
    return list_offsets.ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(isolation_level),
        topics=tuple(
            list_offsets.ListOffsetsTopic(
                name=TopicName(name),
                partitions=tuple(
                    list_offsets.ListOffsetsPartition(partition_index=i32(p), timestamp=i64(timestamp)) for p in ps
                ),
            )
            for name, ps in partitions.items()
        ),
    )


def fetch_request(
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int,
    *,
    isolation_level: int = READ_UNCOMMITTED,
    max_wait_ms: int = 100,
    min_bytes: int = 1,
) -> fetch.FetchRequest:
    """A sessionless fetch of one partition."""
    return fetch.FetchRequest(
        max_wait=milliseconds(max_wait_ms),
        min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes),
        isolation_level=i8(isolation_level),
        topics=(
            fetch.FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    fetch.FetchPartition(
                        partition=i32(partition), fetch_offset=i64(offset), partition_max_bytes=i32(max_bytes)
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def delete_records_request(
    offsets: Mapping[str, Iterable[tuple[int, int]]], timeout_ms: int
) -> delete_records.DeleteRecordsRequest:
    """Advance each (partition, offset)'s log start offset to that offset."""
    return delete_records.DeleteRecordsRequest(
        topics=tuple(
            delete_records.DeleteRecordsTopic(
                name=TopicName(name),
                partitions=tuple(
                    delete_records.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o)) for p, o in ps
                ),
            )
            for name, ps in offsets.items()
        ),
        timeout=milliseconds(timeout_ms),
    )
