"""Retention after a tiering pass, in three steps:

1. local retention (`local_retention`): DeleteRecords advances each tiered partition's log
   start offset on the broker, only over data COPY_SEGMENT_FINISHED remotely;
2. remote retention (`remote_retention`): remote segments past retention.ms / retention.bytes
   are deleted, oldest first;
3. partition removal (`partition_remover`): the remote data of topics deleted from the
   cluster, at most every remote.partition.remover.task.interval.ms.

Local retention goes first: it may trim over segments that remote retention then expires,
never the other way round. A failure in one partition is logged and reported, and the other
partitions and steps go on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tierproxy.config import Config
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.rsm import RemoteStorageManager

from tierproxy.client.cluster import Cluster
from .failures import log_failure
from .local_retention import LocalTrim, apply_local_retention
from .partition_remover import PartitionRemoval, remove_deleted_partitions
from .remote_retention import RemoteExpiry, apply_remote_retention

log = logging.getLogger(__name__)

LOCAL_RETENTION = "local retention"
REMOTE_RETENTION = "remote retention"
PARTITION_REMOVAL = "partition removal"


@dataclass(frozen=True, slots=True)
class RetentionFailure:
    step: str  # LOCAL_RETENTION, REMOTE_RETENTION or PARTITION_REMOVAL
    partition: str  # "topic-partition", a topic name, or "*" when the whole step failed
    error: str


@dataclass(slots=True)
class RetentionReport:
    trimmed: list[LocalTrim] = field(default_factory=list)
    expired: list[RemoteExpiry] = field(default_factory=list)
    removed: list[PartitionRemoval] = field(default_factory=list)
    failures: list[RetentionFailure] = field(default_factory=list)
    partition_remover_ran: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary_rows(self) -> list[tuple[str, str, str]]:
        """(partition, what happened, details), for the summary table."""
        rows = []
        for t in self.trimmed:
            rows.append((str(t.topic_id_partition), "trimmed locally",
                         f"log start {t.old_log_start_offset} -> {t.new_log_start_offset}, "
                         f"{t.segments} segments, {t.bytes} bytes ({t.reason})"))
        for e in self.expired:
            what = f"{e.segments} segments, {e.bytes} bytes ({e.reason})" if e.segments else "no new segments"
            if e.completed:
                what += f", {e.completed} interrupted deletes finished"
            rows.append((str(e.topic_id_partition), "expired remotely",
                         f"{what}, remote log start {_offset(e.old_log_start_offset)} -> "
                         f"{_offset(e.new_log_start_offset)}"))
        for r in self.removed:
            rows.append((f"{r.topic_id_partition} ({r.topic_id_partition.topic_id})", "removed",
                         f"{r.segments} segments, {r.objects} objects"))
        for f in self.failures:
            rows.append((f.partition, f"{f.step} failed", f.error))
        return rows


def _offset(offset: int | None) -> str:
    return "none" if offset is None else str(offset)


async def run_retention(
    config: Config,
    cluster: Cluster,
    rlmm: RemoteLogMetadataManager,
    rsm: RemoteStorageManager,
    *,
    now_ms: int,
    force_partition_removal: bool = False,
) -> RetentionReport:
    """Local retention, remote retention, then partition removal (due every
    remote.partition.remover.task.interval.ms, or now with `force_partition_removal`).
    `now_ms` is the clock retention compares timestamps and intervals with."""
    report = RetentionReport()
    # A file-backed manager shared with copy tasks in other processes sees their appends only
    # after a refresh; decisions must rest on every finished segment.
    refresh = getattr(rlmm, "refresh", None)
    if refresh is not None:
        await refresh()
    tiered = [t.name for t in config.tiered_topics]
    try:
        topics = await cluster.topics(tiered) if tiered else {}
    except Exception as e:
        report.failures += [_step_failed(LOCAL_RETENTION, e), _step_failed(REMOTE_RETENTION, e)]
        topics = None

    if topics is not None:
        try:
            local = await apply_local_retention(config, cluster, rlmm, topics, now_ms=now_ms)
        except Exception as e:
            report.failures.append(_step_failed(LOCAL_RETENTION, e))
        else:
            report.trimmed = local.trimmed
            report.failures += _partition_failures(LOCAL_RETENTION, local.failures)
        try:
            remote = await apply_remote_retention(config, rlmm, rsm, topics, now_ms=now_ms)
        except Exception as e:
            report.failures.append(_step_failed(REMOTE_RETENTION, e))
        else:
            report.expired = remote.expired
            report.failures += _partition_failures(REMOTE_RETENTION, remote.failures)

    try:
        removal = await remove_deleted_partitions(
            config, cluster, rlmm, rsm, now_ms=now_ms, force=force_partition_removal)
    except Exception as e:
        report.failures.append(_step_failed(PARTITION_REMOVAL, e))
    else:
        report.partition_remover_ran = removal.ran
        report.removed = removal.removed
        report.failures += _partition_failures(PARTITION_REMOVAL, removal.failures)
    return report


def _step_failed(step: str, error: Exception) -> RetentionFailure:
    return RetentionFailure(step, "*", log_failure(log, logging.WARNING, step, error))


def _partition_failures(step: str, failures: list[tuple[str, str]]) -> list[RetentionFailure]:
    return [RetentionFailure(step, partition, error) for partition, error in failures]
