"""A segment's leader epochs against an epoch lineage, after Kafka's `RemoteLogManager`, and
a partition's leader-epoch history asked for an epoch's end offset (`end_offset_for`).

Pure functions over `(leader epoch, start offset)` pairs (sorted by epoch) and an end
offset, so the compact cache asks them without making a RemoteLogSegmentMetadata.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from ..model import RemoteLogSegmentMetadata

LeaderEpochs = Sequence[tuple[int, int]]
EpochChain = Sequence[tuple[int, int]]
"""A leader-epoch lineage: (leader epoch, start offset) pairs, as in Kafka's checkpoint file."""

#: OffsetForLeaderEpoch's answer when the epoch is not known (Kafka's names).
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


def epoch_end(epochs: LeaderEpochs, end_offset: int, epoch: int) -> int:
    """Last offset of `epoch` in a segment: the next epoch's start - 1, else the segment's end."""
    i = bisect.bisect_right(epochs, (epoch, float("inf")))
    return epochs[i][1] - 1 if i < len(epochs) else end_offset


def end_offset_for(history: EpochChain, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
    """(leader epoch, end offset) for `requested_epoch`, as Kafka's `LeaderEpochFileCache.endOffsetFor`
    answers OffsetForLeaderEpoch: the largest known epoch <= the one asked and the start offset of
    the next known epoch, or `log_end_offset` when the latest epoch is asked. Below every known
    epoch: the epoch asked and the first epoch's start offset (what came before is gone from the
    log). UNDEFINED_EPOCH asked, an epoch above every known one, or no history at all:
    (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)."""
    if requested_epoch == UNDEFINED_EPOCH or not history:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if requested_epoch == history[-1][0]:
        return requested_epoch, log_end_offset
    higher = bisect.bisect_right(history, (requested_epoch, float("inf")))
    if higher == len(history):
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if higher == 0:
        return requested_epoch, history[0][1]
    return history[higher - 1][0], history[higher][1]


def epoch_end_offset(segment: RemoteLogSegmentMetadata, epoch: int) -> int:
    return epoch_end(segment.segment_leader_epochs, segment.end_offset, epoch)


def _filter_epochs_without_records(epochs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drops an epoch whose start offset equals the next one's (it holds no records); Kafka's
    `buildFilteredLeaderEpochMap`."""
    ordered = sorted(epochs)
    return [e for i, e in enumerate(ordered) if i + 1 == len(ordered) or ordered[i + 1][1] != e[1]]


def epochs_within_lineage(
    epochs: LeaderEpochs, end_offset: int, epoch_chain: EpochChain, log_end_offset: int | None = None
) -> bool:
    """Kafka's `isRemoteSegmentWithinLeaderEpochs`: the segment's epochs and offsets agree with
    the chain, except that its first epoch may start before the chain's (an older segment
    overlapping a log start that moved) and its last epoch ends at its end offset, which must
    not pass the chain's next epoch start (nor `log_end_offset` when given)."""
    seg = _filter_epochs_without_records(epochs)
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
            if chain_next is not None and end_offset > chain_next[1] - 1:
                return False
        elif chain_next != valid[i + 1]:
            return False
    return log_end_offset is None or end_offset < log_end_offset


def is_segment_within_lineage(
    segment: RemoteLogSegmentMetadata, epoch_chain: EpochChain, log_end_offset: int | None = None
) -> bool:
    return epochs_within_lineage(segment.segment_leader_epochs, segment.end_offset, epoch_chain, log_end_offset)
