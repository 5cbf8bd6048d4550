"""Remote retention against the real broker and remote stores (local files, and S3 once)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from tierproxy.pipeline.remote_retention import expired_segments
from tierproxy.pipeline.retention import REMOTE_RETENTION, run_retention
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.model import LogSegmentData, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager, kafka_uuid
from tests.helpers.retention import (
    broker_log_start,
    four_segments,
    last_states,
    retention_config,
    rule_segment,
    run_past_two_segments,
    tiered_groups,
)

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


async def segment_keys(rsm: RemoteStorageManager, segment: RemoteLogSegmentMetadata) -> list[str]:
    return [k for k in await rsm.list_partition_objects(segment.topic_id_partition)
            if kafka_uuid(segment.segment_id.id) in k]


class FailingDeletes(RemoteStorageManager):
    """A real store whose first `failures` segment deletes fail, as an unreachable store would."""

    def __init__(self, inner: RemoteStorageManager, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        if self.failures:
            self.failures -= 1
            raise RemoteStorageError(f"store unreachable deleting {metadata.segment_id.id}", retriable=True)
        await self.inner.delete_log_segment_data(metadata)

    async def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> None:
        await self.inner.copy_log_segment_data(metadata, data)

    def fetch_log_segment(self, metadata, start_position, end_position=None):
        return self.inner.fetch_log_segment(metadata, start_position, end_position)

    async def fetch_index(self, metadata, index_type):
        return await self.inner.fetch_index(metadata, index_type)

    async def verify_segment(self, metadata, *, check_crc=False):
        return await self.inner.verify_segment(metadata, check_crc=check_crc)

    async def list_partition_objects(self, topic_id_partition: TopicIdPartition) -> list[str]:
        return await self.inner.list_partition_objects(topic_id_partition)

    async def delete_partition(self, topic_id_partition: TopicIdPartition) -> None:
        await self.inner.delete_partition(topic_id_partition)

    async def close(self) -> None:
        pass


def test_expiry_is_a_prefix_by_time_or_size():
    segments = four_segments()
    segments.append(rule_segment(40, 49, max_ts=0, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED))
    expired, reason = expired_segments(segments, 2500, -1, now_ms=5000)
    assert [s.start_offset for s in expired] == [0, 10] and reason == "time"
    # 400 finished bytes, limit 150: two segments fit in the 250 over it.
    expired, reason = expired_segments(segments, -1, 150, now_ms=5000)
    assert [s.start_offset for s in expired] == [0, 10] and reason == "size"
    expired, reason = expired_segments(segments, 1500, 250, now_ms=5000)
    assert [s.start_offset for s in expired] == [0, 10, 20] and reason == "time"
    assert expired_segments(segments, -1, -1, now_ms=10**12) == ([], "")
    assert expired_segments(segments, -1, 400, now_ms=0) == ([], "")


async def test_time_retention_expires_exactly_the_old_segments(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic()
    async with tiered_groups(bootstrap, name, tmp_path, end=100) as tiered:
        rlmm, rsm, cluster, segments = tiered
        tp = segments[0].topic_id_partition
        config, now_ms, report = await run_past_two_segments(tiered, tmp_path, bootstrap, name, "retention.ms")
        (expiry,) = report.expired
        assert (expiry.old_log_start_offset, expiry.new_log_start_offset, expiry.segments, expiry.reason) == \
            (0, 40, 2, "time")
        assert expiry.bytes == segments[0].segment_size_in_bytes + segments[1].segment_size_in_bytes
        assert rlmm.log_start_offset(tp) == 40
        assert [s.segment_id for s in rlmm.list_segments(tp)] == [s.segment_id for s in segments[2:]]
        for segment in segments[:2]:
            assert await segment_keys(rsm, segment) == []
        for segment in segments[2:]:
            assert len(await segment_keys(rsm, segment)) >= 6  # .log, indexes, manifest
            await rsm.verify_segment(segment)
        states = last_states(rlmm)
        assert [states[s.segment_id.id] for s in segments] == [DELETE_FINISHED] * 2 + [FINISHED] * 3
        # Data past retention.ms leaves the broker too, through what was tiered.
        assert [(t.new_log_start_offset, t.reason) for t in report.trimmed] == [(40, "time")]
        assert await broker_log_start(cluster, name) == 40

        # Nothing else is old enough: a second pass expires nothing.
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms)
        assert report.expired == [] and report.ok


async def test_size_retention_and_an_interrupted_delete_completed_next_pass(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic()
    async with tiered_groups(bootstrap, name, tmp_path, end=100) as (rlmm, rsm, cluster, segments):
        tp = segments[0].topic_id_partition
        sizes = [s.segment_size_in_bytes for s in segments]
        # Keep the last three: the oldest two go, oldest first.
        config = retention_config(tmp_path, bootstrap, {name: {"retention.ms": -1, "retention.bytes": sum(sizes[2:])}})
        now_ms = int(time.time() * 1000)

        # The store fails on the first delete: that segment stays DELETE_SEGMENT_STARTED (no longer
        # served) and the next one is not touched, so no hole opens.
        failing = FailingDeletes(rsm, failures=1)
        report = await run_retention(config, cluster, rlmm, failing, now_ms=now_ms)
        assert [(f.step, f.partition) for f in report.failures] == [(REMOTE_RETENTION, str(tp))]
        assert "store unreachable" in report.failures[0].error
        assert report.expired == []
        assert [(s.segment_id, s.state) for s in rlmm.list_segments(tp)] == \
            [(segments[0].segment_id, DELETE_STARTED)] + [(s.segment_id, FINISHED) for s in segments[1:]]
        assert rlmm.log_start_offset(tp) == 20
        assert len(await segment_keys(rsm, segments[0])) >= 6
        # Local retention follows retention.bytes (local.retention.bytes is -2) and went first.
        assert [(t.new_log_start_offset, t.reason) for t in report.trimmed] == [(40, "size")]
        assert await broker_log_start(cluster, name) == 40

        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms)
        assert report.ok, report.failures
        (expiry,) = report.expired
        # Retention now sees four finished segments: only the second one is over the limit.
        assert (expiry.completed, expiry.segments, expiry.bytes, expiry.reason) == (1, 1, sizes[1], "size")
        assert (expiry.old_log_start_offset, expiry.new_log_start_offset) == (20, 40)
        for segment in segments[:2]:
            assert await segment_keys(rsm, segment) == []
        states = last_states(rlmm)
        assert [states[s.segment_id.id] for s in segments] == [DELETE_FINISHED] * 2 + [FINISHED] * 3
        assert sum(s.segment_size_in_bytes for s in rlmm.list_segments(tp)) == sum(sizes[2:])

        report = await run_retention(config, cluster, rlmm, rsm, now_ms=now_ms)
        assert report.expired == [] and report.ok


async def test_time_retention_on_s3(kafka_cluster, topic, tmp_path, s3_server):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic()
    s3 = s3_server.storage_properties(f"retention-{uuid.uuid4().hex[:8]}")
    config = retention_config(tmp_path, bootstrap, {name: {"retention.ms": 60_000}}, **s3)
    async with tiered_groups(bootstrap, name, tmp_path, end=60, groups=3, **s3) as (rlmm, rsm, cluster, segments):
        tp = segments[0].topic_id_partition
        keys_before = await rsm.list_partition_objects(tp)
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=segments[0].max_timestamp_ms + 60_001)
        assert report.ok, report.failures
        assert [(e.segments, e.new_log_start_offset) for e in report.expired] == [(1, 20)]
        kept = await rsm.list_partition_objects(tp)
        assert await segment_keys(rsm, segments[0]) == []
        assert kept == [k for k in keys_before if kafka_uuid(segments[0].segment_id.id) not in k]
        assert last_states(rlmm)[segments[0].segment_id.id] == DELETE_FINISHED
        assert Path(config["remote.log.metadata.dir"]).is_dir()
