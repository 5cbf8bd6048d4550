"""The transaction index (`.txnindex`): aborted transactions whose ABORT marker is in the segment.

Kafka's `TransactionIndex` / `AbortedTxn`: 34-byte entries, in marker order

    version int16 (0) | producer id int64 | first offset int64 | last offset int64
    | last stable offset int64

`first offset` is the transaction's first data offset (possibly in an earlier
segment), `last offset` the offset of the ABORT marker, `last stable offset` the
partition's LSO right after the abort. A READ_COMMITTED fetch of [fetch offset,
upper bound) asks `collect_aborted` which transactions overlap that range, to
return them as the fetch response's aborted transactions.
"""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

from . import CorruptIndexError

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
CURRENT_VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def pack(self) -> bytes:
        return _ENTRY.pack(CURRENT_VERSION, *self)


class TxnIndexSearchResult(NamedTuple):
    aborted: list[AbortedTxn]
    #: True when an entry's LSO reached the upper bound: later segments cannot add
    #: overlapping transactions, so the search stops here (Kafka's `isComplete`).
    is_complete: bool


class TransactionIndex:
    __slots__ = ("_entries",)

    def __init__(self, entries: tuple[AbortedTxn, ...] = ()) -> None:
        for previous, current in zip(entries, entries[1:]):
            if current.last_offset <= previous.last_offset:
                raise CorruptIndexError(
                    f"transaction index is corrupt: last offset {current.last_offset} does not follow"
                    f" {previous.last_offset}"
                )
        for txn in entries:
            if txn.first_offset > txn.last_offset:
                raise CorruptIndexError(f"transaction index is corrupt: {txn} starts after its marker")
        self._entries = tuple(entries)

    @classmethod
    def from_entries(cls, entries: Iterable[AbortedTxn]) -> TransactionIndex:
        return cls(tuple(AbortedTxn(*e) for e in entries))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> TransactionIndex:
        if len(data) % ENTRY_SIZE:
            raise CorruptIndexError(
                f"transaction index is corrupt: {len(data)} bytes is not a multiple of {ENTRY_SIZE}"
            )
        entries = []
        for version, *fields in _ENTRY.iter_unpack(data):
            # Kafka refuses versions above its own; 0 is the only one there is.
            if version != CURRENT_VERSION:
                raise CorruptIndexError(f"transaction index entry has unknown version {version}")
            entries.append(AbortedTxn(*fields))
        return cls(tuple(entries))

    def to_bytes(self) -> bytes:
        return b"".join(txn.pack() for txn in self._entries)

    @property
    def entries(self) -> tuple[AbortedTxn, ...]:
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransactionIndex) and self._entries == other._entries

    def __repr__(self) -> str:
        return f"TransactionIndex({list(self._entries)!r})"

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions overlapping [fetch_offset, upper_bound_offset), Kafka's `collectAbortedTxns`."""
        aborted = []
        for txn in self._entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                aborted.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(aborted, True)
        return TxnIndexSearchResult(aborted, False)
