"""Which remote segment serves an offset, by leader-epoch lineage, and the walk onwards.

Kafka reads an offset's leader epoch from the broker's leader-epoch cache, then asks the
metadata for the COPY_SEGMENT_FINISHED segment holding the offset in that epoch
(`remoteLogSegmentMetadata(tp, epoch, offset)`); the segment after one is the one serving
its end offset + 1 (`findNextSegmentMetadata`). The proxy has no broker leader-epoch cache:
the epoch is a candidate segment's own epoch at the offset, candidates of the newest epoch
first (after an unclean election the later lineage wins), and the metadata's
`segment_for(offset, epoch)` has the last word, since it knows which segments a new
leader's uploads replaced. A client's current leader epoch keeps segments written in
later epochs out.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from cachetools import LRUCache

from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

NO_LEADER_EPOCH = -1
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def epoch_at(segment: RemoteLogSegmentMetadata, offset: int) -> int:
    """The leader epoch of `offset` within the segment (its first epoch for an offset before it)."""
    epoch = segment.segment_leader_epochs[0][0]
    for e, start in segment.segment_leader_epochs:
        if start > offset:
            break
        epoch = e
    return epoch


class RemoteLogSegments:
    """Segment selection over a RemoteLogMetadataManager. Raises MetadataNotReady while a
    partition's metadata loads."""

    def __init__(self, rlmm: RemoteLogMetadataManager) -> None:
        self.rlmm = rlmm
        # The segment each partition was last read from: sequential readers stay in it.
        self._last: LRUCache[TopicIdPartition, RemoteLogSegmentMetadata] = LRUCache(maxsize=65_536)

    def segment_for(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int = NO_LEADER_EPOCH, *, remember: bool = False
    ) -> RemoteLogSegmentMetadata | None:
        """The segment serving `offset`; None when none does (below the remote log start,
        past its end, in a gap, or only in epochs after the client's `leader_epoch`).
        With `remember`, the next lookup of the partition tries this segment first."""
        last = self._last.get(tp)
        if last is not None and last.start_offset <= offset <= last.end_offset:
            found = self._confirmed(tp, last, offset, leader_epoch)
            if found is not None:
                return found
        holding = itertools.takewhile(lambda m: m.start_offset <= offset, self.rlmm.segments_from(tp, offset))
        candidates = [m for m in holding if m.state == _FINISHED]
        # Newest lineage first: after an unclean election the later epoch's copy wins.
        candidates.sort(key=lambda m: epoch_at(m, offset), reverse=True)
        for candidate in candidates:
            found = self._confirmed(tp, candidate, offset, leader_epoch)
            if found is not None:
                if remember:
                    self._last[tp] = found
                return found
        return None

    def following(
        self, segment: RemoteLogSegmentMetadata, leader_epoch: int = NO_LEADER_EPOCH
    ) -> RemoteLogSegmentMetadata | None:
        """The segment serving the offset after `segment`'s end (Kafka's `findNextSegmentMetadata`)."""
        return self.segment_for(segment.topic_id_partition, segment.end_offset + 1, leader_epoch)

    def walk(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int = NO_LEADER_EPOCH
    ) -> Iterator[tuple[RemoteLogSegmentMetadata, int]]:
        """(segment, the first offset it serves) of the remote log from `offset` on, each
        segment the one following the last: every offset is served once, by its lineage's
        segment. A gap in the remote log (data the broker dropped before it was copied) is
        stepped over to the first segment serving an offset after it."""
        segment = self.segment_for(tp, offset, leader_epoch)
        while True:
            if segment is None:
                after = self._first_after(tp, offset, leader_epoch)
                if after is None:
                    return
                segment, offset = after
            yield segment, offset
            offset = segment.end_offset + 1
            segment = self.following(segment, leader_epoch)

    def _first_after(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int
    ) -> tuple[RemoteLogSegmentMetadata, int] | None:
        for m in self.rlmm.segments_from(tp, offset + 1):  # by start offset
            if m.state == _FINISHED and m.start_offset > offset:
                found = self._confirmed(tp, m, m.start_offset, leader_epoch)
                if found is not None:
                    return found, m.start_offset
        return None

    def _confirmed(
        self, tp: TopicIdPartition, candidate: RemoteLogSegmentMetadata, offset: int, leader_epoch: int
    ) -> RemoteLogSegmentMetadata | None:
        """What the metadata serves for `offset` in the candidate's epoch there."""
        epoch = epoch_at(candidate, offset)
        if leader_epoch >= 0 and epoch > leader_epoch:
            return None
        found = self.rlmm.segment_for(tp, offset, epoch)
        if found is None or not found.start_offset <= offset <= found.end_offset:
            return None
        return found
