"""In-memory remote log metadata, per partition and per leader epoch; shared by both backends.

Follows Kafka's `RemoteLogMetadataCache` and `RemoteLogLeaderEpochState`:

| method / state                    | COPY_STARTED | COPY_FINISHED | DELETE_STARTED | DELETE_FINISHED |
|-----------------------------------|--------------|---------------|----------------|-----------------|
| segment_for(offset, epoch)        | no           | yes           | no             | no              |
| list_segments(tp[, epoch]), segments_from | yes  | yes           | yes            | no (forgotten)  |
| log_start/end_offset, lineage     | no           | yes           | no             | no              |

Per leader epoch, COPY_SEGMENT_FINISHED segments are "referenced" by the start offset of
that epoch in the segment; the others are "unreferenced" (kept for listing and cleanup).
When a segment finishes whose epoch range covers the newest referenced ones of an epoch
(a new leader uploaded a superset after an election), those are unreferenced, as Kafka does.

Two kinds of calls: `apply` checks a record against the state and raises on a broken rule
(used before a write), `replay` applies a record read back from a store and drops
one that breaks a rule with a log line (Kafka's consumer does the same, so every reader of
the same records converges on the same state).

Lineage: `is_segment_within_lineage` is Kafka's `RemoteLogManager.isRemoteSegmentWithinLeaderEpochs`;
`segment_for(..., epoch_chain=...)` and `segments_in_lineage` serve only segments that pass it.
Truncation: see `serde.RemoteLogTruncation`. A straddling segment is stored with its end
offset cut to `truncation_offset - 1` and its leader epochs starting at or above the cut
dropped, so every query (and the materialized flat files) sees the cut segment.

Each partition's state is compact (`partition.py`); lookups by offset are bisections, and a
RemoteLogSegmentMetadata is made only for what a lookup returns. Where several segments tie,
the one added first comes first.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator

from ..errors import IllegalStateTransition, RemoteLogMetadataError
from ..model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    check_partition_delete_transition,
    check_segment_transition,
)
from .lineage import EpochChain, end_offset_for, epoch_end_offset, is_segment_within_lineage
from .partition import PartitionState
from .serde import RemoteLogMetadata, RemoteLogTruncation

__all__ = [
    "DuplicateSegment",
    "EpochChain",
    "RemoteLogMetadataCache",
    "UnknownSegment",
    "epoch_end_offset",
    "is_segment_within_lineage",
]

log = logging.getLogger(__name__)

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


class UnknownSegment(RemoteLogMetadataError):
    """An update names a segment this metadata does not know (Kafka: RemoteResourceNotFoundException)."""


class DuplicateSegment(RemoteLogMetadataError):
    """A segment id added twice."""


# Every cache numbers its changes from this one sequence, so that a manager that swaps its
# cache for a new one (read again from scratch) shows a new `partitions_version` too.
_VERSIONS = itertools.count(1)


class RemoteLogMetadataCache:
    """The state of every partition's remote log, built from metadata records."""

    def __init__(self) -> None:
        self._partitions: dict[TopicIdPartition, PartitionState] = {}
        # One topic id and name object per topic, not one per partition (each record decodes its own).
        self._topics: dict[tuple[uuid.UUID, str], tuple[uuid.UUID, str]] = {}
        self.partitions_version = 0
        """Changes whenever a partition is added or installed, or its delete state changes
        (not with its segments): while it stays, `partitions()` and every
        `partition_delete_state` answer the same."""

    def _changed(self) -> None:
        self.partitions_version = next(_VERSIONS)

    def _partition(self, tp: TopicIdPartition) -> PartitionState:
        p = self._partitions.get(tp)
        if p is None:
            topic_id, topic = self._topics.setdefault((tp.topic_id, tp.topic), (tp.topic_id, tp.topic))
            tp = TopicIdPartition(topic_id, topic, tp.partition)
            p = self._partitions[tp] = PartitionState(tp)
            self._changed()
        return p

    def _row(self, segment_id: RemoteLogSegmentId) -> tuple[PartitionState, int] | tuple[None, None]:
        p = self._partitions.get(segment_id.topic_id_partition)
        row = p.find(segment_id.id) if p is not None else None
        return (p, row) if p is not None and row is not None else (None, None)

    # ------------------------------------------------------------------ writes

    def check(self, record: RemoteLogMetadata) -> None:
        """Raises if applying `record` would break a rule; changes nothing."""
        if isinstance(record, RemoteLogSegmentMetadata):
            if record.state != _STARTED:
                raise IllegalStateTransition(
                    f"segment {record.segment_id} must be added in COPY_SEGMENT_STARTED, not {record.state.name}")
            if self._row(record.segment_id)[0] is not None:
                raise DuplicateSegment(f"segment {record.segment_id} already exists")
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            p, row = self._row(record.segment_id)
            if p is None or row is None:
                raise UnknownSegment(f"no remote log segment metadata for {record.segment_id}")
            check_segment_transition(p.state(row), record.state)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            current = self.partition_delete_state(record.topic_id_partition)
            check_partition_delete_transition(current, record.state)
        elif isinstance(record, RemoteLogTruncation):
            pass  # any offset >= 0 (checked by the record itself)
        else:
            raise TypeError(f"not a remote log metadata record: {type(record).__name__}")

    def apply(self, record: RemoteLogMetadata) -> None:
        """Checks then applies; raises (changing nothing) on a broken rule."""
        self.check(record)
        self._apply(record)

    def replay(self, record: RemoteLogMetadata) -> bool:
        """Applies a record read back from a store; one that breaks a rule is logged and dropped."""
        try:
            self.check(record)
        except RemoteLogMetadataError as exc:
            log.warning("dropping remote log metadata record %s: %s", record, exc)
            return False
        self._apply(record)
        return True

    def restore(self, record: RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata) -> None:
        """Loads one entry of a materialized snapshot: a segment in any state but
        DELETE_SEGMENT_FINISHED, or a partition's delete state. No transition check."""
        p = self._partition(record.topic_id_partition)
        if isinstance(record, RemotePartitionDeleteMetadata):
            p.delete_metadata = record
            self._changed()
            return
        if record.state == _DELETE_FINISHED:
            return
        row = p.find(record.segment_id.id)
        if row is None:
            p.add(record)
        else:
            p.replace(row, record)

    def _apply(self, record: RemoteLogMetadata) -> None:
        if isinstance(record, RemoteLogSegmentMetadata):
            self._partition(record.topic_id_partition).add(record)
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            p, row = self._row(record.segment_id)
            assert p is not None and row is not None  # checked
            p.transition(row, record.state, record.event_timestamp_ms, record.leader_epoch)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            self._partition(record.topic_id_partition).delete_metadata = record
            self._changed()
        else:
            self._partition(record.topic_id_partition).truncate(
                record.truncation_offset, record.leader_epoch, record.event_timestamp_ms)

    # ------------------------------------------------------------------ whole partitions (snapshots)

    def partition_state(self, tp: TopicIdPartition) -> PartitionState | None:
        return self._partitions.get(tp)

    def partition_states(self) -> list[PartitionState]:
        return list(self._partitions.values())

    def install(self, state: PartitionState) -> None:
        """Takes a partition's whole state, loaded from a snapshot, in place of what was known."""
        self._partitions[state.tp] = state
        self._changed()

    # ------------------------------------------------------------------ reads

    def partitions(self) -> list[TopicIdPartition]:
        return list(self._partitions)

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        p, row = self._row(segment_id)
        return p.segment(row) if p is not None and row is not None else None

    def segment_for(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int, epoch_chain: EpochChain | None = None
    ) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding `offset` written in `leader_epoch`.

        With `epoch_chain`, only a segment within that lineage is served; when the segment
        Kafka's lookup picks is not, another finished segment of the epoch holding the
        offset and within the lineage is (the one reaching furthest)."""
        p = self._partitions.get(tp)
        if p is None:
            return None
        row = p.epochs.floor(leader_epoch, offset)
        if row is not None and offset <= p.epoch_end(row, leader_epoch) and (
                epoch_chain is None or p.within_lineage(row, epoch_chain)):
            return p.segment(row)
        if epoch_chain is None:
            return None
        best: int | None = None
        for row in p.epochs.rows(leader_epoch):
            if p.state(row) != _FINISHED:
                continue
            start = dict(p.leader_epochs(row)).get(leader_epoch)
            if start is not None and start <= offset <= p.epoch_end(row, leader_epoch) \
                    and p.within_lineage(row, epoch_chain):
                if best is None or p.offsets(row)[1] > p.offsets(best)[1]:
                    best = row
        return p.segment(best) if best is not None else None

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        p = self._partitions.get(tp)
        return p.epochs.highest_offset(leader_epoch) if p is not None else None

    def end_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> tuple[int, int]:
        """(leader epoch, end offset) of `leader_epoch` in the remote log (`lineage.end_offset_for`):
        the latest epoch ends at the remote log end offset + 1."""
        p = self._partitions.get(tp)
        if p is None:
            return end_offset_for((), leader_epoch, 0)
        end = p.log_end_offset()
        return end_offset_for(p.epochs.history(), leader_epoch, end + 1 if end is not None else 0)

    def list_segments(self, tp: TopicIdPartition, leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """Segments not DELETE_SEGMENT_FINISHED (of `leader_epoch` if given), by start offset."""
        p = self._partitions.get(tp)
        if p is None:
            return []
        if leader_epoch is None:
            rows = list(p.ordered_rows())
        else:
            rows = sorted(p.epochs.rows(leader_epoch), key=lambda row: (*p.offsets(row), row))
        return [p.segment(row) for row in rows]

    def segments_from(self, tp: TopicIdPartition, offset: int) -> Iterator[RemoteLogSegmentMetadata]:
        """`list_segments(tp)` from the first segment ending at or after `offset` on, found by
        bisection; those ending before `offset` are left out. Iterate it before the partition
        changes (RuntimeError otherwise)."""
        p = self._partitions.get(tp)
        if p is None:
            return iter(())
        return (p.segment(row) for row in p.rows_from(offset))

    def segments_in_lineage(
        self, tp: TopicIdPartition, epoch_chain: EpochChain, log_end_offset: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        """COPY_SEGMENT_FINISHED segments within the lineage, by start offset."""
        p = self._partitions.get(tp)
        if p is None:
            return []
        return [p.segment(row) for row in p.ordered_rows()
                if p.state(row) == _FINISHED and p.within_lineage(row, epoch_chain, log_end_offset)]

    def partition_delete_state(self, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
        metadata = self.partition_delete_metadata(tp)
        return metadata.state if metadata is not None else None

    def partition_delete_metadata(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        p = self._partitions.get(tp)
        return p.delete_metadata if p is not None else None

    def log_start_offset(self, tp: TopicIdPartition) -> int | None:
        """Lowest start offset of the COPY_SEGMENT_FINISHED segments (the remote log start)."""
        p = self._partitions.get(tp)
        return p.log_start_offset() if p is not None else None

    def log_end_offset(self, tp: TopicIdPartition) -> int | None:
        """Highest end offset of the COPY_SEGMENT_FINISHED segments (the last offset in remote storage)."""
        p = self._partitions.get(tp)
        return p.log_end_offset() if p is not None else None

    def snapshot(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata]:
        """Entries that `restore` turns back into this partition's state: its live segments in
        the order they were added, then its delete state."""
        p = self._partitions.get(tp)
        if p is None:
            return []
        entries: list[RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata] = [
            p.segment(row) for row in p.live_rows()]
        if p.delete_metadata is not None:
            entries.append(p.delete_metadata)
        return entries
