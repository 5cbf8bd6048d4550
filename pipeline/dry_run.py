"""`tierproxy tier --dry-run`: what a pass would copy, trim and expire, changing nothing.

The pass's own steps run against the real cluster and store, read-only: the plan
(`plan.plan_pass`), then each partition's copy (`copy.copy_partition`, on the driver) with a
store and metadata that only record what would be uploaded and added, so that the segments
are cut exactly as a pass cuts them; then local retention's rule (`local_retention.local_trim`)
and remote retention's (`remote_retention.expired_segments`) over the remote log as it would
be after those segments commit, with the check of the remote segments a trim would leave
only remote (`local_retention.damaged_segments`): a damaged one stops that trim, reported
as the pass reports it, so the dry run fails where the pass would. Nothing is written to the store or the metadata, and no
DeleteRecords is sent. The result is a PassReport, printed like a pass's summary.

What a dry run shows is what a pass started right after it does, as long as the data, the
clock (time retention) and the store stay as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from tierproxy.config import Config
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import RemoteLogSegmentMetadata, RemoteLogSegmentState
from tierproxy.storage.rsm import RemoteStorageManager

from tierproxy.client.cluster import Cluster
from .copy import copy_partition
from .failures import log_failure
from .local_retention import LocalRetentionLimits, LocalTrim, TrimDecision, damaged_segments, local_trim, trim_stopped
from .plan import PartitionPlan
from .remote_retention import RemoteExpiry, expired_segments

S = RemoteLogSegmentState
log = logging.getLogger(__name__)


class _Recording:
    """The store and the metadata as a copy sees them, writing nothing: segments are
    recorded instead of added and uploaded; index reads go to the real store."""

    def __init__(self, rsm: RemoteStorageManager) -> None:
        self._rsm = rsm
        self.added: list[RemoteLogSegmentMetadata] = []

    async def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        self.added.append(metadata)

    async def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: Any) -> None:
        pass

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: Any) -> bytes:
        return await self._rsm.fetch_index(metadata, index_type)


async def dry_copy(config: Config, cluster: Cluster, rsm: RemoteStorageManager, plan: PartitionPlan,
                   ) -> tuple[list[RemoteLogSegmentMetadata], int]:
    """The segments a pass would commit for `plan` (COPY_SEGMENT_FINISHED), and the bytes of
    the tail left waiting."""
    recording = _Recording(rsm)
    with tempfile.TemporaryDirectory(prefix=f"tierproxy-dry-run-{plan.topic}-{plan.partition}-") as work_dir:
        result = await copy_partition(config, plan, cluster=cluster,
                                      rsm=recording,  # type: ignore[arg-type]  # stands in with what a copy calls
                                      rlmm=recording,  # type: ignore[arg-type]  # likewise
                                      work_dir=Path(work_dir))
    return [dataclasses.replace(m, state=S.COPY_SEGMENT_FINISHED) for m in recording.added], result.pending_bytes


async def _trim_checked(rsm: RemoteStorageManager, retention: Any, plan: PartitionPlan, trim: TrimDecision,
                        existing: list[RemoteLogSegmentMetadata]) -> bool:
    """Whether the pass would trim as `trim` says: the segments it leaves only remote that are
    in the store already are checked as the pass checks them (those it would copy first are
    checked by the pass after their copy). Otherwise the partition's failure is in
    `retention` (a RetentionReport), as the pass would report it."""
    from .retention import LOCAL_RETENTION, RetentionFailure

    tp = plan.topic_id_partition
    stored = {m.segment_id for m in existing}
    try:
        damaged = await damaged_segments(rsm, [s for s in trim.segments if s.segment_id in stored])
    except Exception as e:  # the store cannot be asked: the pass would fail this partition's trim too
        error = log_failure(log, logging.WARNING, f"dry run: local retention of {tp}", e)
        retention.failures.append(RetentionFailure(LOCAL_RETENTION, str(tp), error))
        return False
    for damage in damaged:
        log.error("dry run: local retention of %s would stop at log start offset %d: %s",
                  tp, plan.local_log_start_offset, damage)
    if damaged:
        retention.damaged += damaged
        retention.failures.append(RetentionFailure(LOCAL_RETENTION, str(tp), trim_stopped("trim would stop", damaged)))
    return not damaged


async def dry_pass(config: Config, cluster: Cluster, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                   report: Any, plans: list[PartitionPlan], *, retention: bool) -> None:
    """Fills `report` (a PassReport whose partitions are `plans`) with what a pass would do."""
    from .retention import RetentionReport

    report.retention = RetentionReport()
    tps = [(p.topic, p.partition) for p in plans]
    topics = await cluster.topics({p.topic for p in plans}) if plans else {}
    ends = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST) if tps else {}
    now_ms = int(time.time() * 1000)
    for summary in report.partitions:
        plan = summary.plan
        tp = plan.topic_id_partition
        existing = rlmm.list_segments(tp)
        summary.cleaned = sum(1 for m in existing if m.state == S.COPY_SEGMENT_STARTED)  # orphans to delete
        new, summary.pending_bytes = await dry_copy(config, cluster, rsm, plan) if not plan.empty else ([], 0)
        summary.segments, summary.bytes = len(new), sum(m.segment_size_in_bytes for m in new)
        if new:
            summary.copied = (new[0].start_offset, new[-1].end_offset + 1)
        if not retention or rlmm.partition_delete_state(tp) is not None:
            continue
        segments = [*existing, *new]
        topic = config.topic(plan.topic)
        trim = local_trim(segments, plan.local_log_start_offset, ends[(plan.topic, plan.partition)].offset,
                          LocalRetentionLimits.of(topic), now_ms)
        if trim is not None and await _trim_checked(rsm, report.retention, plan, trim, existing):
            report.retention.trimmed.append(LocalTrim(
                tp, plan.local_log_start_offset, trim.new_log_start_offset, len(trim.segments),
                sum(s.segment_size_in_bytes for s in trim.segments), trim.reason))
        expired, reason = expired_segments(segments, topic.retention_ms, topic.retention_bytes, now_ms)
        pending = [m for m in existing if m.state == S.DELETE_SEGMENT_STARTED]
        if expired or pending:
            start = rlmm.log_start_offset(tp)
            report.retention.expired.append(RemoteExpiry(
                tp, start, expired[-1].end_offset + 1 if expired else start, len(expired),
                sum(s.segment_size_in_bytes for s in expired), len(pending), reason))
