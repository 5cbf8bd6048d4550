"""FileRemoteLogMetadataManager: durable appends, reload, torn tails, one writer."""

from __future__ import annotations

import os
import uuid

import pytest

from tierproxy.storage.errors import IllegalStateTransition, MetadataNotReady, RemoteLogMetadataError
from tierproxy.storage.metadata import DuplicateSegment, MetadataDecodeError, UnknownSegment
from tierproxy.storage.metadata.file_store import LOG_FILE_NAME, FileRemoteLogMetadataManager, encode_checked_entry
from tierproxy.storage.metadata.serde import serialize
from tierproxy.storage.model import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.model import RemotePartitionDeleteMetadata, RemotePartitionDeleteState
from tests.helpers.metadata import segment

S = RemoteLogSegmentState
TP = TopicIdPartition(uuid.uuid4(), "payments", 3)


async def copy(rlmm, m):
    await rlmm.add_remote_log_segment_metadata(m)
    await rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(m.segment_id, 9, S.COPY_SEGMENT_FINISHED, 1))


def state_of(rlmm, tp=TP):
    return (rlmm.list_segments(tp), rlmm.partition_delete_state(tp), rlmm.log_start_offset(tp),
            rlmm.log_end_offset(tp), [rlmm.highest_offset_for_epoch(tp, e) for e in range(4)])


async def test_reads_before_start_are_not_ready(tmp_path):
    rlmm = FileRemoteLogMetadataManager(tmp_path)
    with pytest.raises(MetadataNotReady):
        rlmm.list_segments(TP)
    with pytest.raises(MetadataNotReady):
        await rlmm.wait_until_ready(TP, timeout=0.01)
    with pytest.raises(MetadataNotReady):
        await rlmm.add_remote_log_segment_metadata(segment(TP, 0, 9, [(0, 0)]))


async def test_writes_follow_the_rules_and_survive_a_restart(tmp_path):
    a, b, c = segment(TP, 0, 99, [(0, 0)]), segment(TP, 100, 199, [(0, 100), (1, 150)]), segment(TP, 200, 299, [(1, 200)])
    async with FileRemoteLogMetadataManager(tmp_path) as rlmm:
        await rlmm.wait_until_ready(TP, timeout=1)
        await copy(rlmm, a)
        await copy(rlmm, b)
        await rlmm.add_remote_log_segment_metadata(c)
        with pytest.raises(DuplicateSegment):
            await rlmm.add_remote_log_segment_metadata(c)
        with pytest.raises(IllegalStateTransition):
            await rlmm.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(c.segment_id, 1, S.DELETE_SEGMENT_FINISHED, 1))
        with pytest.raises(UnknownSegment):
            await rlmm.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(segment(TP, 0, 1, [(0, 0)]).segment_id, 1, S.COPY_SEGMENT_FINISHED, 1))
        with pytest.raises(IllegalStateTransition):
            await rlmm.put_partition_delete(
                RemotePartitionDeleteMetadata(TP, RemotePartitionDeleteState.DELETE_PARTITION_STARTED, 1, 1))
        await rlmm.record_truncation(TP, 180, leader_epoch=2)
        assert rlmm.segment_for(TP, 170, 1).end_offset == 179
        assert rlmm.segment_for(TP, 50, 0).segment_id == a.segment_id
        assert rlmm.list_segments(TP, 1)[-1].state == S.DELETE_SEGMENT_STARTED  # c, wholly past the cut
        before = state_of(rlmm)
        size = os.path.getsize(tmp_path / LOG_FILE_NAME)

    # Rejected writes left nothing in the file.
    async with FileRemoteLogMetadataManager(tmp_path) as again:
        assert state_of(again) == before
        assert os.path.getsize(tmp_path / LOG_FILE_NAME) == size
        assert again.segment_for(TP, 170, 1).end_offset == 179


async def test_torn_tail_is_cut_off_on_load(tmp_path):
    a, b = segment(TP, 0, 99, [(0, 0)]), segment(TP, 100, 199, [(0, 100)])
    async with FileRemoteLogMetadataManager(tmp_path) as rlmm:
        await copy(rlmm, a)
        await rlmm.add_remote_log_segment_metadata(b)
        good = state_of(rlmm)
    path = tmp_path / LOG_FILE_NAME
    valid_size = path.stat().st_size
    torn = encode_checked_entry(serialize(
        RemoteLogSegmentMetadataUpdate(b.segment_id, 9, S.COPY_SEGMENT_FINISHED, 1)))
    for tail in (torn[:-3], torn[:1], torn[:-1] + bytes([torn[-1] ^ 0xFF]), b"\x00" * 11):
        with open(path, "ab") as f:
            f.write(tail)
        async with FileRemoteLogMetadataManager(tmp_path) as rlmm:
            assert state_of(rlmm) == good
            assert path.stat().st_size == valid_size  # cut back to the last whole entry
            # Appends continue after the cut and are read back.
            await rlmm.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(b.segment_id, 9, S.COPY_SEGMENT_FINISHED, 1))
        async with FileRemoteLogMetadataManager(tmp_path) as rlmm:
            assert rlmm.segment_for(TP, 150, 0).segment_id == b.segment_id
            await rlmm.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(b.segment_id, 9, S.DELETE_SEGMENT_STARTED, 1))
            await rlmm.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(b.segment_id, 9, S.DELETE_SEGMENT_FINISHED, 1))
            b = segment(TP, 100, 199, [(0, 100)])
            await rlmm.add_remote_log_segment_metadata(b)
            good = state_of(rlmm)
        valid_size = path.stat().st_size


async def test_an_entry_with_a_good_crc_that_does_not_decode_stops_start_up(tmp_path):
    (tmp_path / LOG_FILE_NAME).write_bytes(encode_checked_entry(b"\x01\x09\x00"))
    with pytest.raises(MetadataDecodeError):
        await FileRemoteLogMetadataManager(tmp_path).start()


async def test_one_writer_and_read_only_followers(tmp_path):
    async with FileRemoteLogMetadataManager(tmp_path) as writer:
        with pytest.raises(RemoteLogMetadataError, match="already open"):
            await FileRemoteLogMetadataManager(tmp_path).start()
        async with FileRemoteLogMetadataManager(tmp_path, read_only=True) as reader:
            assert reader.list_segments(TP) == []
            # Only a follower has to be told to look for another process's appends.
            assert reader.needs_refresh and not writer.needs_refresh
            assert await writer.refresh() == 0
            a = segment(TP, 0, 99, [(0, 0)])
            await copy(writer, a)
            with open(tmp_path / LOG_FILE_NAME, "ab") as f:  # a writer half-way through an append
                f.write(encode_checked_entry(serialize(segment(TP, 100, 199, [(0, 100)])))[:5])
            assert await reader.refresh() == 2
            assert reader.segment_for(TP, 5, 0) == writer.segment_for(TP, 5, 0)
            with pytest.raises(RemoteLogMetadataError, match="read-only"):
                await reader.add_remote_log_segment_metadata(segment(TP, 100, 199, [(0, 100)]))
    # The writer's lock is released on close.
    async with FileRemoteLogMetadataManager(tmp_path) as again:
        assert again.log_end_offset(TP) == 99


async def test_shared_writers_see_each_other_and_keep_one_valid_file(tmp_path):
    # Two processes' worth of writers: each append first replays what the other wrote.
    async with FileRemoteLogMetadataManager(tmp_path, shared=True) as one, \
            FileRemoteLogMetadataManager(tmp_path, shared=True) as two:
        a, b = segment(TP, 0, 99, [(0, 0)]), segment(TP, 100, 199, [(0, 100)])
        await one.add_remote_log_segment_metadata(a)
        await two.add_remote_log_segment_metadata(b)
        # `two` checked its first update against `one`'s add: a is known to it.
        await two.update_remote_log_segment_metadata(
            RemoteLogSegmentMetadataUpdate(a.segment_id, 9, S.COPY_SEGMENT_FINISHED, 1))
        with pytest.raises(IllegalStateTransition):  # `one` sees that a is FINISHED already
            await one.update_remote_log_segment_metadata(
                RemoteLogSegmentMetadataUpdate(a.segment_id, 9, S.DELETE_SEGMENT_FINISHED, 1))
        with pytest.raises(DuplicateSegment):
            await one.add_remote_log_segment_metadata(b)
        assert one.needs_refresh and two.needs_refresh
        await one.refresh()
        assert state_of(one) == state_of(two)
        assert one.log_end_offset(TP) == 99
        # A torn tail left by a writer that died mid-append is cut by the next one to append.
        with open(tmp_path / LOG_FILE_NAME, "ab") as f:
            f.write(encode_checked_entry(serialize(segment(TP, 200, 299, [(0, 200)])))[:7])
        await two.update_remote_log_segment_metadata(
            RemoteLogSegmentMetadataUpdate(b.segment_id, 9, S.COPY_SEGMENT_FINISHED, 1))
        await one.refresh()
        assert one.log_end_offset(TP) == two.log_end_offset(TP) == 199
    async with FileRemoteLogMetadataManager(tmp_path, read_only=True) as reader:
        assert [m.state for m in reader.list_segments(TP)] == [S.COPY_SEGMENT_FINISHED] * 2
    with pytest.raises(ValueError):
        FileRemoteLogMetadataManager(tmp_path, read_only=True, shared=True)
