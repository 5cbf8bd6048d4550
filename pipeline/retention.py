"""Retention after a tiering pass, in three steps:

1. local retention (`local_retention`): DeleteRecords advances each tiered partition's log
   start offset on the broker, only over data COPY_SEGMENT_FINISHED remotely and found
   intact in the store;
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
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tierproxy.config import Config
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.verify import SegmentDamage

from tierproxy.client.cluster import Cluster
from .failures import log_failure
from .local_retention import LocalTrim, apply_local_retention
from .partition_remover import PartitionRemoval, remove_deleted_partitions
from .remote_retention import RemoteExpiry, apply_remote_retention

class _StepResult(Protocol):
    failures: list[tuple[str, str]]  # (partition, error)


T = TypeVar("T", bound=_StepResult)
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
    damaged: list[SegmentDamage] = field(default_factory=list)  # remote segments that stopped a trim
    expired: list[RemoteExpiry] = field(default_factory=list)
    removed: list[PartitionRemoval] = field(default_factory=list)
    failures: list[RetentionFailure] = field(default_factory=list)
    partition_remover_ran: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def trims_stopped(self) -> int:
        """The failures that are trims stopped by damaged remote segments (`damaged`)."""
        partitions = {str(d.segment.topic_id_partition) for d in self.damaged}
        return sum(1 for f in self.failures if f.step == LOCAL_RETENTION and f.partition in partitions)


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
    await rlmm.refresh()
    tiered = [t.name for t in config.tiered_topics]
    try:
        topics = await cluster.topics(tiered) if tiered else {}
    except Exception as e:
        report.failures += [_step_failed(LOCAL_RETENTION, e), _step_failed(REMOTE_RETENTION, e)]
        topics = None

    if topics is not None:
        local = await _step(report, LOCAL_RETENTION, apply_local_retention(config, cluster, rlmm, rsm, topics,
                                                                           now_ms=now_ms))
        if local is not None:
            report.trimmed = local.trimmed
            report.damaged = local.damaged
        remote = await _step(report, REMOTE_RETENTION, apply_remote_retention(config, rlmm, rsm, topics,
                                                                             now_ms=now_ms))
        if remote is not None:
            report.expired = remote.expired
    removal = await _step(report, PARTITION_REMOVAL, remove_deleted_partitions(
        config, cluster, rlmm, rsm, now_ms=now_ms, force=force_partition_removal))
    if removal is not None:
        report.partition_remover_ran = removal.ran
        report.removed = removal.removed
    return report


async def _step(report: RetentionReport, step: str, run: Awaitable[T]) -> T | None:
    """One step's result, its partitions' failures added to the report; None (the step's
    failure added) when the step failed as a whole: the next steps still run."""
    try:
        result = await run
    except Exception as e:
        report.failures.append(_step_failed(step, e))
        return None
    report.failures += _partition_failures(step, result.failures)
    return result


def _step_failed(step: str, error: Exception) -> RetentionFailure:
    return RetentionFailure(step, "*", log_failure(log, logging.WARNING, step, error))


def _partition_failures(step: str, failures: list[tuple[str, str]]) -> list[RetentionFailure]:
    return [RetentionFailure(step, partition, error) for partition, error in failures]
