"""collect_aborted: the one aborted-transaction walk over a segment and those following it."""

from __future__ import annotations

from pathlib import Path

from tierproxy.remote_log.segments import RemoteLogSegments
from tierproxy.remote_log.transactions import collect_aborted
from tierproxy.storage.indexes import AbortedTxn
from tests.helpers.batches import batch
from tests.helpers.remote_log import Partition, abort_marker, add_segment, close, local_remote_log, make_reader, new_tp

TXN = dict(transactional=True, producer_epoch=0)


async def _transactions_across_segments(rsm, rlmm, work: Path, *, epochs=(0, 0, 0, 0)) -> Partition:
    """Producer 7's transaction begins in the first segment and is aborted in the third; the
    second holds no marker at all; the fourth aborts producer 9's, begun in the third."""
    partition = Partition(new_tp())
    e = epochs
    await add_segment(rsm, rlmm, partition, [batch(0, 2, leader_epoch=e[0]),
                                             batch(2, 2, producer_id=7, leader_epoch=e[0], **TXN)], work)
    await add_segment(rsm, rlmm, partition, [batch(4, 3, leader_epoch=e[1])], work)
    await add_segment(rsm, rlmm, partition, [batch(7, 1, producer_id=7, leader_epoch=e[2], **TXN),
                                             abort_marker(8, 7, leader_epoch=e[2]),
                                             batch(9, 2, producer_id=9, leader_epoch=e[2], **TXN)], work)
    await add_segment(rsm, rlmm, partition, [abort_marker(11, 9, leader_epoch=e[3]), batch(12, 2, leader_epoch=e[3])],
                      work)
    return partition


async def test_an_abort_marker_segments_later_is_found_and_the_walk_stops_when_complete(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await _transactions_across_segments(rsm, rlmm, tmp_path / "work")
        first, second, third, fourth = partition.segments
        assert [s.txn_index_empty for s in partition.segments] == [True, True, False, False]
        reader = make_reader(rsm, rlmm)
        loaded = []

        async def transaction_index(segment):
            loaded.append(segment.segment_id)
            return await reader.index_cache.transaction_index(segment)

        segments = RemoteLogSegments(rlmm)
        found = await collect_aborted(segments, first, 0, 4, transaction_index)
        assert found.aborted == [AbortedTxn(7, 2, 8, 9)] and found.is_complete
        assert loaded == [third.segment_id]  # indexes known empty are not read; the fourth is not needed
        loaded.clear()

        both = await collect_aborted(segments, second, 4, 10, transaction_index)
        assert both.aborted == [AbortedTxn(7, 2, 8, 9), AbortedTxn(9, 9, 11, 12)] and both.is_complete
        assert loaded == [third.segment_id, fourth.segment_id]

        # Past the last remote segment nothing rules out a marker in the broker's local log.
        open_ended = await collect_aborted(segments, fourth, 12, 14, transaction_index)
        assert open_ended.aborted == [] and not open_ended.is_complete

        # The reader's READ_COMMITTED read uses the same walk.
        result = await reader.read(partition.tp, 0, 1 << 20, min_one_batch=True, isolation_level=1)
        assert result.aborted_transactions == [AbortedTxn(7, 2, 8, 9)] and result.aborted_transactions_complete
        await close(reader)


async def test_the_walk_ends_where_the_clients_leader_epoch_ends(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await _transactions_across_segments(rsm, rlmm, tmp_path / "work", epochs=(0, 0, 1, 1))
        reader = make_reader(rsm, rlmm)
        first = partition.segments[0]
        in_epoch_0 = await reader.aborted_transactions(first, 0, 4, leader_epoch=0)
        assert in_epoch_0.aborted == [] and not in_epoch_0.is_complete
        in_epoch_1 = await reader.aborted_transactions(first, 0, 4, leader_epoch=1)
        assert in_epoch_1.aborted == [AbortedTxn(7, 2, 8, 9)] and in_epoch_1.is_complete
        await close(reader)
