"""Producer state: the `.snapshot` file, and the tracking that yields aborted transactions.

Kafka's `ProducerStateManager` snapshot, version 1, big-endian:

    version int16 (1) | crc uint32 (CRC-32C of everything after it)
    | entries: count int32, then per producer
        producer id int64 | producer epoch int16 | last sequence int32
        | last offset int64 | offset delta int32 | timestamp int64
        | coordinator epoch int32 | current txn first offset int64 (-1: none)

The broker writes one each time a segment rolls, named after the new segment's
base offset: the state after the last batch of the rolled segment.
`ProducerState` replays batch headers the way the broker's recovery does
(`ProducerAppendInfo` with origin REPLICATION) and so yields, for each ABORT
marker, the transaction index entry with Kafka's last stable offset.

What is covered, and how it differs from the broker's own state:
- Producer epoch, coordinator epoch (read from the marker record's value),
  current transaction first offset and last timestamp (batch max timestamp; the
  marker record's timestamp for markers) are Kafka's.
- Kafka caches the last 5 batches per producer for duplicate detection; the
  snapshot stores only the last one, which is all this keeps (last sequence,
  last offset, offset delta). A new producer epoch clears it, as in Kafka.
- Entries are written in the iteration order of the broker's `HashMap<Long, ..>`
  (bucket of the producer id's hash, then insertion order), so a snapshot built
  from a partition's whole log matches the broker's byte for byte. Not modelled:
  producer-id expiration (`producer.id.expiration.ms`, by wall clock) and tree
  bins of very crowded buckets.
- Sequence and epoch validation is skipped: the log was already accepted.
"""

from __future__ import annotations

import struct
from typing import Iterable, Mapping, NamedTuple

import crc32c

from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import BatchHeader, ControlType, read_end_txn_marker

from . import CorruptIndexError, CorruptLogError
from .transaction_index import AbortedTxn

SNAPSHOT_VERSION = 1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
_HEAD = struct.Struct(">hIi")  # version, crc, entry count
_CRC_START = 6  # the CRC covers the entry count and the entries
_ENTRY = struct.Struct(">qhiqiqiq")
_INT32_MAX = 2**31 - 1


class ProducerStateEntry(NamedTuple):
    """One producer, as the snapshot stores it. last_offset -1: no batch metadata."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_sequence: int = NO_SEQUENCE
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1


class ProducerSnapshot:
    __slots__ = ("entries",)

    def __init__(self, entries: Iterable[ProducerStateEntry] = ()) -> None:
        self.entries: tuple[ProducerStateEntry, ...] = tuple(ProducerStateEntry(*e) for e in entries)

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview) -> ProducerSnapshot:
        data = bytes(data)
        if len(data) < _HEAD.size:
            raise CorruptIndexError(f"producer snapshot is truncated: {len(data)} bytes")
        version, crc, count = _HEAD.unpack_from(data)
        if version != SNAPSHOT_VERSION:
            raise CorruptIndexError(f"producer snapshot has unknown version {version}")
        computed = crc32c.crc32c(memoryview(data)[_CRC_START:])
        if crc != computed:
            raise CorruptIndexError(f"producer snapshot is corrupt: stored CRC {crc}, computed {computed}")
        if count < 0 or len(data) != _HEAD.size + count * _ENTRY.size:
            raise CorruptIndexError(f"producer snapshot declares {count} entries but holds {len(data)} bytes")
        return cls(ProducerStateEntry(*fields) for fields in _ENTRY.iter_unpack(memoryview(data)[_HEAD.size :]))

    def serialize(self) -> bytes:
        try:
            body = struct.pack(">i", len(self.entries)) + b"".join(_ENTRY.pack(*e) for e in self.entries)
        except struct.error as e:
            raise ValueError(f"producer state entry out of range: {e}") from None
        return struct.pack(">hI", SNAPSHOT_VERSION, crc32c.crc32c(body)) + body

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProducerSnapshot) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"ProducerSnapshot({list(self.entries)!r})"


class ProducerState:
    """The producers of one partition and their ongoing transactions, replayed from batches."""

    __slots__ = ("_producers", "_ongoing")

    def __init__(self, entries: Iterable[ProducerStateEntry] = ()) -> None:
        # Insertion order is the broker's (first time it saw each producer id).
        self._producers: dict[int, ProducerStateEntry] = {}
        # First offset of each ongoing transaction -> producer id (Kafka's `ongoingTxns`).
        self._ongoing: dict[int, int] = {}
        for entry in entries:
            entry = ProducerStateEntry(*entry)
            self._producers[entry.producer_id] = entry
            if entry.current_txn_first_offset >= 0:
                self._ongoing[entry.current_txn_first_offset] = entry.producer_id

    @classmethod
    def from_snapshot(cls, data: bytes | bytearray | memoryview) -> ProducerState:
        return cls(ProducerSnapshot.parse(data).entries)

    @classmethod
    def from_ongoing(cls, ongoing: Mapping[int, int]) -> ProducerState:
        """From {producer id: first offset of its ongoing transaction}, nothing else known."""
        return cls(ProducerStateEntry(pid, current_txn_first_offset=first) for pid, first in ongoing.items())

    def copy(self) -> ProducerState:
        return ProducerState(self._producers.values())

    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        return dict(self._producers)

    @property
    def ongoing_transactions(self) -> dict[int, int]:
        """{producer id: first offset} of transactions without a marker yet, by first offset."""
        return {self._ongoing[first]: first for first in sorted(self._ongoing)}

    @property
    def first_undecided_offset(self) -> int | None:
        return min(self._ongoing) if self._ongoing else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProducerState) and self._producers == other._producers

    def __repr__(self) -> str:
        return f"ProducerState({list(self._producers.values())!r})"

    def append(self, buffer: bytes | bytearray | memoryview, header: BatchHeader) -> AbortedTxn | None:
        """Replay one batch; for an ABORT marker that ends a transaction, its index entry.

        `buffer` holds the batch at `header.position` (only read for markers).
        """
        pid = header.producer_id
        if pid < 0:
            return None
        current = self._producers.get(pid) or ProducerStateEntry(pid)
        if header.is_control:
            return self._append_marker(buffer, header, current)
        if header.producer_epoch != current.producer_epoch:
            current = current._replace(producer_epoch=header.producer_epoch)
        txn_first = current.current_txn_first_offset
        if txn_first >= 0 and not header.is_transactional:
            raise CorruptLogError(
                f"non-transactional batch at offset {header.base_offset} from producer {pid}, whose transaction"
                f" from offset {txn_first} is still open (wrong initial producer state?)"
            )
        if txn_first < 0 and header.is_transactional:
            txn_first = header.base_offset
            self._ongoing[txn_first] = pid
        self._producers[pid] = current._replace(
            last_sequence=_last_sequence(header.base_sequence, header.last_offset_delta),
            last_offset=header.last_offset,
            offset_delta=header.last_offset_delta,
            timestamp=header.max_timestamp,
            current_txn_first_offset=txn_first,
        )
        return None

    def _append_marker(self, buffer, header: BatchHeader, current: ProducerStateEntry) -> AbortedTxn | None:
        if header.records_count == 0:
            # The cleaner emptied it: the transaction's data is gone, nothing completes.
            self._producers[current.producer_id] = current
            return None
        marker, coordinator_epoch, timestamp = end_txn_marker(buffer, header)
        txn_first = current.current_txn_first_offset
        if header.producer_epoch != current.producer_epoch:
            # A new epoch (transactions v2 bump it in every marker) drops the cached
            # batch metadata: Kafka's maybeUpdateProducerEpoch.
            current = current._replace(
                producer_epoch=header.producer_epoch, last_sequence=NO_SEQUENCE, last_offset=-1, offset_delta=0
            )
        self._producers[current.producer_id] = current._replace(
            coordinator_epoch=coordinator_epoch, timestamp=timestamp, current_txn_first_offset=-1
        )
        if txn_first < 0:
            return None  # a marker without data changes no transaction
        aborted = None
        if marker is ControlType.ABORT:
            aborted = AbortedTxn(current.producer_id, txn_first, header.base_offset, self._lso_after(header))
        self._ongoing.pop(txn_first, None)
        return aborted

    def _lso_after(self, marker: BatchHeader) -> int:
        """Kafka's `lastStableOffset(completedTxn)`: the earliest other open transaction, else marker + 1."""
        for first in sorted(self._ongoing):
            if self._ongoing[first] != marker.producer_id:
                return first
        return marker.base_offset + 1

    def snapshot(self) -> ProducerSnapshot:
        return ProducerSnapshot(self._producers[pid] for pid in java_hash_map_order(list(self._producers)))


def java_hash_map_order(producer_ids: list[int]) -> list[int]:
    """The order a Java `HashMap<Long, V>` iterates these keys, given in insertion order.

    Buckets by `Long.hashCode` spread as `HashMap.hash` does, in a table grown from
    16 by doubling past a 0.75 load factor; inside a bucket, insertion order.
    """
    capacity = 16
    while len(producer_ids) > capacity * 3 // 4:
        capacity *= 2
    mask = capacity - 1

    def bucket(pid: int) -> int:
        unsigned = pid & 0xFFFF_FFFF_FFFF_FFFF
        h = (unsigned ^ (unsigned >> 32)) & 0xFFFF_FFFF
        return (h ^ (h >> 16)) & mask

    return sorted(producer_ids, key=bucket)  # stable: insertion order within a bucket


def end_txn_marker(buffer: bytes | bytearray | memoryview, header: BatchHeader) -> tuple[ControlType, int, int]:
    """(COMMIT/ABORT, coordinator epoch, record timestamp) of a transaction marker batch."""
    try:
        marker = read_end_txn_marker(buffer, header)
        return marker.type, marker.coordinator_epoch, marker.timestamp
    except DecodeError as e:
        raise CorruptLogError(f"transaction marker at offset {header.base_offset} is malformed: {e}") from None


def _last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Kafka's `DefaultRecordBatch.lastSequence`: sequences wrap past int32 max to 0."""
    if base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    if base_sequence > _INT32_MAX - last_offset_delta:
        return last_offset_delta - (_INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta
