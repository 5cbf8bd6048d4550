"""The offset index (`.index`): where in the `.log` to start looking for an offset.

Kafka's `OffsetIndex`: a sparse, sorted array of 8-byte entries

    relative offset int32 (offset - segment base offset) | position int32 (byte in the .log)

The broker adds an entry for a batch once more than `index.interval.bytes` (4096)
of log were written since the previous entry; the entry holds the batch's *last*
offset and the position where the batch starts. `lookup(offset)` returns the
entry with the largest offset <= the target, or (base offset, 0) when there is
none: the batch holding the target starts at or after that position.

`EntryIndex` is the sorted fixed-size-entry array that the time index shares
(Kafka's `AbstractIndex`): length checks, preallocation trimming and the binary
search, done with `struct.unpack_from` over the bytes, never a decoded copy.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Iterable, NamedTuple

from . import CorruptIndexError

_INT32_MAX = 2**31 - 1


class EntryIndex:
    """A sorted array of fixed-size big-endian entries, searched in place."""

    ENTRY: ClassVar[struct.Struct]
    KIND: ClassVar[str]
    __slots__ = ("_buffer", "base_offset", "_count")

    def __init__(self, buffer: bytes, base_offset: int) -> None:
        # Trusted: callers go through from_bytes/from_entries, which validate.
        self._buffer = buffer
        self.base_offset = base_offset
        self._count = len(buffer) // self.ENTRY.size

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, base_offset: int, *, preallocated: bool = False):
        """Load an index file's bytes, checking size and order.

        `preallocated` reads the file of an active segment, which the broker
        pre-sizes (`segment.index.bytes`) and fills with zeros past the last entry;
        those zero entries are dropped, as Kafka does when it trims on roll.
        """
        if base_offset < 0:
            raise ValueError(f"base offset must be >= 0, got {base_offset}")
        buffer = bytes(data)
        size = cls.ENTRY.size
        if preallocated:
            end = len(buffer) - len(buffer) % size
            zero = bytes(size)
            while end >= size and buffer[end - size : end] == zero:
                end -= size
            buffer = buffer[:end]
        if len(buffer) % size:
            raise CorruptIndexError(
                f"{cls.KIND} of segment {base_offset} is corrupt: {len(buffer)} bytes is not a multiple of {size}"
            )
        cls._validate(buffer, base_offset)
        return cls(buffer, base_offset)

    @classmethod
    def _validate(cls, buffer: bytes, base_offset: int) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self.base_offset == other.base_offset
            and self._buffer == other._buffer
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_offset={self.base_offset}, entries={self._count})"

    def to_bytes(self) -> bytes:
        return self._buffer

    def _largest_lower_bound(self, target: int, key_index: int) -> int:
        """Slot of the last entry whose key (field `key_index`) is <= target, or -1."""
        unpack_from, size, buffer = self.ENTRY.unpack_from, self.ENTRY.size, self._buffer
        low, high = 0, self._count  # answer is in [low - 1, high - 1]
        while low < high:
            mid = (low + high) // 2
            if unpack_from(buffer, mid * size)[key_index] <= target:
                low = mid + 1
            else:
                high = mid
        return low - 1


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class OffsetIndex(EntryIndex):
    ENTRY = struct.Struct(">ii")
    KIND = "offset index"
    __slots__ = ()

    @classmethod
    def from_entries(cls, entries: Iterable[tuple[int, int]], base_offset: int) -> OffsetIndex:
        """From (absolute offset, position) pairs; they are validated like a file."""
        pack = cls.ENTRY.pack
        try:
            buffer = b"".join(pack(offset - base_offset, position) for offset, position in entries)
        except struct.error as e:
            raise CorruptIndexError(f"offset index entry does not fit in int32 for base offset {base_offset}: {e}")
        return cls.from_bytes(buffer, base_offset)

    @classmethod
    def _validate(cls, buffer: bytes, base_offset: int) -> None:
        last_relative, last_position = -1, 0
        for relative, position in cls.ENTRY.iter_unpack(buffer):
            if relative <= last_relative or position < last_position:
                raise CorruptIndexError(
                    f"offset index of segment {base_offset} is corrupt: entry ({base_offset + relative}, {position})"
                    f" follows ({base_offset + last_relative}, {last_position})"
                )
            last_relative, last_position = relative, position
        if base_offset + last_relative > 2**63 - 1:
            raise CorruptIndexError(f"offset index of segment {base_offset} overflows int64 offsets")

    @property
    def entries(self) -> list[OffsetPosition]:
        base = self.base_offset
        return [OffsetPosition(base + relative, position) for relative, position in self.ENTRY.iter_unpack(self._buffer)]

    def entry(self, n: int) -> OffsetPosition:
        if not 0 <= n < self._count:
            raise IndexError(f"offset index entry {n} out of range ({self._count} entries)")
        relative, position = self.ENTRY.unpack_from(self._buffer, n * self.ENTRY.size)
        return OffsetPosition(self.base_offset + relative, position)

    @property
    def last_offset(self) -> int:
        """The offset of the last entry, or the base offset when empty (Kafka's `lastOffset`)."""
        return self.entry(self._count - 1).offset if self._count else self.base_offset

    def lookup(self, offset: int) -> OffsetPosition:
        """The entry with the largest offset <= `offset`; (base offset, 0) if none."""
        relative = offset - self.base_offset
        if relative < 0:
            return OffsetPosition(self.base_offset, 0)
        slot = self._largest_lower_bound(min(relative, _INT32_MAX), 0)
        return self.entry(slot) if slot >= 0 else OffsetPosition(self.base_offset, 0)
