"""The pipeline's metrics (pipeline.metrics), from passes over the real broker and from
reports made by hand for what a real pass rarely shows (failures, throttled copies)."""

from __future__ import annotations

import asyncio
import threading
import uuid

from tierproxy.pipeline.metrics import PipelineMetrics
from tierproxy.pipeline.plan import PartitionPlan
from tierproxy.pipeline.remote_log_stats import RemoteLogStats
from tierproxy.pipeline.remote_retention import RemoteExpiry
from tierproxy.pipeline.retention import RetentionFailure, RetentionReport
from tierproxy.pipeline.tier import PartitionSummary, PassReport, run_every
from tierproxy.storage.model import RemoteLogSegmentState, TopicIdPartition
from tests.helpers.produce import produce_codecs
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, all_segments, tier_config


def _plan(topic: str, partition: int) -> PartitionPlan:
    return PartitionPlan(topic, uuid.UUID(int=1), partition, 0, 0, 100, None, 0, 100, 1000, 1000)


def _value(metrics: PipelineMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_report_becomes_counters_and_gauges():
    metrics = PipelineMetrics()
    good = PartitionSummary(_plan("a", 0), segments=3, bytes=3000, uploaded=3, cleaned=1, copy_lag=(3000, 3),
                            throttle_waits=[0.5, 1.5])
    failed = PartitionSummary(_plan("a", 1), error="copy failed", copy_failed=True, copy_lag=None)
    other = PartitionSummary(_plan("b", 0), segments=1, bytes=10, uploaded=1, copy_lag=(10, 1))
    tp = TopicIdPartition(uuid.UUID(int=1), "a", 0)
    report = PassReport(
        partitions=[good, failed, other], seconds=2.0,
        retention=RetentionReport(
            expired=[RemoteExpiry(tp, 0, 10, 2, 200, 1, "time")],
            failures=[RetentionFailure("remote retention", "a-1", "RemoteStorageError: x"),
                      RetentionFailure("local retention", "a-0", "ClusterError: y"),
                      RetentionFailure("partition removal", "*", "ConnectionError: z")]),
        remote_logs={"a-0": RemoteLogStats("a", 5000, 4, 100, 1), "a-1": RemoteLogStats("a", 1000, 1),
                     "b-0": RemoteLogStats("b", 10, 1)},
    )
    metrics.record(report, now=1234.0)

    assert _value(metrics, "tierproxy_remote_copy_bytes_total", topic="a") == 3000
    assert _value(metrics, "tierproxy_remote_copy_requests_total", topic="a") == 3
    assert _value(metrics, "tierproxy_remote_copy_errors_total", topic="a") == 1
    assert _value(metrics, "tierproxy_remote_copy_errors_total", topic="b") == 0
    assert _value(metrics, "tierproxy_remote_copy_lag_bytes", topic="a") == 3000  # a-1 unmeasured
    assert _value(metrics, "tierproxy_remote_copy_lag_segments", topic="b") == 1
    assert _value(metrics, "tierproxy_remote_copy_throttle_seconds_count") == 2
    assert _value(metrics, "tierproxy_remote_copy_throttle_seconds_sum") == 2.0
    # 1 orphan cleaned, 2 expired and 1 interrupted delete finished.
    assert _value(metrics, "tierproxy_remote_delete_requests_total", topic="a") == 4
    # Remote retention of a-1 and the whole partition removal step; local retention is no delete.
    assert _value(metrics, "tierproxy_remote_delete_errors_total", topic="a") == 1
    assert _value(metrics, "tierproxy_remote_delete_errors_total", topic="*") == 1
    assert _value(metrics, "tierproxy_remote_log_size_bytes", topic="a") == 6000
    assert _value(metrics, "tierproxy_remote_log_metadata_count", topic="a") == 5
    assert _value(metrics, "tierproxy_remote_delete_lag_bytes", topic="a") == 100
    assert _value(metrics, "tierproxy_remote_delete_lag_segments", topic="a") == 1
    assert _value(metrics, "tierproxy_tier_passes_total") == 1
    assert _value(metrics, "tierproxy_tier_passes_failed_total") == 1  # it reported errors
    assert _value(metrics, "tierproxy_tier_last_success_timestamp_seconds") == 0
    assert _value(metrics, "tierproxy_tier_pass_duration_seconds_count") == 1

    # The next pass: a-1 copied after all, b is no longer tiered and leaves every gauge.
    good.copy_lag, failed.copy_lag, failed.error, failed.copy_failed = (0, 0), (700, 1), None, False
    metrics.record(PassReport(partitions=[good, failed], seconds=1.0,
                              remote_logs={"a-0": RemoteLogStats("a", 5000, 4)}), now=2000.0)
    assert _value(metrics, "tierproxy_remote_copy_lag_bytes", topic="a") == 700
    assert _value(metrics, "tierproxy_remote_copy_lag_bytes", topic="b") is None
    assert _value(metrics, "tierproxy_remote_log_size_bytes", topic="b") is None
    assert _value(metrics, "tierproxy_remote_copy_bytes_total", topic="b") == 10  # counters stay
    assert _value(metrics, "tierproxy_tier_last_success_timestamp_seconds") == 2000.0
    assert _value(metrics, "tierproxy_tier_passes_total") == 2

    metrics.pass_failed(0.5)
    assert _value(metrics, "tierproxy_tier_passes_failed_total") == 2
    assert _value(metrics, "tierproxy_tier_pass_duration_seconds_count") == 3


async def test_passes_of_run_every_report_the_remote_log(spark, kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    await produce_codecs(bootstrap, name, 2, 3_000)
    config = tier_config(tmp_path, bootstrap, name, topic_settings={"segment.bytes": 32 * 1024})
    metrics = PipelineMetrics()
    failures = await asyncio.to_thread(run_every, config, spark, 10, max_passes=1, stop=threading.Event(),
                                       metrics=metrics)
    assert failures == 0

    segments = []
    from tierproxy.client.cluster import Cluster

    async with Cluster([bootstrap]) as cluster:
        info = (await cluster.topics([name]))[name]
    for p in range(2):
        segments += await all_segments(config, TopicIdPartition(info.topic_id, name, p))
    finished = [s for s in segments if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    assert len(finished) >= 4
    size = sum(s.segment_size_in_bytes for s in finished)
    assert _value(metrics, "tierproxy_remote_log_size_bytes", topic=name) == size
    assert _value(metrics, "tierproxy_remote_log_metadata_count", topic=name) == len(segments)
    assert _value(metrics, "tierproxy_remote_copy_bytes_total", topic=name) == size
    assert _value(metrics, "tierproxy_remote_copy_requests_total", topic=name) == len(finished)
    assert _value(metrics, "tierproxy_remote_copy_lag_bytes", topic=name) == size  # what the pass found to copy
    assert _value(metrics, "tierproxy_remote_copy_lag_segments", topic=name) == len(finished)
    assert _value(metrics, "tierproxy_remote_delete_lag_segments", topic=name) == 0
    assert _value(metrics, "tierproxy_tier_passes_total") == 1
    assert _value(metrics, "tierproxy_tier_passes_failed_total") == 0
    assert _value(metrics, "tierproxy_tier_last_success_timestamp_seconds") > 0


def test_a_pass_that_copies_a_partition_the_last_pass_failed_shows_progress_before_it_ends(monkeypatch, tmp_path):
    """tierproxy_tier_last_progress_timestamp_seconds moves while a pass runs, as soon as it
    copies a partition the pass before it failed (TierproxyTierPassesFailing resolves on it);
    a partition that did not fail before shows nothing: a pass that fails one partition on
    every pass still alerts."""
    import tierproxy.pipeline.tier as tier

    metrics = PipelineMetrics()
    progress = []

    def first(*args, on_copied, **kwargs) -> PassReport:
        on_copied("a-0")  # copies while a-1 fails: nothing had failed before
        progress.append(_value(metrics, "tierproxy_tier_last_progress_timestamp_seconds"))
        return PassReport(partitions=[PartitionSummary(_plan("a", 0), segments=1),
                                      PartitionSummary(_plan("a", 1), error="copy failed", copy_failed=True)])

    def second(*args, on_copied, **kwargs) -> PassReport:
        on_copied("a-0")
        progress.append(_value(metrics, "tierproxy_tier_last_progress_timestamp_seconds"))
        on_copied("a-1")  # failed in the pass before: it is back
        progress.append(_value(metrics, "tierproxy_tier_last_progress_timestamp_seconds"))
        return PassReport(partitions=[PartitionSummary(_plan("a", 0)), PartitionSummary(_plan("a", 2), error="x")])

    passes = iter([first, second])
    monkeypatch.setattr(tier, "run_pass", lambda *args, **kwargs: next(passes)(*args, **kwargs))
    config = tier_config(tmp_path, "127.0.0.1:9", "a", extra={"remote.log.manager.task.retry.backoff.ms": 1,
                                                               "remote.log.manager.task.retry.backoff.max.ms": 1})
    assert run_every(config, None, 1, max_passes=2, stop=threading.Event(), metrics=metrics) == 2
    assert progress[:2] == [0, 0]
    assert progress[2] > 0
    assert _value(metrics, "tierproxy_tier_last_success_timestamp_seconds") == 0
