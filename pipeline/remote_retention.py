"""Remote retention: expire remote segments past `retention.ms` / `retention.bytes`.

Kafka's rules (`RemoteLogManager`'s expiration task, `retention_rule`), applied to the
COPY_SEGMENT_FINISHED segments of a partition, oldest first: each rule expires a prefix of
the remote log, so the log start only moves forward and no hole opens in the middle.

A segment is deleted through DELETE_SEGMENT_STARTED -> delete its objects ->
DELETE_SEGMENT_FINISHED. A failure leaves it in DELETE_SEGMENT_STARTED, which is already no
longer served, and stops that partition's pass (so nothing newer goes first); the next pass
finishes every DELETE_SEGMENT_STARTED segment before expiring more.

Expiring remote data the broker still holds is fine: local retention never keeps less than
remote retention (it applies the smaller of the two), and consumers read it from the broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from tierproxy.config import Config
from tierproxy.storage.errors import RemoteLogMetadataError
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierproxy.storage.rsm import RemoteStorageManager

from tierproxy.client.cluster import TopicInfo
from .failures import log_failure
from .local_retention import METADATA_READY_TIMEOUT_S
from .retention_rule import finished_segments, retention_prefix

log = logging.getLogger(__name__)

# Partitions expired at the same time; each one deletes its segments in order.
CONCURRENT_PARTITIONS = 16


@dataclass(frozen=True, slots=True)
class RemoteExpiry:
    """What one partition's pass deleted from remote storage."""

    topic_id_partition: TopicIdPartition
    old_log_start_offset: int | None  # remote log start offsets; None when nothing is finished
    new_log_start_offset: int | None
    segments: int  # segments expired in this pass
    bytes: int
    completed: int  # DELETE_SEGMENT_STARTED segments left by an earlier pass, finished now
    reason: str  # "time", "size", "time+size", or "" when only `completed`


def expired_segments(
    segments: Iterable[RemoteLogSegmentMetadata], retention_ms: int, retention_bytes: int, now_ms: int
) -> tuple[list[RemoteLogSegmentMetadata], str]:
    """The oldest COPY_SEGMENT_FINISHED segments that retention expires, and why."""
    finished = finished_segments(segments)
    count, reason = retention_prefix(finished, retention_ms, retention_bytes, now_ms)
    return finished[:count], reason


async def delete_segment(
    rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, segment: RemoteLogSegmentMetadata, leader_epoch: int
) -> None:
    """DELETE_SEGMENT_STARTED (unless it already is) -> objects deleted -> DELETE_SEGMENT_FINISHED."""
    if segment.state != RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
        await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            segment.segment_id, wall_clock_ms(), RemoteLogSegmentState.DELETE_SEGMENT_STARTED, leader_epoch))
    await rsm.delete_log_segment_data(segment)
    try:
        await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            segment.segment_id, wall_clock_ms(), RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, leader_epoch))
    except RemoteLogMetadataError:
        # Another cleaner may have finished it between our reads (the objects are gone
        # either way); anything else is a real failure.
        tp = segment.topic_id_partition
        if any(s.segment_id == segment.segment_id for s in rlmm.list_segments(tp)):
            raise
        log.info("segment %s of %s was already deleted", segment.segment_id.id, tp)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class RemoteRetentionResult:
    expired: list[RemoteExpiry]
    failures: list[tuple[str, str]]  # (partition, error)


async def apply_remote_retention(
    config: Config,
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    topics: dict[str, TopicInfo],
    *,
    now_ms: int,
) -> RemoteRetentionResult:
    """Expire remote segments of every partition of `topics` (the tiered topics, with their
    current topic ids); a partition that failed is reported and the others go on."""
    result = RemoteRetentionResult([], [])
    limit = asyncio.Semaphore(CONCURRENT_PARTITIONS)

    async def expire(name: str, info: TopicInfo, partition: int) -> None:
        tp = TopicIdPartition(info.topic_id, name, partition)
        topic = config.topic(name)
        async with limit:
            try:
                expiry = await expire_partition(
                    rlmm, rsm, tp, topic.retention_ms, topic.retention_bytes,
                    now_ms=now_ms, leader_epoch=info.partitions[partition].leader_epoch,
                )
            except Exception as e:  # one partition's failure must not stop the others
                result.failures.append((str(tp), log_failure(log, logging.WARNING, f"remote retention of {tp}", e)))
                return
        if expiry is not None:
            result.expired.append(expiry)

    await asyncio.gather(*(expire(name, info, p) for name, info in topics.items() for p in sorted(info.partitions)))
    result.expired.sort(key=lambda e: (e.topic_id_partition.topic, e.topic_id_partition.partition))
    return result


async def expire_partition(
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    tp: TopicIdPartition,
    retention_ms: int,
    retention_bytes: int,
    *,
    now_ms: int,
    leader_epoch: int,
) -> RemoteExpiry | None:
    """One partition's pass: finish interrupted deletes, then expire. None when nothing changed."""
    await rlmm.wait_until_ready(tp, METADATA_READY_TIMEOUT_S)
    if rlmm.partition_delete_state(tp) is not None:
        return None  # the partition remover owns it
    old_start = rlmm.log_start_offset(tp)
    segments = rlmm.list_segments(tp)
    pending = [s for s in segments if s.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED]
    for segment in pending:
        await delete_segment(rlmm, rsm, segment, leader_epoch)
    expired, reason = expired_segments(segments, retention_ms, retention_bytes, now_ms)
    for segment in expired:
        await delete_segment(rlmm, rsm, segment, leader_epoch)
    if not pending and not expired:
        return None
    new_start = rlmm.log_start_offset(tp)
    log.info("remote retention of %s: %d segments expired (%s), %d interrupted deletes finished, "
             "remote log start %s -> %s", tp, len(expired), reason or "-", len(pending), old_start, new_start)
    return RemoteExpiry(
        tp, old_start, new_start, len(expired), sum(s.segment_size_in_bytes for s in expired), len(pending), reason,
    )
