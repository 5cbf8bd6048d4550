"""storage.segment_copy: one segment from its `.log` to the remote tier, then committed."""

from __future__ import annotations

import uuid
from pathlib import Path

from tierproxy.protocol.records import ControlType
from tierproxy.storage.indexes import TransactionIndex
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.model import IndexType, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.segment_copy import copy_segment, finish_segment_copy
from tests.helpers.batches import batch, control_batch

S = RemoteLogSegmentState


def _log(directory: Path, base_offset: int, data: bytes) -> Path:
    path = directory / f"{base_offset:020d}.log"
    path.write_bytes(data)
    return path


async def test_two_segments_chained_then_committed(tmp_path: Path) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "copied", 0)
    work = tmp_path / "work"
    work.mkdir()
    # A transaction begun in the first segment and aborted in the second: only the producer
    # state carried over from the first lets the second's transaction index list it.
    first = batch(0, 3, leader_epoch=1) + batch(3, 2, producer_id=5, producer_epoch=0, transactional=True,
                                                 leader_epoch=1)
    second = control_batch(5, ControlType.ABORT, producer_id=5, leader_epoch=2) + batch(6, 4, leader_epoch=2)
    async with LocalRemoteStorageManager(tmp_path / "remote") as rsm, \
            FileRemoteLogMetadataManager(tmp_path / "metadata") as rlmm:
        one = await copy_segment(rsm, rlmm, tp, _log(work, 0, first), 0, work)
        assert (one.metadata.start_offset, one.metadata.end_offset, one.metadata.leader_epoch) == (0, 4, 1)
        assert one.metadata.state is S.COPY_SEGMENT_STARTED and one.metadata.txn_index_empty
        assert rlmm.list_segments(tp) == [one.metadata]
        assert rlmm.log_start_offset(tp) is None  # nothing is served before it is committed
        await rsm.verify_segment(one.metadata, check_crc=True)
        assert one.data.log_segment.read_bytes() == first

        two = await copy_segment(rsm, rlmm, tp, _log(work, 5, second), 5, work,
                                 producer_state=one.indexes.producer_state, leader_epochs=one.indexes.leader_epochs,
                                 leader_epoch=7, end_offset=12, event_timestamp_ms=1234)
        assert (two.metadata.start_offset, two.metadata.end_offset) == (5, 12)  # past its last batch, at 9
        assert (two.metadata.leader_epoch, two.metadata.event_timestamp_ms) == (7, 1234)
        assert two.metadata.segment_leader_epochs == ((2, 5),)
        assert [tuple(e) for e in two.indexes.leader_epochs] == [(1, 0), (2, 5)]
        aborted = TransactionIndex.from_bytes(await rsm.fetch_index(two.metadata, IndexType.TRANSACTION))
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in aborted.collect_aborted(0, 20).aborted] == \
            [(5, 3, 5)]

        finished = [await finish_segment_copy(rlmm, one.metadata),
                    await finish_segment_copy(rlmm, two.metadata, leader_epoch=8, event_timestamp_ms=99)]
        assert [m.state for m in rlmm.list_segments(tp)] == [S.COPY_SEGMENT_FINISHED] * 2
        assert rlmm.list_segments(tp) == finished
        assert (finished[1].leader_epoch, finished[1].event_timestamp_ms) == (8, 99)
        assert (rlmm.log_start_offset(tp), rlmm.log_end_offset(tp)) == (0, 12)
        assert rlmm.segment_for(tp, 7, 2) == finished[1]
