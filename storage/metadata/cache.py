"""In-memory remote log metadata, per partition and per leader epoch; shared by both backends.

Follows Kafka's `RemoteLogMetadataCache` and `RemoteLogLeaderEpochState`:

| method / state                    | COPY_STARTED | COPY_FINISHED | DELETE_STARTED | DELETE_FINISHED |
|-----------------------------------|--------------|---------------|----------------|-----------------|
| segment_for(offset, epoch)        | no           | yes           | no             | no              |
| list_segments(tp[, epoch])        | yes          | yes           | yes            | no (forgotten)  |
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
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
from .serde import RemoteLogMetadata, RemoteLogTruncation

log = logging.getLogger(__name__)

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

EpochChain = Sequence[tuple[int, int]]
"""A leader-epoch lineage: (leader epoch, start offset) pairs, as in Kafka's checkpoint file."""


class UnknownSegment(RemoteLogMetadataError):
    """An update names a segment this metadata does not know (Kafka: RemoteResourceNotFoundException)."""


class DuplicateSegment(RemoteLogMetadataError):
    """A segment id added twice."""


def epoch_end_offset(segment: RemoteLogSegmentMetadata, epoch: int) -> int:
    """Last offset of `epoch` inside the segment: the next epoch's start - 1, else the segment end."""
    epochs = segment.segment_leader_epochs
    i = bisect.bisect_right(epochs, (epoch, float("inf")))
    return epochs[i][1] - 1 if i < len(epochs) else segment.end_offset


def _filter_epochs_without_records(epochs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drops an epoch whose start offset equals the next one's (it holds no records); Kafka's
    `buildFilteredLeaderEpochMap`."""
    ordered = sorted(epochs)
    return [e for i, e in enumerate(ordered) if i + 1 == len(ordered) or ordered[i + 1][1] != e[1]]


def is_segment_within_lineage(
    segment: RemoteLogSegmentMetadata, epoch_chain: EpochChain, log_end_offset: int | None = None
) -> bool:
    """Kafka's `isRemoteSegmentWithinLeaderEpochs`: the segment's epochs and offsets agree with
    the chain, except that its first epoch may start before the chain's (an older segment
    overlapping a log start that moved) and its last epoch ends at its end offset, which must
    not pass the chain's next epoch start (nor `log_end_offset` when given)."""
    seg = _filter_epochs_without_records(segment.segment_leader_epochs)
    chain = _filter_epochs_without_records(epoch_chain)
    if not seg or not chain:
        return False
    chain_epochs = [e for e, _ in chain]
    chain_start = dict(chain)
    seg_last = seg[-1][0]
    if seg_last < chain_epochs[0] or seg_last > chain_epochs[-1]:
        return False
    valid = [(e, o) for e, o in seg if e >= chain_epochs[0]]
    if not valid:
        return False
    seg_first = valid[0][0]
    for i, (epoch, offset) in enumerate(valid):
        if epoch not in chain_start:
            return False
        j = chain_epochs.index(epoch)
        chain_next = chain[j + 1] if j + 1 < len(chain) else None
        if epoch == seg_first and j > 0 and offset < chain_start[epoch]:
            return False
        if epoch == seg_last:
            if chain_next is not None and segment.end_offset > chain_next[1] - 1:
                return False
        elif chain_next != valid[i + 1]:
            return False
    return log_end_offset is None or segment.end_offset < log_end_offset


@dataclass(slots=True)
class _EpochState:
    """One leader epoch of one partition (Kafka's `RemoteLogLeaderEpochState`)."""

    starts: list[int] = field(default_factory=list)  # sorted keys of `referenced`
    referenced: dict[int, RemoteLogSegmentId] = field(default_factory=dict)  # epoch start offset -> FINISHED
    unreferenced: set[RemoteLogSegmentId] = field(default_factory=set)
    highest_offset: int | None = None

    def floor(self, offset: int) -> RemoteLogSegmentId | None:
        i = bisect.bisect_right(self.starts, offset)
        return self.referenced[self.starts[i - 1]] if i else None

    def add_finished(self, start: int, segment_id: RemoteLogSegmentId, epoch_end: int) -> None:
        # A new leader may upload a superset of segments the previous one uploaded for this
        # epoch: the newest referenced ones at or after `start` are replaced.
        while self.starts and self.starts[-1] >= start and self.highest_offset is not None \
                and self.highest_offset <= epoch_end:
            self.unreferenced.add(self.referenced.pop(self.starts.pop()))
        previous = self.referenced.get(start)
        if previous is None:
            bisect.insort(self.starts, start)
        elif previous != segment_id:
            self.unreferenced.add(previous)  # Kafka overwrites; keep it listable for cleanup
        self.referenced[start] = segment_id
        self.unreferenced.discard(segment_id)
        if self.highest_offset is None or epoch_end > self.highest_offset:
            self.highest_offset = epoch_end

    def unreference(self, start: int, segment_id: RemoteLogSegmentId) -> None:
        self.drop(start, segment_id)
        self.unreferenced.add(segment_id)

    def drop(self, start: int, segment_id: RemoteLogSegmentId) -> None:
        if self.referenced.get(start) == segment_id:
            del self.referenced[start]
            self.starts.remove(start)
        self.unreferenced.discard(segment_id)

    def segment_ids(self) -> list[RemoteLogSegmentId]:
        return [self.referenced[s] for s in self.starts] + list(self.unreferenced)


@dataclass(slots=True)
class PartitionState:
    """Everything known about one user partition's remote log."""

    # Segments not yet DELETE_SEGMENT_FINISHED, in the order they were added.
    segments: dict[RemoteLogSegmentId, RemoteLogSegmentMetadata] = field(default_factory=dict)
    epochs: dict[int, _EpochState] = field(default_factory=dict)
    delete_metadata: RemotePartitionDeleteMetadata | None = None

    def register(self, m: RemoteLogSegmentMetadata) -> None:
        for epoch, start in m.segment_leader_epochs:
            state = self.epochs.setdefault(epoch, _EpochState())
            if m.state == _FINISHED:
                state.add_finished(start, m.segment_id, epoch_end_offset(m, epoch))
            else:
                state.unreference(start, m.segment_id)

    def unregister(self, m: RemoteLogSegmentMetadata) -> None:
        for epoch, start in m.segment_leader_epochs:
            state = self.epochs.get(epoch)
            if state is not None:
                state.drop(start, m.segment_id)


class RemoteLogMetadataCache:
    """The state of every partition's remote log, built from metadata records."""

    def __init__(self) -> None:
        self._partitions: dict[TopicIdPartition, PartitionState] = {}
        # Per-partition answers every remote fetch asks for, kept until the next write:
        # sorting the segments of a long remote log once per read would cost more than the read.
        self._sorted: dict[TopicIdPartition, list[RemoteLogSegmentMetadata]] = {}
        self._log_start: dict[TopicIdPartition, int | None] = {}

    # ------------------------------------------------------------------ writes

    def check(self, record: RemoteLogMetadata) -> None:
        """Raises if applying `record` would break a rule; changes nothing."""
        if isinstance(record, RemoteLogSegmentMetadata):
            if record.state != _STARTED:
                raise IllegalStateTransition(
                    f"segment {record.segment_id} must be added in COPY_SEGMENT_STARTED, not {record.state.name}")
            if record.segment_id in self._segments_of(record.topic_id_partition):
                raise DuplicateSegment(f"segment {record.segment_id} already exists")
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            existing = self._segments_of(record.segment_id.topic_id_partition).get(record.segment_id)
            if existing is None:
                raise UnknownSegment(f"no remote log segment metadata for {record.segment_id}")
            check_segment_transition(existing.state, record.state)
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
        self._changed()
        self._apply(record)

    def replay(self, record: RemoteLogMetadata) -> bool:
        """Applies a record read back from a store; one that breaks a rule is logged and dropped."""
        try:
            self.check(record)
        except RemoteLogMetadataError as exc:
            log.warning("dropping remote log metadata record %s: %s", record, exc)
            return False
        self._changed()
        self._apply(record)
        return True

    def _changed(self) -> None:
        self._sorted.clear()
        self._log_start.clear()

    def restore(self, record: RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata) -> None:
        """Loads one entry of a materialized snapshot: a segment in any state but
        DELETE_SEGMENT_FINISHED, or a partition's delete state. No transition check."""
        self._changed()
        tp = record.topic_id_partition
        p = self._partitions.setdefault(tp, PartitionState())
        if isinstance(record, RemotePartitionDeleteMetadata):
            p.delete_metadata = record
            return
        if record.state == _DELETE_FINISHED:
            return
        old = p.segments.get(record.segment_id)
        if old is not None:
            p.unregister(old)
        p.segments[record.segment_id] = record
        p.register(record)

    def _apply(self, record: RemoteLogMetadata) -> None:
        if isinstance(record, RemoteLogSegmentMetadata):
            p = self._partitions.setdefault(record.topic_id_partition, PartitionState())
            p.segments[record.segment_id] = record
            p.register(record)
        elif isinstance(record, RemoteLogSegmentMetadataUpdate):
            p = self._partitions[record.segment_id.topic_id_partition]
            self._transition(p, p.segments[record.segment_id], record)
        elif isinstance(record, RemotePartitionDeleteMetadata):
            self._partitions.setdefault(record.topic_id_partition, PartitionState()).delete_metadata = record
        else:
            self._truncate(record)

    @staticmethod
    def _transition(p: PartitionState, old: RemoteLogSegmentMetadata, update: RemoteLogSegmentMetadataUpdate) -> None:
        new = old.with_update(update)
        if new.state != _DELETE_FINISHED:
            # FINISHED: referenced per epoch. DELETE_STARTED: unreferenced but listable for
            # cleanup, and (as in Kafka) the epoch's highest offset stays.
            p.segments[new.segment_id] = new
            p.register(new)
        else:  # forget it
            p.unregister(old)
            del p.segments[new.segment_id]

    def _truncate(self, t: RemoteLogTruncation) -> None:
        p = self._partitions.setdefault(t.topic_id_partition, PartitionState())
        cut = t.truncation_offset
        touched_epochs: set[int] = set()
        for segment_id, m in list(p.segments.items()):
            if m.state == _DELETE_STARTED or m.end_offset < cut:
                continue
            touched_epochs.update(e for e, _ in m.segment_leader_epochs)
            if m.start_offset >= cut:
                update = RemoteLogSegmentMetadataUpdate(segment_id, t.event_timestamp_ms, _DELETE_STARTED, t.leader_epoch)
                self._transition(p, m, update)
                continue
            # Leave the epochs below the cut as they are indexed (re-registering would let the
            # shorter segment displace others); only drop it from the epochs it no longer holds.
            kept = tuple((e, o) for e, o in m.segment_leader_epochs if o < cut) or m.segment_leader_epochs[:1]
            for epoch, start in m.segment_leader_epochs[len(kept):]:
                p.epochs[epoch].drop(start, segment_id)
            p.segments[segment_id] = dataclasses.replace(m, end_offset=cut - 1, segment_leader_epochs=kept)
        for epoch in touched_epochs:
            state = p.epochs.get(epoch)
            if state is None or state.highest_offset is None or state.highest_offset < cut:
                continue
            # The epoch's offsets at or past the cut are gone; what remains ends at cut - 1
            # if a finished segment still holds this epoch below the cut.
            state.highest_offset = cut - 1 if state.starts else None

    # ------------------------------------------------------------------ reads

    def _segments_of(self, tp: TopicIdPartition) -> dict[RemoteLogSegmentId, RemoteLogSegmentMetadata]:
        p = self._partitions.get(tp)
        return p.segments if p is not None else {}

    def partitions(self) -> list[TopicIdPartition]:
        return list(self._partitions)

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self._segments_of(segment_id.topic_id_partition).get(segment_id)

    def segment_for(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int, epoch_chain: EpochChain | None = None
    ) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding `offset` written in `leader_epoch`.

        With `epoch_chain`, only a segment within that lineage is served; when the segment
        Kafka's lookup picks is not, another finished segment of the epoch holding the
        offset and within the lineage is (the one reaching furthest)."""
        p = self._partitions.get(tp)
        state = p.epochs.get(leader_epoch) if p is not None else None
        if state is None:
            return None
        segment_id = state.floor(offset)
        if segment_id is not None:
            m = p.segments[segment_id]
            if offset <= epoch_end_offset(m, leader_epoch) and (
                    epoch_chain is None or is_segment_within_lineage(m, epoch_chain)):
                return m
        if epoch_chain is None:
            return None
        best: RemoteLogSegmentMetadata | None = None
        for segment_id in state.segment_ids():
            m = p.segments[segment_id]
            if m.state != _FINISHED:
                continue
            start = dict(m.segment_leader_epochs)[leader_epoch]
            if start <= offset <= epoch_end_offset(m, leader_epoch) and is_segment_within_lineage(m, epoch_chain):
                if best is None or m.end_offset > best.end_offset:
                    best = m
        return best

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        p = self._partitions.get(tp)
        state = p.epochs.get(leader_epoch) if p is not None else None
        return state.highest_offset if state is not None else None

    def list_segments(self, tp: TopicIdPartition, leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """Segments not DELETE_SEGMENT_FINISHED (of `leader_epoch` if given), by start offset."""
        p = self._partitions.get(tp)
        if p is None:
            return []
        if leader_epoch is None:
            known = self._sorted.get(tp)
            if known is None:
                known = self._sorted[tp] = sorted(p.segments.values(), key=lambda m: (m.start_offset, m.end_offset))
            return list(known)
        else:
            state = p.epochs.get(leader_epoch)
            segments = [p.segments[i] for i in state.segment_ids()] if state is not None else []
        return sorted(segments, key=lambda m: (m.start_offset, m.end_offset))

    def segments_in_lineage(
        self, tp: TopicIdPartition, epoch_chain: EpochChain, log_end_offset: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        """COPY_SEGMENT_FINISHED segments within the lineage, by start offset."""
        return [m for m in self.list_segments(tp)
                if m.state == _FINISHED and is_segment_within_lineage(m, epoch_chain, log_end_offset)]

    def partition_delete_state(self, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
        p = self._partitions.get(tp)
        return p.delete_metadata.state if p is not None and p.delete_metadata is not None else None

    def partition_delete_metadata(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        p = self._partitions.get(tp)
        return p.delete_metadata if p is not None else None

    def _finished(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        return [m for m in self._segments_of(tp).values() if m.state == _FINISHED]

    def log_start_offset(self, tp: TopicIdPartition) -> int | None:
        """Lowest start offset of the COPY_SEGMENT_FINISHED segments (the remote log start)."""
        if tp not in self._log_start:
            self._log_start[tp] = min((m.start_offset for m in self._finished(tp)), default=None)
        return self._log_start[tp]

    def log_end_offset(self, tp: TopicIdPartition) -> int | None:
        """Highest end offset of the COPY_SEGMENT_FINISHED segments (the last offset in remote storage)."""
        return max((m.end_offset for m in self._finished(tp)), default=None)

    def snapshot(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata]:
        """Entries that `restore` turns back into this partition's state: its live segments in
        the order they were added, then its delete state."""
        p = self._partitions.get(tp)
        if p is None:
            return []
        entries: list[RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata] = list(p.segments.values())
        if p.delete_metadata is not None:
            entries.append(p.delete_metadata)
        return entries
