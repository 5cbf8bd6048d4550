"""The aborted transactions of a read: Kafka's `collectAbortedTransactions` over the remote log.

A segment's transaction index lists the transactions whose ABORT marker the segment
holds, so a transaction aborted in a later segment than its data is listed there: the
walk reads the index of the segment read and of each one following it, until an index
says no later one can add a transaction overlapping the range (`is_complete`). When the
remote log runs out first, the answer is not complete: the marker may sit in the broker's
local log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tierproxy.storage.indexes import AbortedTxn, TransactionIndex, TxnIndexSearchResult
from tierproxy.storage.model import RemoteLogSegmentMetadata

from .segments import NO_LEADER_EPOCH, RemoteLogSegments


async def collect_aborted(
    segments: RemoteLogSegments,
    segment: RemoteLogSegmentMetadata,
    start_offset: int,
    upper_bound_offset: int,
    transaction_index: Callable[[RemoteLogSegmentMetadata], Awaitable[TransactionIndex]],
    *,
    leader_epoch: int = NO_LEADER_EPOCH,
) -> TxnIndexSearchResult:
    """Aborted transactions overlapping [start_offset, upper_bound_offset), from `segment` on;
    `transaction_index` loads a segment's index (empty for one copied without)."""
    aborted: list[AbortedTxn] = []
    current: RemoteLogSegmentMetadata | None = segment
    while current is not None:
        if not current.txn_index_empty:
            found = (await transaction_index(current)).collect_aborted(start_offset, upper_bound_offset)
            aborted.extend(found.aborted)
            if found.is_complete:
                return TxnIndexSearchResult(aborted, True)
        current = segments.following(current, leader_epoch)
    return TxnIndexSearchResult(aborted, False)
