"""Kafka's own files beside a segment's `.log`, read and rebuilt byte for byte.

- `offset_index`: the `.index` (relative offset -> position in the `.log`)
- `time_index`: the `.timeindex` (timestamp -> relative offset)
- `transaction_index`: the `.txnindex` (aborted transactions)
- `leader_epoch`: the leader-epoch checkpoint (text)
- `producer_snapshot`: the `.snapshot` (producer state) and the producer-state
  tracking that the transaction index needs
- `builder`: one pass over a `.log` that produces all of them

Readers validate what they load: a file that cannot be one of these formats
raises `CorruptIndexError`; a `.log` that cannot be walked raises `CorruptLogError`.
"""

from __future__ import annotations


class CorruptIndexError(ValueError):
    """An index or checkpoint file is not well formed (size, order, version)."""


class CorruptLogError(ValueError):
    """A segment's `.log` holds bytes that are not whole v2 record batches in offset order."""


from .builder import SegmentIndexes, build_segment_indexes, segment_file_name, write_indexes, write_segment_files  # noqa: E402
from .leader_epoch import EpochEntry, LeaderEpochCheckpoint, epochs_in_range  # noqa: E402
from .offset_index import OffsetIndex, OffsetPosition  # noqa: E402
from .producer_snapshot import ProducerSnapshot, ProducerState, ProducerStateEntry  # noqa: E402
from .time_index import TimeIndex, TimestampOffset, find_offset_by_timestamp  # noqa: E402
from .transaction_index import AbortedTxn, TransactionIndex, TxnIndexSearchResult  # noqa: E402

__all__ = [
    "AbortedTxn",
    "CorruptIndexError",
    "CorruptLogError",
    "EpochEntry",
    "LeaderEpochCheckpoint",
    "OffsetIndex",
    "OffsetPosition",
    "ProducerSnapshot",
    "ProducerState",
    "ProducerStateEntry",
    "SegmentIndexes",
    "TimeIndex",
    "TimestampOffset",
    "TransactionIndex",
    "TxnIndexSearchResult",
    "build_segment_indexes",
    "epochs_in_range",
    "find_offset_by_timestamp",
    "segment_file_name",
    "write_indexes",
    "write_segment_files",
]
