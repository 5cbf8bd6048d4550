"""The time index (`.timeindex`): which offset to start from for a timestamp.

Kafka's `TimeIndex`: a sparse, sorted array of 12-byte entries

    timestamp int64 | relative offset int32

An entry (T, O) says "the largest timestamp in the log before O's batch ended is
T": any record with a timestamp > T comes after offset O. The broker adds one
entry beside each offset-index entry (the largest batch max timestamp so far and
the *last* offset of the batch that carried it) when that timestamp grew, and a
final one when the segment rolls. Timestamps and offsets only grow.

`TimeIndex.lookup(t)` is Kafka's: the entry with the largest timestamp <= t, or
(-1, base offset) when there is none. A search for t then starts at that entry's
offset (through the offset index) and scans batches: `find_offset_by_timestamp`
does that scan over the `.log` bytes. Kafka's `LogSegment.findOffsetByTimestamp`
returns the first *record* with timestamp >= t; batch headers carry only the
batch's max timestamp, so this scan stops at the first batch whose max timestamp
>= t and reports that batch. The record itself is inside it (or, if a record
decoder finds none there at or above the starting offset, in a later batch):
decoding records is the caller's job.
"""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import BatchHeader, iter_batches

from . import CorruptIndexError, CorruptLogError
from .offset_index import EntryIndex, OffsetIndex

NO_TIMESTAMP = -1


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class TimeIndex(EntryIndex):
    ENTRY = struct.Struct(">qi")
    KIND = "time index"
    __slots__ = ()

    @classmethod
    def from_entries(cls, entries: Iterable[tuple[int, int]], base_offset: int) -> TimeIndex:
        """From (timestamp, absolute offset) pairs; they are validated like a file."""
        pack = cls.ENTRY.pack
        try:
            buffer = b"".join(pack(timestamp, offset - base_offset) for timestamp, offset in entries)
        except struct.error as e:
            raise CorruptIndexError(f"time index entry does not fit for base offset {base_offset}: {e}")
        return cls.from_bytes(buffer, base_offset)

    @classmethod
    def _validate(cls, buffer: bytes, base_offset: int) -> None:
        # Kafka appends only timestamps above the last one, starting from -1 (none).
        last_timestamp, last_relative = NO_TIMESTAMP + 1, 0
        for timestamp, relative in cls.ENTRY.iter_unpack(buffer):
            if timestamp < last_timestamp or relative < last_relative:
                raise CorruptIndexError(
                    f"time index of segment {base_offset} is corrupt: entry ({timestamp}, {base_offset + relative})"
                    f" follows ({last_timestamp}, {base_offset + last_relative})"
                )
            last_timestamp, last_relative = timestamp, relative

    @property
    def entries(self) -> list[TimestampOffset]:
        base = self.base_offset
        return [TimestampOffset(t, base + relative) for t, relative in self.ENTRY.iter_unpack(self._buffer)]

    def entry(self, n: int) -> TimestampOffset:
        if not 0 <= n < self._count:
            raise IndexError(f"time index entry {n} out of range ({self._count} entries)")
        timestamp, relative = self.ENTRY.unpack_from(self._buffer, n * self.ENTRY.size)
        return TimestampOffset(timestamp, self.base_offset + relative)

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or (-1, base offset) when empty (Kafka's `lastEntry`)."""
        return self.entry(self._count - 1) if self._count else TimestampOffset(NO_TIMESTAMP, self.base_offset)

    def lookup(self, timestamp: int) -> TimestampOffset:
        """The entry with the largest timestamp <= `timestamp`; (-1, base offset) if none."""
        slot = self._largest_lower_bound(timestamp, 0)
        return self.entry(slot) if slot >= 0 else TimestampOffset(NO_TIMESTAMP, self.base_offset)


class TimestampSearchResult(NamedTuple):
    """The batch where the first record with timestamp >= the target lies."""

    batch: BatchHeader
    #: A lower bound of the record's offset: max(batch base offset, starting offset).
    offset: int


def find_offset_by_timestamp(
    log: bytes | bytearray | memoryview,
    timestamp: int,
    *,
    offset_index: OffsetIndex,
    time_index: TimeIndex,
    starting_offset: int = 0,
) -> TimestampSearchResult | None:
    """The first batch with max timestamp >= `timestamp` and last offset >= `starting_offset`.

    `log` is the segment's `.log` content: bytes, or an `mmap` of the file so a large
    segment is paged in only from the indexed position on. None when no batch
    qualifies (the answer is in a later segment, or nowhere).
    """
    indexed = time_index.lookup(timestamp)
    position = offset_index.lookup(max(indexed.offset, starting_offset)).position
    try:
        for header in iter_batches(log, position):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                return TimestampSearchResult(header, max(header.base_offset, starting_offset))
    except DecodeError as e:
        raise CorruptLogError(f"segment {offset_index.base_offset}: {e}") from e
    return None
