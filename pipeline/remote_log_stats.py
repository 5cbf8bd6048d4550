"""A partition's remote log in figures, after a pass: its size, its metadata, and what
retention still has to delete (the pipeline's metrics, Kafka's RemoteLogSizeBytes,
RemoteLogMetadataCount and RemoteDelete lag)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierproxy.config import TopicConfig
from tierproxy.storage.model import RemoteLogSegmentMetadata, RemoteLogSegmentState

from .remote_retention import expired_segments
from .retention_rule import finished_segments

__all__ = ("RemoteLogStats", "remote_log_stats")


@dataclass(frozen=True, slots=True)
class RemoteLogStats:
    topic: str
    size_bytes: int = 0  # COPY_SEGMENT_FINISHED segments
    metadata_count: int = 0  # segments in any state but DELETE_SEGMENT_FINISHED
    delete_lag_bytes: int = 0  # past retention, or whose delete began, and not deleted yet
    delete_lag_segments: int = 0

    def __add__(self, other: RemoteLogStats) -> RemoteLogStats:
        return RemoteLogStats(self.topic, self.size_bytes + other.size_bytes,
                              self.metadata_count + other.metadata_count,
                              self.delete_lag_bytes + other.delete_lag_bytes,
                              self.delete_lag_segments + other.delete_lag_segments)


def remote_log_stats(segments: Sequence[RemoteLogSegmentMetadata], topic: TopicConfig, now_ms: int) -> RemoteLogStats:
    """`segments`: a partition's, as the metadata manager lists them."""
    deleting = [s for s in segments if s.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED]
    expired, _ = expired_segments(segments, topic.retention_ms, topic.retention_bytes, now_ms)
    lag = deleting + expired
    return RemoteLogStats(
        topic.name,
        size_bytes=sum(s.segment_size_in_bytes for s in finished_segments(segments)),
        metadata_count=len(segments),
        delete_lag_bytes=sum(s.segment_size_in_bytes for s in lag),
        delete_lag_segments=len(lag),
    )
