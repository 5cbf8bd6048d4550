"""Local retention (KIP-405 `local.retention.ms` / `local.retention.bytes`) on a broker we do not modify.

The broker keeps every record until the pipeline trims it: for each tiered partition the
broker's log start offset is advanced with DeleteRecords, and only over data that is
COPY_SEGMENT_FINISHED in remote storage. So the new log start is always the end offset + 1
of a finished remote segment, reached through finished segments without a gap from the
current log start, and never past the remote log end offset + 1 (KIP-405: "local logs are
not cleaned up till those segments are copied successfully").

The broker's own time and size retention must therefore be off for tiered topics: set the
topic's `retention.ms=-1` and `retention.bytes=-1` on the broker (or values far beyond the
tierproxy settings), or the broker deletes data that was never copied. Data older than
tierproxy's `retention.ms` leaves the broker through this module, which applies the smaller
of `local.retention.ms` and `retention.ms` (Kafka refuses a local retention above the total).

Before the DeleteRecords, every segment the trim would leave only remote is checked where it
is stored (`storage.verify`): its objects are there with the size and CRC-32C recorded at
copy time. COPY_SEGMENT_FINISHED says the copy was whole once; an object deleted or altered
since would otherwise leave offsets that neither tier can serve (KAFKA-20732). A segment
that fails stops the trim of its partition, whose log start stays where it is, until the
segment is repaired or copied again; the other partitions go on.

The rules are Kafka's time and size rules (`retention_rule`), with local.retention.ms,
local.retention.bytes and the local size, over our remote segments as the unit of deletion.

Local size: the bytes of the finished remote segments from the segment holding the broker's
log start onwards, counted whole as Kafka counts the segment holding its log start. The
copies are byte-identical to the broker's batches, so this is exactly what the broker keeps
of the tiered range. The not-yet-tiered tail (below one segment plus the active data in a
steady state) is not counted: measuring it needs reading it, and the broker's own size
(DescribeLogDirs) keeps counting bytes below the log start until its log-retention check
removes whole segments, which would make every pass trim again. Not counting it errs on
keeping more data locally, never less.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tierproxy.protocol.apis import OffsetSpec
from tierproxy.config import Config, TopicConfig
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.verify import SegmentDamage, check_segments

from tierproxy.client.cluster import Cluster, ListedOffset, TopicInfo
from .failures import log_failure, one_line
from .retention_rule import finished_segments, retention_prefix

log = logging.getLogger(__name__)

METADATA_READY_TIMEOUT_S = 30.0
SEGMENT_CHECKS = 8  # segments of one partition checked at once


@dataclass(frozen=True, slots=True)
class LocalRetentionLimits:
    """Effective limits; -1 disables one."""

    retention_ms: int
    retention_bytes: int

    @classmethod
    def of(cls, topic: TopicConfig) -> LocalRetentionLimits:
        return cls(_smaller_limit(topic.local_retention_ms, topic.retention_ms),
                   _smaller_limit(topic.local_retention_bytes, topic.retention_bytes))


def _smaller_limit(local: int, total: int) -> int:
    """The stricter of two limits where -1 is unlimited (data past the total retention
    must leave the broker too)."""
    limits = [v for v in (local, total) if v >= 0]
    return min(limits) if limits else -1


@dataclass(frozen=True, slots=True)
class LocalTrim:
    """One partition whose broker log start offset moved."""

    topic_id_partition: TopicIdPartition
    old_log_start_offset: int
    new_log_start_offset: int
    segments: int  # finished remote segments now only remote (the first may have been partly local)
    bytes: int  # their sizes
    reason: str  # "time", "size" or "time+size"


@dataclass(frozen=True, slots=True)
class TrimDecision:
    new_log_start_offset: int
    segments: tuple[RemoteLogSegmentMetadata, ...]
    reason: str


def local_trim(
    segments: Iterable[RemoteLogSegmentMetadata],
    log_start_offset: int,
    high_watermark: int,
    limits: LocalRetentionLimits,
    now_ms: int,
) -> TrimDecision | None:
    """Where the broker's log start offset may move, or None.

    `segments` may be in any state and order; only COPY_SEGMENT_FINISHED ones count.
    """
    finished = finished_segments(segments)
    # The finished segments holding the local log from its start on, without a gap:
    # the broker's log start may move only through them.
    covering: list[RemoteLogSegmentMetadata] = []
    next_offset = log_start_offset
    for segment in finished:
        if segment.end_offset < next_offset:
            continue  # already trimmed locally (or overlapped by an earlier one)
        if segment.start_offset > next_offset or segment.end_offset >= high_watermark:
            break  # a gap, or remote data the broker does not (yet) have below its high watermark
        covering.append(segment)
        next_offset = segment.end_offset + 1
    if not covering:
        return None

    count, reason = retention_prefix(covering, limits.retention_ms, limits.retention_bytes, now_ms)
    if count == 0:
        return None
    return TrimDecision(covering[count - 1].end_offset + 1, tuple(covering[:count]), reason)


async def damaged_segments(rsm: RemoteStorageManager,
                           segments: Sequence[RemoteLogSegmentMetadata]) -> list[SegmentDamage]:
    """The segments of a trim that are not intact where they are stored (size and CRC-32C of
    every object): any one stops the trim. A pass and a dry run check alike."""
    checked = await check_segments(rsm, segments, check_crc=True, concurrency=SEGMENT_CHECKS)
    return [c for c in checked if isinstance(c, SegmentDamage)]


def trim_stopped(what: str, damaged: Sequence[SegmentDamage]) -> str:
    """A partition's failure for a trim its damaged segments stop."""
    return f"{what}: " + "; ".join(map(str, damaged))


@dataclass(slots=True)
class LocalRetentionResult:
    trimmed: list[LocalTrim]
    failures: list[tuple[str, str]]  # (partition, error)
    damaged: list[SegmentDamage] = field(default_factory=list)  # segments whose check stopped a trim


async def apply_local_retention(
    config: Config,
    cluster: Cluster,
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    topics: dict[str, TopicInfo],
    *,
    now_ms: int,
) -> LocalRetentionResult:
    """Advance the log start offset of every tiered partition in `topics` that local
    retention allows to move, with one DeleteRecords per partition, once the segments it
    leaves only remote are intact in `rsm`."""
    result = LocalRetentionResult([], [])
    partitions = [(name, p) for name, info in topics.items() for p in sorted(info.partitions)]
    if not partitions:
        return result
    starts = await listed_offsets(cluster, topics, partitions, OffsetSpec.EARLIEST, result.failures)
    ends = await listed_offsets(cluster, topics, partitions, OffsetSpec.LATEST, result.failures)

    async def trim(name: str, partition: int) -> None:
        tp = TopicIdPartition(topics[name].topic_id, name, partition)
        try:
            await rlmm.wait_until_ready(tp, METADATA_READY_TIMEOUT_S)
            if rlmm.partition_delete_state(tp) is not None:
                return
            log_start = starts[(name, partition)].offset
            decision = local_trim(
                rlmm.list_segments(tp), log_start, ends[(name, partition)].offset,
                LocalRetentionLimits.of(config.topic(name)), now_ms,
            )
            if decision is None:
                return
            damaged = await damaged_segments(rsm, decision.segments)
            if damaged:
                for damage in damaged:
                    log.error("local retention of %s stopped at log start offset %d: %s", tp, log_start, damage)
                result.damaged += damaged
                result.failures.append((str(tp), trim_stopped("trim stopped", damaged)))
                return
            low_watermarks = await cluster.delete_records(topics, {(name, partition): decision.new_log_start_offset})
            new_start = low_watermarks[(name, partition)]
        except Exception as e:  # one partition's failure must not stop the others
            result.failures.append((str(tp), log_failure(log, logging.WARNING, f"local retention of {tp}", e)))
            return
        log.info("local retention of %s: log start offset %d -> %d (%s, %d segments)",
                 tp, log_start, new_start, decision.reason, len(decision.segments))
        result.trimmed.append(LocalTrim(
            tp, log_start, new_start, len(decision.segments),
            sum(s.segment_size_in_bytes for s in decision.segments), decision.reason,
        ))

    await asyncio.gather(*(trim(name, p) for name, p in partitions if (name, p) in starts and (name, p) in ends))
    result.trimmed.sort(key=lambda t: (t.topic_id_partition.topic, t.topic_id_partition.partition))
    return result


async def listed_offsets(
    cluster: Cluster,
    topics: dict[str, TopicInfo],
    partitions: Sequence[tuple[str, int]],
    spec: int,
    failures: list[tuple[str, str]],
) -> dict[tuple[str, int], ListedOffset]:
    """ListOffsets for all partitions at once; when that fails, partition by partition, so
    one partition's error (appended to `failures`) leaves the others' answers."""
    try:
        return await cluster.list_offsets(topics, partitions, spec)
    except Exception:
        pass
    out: dict[tuple[str, int], ListedOffset] = {}
    for tp in partitions:
        try:
            out.update(await cluster.list_offsets(topics, [tp], spec))
        except Exception as e:
            log.warning("ListOffsets of %s-%d failed: %s", tp[0], tp[1], e)
            failures.append((f"{tp[0]}-{tp[1]}", one_line(e)))
    return out
