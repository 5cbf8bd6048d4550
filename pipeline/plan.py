"""Plan of one tiering pass, made on the driver: what each tiered partition still has to copy.

For each partition of each tiered topic present in the cluster (KIP-405's offsets):

    Lx  local log start offset   ListOffsets EARLIEST
    Ly  last stable offset       ListOffsets LATEST, READ_COMMITTED
    Ry  remote log end offset    highest end offset of the COPY_SEGMENT_FINISHED segments

the copy range is [max(Ry + 1, Lx), Ly). Data at or above Ly is never copied: it may still
belong to an open transaction, like the broker's active segment. When Ry + 1 < Lx the broker
dropped data that never reached remote storage: a gap, reported loudly, and copying resumes
at Lx.

A topic with `remote.log.copy.disable=true` (KIP-950) is planned with an empty range: its
remote data is still served and expired, nothing new is copied, and data the broker drops
by its own retention (local retention equals retention then, as Kafka requires) is no gap.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from dataclasses import dataclass

from tierproxy.config import Config
from tierproxy.protocol.apis import OffsetSpec
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.serde import serialize
from tierproxy.storage.model import RemoteLogSegmentState, TopicIdPartition

from tierproxy.client.cluster import READ_COMMITTED, Cluster
from .failures import log_failure

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """One partition's part of a pass; shipped to a Spark task, so plain values only."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    leader_epoch: int  # the partition leader's epoch when planned: the writer epoch of our metadata
    local_log_start_offset: int  # Lx
    last_stable_offset: int  # Ly
    remote_log_end_offset: int | None  # Ry; None when nothing is in remote storage yet
    start_offset: int  # first offset to copy
    end_offset: int  # exclusive: Ly
    segment_bytes: int
    segment_ms: int
    copy_disabled: bool = False  # remote.log.copy.disable: nothing is copied
    # The FINISHED segment ending at start_offset - 1 (serde bytes), whose producer snapshot
    # and leader-epoch checkpoint carry over into the first segment copied now.
    previous_segment: bytes | None = None

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, self.topic, self.partition)

    @property
    def gap(self) -> bool:
        """Data between the remote end and the local log start was lost before it was tiered."""
        if self.copy_disabled or self.remote_log_end_offset is None:
            return False
        return self.local_log_start_offset > self.remote_log_end_offset + 1

    @property
    def empty(self) -> bool:
        return self.start_offset >= self.end_offset

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.start_offset}, {self.end_offset})"


def copy_range(local_log_start: int, last_stable: int, remote_end: int | None) -> tuple[int, int]:
    """[start, end) still to copy: from after the remote end (never below the local log start)
    up to the last stable offset."""
    start = local_log_start if remote_end is None else max(remote_end + 1, local_log_start)
    return start, max(start, last_stable)


async def tiered_partition_counts(config: Config, cluster: Cluster) -> dict[str, int]:
    """Each tiered topic present in the cluster -> its partition count in the cluster's
    metadata, whatever of it is tiered yet (what a read replica's topic must have)."""
    names = [t.name for t in config.tiered_topics]
    topics = await cluster.topics(names) if names else {}
    return {name: len(info.partitions) for name, info in topics.items()}


async def plan_pass(
    config: Config, cluster: Cluster, rlmm: RemoteLogMetadataManager, *, metadata_timeout_s: float = 30.0,
    unplanned: dict[tuple[str, int], str] | None = None,
) -> list[PartitionPlan]:
    """Every partition of every tiered topic present in the cluster, by topic and partition.
    A partition whose leader does not answer (or refuses) raises; with `unplanned` it is
    left out and its error put there, so that one broker down fails only its partitions."""
    tiered = {t.name: t for t in config.tiered_topics}
    if not tiered:
        return []
    topics = await cluster.topics(tiered)
    for missing in sorted(set(tiered) - set(topics)):
        log.warning("tiered topic %s is not in the cluster; skipped", missing)
    tps = [(name, p) for name, info in sorted(topics.items()) for p in sorted(info.partitions)]
    if not tps:
        return []
    failures: dict[tuple[str, int], Exception] | None = None if unplanned is None else {}
    earliest = await cluster.list_offsets(topics, tps, OffsetSpec.EARLIEST, failures=failures)
    stable = await cluster.list_offsets(topics, [tp for tp in tps if tp in earliest], OffsetSpec.LATEST,
                                        isolation_level=READ_COMMITTED, failures=failures)
    for (name, p), error in (failures or {}).items():
        assert unplanned is not None
        unplanned[(name, p)] = log_failure(log, logging.ERROR, f"planning {name}-{p}", error)

    plans = []
    for name, p in tps:
        if (name, p) not in stable:
            continue
        info, settings = topics[name], tiered[name]
        tip = TopicIdPartition(info.topic_id, name, p)
        await rlmm.wait_until_ready(tip, metadata_timeout_s)
        remote_end = rlmm.log_end_offset(tip)
        start, end = copy_range(earliest[(name, p)].offset, stable[(name, p)].offset, remote_end)
        if settings.remote_log_copy_disable:
            end = start
        plan = PartitionPlan(
            topic=name,
            topic_id=info.topic_id,
            partition=p,
            leader_epoch=info.partitions[p].leader_epoch,
            local_log_start_offset=earliest[(name, p)].offset,
            last_stable_offset=stable[(name, p)].offset,
            remote_log_end_offset=remote_end,
            start_offset=start,
            end_offset=end,
            segment_bytes=settings.segment_bytes,
            segment_ms=settings.segment_ms,
            copy_disabled=settings.remote_log_copy_disable,
            previous_segment=_previous_segment(rlmm, tip, start),
        )
        if plan.gap:
            assert remote_end is not None  # a gap is one after the remote end
            log.error(
                "GAP in %s-%d: remote storage ends at offset %d but the broker's log starts at %d; "
                "offsets [%d, %d) were deleted locally before they were tiered and are lost",
                name, p, remote_end, plan.local_log_start_offset, remote_end + 1, plan.local_log_start_offset,
            )
        plans.append(plan)
    return plans


def _previous_segment(rlmm: RemoteLogMetadataManager, tip: TopicIdPartition, start: int) -> bytes | None:
    """The last (by start offset) FINISHED segment ending at start - 1: among those holding that
    offset, which the metadata finds by bisection."""
    previous = None
    for m in itertools.takewhile(lambda m: m.start_offset < start, rlmm.segments_from(tip, start - 1)):
        if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED and m.end_offset == start - 1:
            previous = m
    return serialize(previous) if previous is not None else None
