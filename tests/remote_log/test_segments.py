"""RemoteLogSegments: the segment serving an offset by leader-epoch lineage, the one
following it, and the walk over a remote log; with the reader on top where it matters."""

from __future__ import annotations

from pathlib import Path

from tierproxy.remote_log.segments import RemoteLogSegments, epoch_at
from tests.helpers.remote_log import (
    Partition,
    add_segment,
    build_partition,
    close,
    local_remote_log,
    make_reader,
    new_tp,
    plain_batches,
)


def _walk(segments: RemoteLogSegments, partition: Partition, offset: int, leader_epoch: int = -1) -> list[tuple]:
    return [(s.segment_id, first) for s, first in segments.walk(partition.tp, offset, leader_epoch)]


async def test_a_new_leaders_uploads_replace_the_old_leaders_segments(tmp_path: Path) -> None:
    """Unclean election: the new leader (epoch 1) uploads its own copy of the epoch-0 offsets
    the old leader had uploaded in two segments, then its own epoch. Every offset is served
    from the new leader's segment from then on."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        tp = new_tp()
        old = Partition(tp)
        for _ in range(2):
            batches, _ = plain_batches(old.segments[-1].end_offset + 1 if old.segments else 100, 10, value_size=40)
            await add_segment(rsm, rlmm, old, batches, tmp_path / "work")
        old_end = old.log_end_offset
        new = Partition(tp)
        epoch_0, offset = plain_batches(100, 20, value_size=90)  # other bytes for the same offsets
        assert offset == old_end + 1
        epoch_1, _ = plain_batches(offset, 10, leader_epoch=1, value_size=90)
        replacement = await add_segment(rsm, rlmm, new, epoch_0 + epoch_1, tmp_path / "work")
        assert replacement.segment_leader_epochs == ((0, 100), (1, offset))

        segments = RemoteLogSegments(rlmm)
        for probe in (100, old.segments[0].end_offset, old.segments[1].start_offset + 3, old_end, old_end + 1,
                      replacement.end_offset):
            assert segments.segment_for(tp, probe).segment_id == replacement.segment_id, probe
        assert _walk(segments, new, 100) == [(replacement.segment_id, 100)]

        reader = make_reader(rsm, rlmm)
        result = await reader.read(tp, old.segments[1].start_offset, 1 << 20, min_one_batch=True)
        assert b"".join(result.records) == b"".join(
            b.data for b in new.batches if b.last_offset >= old.segments[1].start_offset)
        await close(reader)


async def test_a_truncated_lineage_hands_over_to_the_new_leaders_segment(tmp_path: Path) -> None:
    """The remote log diverged at an offset inside the old leader's second segment: that
    segment serves only below it, the new leader's segment from it on."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        old = await build_partition(rsm, rlmm, tmp_path / "work", segments=2, batches_per_segment=10)
        second = [b for b in old.batches if b.segment == 1]
        cut = second[4].base_offset
        await rlmm.record_truncation(old.tp, cut, leader_epoch=1)
        new = Partition(old.tp)
        batches, _ = plain_batches(cut, 10, leader_epoch=1, value_size=90)
        successor = await add_segment(rsm, rlmm, new, batches, tmp_path / "work")

        segments = RemoteLogSegments(rlmm)
        truncated = segments.segment_for(old.tp, cut - 1)
        assert truncated.segment_id == old.segments[1].segment_id and truncated.end_offset == cut - 1
        assert segments.segment_for(old.tp, cut).segment_id == successor.segment_id
        assert segments.following(truncated).segment_id == successor.segment_id
        assert _walk(segments, old, old.log_start_offset) == [
            (old.segments[0].segment_id, old.log_start_offset),
            (old.segments[1].segment_id, old.segments[1].start_offset),
            (successor.segment_id, cut),
        ]

        reader = make_reader(rsm, rlmm)
        served, offset = [], second[0].base_offset
        while offset <= successor.end_offset:
            result = await reader.read(old.tp, offset, 1 << 20, min_one_batch=True)
            served.extend(result.records)
            offset = result.next_fetch_offset
        assert b"".join(served) == b"".join(b.data for b in second[:4]) + new.log_of(0)
        await close(reader)


async def test_a_clients_current_leader_epoch_keeps_later_epochs_out(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3, epochs=[0, 1, 2])
        first, second, third = partition.segments
        segments = RemoteLogSegments(rlmm)
        assert [epoch_at(s, s.start_offset) for s in partition.segments] == [0, 1, 2]
        for epoch, reachable in ((-1, 3), (0, 1), (1, 2), (2, 3), (9, 3)):
            assert [s for s, _ in segments.walk(partition.tp, first.start_offset, epoch)] == \
                partition.segments[:reachable], epoch
        assert segments.segment_for(partition.tp, third.start_offset, leader_epoch=1) is None
        assert segments.following(second, leader_epoch=1) is None
        assert segments.following(second, leader_epoch=2) == third
        # A read in an earlier epoch's segment stops at its end; the next one is out of range.
        reader = make_reader(rsm, rlmm)
        result = await reader.read(partition.tp, second.end_offset, 1 << 20, min_one_batch=True, leader_epoch=1)
        assert result.next_fetch_offset == third.start_offset
        beyond = await reader.read(partition.tp, third.start_offset, 1 << 20, min_one_batch=True, leader_epoch=1)
        assert beyond.offset_out_of_range and beyond.records == []
        await close(reader)


async def test_a_segment_compacted_to_nothing_hands_over_to_the_next(tmp_path: Path) -> None:
    """Kafka copies a segment up to the next one's base offset - 1: compaction may have left
    nothing at or after a fetch offset in it. The read goes on in the following segment."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = Partition(new_tp())
        batches, next_offset = plain_batches(100, 10)
        compacted = await add_segment(rsm, rlmm, partition, batches, tmp_path / "work", end_offset=next_offset + 49)
        batches, _ = plain_batches(next_offset + 50, 10)
        following = await add_segment(rsm, rlmm, partition, batches, tmp_path / "work")
        assert compacted.end_offset + 1 == following.start_offset

        reader = make_reader(rsm, rlmm)
        for fetch_offset in (next_offset, next_offset + 20, compacted.end_offset):
            result = await reader.read(partition.tp, fetch_offset, 1 << 20, min_one_batch=True)
            assert result.segment.segment_id == following.segment_id
            assert b"".join(result.records) == partition.log_of(1)
            assert result.next_fetch_offset == following.end_offset + 1
        within = await reader.read(partition.tp, 100, 1 << 20, min_one_batch=True)
        assert b"".join(within.records) == partition.log_of(0) and within.next_fetch_offset == next_offset
        await close(reader)


async def test_the_walk_steps_over_a_gap_in_the_remote_log(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = Partition(new_tp())
        batches, end = plain_batches(100, 8)
        before = await add_segment(rsm, rlmm, partition, batches, tmp_path / "work")
        partition.producer_state = None  # the broker dropped what came between: nothing carries over
        batches, _ = plain_batches(end + 40, 8)
        after = await add_segment(rsm, rlmm, partition, batches, tmp_path / "work")
        segments = RemoteLogSegments(rlmm)
        assert segments.following(before) is None  # Kafka's findNextSegmentMetadata: nothing at end + 1
        assert segments.segment_for(partition.tp, end + 10) is None
        assert _walk(segments, partition, 100) == [(before.segment_id, 100), (after.segment_id, after.start_offset)]
        assert _walk(segments, partition, end + 10) == [(after.segment_id, after.start_offset)]
        assert _walk(segments, partition, after.end_offset + 1) == []
