"""A remote log metadata history for tests of the stores: segments, a deletion, a forgotten
segment, an epoch change, a truncation, a partition delete; and the state a store shows of it."""

from __future__ import annotations

import uuid

from tierproxy.storage.model import (RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate,
                                     RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState,
                                     TopicIdPartition)

S = RemoteLogSegmentState
TPS = [TopicIdPartition(uuid.uuid4(), "orders", p) for p in range(3)]


def segment(tp, start, end, epoch=0):
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tp, uuid.uuid4()), start_offset=start, end_offset=end, max_timestamp_ms=7,
        leader_epoch=epoch, event_timestamp_ms=8, segment_leader_epochs=((epoch, start),), segment_size_in_bytes=4096)


async def tier(rlmm, tp, start, end, epoch=0):
    m = segment(tp, start, end, epoch)
    await rlmm.add_remote_log_segment_metadata(m)
    await rlmm.update_remote_log_segment_metadata(
        RemoteLogSegmentMetadataUpdate(m.segment_id, 9, S.COPY_SEGMENT_FINISHED, epoch))
    return m


def state_of(rlmm, tps=TPS):
    return {tp: (rlmm.list_segments(tp), rlmm.partition_delete_state(tp), rlmm.log_start_offset(tp),
                 rlmm.log_end_offset(tp), rlmm.segment_for(tp, 150, 1), rlmm.highest_offset_for_epoch(tp, 0))
            for tp in tps}


async def history(rlmm):
    """Segments, a deletion, a forgotten segment, an epoch change, a truncation, a partition delete."""
    for tp in TPS:
        for i in range(3):
            await tier(rlmm, tp, i * 100, i * 100 + 99, epoch=i // 2)
    first = rlmm.list_segments(TPS[0])[0]
    for state in (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(first.segment_id, 10, state, 1))
    await rlmm.record_truncation(TPS[1], 250, leader_epoch=2, event_timestamp_ms=11)
    await rlmm.put_partition_delete(
        RemotePartitionDeleteMetadata(TPS[2], RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 12, 2))
