"""The questions tierproxy asks a Kafka cluster, written once over any transport that
sends a kio request and returns the kio response (`Send`):

- `client.cluster.Cluster` asks each partition's leader over tierproxy's own
  connections (the pipeline, `tierproxy status`, the test helpers);
- the proxy asks on a client's own upstream connection, so that the broker checks the
  client's identity and ACLs (with correlation ids of the proxy's own).

Topic ids and leaders (Metadata), offsets by spec (ListOffsets), a partition's log
start offset, high watermark and last stable offset (the ListOffsets sent together:
pipelined on one connection, they cost one round trip), aborted transactions at an
offset (a READ_COMMITTED Fetch) and DeleteRecords. Request versions are those of
`protocol.requests`, which every Kafka 3.x and 4.x broker accepts.

A partition the broker answers with an error gets its ErrorCode in place of a value;
what to do with it is the caller's choice (Cluster raises ClusterError, the proxy
answers the client with the broker's refusal).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tierproxy.protocol.apis import ErrorCode, OffsetSpec, error_name
from tierproxy.protocol.requests import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    delete_records_request,
    fetch_request,
    list_offsets_request,
    metadata_request,
)

__all__ = [
    "ClusterError",
    "ClusterQueries",
    "ListedOffset",
    "LogOffsets",
    "Metadata",
    "PartitionInfo",
    "Send",
    "TopicInfo",
]

Send = Callable[[Any], Awaitable[Any]]
"""Send a kio request to a broker and return its kio response."""

TopicPartition = tuple[str, int]


class ClusterError(RuntimeError):
    """The broker answered with an error for a partition or topic."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionInfo]


@dataclass(frozen=True, slots=True)
class Metadata:
    """A Metadata answer: the brokers, the topics it described, and the error of each
    topic it did not."""

    brokers: dict[int, tuple[str, int]]
    topics: dict[str, TopicInfo]
    errors: dict[str, ErrorCode]


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class LogOffsets:
    """A partition's offsets as its leader reports them: its log start offset (for a
    broker whose old data went to the remote tier, the local log start), high
    watermark and last stable offset."""

    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


class ClusterQueries:
    """The queries, over one `send`."""

    __slots__ = ("send",)

    def __init__(self, send: Send) -> None:
        self.send = send

    async def metadata(self, names: Iterable[str] | None) -> Metadata:
        """Brokers and the named topics (every topic when `names` is None); never
        creates one."""
        response = await self.send(metadata_request(names))
        topics: dict[str, TopicInfo] = {}
        errors: dict[str, ErrorCode] = {}
        for topic in response.topics:
            if topic.error_code != ErrorCode.none:
                errors[topic.name] = ErrorCode(topic.error_code)
                continue
            topics[topic.name] = TopicInfo(
                topic.name,
                topic.topic_id,
                {p.partition_index: PartitionInfo(p.partition_index, p.leader_id, p.leader_epoch)
                 for p in topic.partitions},
            )
        return Metadata({b.node_id: (b.host, b.port) for b in response.brokers}, topics, errors)

    async def topic_ids(self, names: Iterable[str]) -> dict[str, uuid.UUID]:
        """Current ids of the named topics (a recreated topic has a new one); unknown
        and unauthorized topics are left out."""
        metadata = await self.metadata(sorted(names))
        return {name: topic.topic_id for name, topic in metadata.topics.items() if topic.topic_id is not None}

    async def list_offsets(
        self, partitions: Mapping[str, Iterable[int]], spec: int, isolation_level: int = READ_UNCOMMITTED
    ) -> dict[TopicPartition, ListedOffset | ErrorCode]:
        """One ListOffsets for every listed partition. With LATEST and READ_COMMITTED the
        answer is the last stable offset."""
        response = await self.send(list_offsets_request(partitions, spec, isolation_level))
        return {
            (topic.name, p.partition_index): (
                ListedOffset(p.offset, p.timestamp, p.leader_epoch) if p.error_code == ErrorCode.none
                else ErrorCode(p.error_code))
            for topic in response.topics
            for p in topic.partitions
        }

    async def log_offsets(
        self, partitions: Mapping[str, Iterable[int]], isolation_level: int = READ_UNCOMMITTED
    ) -> dict[TopicPartition, LogOffsets | ErrorCode]:
        """Log start offset, high watermark and, for READ_COMMITTED, last stable offset
        (else the high watermark again), or the first error the broker gave. The two or
        three ListOffsets go out together: one round trip, not one each."""
        partitions = {topic: list(indexes) for topic, indexes in partitions.items()}
        asked = [self.list_offsets(partitions, OffsetSpec.EARLIEST), self.list_offsets(partitions, OffsetSpec.LATEST)]
        if isolation_level == READ_COMMITTED:
            asked.append(self.list_offsets(partitions, OffsetSpec.LATEST, READ_COMMITTED))
        start, end, *stable = await asyncio.gather(*asked)
        last_stable = stable[0] if stable else end
        out: dict[TopicPartition, LogOffsets | ErrorCode] = {}
        for key, first in start.items():
            low, high, stable_end = first, end[key], last_stable[key]
            if isinstance(low, ErrorCode):
                out[key] = low
            elif isinstance(high, ErrorCode):
                out[key] = high
            elif isinstance(stable_end, ErrorCode):
                out[key] = stable_end
            else:
                out[key] = LogOffsets(low.offset, high.offset, stable_end.offset)
        return out

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, *,
        isolation_level: int = READ_UNCOMMITTED, max_wait_ms: int = 100, min_bytes: int = 1,
    ) -> Any:
        """One sessionless Fetch of one partition: the kio partition response, records as
        the broker sent them. ClusterError when the whole Fetch failed."""
        response = await self.send(fetch_request(topic, partition, offset, max_bytes, isolation_level=isolation_level,
                                                 max_wait_ms=max_wait_ms, min_bytes=min_bytes))
        if response.error_code != ErrorCode.none:
            raise ClusterError(f"Fetch {topic}-{partition}: {error_name(response.error_code)}", response.error_code)
        (partition_response,) = response.responses[0].partitions
        return partition_response

    async def aborted_transactions(self, topic: str, partition: int, offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a READ_COMMITTED fetch
        at `offset` lists: those whose ABORT marker lies beyond it."""
        answer = await self.fetch(topic, partition, offset, 1, isolation_level=READ_COMMITTED, max_wait_ms=0,
                                  min_bytes=0)
        return [(t.producer_id, t.first_offset) for t in answer.aborted_transactions or ()]

    async def delete_records(
        self, offsets: Mapping[str, Iterable[tuple[int, int]]], timeout_ms: int
    ) -> dict[TopicPartition, int | ErrorCode]:
        """DeleteRecords: advance each (partition, offset)'s log start offset to that
        offset. The new low watermark of each partition."""
        response = await self.send(delete_records_request(offsets, timeout_ms))
        return {
            (topic.name, p.partition_index): (
                p.low_watermark if p.error_code == ErrorCode.none else ErrorCode(p.error_code))
            for topic in response.topics
            for p in topic.partitions
        }
