"""Copying one segment to the remote tier, as Kafka's `RemoteLogManager.copyLogSegment` does.

From a `.log` file and the state the previous segment ended with (its producer state and
leader epochs): build every index in one pass over the `.log`, write the index files,
make the segment's RemoteLogSegmentMetadata under a fresh segment id, add it
COPY_SEGMENT_STARTED, and copy the files with the RemoteStorageManager. Committing it
COPY_SEGMENT_FINISHED is a step of its own (`finish_segment_copy`): the pipeline's driver
commits one attempt's segments later, once it knows which attempt won.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from .indexes import ProducerState, SegmentIndexes, build_segment_indexes, write_indexes
from .indexes.builder import DEFAULT_INDEX_INTERVAL_BYTES
from .metadata import RemoteLogMetadataManager
from .model import (
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from .rsm import RemoteStorageManager


@dataclass(frozen=True, slots=True)
class CopiedSegment:
    #: As added to the metadata: COPY_SEGMENT_STARTED.
    metadata: RemoteLogSegmentMetadata
    #: The files copied: the `.log` and the index files written beside it.
    data: LogSegmentData
    #: Its indexes; `producer_state` and `leader_epochs` are where the next segment starts.
    indexes: SegmentIndexes


def _now_ms() -> int:
    return int(time.time() * 1000)


async def copy_segment(
    rsm: RemoteStorageManager,
    rlmm: RemoteLogMetadataManager,
    topic_id_partition: TopicIdPartition,
    log_path: str | os.PathLike,
    base_offset: int,
    work_dir: str | os.PathLike,
    *,
    producer_state: ProducerState | None = None,
    leader_epochs: Iterable[tuple[int, int]] = (),
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    end_offset: int | None = None,
    leader_epoch: int | None = None,
    event_timestamp_ms: int | None = None,
) -> CopiedSegment:
    """Copy the `.log` at `log_path` (the segment based at `base_offset`) and its indexes.

    `producer_state` and `leader_epochs` are the previous segment's `indexes.producer_state`
    and `indexes.leader_epochs` (nothing for a partition's first segment). The index files
    go to `work_dir`, a scratch directory of the caller's. `end_offset` is the segment's
    last offset when it is past its last batch (Kafka copies a segment up to the next one's
    base offset - 1, past records compaction removed); `leader_epoch` is the epoch of the
    writer of the metadata (default: the segment's last epoch).
    """
    indexes = await asyncio.to_thread(
        build_segment_indexes, log_path, base_offset, index_interval_bytes=index_interval_bytes,
        initial_producer_state=producer_state, initial_leader_epochs=leader_epochs,
    )
    data = write_indexes(indexes, log_path, work_dir, overwrite=True)
    metadata = RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId.generate(topic_id_partition),  # fresh for every attempt
        start_offset=indexes.base_offset,
        end_offset=indexes.end_offset if end_offset is None else end_offset,
        max_timestamp_ms=indexes.max_timestamp_ms,
        leader_epoch=max(indexes.last_leader_epoch, 0) if leader_epoch is None else leader_epoch,
        event_timestamp_ms=_now_ms() if event_timestamp_ms is None else event_timestamp_ms,
        segment_leader_epochs=indexes.segment_leader_epochs,
        segment_size_in_bytes=indexes.size_in_bytes,
        txn_index_empty=indexes.txn_index_empty,
    )
    await rlmm.add_remote_log_segment_metadata(metadata)
    await rsm.copy_log_segment_data(metadata, data)
    return CopiedSegment(metadata, data, indexes)


async def finish_segment_copy(
    rlmm: RemoteLogMetadataManager,
    metadata: RemoteLogSegmentMetadata,
    *,
    leader_epoch: int | None = None,
    event_timestamp_ms: int | None = None,
) -> RemoteLogSegmentMetadata:
    """Commit a copied segment COPY_SEGMENT_FINISHED; returns its metadata in that state."""
    update = RemoteLogSegmentMetadataUpdate(
        metadata.segment_id,
        _now_ms() if event_timestamp_ms is None else event_timestamp_ms,
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        metadata.leader_epoch if leader_epoch is None else leader_epoch,
    )
    await rlmm.update_remote_log_segment_metadata(update)
    return metadata.with_update(update)

