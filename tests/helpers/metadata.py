"""Remote log segment metadata for tests, built one way."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from tierproxy.storage.model import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition


def segment(tp: TopicIdPartition, start: int, end: int, epochs: Sequence[tuple[int, int]] | None = None, *,
            state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED, max_timestamp_ms: int = 0,
            event_timestamp_ms: int = 0, size: int = 1000) -> RemoteLogSegmentMetadata:
    """A new segment (a new id) of `tp` holding offsets [start, end]. `epochs`: its (leader
    epoch, start offset) entries, ((0, start),) by default; its leader epoch is the highest."""
    lineage = tuple(epochs) if epochs is not None else ((0, start),)
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tp, uuid.uuid4()), start_offset=start, end_offset=end,
        max_timestamp_ms=max_timestamp_ms, leader_epoch=max(epoch for epoch, _ in lineage),
        event_timestamp_ms=event_timestamp_ms, segment_leader_epochs=lineage, segment_size_in_bytes=size,
        state=state)
