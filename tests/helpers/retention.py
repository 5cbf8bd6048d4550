"""The retention tests' set-up: runs of records in the past on the real broker, tiered in
segments of one run each to a local-file (or S3) store with the file metadata store, and
segment metadata for the retention rules alone.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

from aiokafka import AIOKafkaProducer

from tierproxy.client.cluster import Cluster
from tierproxy.config import Config, parse
from tierproxy.pipeline.retention import run_retention
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager, scan_entries
from tierproxy.storage.model import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierproxy.storage.rsm import RemoteStorageManager
from tests.helpers.metadata import segment
from tests.helpers.remote_tier import tier_from_broker

GROUPS = 6
PER_GROUP = 20
GROUP_STEP_MS = 60_000
# The partition of the rules' segments (no broker involved).
TP = TopicIdPartition(uuid.UUID(int=1), "t", 0)


async def produce_groups(bootstrap: str, topic: str, *, partition: int = 0, groups: int = GROUPS,
                         per_group: int = PER_GROUP) -> int:
    """`groups` runs of `per_group` records, each run flushed on its own (so batches never
    straddle a multiple of `per_group`), with timestamps one GROUP_STEP_MS apart per run, in
    the past. Returns the first run's timestamp."""
    first_ms = int(time.time() * 1000) - groups * GROUP_STEP_MS
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50)
    await producer.start()
    try:
        for g in range(groups):
            futures = [
                await producer.send(topic, value=b"v%d-%d" % (g, i) * 10, key=b"k%d" % i, partition=partition,
                                    timestamp_ms=first_ms + g * GROUP_STEP_MS)
                for i in range(per_group)
            ]
            await producer.flush()
            for future in futures:
                await future
    finally:
        await producer.stop()
    return first_ms


def retention_config(tmp_path: Path, bootstrap: str, topics: Mapping[str, Mapping[str, object]],
                     **extra: str) -> Config:
    """Local-file RSM and file RLMM under `tmp_path`; `topics` maps a tiered topic to its
    topic-level overrides (`{"local.retention.ms": 0}`)."""
    properties = {
        "bootstrap.servers": bootstrap,
        "remote.log.storage.local.dir": str(tmp_path / "remote"),
        "remote.log.metadata.dir": str(tmp_path / "metadata"),
        **extra,
    }
    for name, overrides in topics.items():
        properties[f"topic.{name}.remote.storage.enable"] = "true"
        for key, value in overrides.items():
            properties[f"topic.{name}.{key}"] = str(value)
    return parse(properties)


@asynccontextmanager
async def stores(config: Config) -> AsyncIterator[tuple[RemoteLogMetadataManager, RemoteStorageManager]]:
    async with remote_log_metadata_manager(config) as rlmm, remote_storage_manager(config) as rsm:
        yield rlmm, rsm


async def tier(bootstrap: str, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, work_dir: Path,
               topic: str, *, end: int, cut_every: int = PER_GROUP,
               partition: int = 0) -> list[RemoteLogSegmentMetadata]:
    """Offsets [0, end) of the partition into FINISHED remote segments of `cut_every` offsets."""
    return await tier_from_broker(bootstrap, topic, partition, end=end, rsm=rsm, rlmm=rlmm, work_dir=work_dir,
                                  cut_offsets=range(cut_every, end, cut_every))


class Tiered(NamedTuple):
    rlmm: RemoteLogMetadataManager
    rsm: RemoteStorageManager
    cluster: Cluster
    segments: list[RemoteLogSegmentMetadata]


@asynccontextmanager
async def tiered_groups(bootstrap: str, topic: str, tmp_path: Path, *, end: int, groups: int = GROUPS,
                        **extra: str) -> AsyncIterator[Tiered]:
    """`groups` runs produced to partition 0 of `topic` (a tiered topic of `retention_config`,
    with `extra`), offsets [0, end) tiered one run per segment; the stores and a Cluster open."""
    await produce_groups(bootstrap, topic, groups=groups)
    async with stores(retention_config(tmp_path, bootstrap, {topic: {}}, **extra)) as (rlmm, rsm), \
            Cluster(bootstrap.split(",")) as cluster:
        yield Tiered(rlmm, rsm, cluster, await tier(bootstrap, rlmm, rsm, tmp_path / "work", topic, end=end))


async def run_past_two_segments(tiered: Tiered, tmp_path: Path, bootstrap: str, topic: str, key: str):
    """A retention pass with the topic's retention time `key` (local.retention.ms or
    retention.ms) putting the cutoff between the newest records of the second and third
    segments; it must succeed. Returns (its configuration, its now_ms, its report)."""
    retention_ms = 3_600_000
    now_ms = tiered.segments[1].max_timestamp_ms + retention_ms + 1
    config = retention_config(tmp_path, bootstrap, {topic: {key: retention_ms}})
    report = await run_retention(config, tiered.cluster, tiered.rlmm, tiered.rsm, now_ms=now_ms)
    assert report.ok, report.failures
    return config, now_ms, report


async def broker_log_start(cluster: Cluster, topic: str, partition: int = 0) -> int:
    topics = await cluster.topics([topic])
    return (await cluster.list_offsets(topics, [(topic, partition)], OffsetSpec.EARLIEST))[(topic, partition)].offset


def last_states(rlmm: FileRemoteLogMetadataManager) -> dict[uuid.UUID, RemoteLogSegmentState]:
    """Each segment's last state as written to the metadata file (forgotten ones included)."""
    records, _ = scan_entries(rlmm.path.read_bytes())
    states = {}
    for record in records:
        if isinstance(record, (RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate)):
            states[record.segment_id.id] = record.state
    return states


def rule_segment(start: int, end: int, *, max_ts: int = 0, size: int = 100,
                 state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                 ) -> RemoteLogSegmentMetadata:
    """A segment of TP for the retention rules alone, FINISHED unless `state` says otherwise."""
    return segment(TP, start, end, state=state, max_timestamp_ms=max_ts, size=size)


def four_segments() -> list[RemoteLogSegmentMetadata]:
    """Offsets 0-39 in four FINISHED segments of 100 bytes, the i-th newest record at 1000 * (i + 1) ms."""
    return [rule_segment(i * 10, i * 10 + 9, max_ts=1000 * (i + 1)) for i in range(4)]
