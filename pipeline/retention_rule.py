"""Kafka's time and size retention rule, shared by local and remote retention.

The rules are Kafka's (`UnifiedLog.deleteRetentionMsBreachedSegments` and
`deleteRetentionSizeBreachedSegments`, and `RemoteLogManager`'s expiration task), with
remote segments as the unit, oldest first:
- time: a segment goes when its largest timestamp is older than now - retention.ms;
- size: with `diff` = bytes of the segments - retention.bytes, the oldest segments go
  while each fits in what is left of `diff`, so what remains never drops below the limit;
- each rule selects a prefix of the log; a segment goes if either rule says so.

A module of its own because `pipeline.retention` imports both of its users.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tierproxy.storage.model import RemoteLogSegmentMetadata, RemoteLogSegmentState


def finished_segments(segments: Iterable[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    """The COPY_SEGMENT_FINISHED segments of `segments` (any states, any order), oldest first."""
    return sorted(
        (s for s in segments if s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED),
        key=lambda s: (s.start_offset, s.end_offset),
    )


def retention_prefix(
    segments: Sequence[RemoteLogSegmentMetadata], retention_ms: int, retention_bytes: int, now_ms: int
) -> tuple[int, str]:
    """How many of the oldest `segments` (in log order) retention deletes, and why: "time",
    "size", "time+size", or "" when none. A limit of -1 (any negative) is off."""
    by_time = 0
    if retention_ms >= 0:
        cutoff = now_ms - retention_ms
        while by_time < len(segments) and segments[by_time].max_timestamp_ms < cutoff:
            by_time += 1
    by_size = 0
    if retention_bytes >= 0:
        diff = sum(s.segment_size_in_bytes for s in segments) - retention_bytes
        while by_size < len(segments) and diff - segments[by_size].segment_size_in_bytes >= 0:
            diff -= segments[by_size].segment_size_in_bytes
            by_size += 1
    count = max(by_time, by_size)
    reason = "+".join(name for name, n in (("time", by_time), ("size", by_size)) if n == count) if count else ""
    return count, reason
