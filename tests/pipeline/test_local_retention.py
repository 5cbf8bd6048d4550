"""Local retention: DeleteRecords on the real broker, only over COPY_SEGMENT_FINISHED data."""

from __future__ import annotations

import dataclasses
import time

from tierproxy.client.cluster import Cluster
from tierproxy.pipeline.local_retention import LocalRetentionLimits, local_trim
from tierproxy.pipeline.retention import run_retention
from tierproxy.protocol.apis import ErrorCode
from tierproxy.config import Config, parse
from tierproxy.storage.model import RemoteLogSegmentId, RemoteLogSegmentState, TopicIdPartition
from tests.helpers.retention import (
    broker_log_start,
    four_segments,
    produce_groups,
    retention_config,
    rule_segment,
    run_past_two_segments,
    stores,
    tier,
    tiered_groups,
)


# ---------------------------------------------------------------- the rule, without a broker


def test_trim_stops_at_a_gap_an_unfinished_segment_and_the_high_watermark():
    no_limit_but_time = LocalRetentionLimits(retention_ms=0, retention_bytes=-1)
    segments = [rule_segment(0, 9), rule_segment(10, 19), rule_segment(25, 29)]  # offsets 20..24 are not remote
    assert local_trim(segments, 0, 100, no_limit_but_time, now_ms=10).new_log_start_offset == 20
    # The log start inside a segment: that segment still counts (it holds the log start).
    assert local_trim(segments, 5, 100, no_limit_but_time, now_ms=10).new_log_start_offset == 20
    # Nothing finished from the log start on.
    assert local_trim(segments, 20, 100, no_limit_but_time, now_ms=10) is None
    unfinished = [rule_segment(0, 9), rule_segment(10, 19, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED)]
    assert local_trim(unfinished, 0, 100, no_limit_but_time, now_ms=10).new_log_start_offset == 10
    # Remote data past the broker's high watermark is never a reason to go there.
    assert local_trim(segments, 0, 15, no_limit_but_time, now_ms=10).new_log_start_offset == 10


def test_time_and_size_each_delete_a_prefix_and_either_suffices():
    segments = four_segments()
    by_time = local_trim(segments, 0, 100, LocalRetentionLimits(2500, -1), now_ms=5000)  # cutoff 2500
    assert (by_time.new_log_start_offset, by_time.reason) == (20, "time")
    # Size: 400 bytes, limit 150 -> diff 250: two segments fit in it, a third would not.
    by_size = local_trim(segments, 0, 100, LocalRetentionLimits(-1, 150), now_ms=5000)
    assert (by_size.new_log_start_offset, by_size.reason) == (20, "size")
    both = local_trim(segments, 0, 100, LocalRetentionLimits(1500, 150), now_ms=5000)  # time: 3, size: 2
    assert (both.new_log_start_offset, both.reason) == (30, "time")
    assert local_trim(segments, 0, 100, LocalRetentionLimits(-1, -1), now_ms=5000) is None
    assert local_trim(segments, 0, 100, LocalRetentionLimits(-1, 400), now_ms=5000) is None


def test_limits_take_the_stricter_of_local_and_total_retention():
    config = parse({"bootstrap.servers": "127.0.0.1:9092",
                    "topic.a.remote.storage.enable": "true", "topic.a.local.retention.ms": "-1",
                    "topic.a.retention.ms": "5000", "topic.a.local.retention.bytes": "700",
                    "topic.a.retention.bytes": "-1"})
    assert LocalRetentionLimits.of(config.topic("a")) == LocalRetentionLimits(5000, 700)


# ---------------------------------------------------------------- against the broker


async def test_time_retention_trims_finished_segments_and_never_past_the_remote_end(
        kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic()
    # Offsets 0..79 are remote (X = 79), 80..119 only on the broker.
    async with tiered_groups(bootstrap, name, tmp_path, end=80) as tiered:
        rlmm, rsm, cluster, segments = tiered
        assert [(s.start_offset, s.end_offset) for s in segments] == [(0, 19), (20, 39), (40, 59), (60, 79)]

        # local.retention.ms puts the cutoff between the second and third segment's timestamps.
        _, _, report = await run_past_two_segments(tiered, tmp_path, bootstrap, name, "local.retention.ms")
        (trim,) = report.trimmed
        assert (trim.old_log_start_offset, trim.new_log_start_offset, trim.segments, trim.reason) == (0, 40, 2, "time")
        assert trim.bytes == segments[0].segment_size_in_bytes + segments[1].segment_size_in_bytes
        assert await broker_log_start(cluster, name) == 40
        topics = await cluster.topics([name])
        assert (await cluster.fetch_raw(topics, name, 0, 39, 1 << 20)).error_code == ErrorCode.offset_out_of_range
        assert (await cluster.fetch_raw(topics, name, 0, 40, 1 << 20)).error_code == ErrorCode.none

        # Everything is past local retention now, but only the remote part may go: up to X + 1.
        config = retention_config(tmp_path, bootstrap, {name: {"local.retention.ms": 0}})
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=int(time.time() * 1000) + 3_600_000)
        assert [(t.old_log_start_offset, t.new_log_start_offset) for t in report.trimmed] == [(40, 80)]
        assert await broker_log_start(cluster, name) == 80
        # Nothing more is finished remotely: a further pass leaves the broker alone.
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=int(time.time() * 1000) + 3_600_000)
        assert report.trimmed == [] and report.ok
        assert await broker_log_start(cluster, name) == 80
        # Remote retention (7 days by default) kept every segment.
        assert len(rlmm.list_segments(segments[0].topic_id_partition)) == 4


async def test_size_retention_keeps_at_least_the_limit(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic()
    async with tiered_groups(bootstrap, name, tmp_path, end=100) as (rlmm, rsm, cluster, segments):
        sizes = [s.segment_size_in_bytes for s in segments]
        assert len(sizes) == 5
        now_ms = int(time.time() * 1000)

        def config(limit: int) -> Config:
            return retention_config(tmp_path, bootstrap, {name: {
                "local.retention.bytes": limit, "local.retention.ms": -1, "retention.ms": -1}})

        # Deleting the first segment would leave one byte less than the limit: it stays.
        report = await run_retention(config(sum(sizes[1:]) + 1), cluster, rlmm, rsm, now_ms=now_ms)
        assert report.trimmed == [] and report.ok
        assert await broker_log_start(cluster, name) == 0

        report = await run_retention(config(sum(sizes[2:])), cluster, rlmm, rsm, now_ms=now_ms)
        assert [(t.new_log_start_offset, t.segments, t.bytes, t.reason) for t in report.trimmed] == \
            [(40, 2, sizes[0] + sizes[1], "size")]
        assert await broker_log_start(cluster, name) == 40
        # What stays local is exactly the limit now: a second pass trims nothing more.
        report = await run_retention(config(sum(sizes[2:])), cluster, rlmm, rsm, now_ms=now_ms)
        assert report.trimmed == [] and report.ok
        assert await broker_log_start(cluster, name) == 40


async def test_nothing_is_trimmed_without_finished_data_or_with_unlimited_retention(
        kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    started_only, unlimited = topic(), topic()
    await produce_groups(bootstrap, started_only, groups=2)
    await produce_groups(bootstrap, unlimited, groups=2)
    everything_goes = {"local.retention.ms": 0, "local.retention.bytes": 0}
    async with stores(retention_config(tmp_path, bootstrap, {})) as (rlmm, rsm), \
            Cluster(bootstrap.split(",")) as cluster:
        # A copy that never finished: COPY_SEGMENT_STARTED only (objects uploaded, not committed).
        tiered = await tier(bootstrap, rlmm, rsm, tmp_path / "work", unlimited, end=40)
        topic_id = (await cluster.topics([started_only]))[started_only].topic_id
        tp = TopicIdPartition(topic_id, started_only, 0)
        await rlmm.add_remote_log_segment_metadata(dataclasses.replace(
            tiered[0], segment_id=RemoteLogSegmentId.generate(tp), state=RemoteLogSegmentState.COPY_SEGMENT_STARTED))

        config = retention_config(tmp_path, bootstrap, {
            started_only: everything_goes,
            unlimited: {"local.retention.ms": -1, "local.retention.bytes": -1, "retention.ms": -1,
                        "retention.bytes": -1},
        })
        report = await run_retention(config, cluster, rlmm, rsm, now_ms=int(time.time() * 1000) + 3_600_000)
        assert report.ok, report.failures
        assert report.trimmed == [] and report.expired == []
        assert await broker_log_start(cluster, started_only) == 0
        assert await broker_log_start(cluster, unlimited) == 0
        assert [s.state for s in rlmm.list_segments(tp)] == [RemoteLogSegmentState.COPY_SEGMENT_STARTED]
