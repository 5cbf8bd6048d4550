"""The leader-epoch checkpoint: which leader epoch starts at which offset.

Kafka's `LeaderEpochCheckpointFile` (a `CheckpointFile`), UTF-8 text:

    0                 <- version
    2                 <- number of entries
    0 0               <- "epoch start_offset", one line each, epochs increasing
    3 1200

The broker keeps one per partition (`leader-epoch-checkpoint`). For a remote
segment Kafka ships the entries from the log start up to the segment's end
(`epochEntriesInRange(-1, nextSegmentBaseOffset)`), and keeps the segment's own
entries, first one clamped to the segment base offset, in the segment metadata
(`epochEntriesInRange(baseOffset, nextSegmentBaseOffset)`): `epochs_in_range`.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

from . import CorruptIndexError

CURRENT_VERSION = 0
_WHITESPACE = re.compile(r"\s+")


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def assign(entries: list[EpochEntry], epoch: int, start_offset: int) -> bool:
    """Record that `epoch` starts at `start_offset`, as Kafka's `LeaderEpochFileCache.assign`.

    A new epoch is appended; entries that would break monotonicity (an epoch >=
    the new one, or a start offset >= the new one) are dropped first. Returns
    whether `entries` changed.
    """
    if epoch < 0 or start_offset < 0:
        raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
    if entries and entries[-1].epoch == epoch and entries[-1].start_offset <= start_offset:
        return False
    while entries and (entries[-1].epoch >= epoch or entries[-1].start_offset >= start_offset):
        entries.pop()
    entries.append(EpochEntry(epoch, start_offset))
    return True


def epochs_in_range(entries: Iterable[EpochEntry], start_offset: int, end_offset: int) -> list[EpochEntry]:
    """Entries for offsets [start_offset, end_offset), Kafka's `epochEntriesInRange`.

    The epoch in force at `start_offset` is kept with its start moved up to
    `start_offset` (a negative start keeps everything); epochs starting at or after
    `end_offset` are dropped (a negative end keeps everything).
    """
    result = list(entries)
    if start_offset >= 0:
        before = [e for e in result if e.start_offset <= start_offset]
        result = result[len(before) :]
        if before:
            result.insert(0, EpochEntry(before[-1].epoch, start_offset))
    if end_offset >= 0:
        result = [e for e in result if e.start_offset < end_offset]
    return result


class LeaderEpochCheckpoint:
    __slots__ = ("entries",)

    def __init__(self, entries: Iterable[EpochEntry] = ()) -> None:
        self.entries: tuple[EpochEntry, ...] = tuple(EpochEntry(*e) for e in entries)
        for previous, current in zip(self.entries, self.entries[1:]):
            if current.epoch <= previous.epoch or current.start_offset < previous.start_offset:
                raise CorruptIndexError(f"leader epoch entries out of order: {previous} then {current}")
        for entry in self.entries:
            if entry.epoch < 0 or entry.start_offset < 0:
                raise CorruptIndexError(f"leader epoch entry {entry} is negative")

    @classmethod
    def parse(cls, data: bytes | str) -> LeaderEpochCheckpoint:
        """Read the text format; anything Kafka's reader would refuse raises CorruptIndexError."""
        try:
            text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
        except UnicodeDecodeError as e:
            raise CorruptIndexError(f"leader epoch checkpoint is not UTF-8: {e}") from None
        lines = text.splitlines()
        # Kafka reads an empty file, or one with only a version line, as no entries.
        if not lines:
            return cls()
        version = _int(lines[0], 32)
        if version != CURRENT_VERSION:
            raise CorruptIndexError(f"leader epoch checkpoint has version {version}, expected {CURRENT_VERSION}")
        if len(lines) == 1:
            return cls()
        expected = _int(lines[1], 32)
        entries = []
        for line in lines[2:]:
            fields = _WHITESPACE.split(line)
            if len(fields) != 2:
                raise CorruptIndexError(f"malformed line in leader epoch checkpoint: {line!r}")
            entries.append(EpochEntry(_int(fields[0], 32), _int(fields[1], 64)))
        if len(entries) != expected:
            raise CorruptIndexError(f"leader epoch checkpoint declares {expected} entries but holds {len(entries)}")
        return cls(entries)

    def serialize(self) -> bytes:
        lines = [str(CURRENT_VERSION), str(len(self.entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self.entries]
        return ("\n".join(lines) + "\n").encode()

    def in_range(self, start_offset: int, end_offset: int) -> list[EpochEntry]:
        return epochs_in_range(self.entries, start_offset, end_offset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeaderEpochCheckpoint) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"LeaderEpochCheckpoint({list(self.entries)!r})"


def _int(text: str, bits: int) -> int:
    """Java's Integer/Long.parseInt: optional sign, ASCII digits, within range."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise CorruptIndexError(f"malformed number in leader epoch checkpoint: {text!r}")
    value = int(text)
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise CorruptIndexError(f"number out of range in leader epoch checkpoint: {text!r}")
    return value
