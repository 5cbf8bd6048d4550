"""Building blocks of the end-to-end tests of the proxy's remote path: produce a known
data set, tier the oldest part of each partition into a remote tier and trim the
broker's log behind it, and consume it all back.

The cluster is reached through `client.cluster.Cluster` (each partition at its
leader), so the same helpers serve one broker, three brokers, and a SASL cluster
through its PLAINTEXT inter-broker listener. Every segment copied is remembered with
its local files, so a test can upload the very same segments again (moto forgets its
objects when it restarts).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tierproxy.client.cluster import Cluster, TopicInfo
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.storage.model import LogSegmentData, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.s3 import S3RemoteStorageManager
from testbed.s3 import S3Server
from tests.helpers.produce import ProducedRecord
from tests.helpers.remote_tier import tier_log

RAW_FETCH_BYTES = 1 << 20


@dataclass
class TieredTopic:
    """A topic whose oldest records are in the remote tier only."""

    topic: str
    topic_id: uuid.UUID
    records: list[ProducedRecord]  # by (partition, offset)
    #: partition -> the broker's local log start after the trim (0 where nothing was tiered)
    boundary: dict[int, int]
    #: every segment copied, with the local files it was copied from
    copies: list[tuple[RemoteLogSegmentMetadata, LogSegmentData]] = field(default_factory=list)
    #: partition -> the node leading it when the data was tiered
    leaders: dict[int, int] = field(default_factory=dict)

    def of(self, partition: int) -> list[ProducedRecord]:
        return [r for r in self.records if r.partition == partition]

    def remote(self, partition: int) -> list[ProducedRecord]:
        return [r for r in self.of(partition) if r.offset < self.boundary[partition]]

    def local(self, partition: int) -> list[ProducedRecord]:
        return [r for r in self.of(partition) if r.offset >= self.boundary[partition]]


class RecordingCopies:
    """The part of a RemoteStorageManager `tier_log` uses, remembering every copy."""

    def __init__(self, rsm: RemoteStorageManager) -> None:
        self.rsm = rsm
        self.copies: list[tuple[RemoteLogSegmentMetadata, LogSegmentData]] = []

    async def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, segment_data: LogSegmentData) -> None:
        await self.rsm.copy_log_segment_data(metadata, segment_data)
        self.copies.append((metadata, segment_data))


def produce_timed(
    client_config: dict[str, Any],
    topic: str,
    partitions: int,
    per_partition: int,
    *,
    value_size: int = 200,
    base_timestamp_ms: int | None = None,
    step_ms: int = 10,
    timestamps: dict[tuple[int, int], int] | None = None,
    compression: str = "none",
) -> list[ProducedRecord]:
    """`per_partition` uncompressed records per partition (librdkafka), with explicit
    CREATE_TIME timestamps `base + step * i`, increasing in every partition.
    `timestamps` overrides the timestamp of (partition, i), the i-th record produced to
    that partition. Uncompressed unless `compression` names a codec."""
    base = int(time.time() * 1000) if base_timestamp_ms is None else base_timestamp_ms
    # Idempotent: offsets follow the order of produce() calls, so timestamps grow with offsets.
    producer = Producer({**client_config, "linger.ms": 5, "compression.type": compression, "batch.size": 16384,
                         "enable.idempotence": True})
    produced: list[ProducedRecord] = []
    failures: list[Any] = []

    def delivered(err: Any, msg: Any, _timestamp: int) -> None:
        if err is not None:
            failures.append(err)
            return
        produced.append(ProducedRecord(msg.partition(), msg.offset(), msg.key(), msg.value(), (), _timestamp, True,
                                       "librdkafka"))

    for i in range(per_partition):
        for partition in range(partitions):
            key = f"{topic}-{partition}-{i}".encode()
            timestamp = (timestamps or {}).get((partition, i), base + step_ms * i)
            value = (key + b"|") * (value_size // (len(key) + 1) + 1)
            producer.produce(topic, key=key, value=value[:value_size], partition=partition, timestamp=timestamp,
                             on_delivery=lambda err, msg, _t=timestamp: delivered(err, msg, _t))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return sorted(produced, key=lambda r: (r.partition, r.offset))


async def raw_log(cluster: Cluster, topics: dict[str, TopicInfo], topic: str, partition: int, end: int) -> bytes:
    """The partition's record batches [0, end) from its leader, byte for byte."""
    log = bytearray()
    offset = 0
    while offset < end:
        answer = await cluster.fetch_raw(topics, topic, partition, offset, RAW_FETCH_BYTES)
        if answer.error_code != 0:
            raise RuntimeError(f"Fetch of {topic}-{partition} at {offset}: error {answer.error_code}")
        whole = [h for h in iter_batches(answer.records or b"") if h.base_offset < end]
        if not whole:
            raise RuntimeError(f"Fetch of {topic}-{partition} at {offset} returned no whole batch")
        log += (answer.records or b"")[whole[0].position:whole[-1].end_position]
        offset = whole[-1].next_offset
    return bytes(log)


async def tier_and_trim(
    bootstrap: str,
    topic: str,
    records: list[ProducedRecord],
    *,
    rsm: RemoteStorageManager,
    rlmm: Any,
    work_dir: Path,
    fraction: float = 0.6,
    partitions: Iterable[int] | None = None,
    segment_bytes: int = 32 * 1024,
) -> TieredTopic:
    """Tier the first `fraction` of each of `partitions` (default: all) on batch
    boundaries, then advance the broker's log start offset to each cut (DeleteRecords).

    `bootstrap` (comma-separated) must let tierproxy's own (PLAINTEXT, unauthenticated)
    connections in.
    """
    recorder = RecordingCopies(rsm)
    async with Cluster(bootstrap.split(",")) as cluster:
        topics = await cluster.topics([topic])
        info = topics[topic]
        chosen = sorted(info.partitions) if partitions is None else sorted(partitions)
        ends = await cluster.list_offsets(topics, [(topic, p) for p in chosen], OffsetSpec.LATEST)
        boundary = {p: 0 for p in info.partitions}
        for partition in chosen:
            end = ends[(topic, partition)].offset
            log = await raw_log(cluster, topics, topic, partition, end)
            cut = next(b for b in iter_batches(log) if b.base_offset >= end * fraction)
            boundary[partition] = cut.base_offset
            await tier_log(log[:cut.position], TopicIdPartition(info.topic_id, topic, partition), rsm=recorder,
                           rlmm=rlmm, work_dir=work_dir, segment_bytes=segment_bytes)
        wanted = {(topic, p): boundary[p] for p in chosen}
        trimmed = await cluster.delete_records(topics, wanted)
        assert trimmed == wanted, trimmed
    return TieredTopic(topic, info.topic_id, sorted(records, key=lambda r: (r.partition, r.offset)), boundary,
                       recorder.copies, {p: info.partitions[p].leader for p in info.partitions})


async def upload_again(rsm: RemoteStorageManager, copies: Iterable[tuple[RemoteLogSegmentMetadata, LogSegmentData]]
                       ) -> None:
    """Copy the same segments (same ids, same files) to the store once more."""
    for metadata, segment_data in copies:
        await rsm.copy_log_segment_data(metadata, segment_data)


def s3_storage(server: S3Server, prefix: str = "") -> S3RemoteStorageManager:
    """A RemoteStorageManager of the test's own, writing to `server`."""
    return S3RemoteStorageManager(server.bucket, prefix, endpoint_url=server.endpoint_url, region=server.region,
                                  access_key_id=server.access_key, secret_access_key=server.secret_key)


def s3_proxy_settings(endpoint_url: str, server: S3Server, prefix: str = "") -> dict[str, Any]:
    """Proxy settings reading from S3 at `endpoint_url` (moto itself, or something in front of it)."""
    return server.storage_properties(prefix, endpoint_url=endpoint_url)


def local_proxy_settings(root: Path) -> dict[str, Any]:
    return {"remote.log.storage.local.dir": root / "remote", "remote.log.metadata.dir": root / "metadata"}


def record_keys(records: Iterable[Any]) -> list[tuple]:
    """(partition, offset, key, value) of aiokafka records or ProducedRecords, as consumed (no sorting)."""
    return [(r.partition, r.offset, r.key, r.value) for r in records]


def in_partition_order(consumed: list[tuple]) -> dict[int, list[tuple]]:
    """Consumed (partition, offset, key, value) tuples per partition, in the order they arrived."""
    out: dict[int, list[tuple]] = {}
    for item in consumed:
        out.setdefault(item[0], []).append(item)
    return out


def expected_by_partition(tiered: TieredTopic) -> dict[int, list[tuple]]:
    return in_partition_order(record_keys(tiered.records))


def consume_confluent_assigned(
    client_config: dict[str, Any], topic: str, partitions: Iterable[int], count: int, *, timeout_s: float = 60.0,
    errors: list[KafkaError] | None = None, stop: Any = None,
) -> list[tuple]:
    """librdkafka reading `partitions` from offset 0 (no group), in arrival order.
    Per-partition errors the consumer reports go to `errors` (it keeps fetching)."""
    consumer = Consumer({**client_config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.error.backoff.ms": 100})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    consumed: list[tuple] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(consumed) < count and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is None:
                    consumed.append((message.partition(), message.offset(), message.key(), message.value()))
                elif errors is not None:
                    errors.append(message.error())
    finally:
        consumer.close()
    return consumed


async def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        await asyncio.sleep(0.1)
