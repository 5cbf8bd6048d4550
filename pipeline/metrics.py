"""Prometheus metrics of the tiering pipeline, served by `tierproxy tier --every` on
`pipeline.metrics.port` (KIP-405's and KIP-963's remote storage metrics, Kafka's names in each
family's help).

Gauges describe the state after the last pass, per topic: what is still to copy and to
delete, the size of the remote log and its metadata. Counters add up what passes did.
Spark's copy tasks run in other processes; what they measure (the seconds each copy
waited for the quota) comes back with their results and is recorded here, on the driver.

Kafka measures its copy lag after each segment its copy task copies; a pass here copies
every complete segment below the last stable offset, so the copy lag is what a pass
found to copy when it began (the bytes and segments it then cut), Kafka's figure at the
start of its copy task. A partition whose copy failed keeps its last figure.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tierproxy.config.metrics import register_build_info
from tierproxy.storage.verify import REASONS as VERIFY_REASONS

from .remote_log_stats import RemoteLogStats

if TYPE_CHECKING:
    from .tier import PassReport

__all__ = ("PipelineMetrics",)

# From a pass with nothing to do to one copying for an hour.
PASS_SECONDS_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
THROTTLE_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class PipelineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Each family is declared by a direct call, name first: docs/metrics.md is generated
        # by reading these calls (tierproxy.metrics_docs).
        self.build_info = register_build_info(r)
        self.copy_lag_bytes = Gauge(
            "tierproxy_remote_copy_lag_bytes",
            "Bytes of complete segments below the last stable offset not yet in remote storage when the last "
            "pass began, by topic (Kafka's RemoteCopyLagBytes).", ["topic"], registry=r)
        self.copy_lag_segments = Gauge(
            "tierproxy_remote_copy_lag_segments",
            "Segments not yet in remote storage when the last pass began, by topic (Kafka's RemoteCopyLagSegments).",
            ["topic"], registry=r)
        self.delete_lag_bytes = Gauge(
            "tierproxy_remote_delete_lag_bytes",
            "Bytes of remote segments past retention, or whose delete began, not deleted after the last pass, by "
            "topic (Kafka's RemoteDeleteLagBytes).", ["topic"], registry=r)
        self.delete_lag_segments = Gauge(
            "tierproxy_remote_delete_lag_segments",
            "Remote segments past retention, or whose delete began, not deleted after the last pass, by topic "
            "(Kafka's RemoteDeleteLagSegments).", ["topic"], registry=r)
        self.remote_log_size_bytes = Gauge(
            "tierproxy_remote_log_size_bytes",
            "Bytes of the COPY_SEGMENT_FINISHED remote segments after the last pass, by topic "
            "(Kafka's RemoteLogSizeBytes).", ["topic"], registry=r)
        self.remote_log_metadata_count = Gauge(
            "tierproxy_remote_log_metadata_count",
            "Remote segments with metadata in any state but DELETE_SEGMENT_FINISHED after the last pass, by topic "
            "(Kafka's RemoteLogMetadataCount).", ["topic"], registry=r)
        self.copy_bytes = Counter(
            "tierproxy_remote_copy_bytes",
            "Bytes of segments copied and COPY_SEGMENT_FINISHED, by topic (Kafka's RemoteCopyBytesPerSec).",
            ["topic"], registry=r)
        self.copy_requests = Counter(
            "tierproxy_remote_copy_requests",
            "Segments uploaded by copy tasks, by topic (Kafka's RemoteCopyRequestsPerSec).", ["topic"], registry=r)
        self.copy_errors = Counter(
            "tierproxy_remote_copy_errors",
            "Partition copies or commits that failed, by topic (Kafka's RemoteCopyErrorsPerSec).", ["topic"],
            registry=r)
        self.delete_requests = Counter(
            "tierproxy_remote_delete_requests",
            "Remote segments deleted (retention, orphans of failed copies, partition removal, remote storage "
            "turned off), by topic (Kafka's RemoteDeleteRequestsPerSec).", ["topic"], registry=r)
        self.delete_errors = Counter(
            "tierproxy_remote_delete_errors",
            "Remote deletes that failed, by topic; `*` when a whole step failed (Kafka's RemoteDeleteErrorsPerSec).",
            ["topic"], registry=r)
        self.segment_verify_failures = Counter(
            "tierproxy_remote_segment_verify_failures",
            "Remote segments that failed their check where they are stored (an object missing, or of another "
            "size or CRC-32C than at copy time, or a bad manifest) before local retention would have left them "
            "only remote; each stops its partition's trim. By topic and reason (missing, size, checksum, "
            "manifest).", ["topic", "reason"], registry=r)
        self.copy_throttle_seconds = Histogram(
            "tierproxy_remote_copy_throttle_seconds",
            "Each wait of a copy for remote.log.manager.copy.max.bytes.per.second (Kafka's "
            "remote-copy-throttle-time: avg is _sum / _count).", buckets=THROTTLE_SECONDS_BUCKETS, registry=r)
        self.pass_seconds = Histogram(
            "tierproxy_tier_pass_duration_seconds", "Tiering passes, from the lock taken to the summary.",
            buckets=PASS_SECONDS_BUCKETS, registry=r)
        self.passes = Counter("tierproxy_tier_passes", "Tiering passes run.", registry=r)
        self.passes_failed = Counter(
            "tierproxy_tier_passes_failed", "Tiering passes that failed or reported an error.", registry=r)
        self.last_success = Gauge(
            "tierproxy_tier_last_success_timestamp_seconds",
            "Unix time at which the last tiering pass without an error ended.", registry=r)
        self.last_progress = Gauge(
            "tierproxy_tier_last_progress_timestamp_seconds",
            "Unix time at which the pipeline last showed it works: a pass without an error ended, or a "
            "pass copied a partition the pass before it failed (what failed it is back) while it runs.",
            registry=r)
        # (topic, partition) -> (bytes, segments) of the copy lag last measured
        self._copy_lag: dict[tuple[str, int], tuple[int, int]] = {}

    def pass_failed(self, seconds: float) -> None:
        """A pass that raised before it had a report (the pipeline's lock, say)."""
        self.passes.inc()
        self.passes_failed.inc()
        self.pass_seconds.observe(seconds)

    def recovered(self) -> None:
        """A running pass copied a partition that the pass before it failed."""
        self.last_progress.set_to_current_time()

    def record(self, report: PassReport, *, now: float | None = None) -> None:
        self.passes.inc()
        self.pass_seconds.observe(report.seconds)
        if report.ok:
            self.last_success.set(time.time() if now is None else now)
            self.last_progress.set(time.time() if now is None else now)
        else:
            self.passes_failed.inc()
        self._record_copies(report)
        self._record_verify_failures(report)
        self._record_deletes(report)
        self._record_state(report)

    def _record_copies(self, report: PassReport) -> None:
        planned = {(p.plan.topic, p.plan.partition): p for p in report.partitions}
        # Partitions no longer planned (a topic no longer tiered) leave the lag; one whose
        # copy could not be measured keeps its last figure.
        self._copy_lag = {key: lag for key, lag in self._copy_lag.items() if key in planned}
        for key, p in planned.items():
            topic = p.plan.topic
            # Every counter of a tiered topic exists from its first pass, at 0, so that the
            # first error is an increase Prometheus sees.
            for counter in (self.copy_errors, self.delete_requests, self.delete_errors):
                counter.labels(topic)
            self.copy_bytes.labels(topic).inc(p.bytes)
            self.copy_requests.labels(topic).inc(p.uploaded)
            if p.copy_failed:
                self.copy_errors.labels(topic).inc()
            for wait in p.throttle_waits:
                self.copy_throttle_seconds.observe(wait)
            if p.copy_lag is not None:
                self._copy_lag[key] = p.copy_lag
        lag_bytes: dict[str, int] = defaultdict(int)
        lag_segments: dict[str, int] = defaultdict(int)
        for (topic, _), (size, segments) in self._copy_lag.items():
            lag_bytes[topic] += size
            lag_segments[topic] += segments
        for gauge, values in ((self.copy_lag_bytes, lag_bytes), (self.copy_lag_segments, lag_segments)):
            gauge.clear()
            for topic, value in values.items():
                gauge.labels(topic).set(value)

    def _record_verify_failures(self, report: PassReport) -> None:
        for topic in {p.plan.topic for p in report.partitions}:
            for reason in VERIFY_REASONS:  # at 0 from the topic's first pass: the first failure is an increase
                self.segment_verify_failures.labels(topic, reason)
        for damage in getattr(report.retention, "damaged", []):
            self.segment_verify_failures.labels(damage.segment.topic_id_partition.topic, damage.reason).inc()

    def _record_deletes(self, report: PassReport) -> None:
        retention = report.retention
        deleted: list[tuple[str, int]] = [(p.plan.topic, p.cleaned) for p in report.partitions]
        deleted += [(e.topic_id_partition.topic, e.segments + e.completed) for e in getattr(retention, "expired", [])]
        deleted += [(r.topic_id_partition.topic, r.segments) for r in getattr(retention, "removed", [])]
        deleted += [(r.topic_id_partition.topic, r.segments) for r in report.disabled.removed]
        for topic, segments in deleted:
            if segments:
                self.delete_requests.labels(topic).inc(segments)
        failed = [p.plan.topic for p in report.partitions if p.cleanup_failed]
        failed += [_topic_of(f.partition) for f in getattr(retention, "failures", []) if f.step != "local retention"]
        failed += [_topic_of(partition) for partition, _ in report.disabled.failures]
        for topic in failed:
            self.delete_errors.labels(topic).inc()

    def _record_state(self, report: PassReport) -> None:
        """The gauges of the topics the pass looked at, and only theirs (a topic no longer
        tiered leaves them)."""
        by_topic: dict[str, RemoteLogStats] = {}
        for stats in report.remote_logs.values():
            by_topic[stats.topic] = by_topic[stats.topic] + stats if stats.topic in by_topic else stats
        for gauge in (self.delete_lag_bytes, self.delete_lag_segments, self.remote_log_size_bytes,
                      self.remote_log_metadata_count):
            gauge.clear()
        for topic, stats in by_topic.items():
            self.delete_lag_bytes.labels(topic).set(stats.delete_lag_bytes)
            self.delete_lag_segments.labels(topic).set(stats.delete_lag_segments)
            self.remote_log_size_bytes.labels(topic).set(stats.size_bytes)
            self.remote_log_metadata_count.labels(topic).set(stats.metadata_count)


def _topic_of(partition: str) -> str:
    """The topic of "topic-partition" as the reports write it; a topic name or `*` as is."""
    topic, dash, number = partition.rpartition("-")
    return topic if dash and number.isdigit() else partition
