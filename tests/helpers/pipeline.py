"""A tiering pass and what it copied: the pipeline's configuration for a test, and the checks
that every remote `.log` is what a broker Fetch returns at the same offsets and that the
FINISHED segments cover each partition contiguously from offset 0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tierproxy.client.cluster import READ_COMMITTED, Cluster
from tierproxy.pipeline.copy import metadata_manager
from tierproxy.pipeline.tier import PassReport
from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.config import Config, parse
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.indexes import TransactionIndex
from tierproxy.storage.model import IndexType, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager

S = RemoteLogSegmentState
SEGMENT_BYTES = 128 * 1024
BROKER_SEGMENT_BYTES = 64 * 1024


def tier_config(tmp_path: Path, bootstrap: str, topic: str, *, s3=None, key_prefix: str = "",
                topic_settings: Mapping[str, object] | None = None, extra: Mapping[str, object] | None = None) -> Config:
    properties = {
        "bootstrap.servers": bootstrap,
        "remote.log.metadata.backend": "file",
        "remote.log.metadata.dir": str(tmp_path / "metadata"),
        "remote.log.storage.key.prefix": key_prefix,
        f"topic.{topic}.remote.storage.enable": "true",
        f"topic.{topic}.segment.bytes": str(SEGMENT_BYTES),
    }
    if s3 is None:
        properties |= {"remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp_path / "remote")}
    else:
        properties |= s3.storage_properties(key_prefix)
    for key, value in (topic_settings or {}).items():
        properties[f"topic.{topic}.{key}"] = str(value)
    properties |= {k: str(v) for k, v in (extra or {}).items()}
    return parse(properties)


async def broker_bytes(cluster: Cluster, topics, topic: str, partition: int, start: int, end: int) -> bytes:
    """Whole batches holding offsets [start, end], as the broker's Fetch returns them."""
    out = bytearray()
    offset = start
    while offset <= end:
        response = await cluster.fetch_raw(topics, topic, partition, offset, 4 << 20)
        assert response.error_code == ErrorCode.none
        records = response.records or b""
        taken = 0
        for header in iter_batches(records):
            if header.base_offset > end:
                break
            assert header.base_offset >= start, "segments start on batch boundaries"
            taken = header.end_position
            offset = header.next_offset
        assert taken, f"no batch at offset {offset}"
        out += memoryview(records)[:taken]
    return bytes(out)


async def remote_log(rsm: RemoteStorageManager, m: RemoteLogSegmentMetadata) -> bytes:
    return b"".join([bytes(chunk) async for chunk in rsm.fetch_log_segment(m, 0)])


async def finished_segments(config: Config, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
    async with metadata_manager(config) as rlmm:
        return [m for m in rlmm.list_segments(tp) if m.state == S.COPY_SEGMENT_FINISHED]


async def all_segments(config: Config, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
    async with metadata_manager(config) as rlmm:
        return rlmm.list_segments(tp)


async def check_remote_log(config: Config, topic: str, *, tail_may_wait: bool) -> dict[int, list[RemoteLogSegmentMetadata]]:
    """Byte-identity and contiguity of every partition's FINISHED segments; returns them."""
    out = {}
    async with Cluster.from_config(config) as cluster, remote_storage_manager(config) as rsm:
        topics = await cluster.topics([topic])
        info = topics[topic]
        tps = [(topic, p) for p in sorted(info.partitions)]
        stable = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST, isolation_level=READ_COMMITTED)
        for _, p in tps:
            tp = TopicIdPartition(info.topic_id, topic, p)
            segments = await finished_segments(config, tp)
            assert segments, f"{tp}: nothing tiered"
            assert segments[0].start_offset == 0
            for before, after in zip(segments, segments[1:]):
                assert after.start_offset == before.end_offset + 1, f"{tp}: gap or overlap"
            lso = stable[(topic, p)].offset
            end = segments[-1].end_offset + 1
            if tail_may_wait:
                assert end <= lso
                if end < lso:  # the tail waits only while it is smaller than a segment
                    tail = await broker_bytes(cluster, topics, topic, p, end, lso - 1)
                    assert len(tail) <= config.topic(topic).segment_bytes
            else:
                assert end == lso
            for m in segments:
                await rsm.verify_segment(m, check_crc=True)
                data = await remote_log(rsm, m)
                assert len(data) == m.segment_size_in_bytes
                assert data == await broker_bytes(cluster, topics, topic, p, m.start_offset, m.end_offset)
            out[p] = segments
    return out


async def aborted_transactions(config: Config, segments: list[RemoteLogSegmentMetadata]) -> int:
    count = 0
    async with remote_storage_manager(config) as rsm:
        for m in segments:
            if not m.txn_index_empty:
                count += len(TransactionIndex.from_bytes(await rsm.fetch_index(m, IndexType.TRANSACTION)))
    return count


def assert_clean(report: PassReport) -> None:
    assert report.ok, report.errors
    assert not report.gaps
