"""Kafka's `RemoteLogLeaderEpochState` for every leader epoch of one partition, in flat arrays.

Segments are named by their row in the partition's segment table (`partition.py`).

- Referenced: COPY_SEGMENT_FINISHED segments by the start offset of an epoch in them. The
  (start offset, row) pairs of all epochs sit in two parallel arrays sorted by (epoch, start
  offset); epoch `keys[k]` owns positions `lo[k]` up to `lo[k + 1]` (or the end), so a lookup
  is a bisection inside that range. Appends go to the newest epoch, at the end.
- `highest[k]`: the highest offset of epoch `keys[k]` in a segment that reached
  COPY_SEGMENT_FINISHED (NO_OFFSET: none yet).
- Unreferenced: segments of an epoch still copying, being deleted, or replaced by a new
  leader's upload; `epoch << 32 | row` per (epoch, segment), a set kept in an array (it stays
  small: segments leave it when they finish or are deleted).

A few hundred bytes per partition plus 12 per referenced (segment, epoch), instead of an
object with a dict and a set per epoch.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

NO_OFFSET = -(1 << 63)
_ROW_MASK = 0xFFFFFFFF


def _unref_key(epoch: int, row: int) -> int:
    return epoch << 32 | row


class LeaderEpochIndex:
    __slots__ = ("keys", "lo", "highest", "ref_start", "ref_row", "unref")

    def __init__(self) -> None:
        self.keys = array("i")  # leader epochs, ascending
        self.lo = array("I")  # first position of each epoch in ref_start / ref_row
        self.highest = array("q")
        self.ref_start = array("q")
        self.ref_row = array("i")
        self.unref = array("q")

    # ------------------------------------------------------------------ epochs

    def _find(self, epoch: int) -> int | None:
        k = bisect.bisect_left(self.keys, epoch)
        return k if k < len(self.keys) and self.keys[k] == epoch else None

    def _bounds(self, k: int) -> tuple[int, int]:
        hi = self.lo[k + 1] if k + 1 < len(self.keys) else len(self.ref_start)
        return self.lo[k], hi

    def _ensure(self, epoch: int) -> int:
        k = bisect.bisect_left(self.keys, epoch)
        if k < len(self.keys) and self.keys[k] == epoch:
            return k
        self.keys.insert(k, epoch)
        self.lo.insert(k, self.lo[k] if k < len(self.lo) else len(self.ref_start))
        self.highest.insert(k, NO_OFFSET)
        return k

    def _insert(self, k: int, i: int, start: int, row: int) -> None:
        self.ref_start.insert(i, start)
        self.ref_row.insert(i, row)
        for j in range(k + 1, len(self.lo)):
            self.lo[j] += 1

    def _delete(self, k: int, i: int) -> None:
        del self.ref_start[i]
        del self.ref_row[i]
        for j in range(k + 1, len(self.lo)):
            self.lo[j] -= 1

    def _unreference_row(self, epoch: int, row: int) -> None:
        key = _unref_key(epoch, row)
        if key not in self.unref:
            self.unref.append(key)

    def _forget_unreferenced(self, epoch: int, row: int) -> None:
        key = _unref_key(epoch, row)
        if key in self.unref:
            self.unref.remove(key)

    # ------------------------------------------------------------------ transitions

    def add_finished(self, epoch: int, start: int, row: int, epoch_end: int) -> None:
        """A segment reached COPY_SEGMENT_FINISHED holding `epoch` from `start` to `epoch_end`."""
        k = self._ensure(epoch)
        lo, hi = self._bounds(k)
        highest = self.highest[k]
        # A new leader may upload a superset of segments the previous one uploaded for this
        # epoch: the newest referenced ones at or after `start` are replaced.
        while hi > lo and self.ref_start[hi - 1] >= start and highest != NO_OFFSET and highest <= epoch_end:
            self._unreference_row(epoch, self.ref_row[hi - 1])
            self._delete(k, hi - 1)
            hi -= 1
        i = bisect.bisect_left(self.ref_start, start, lo, hi)
        if i < hi and self.ref_start[i] == start:
            previous = self.ref_row[i]
            if previous != row:
                self._unreference_row(epoch, previous)  # Kafka overwrites; keep it listable for cleanup
            self.ref_row[i] = row
        else:
            self._insert(k, i, start, row)
        self._forget_unreferenced(epoch, row)
        if highest == NO_OFFSET or epoch_end > highest:
            self.highest[k] = epoch_end

    def unreference(self, epoch: int, start: int, row: int) -> None:
        """Copying, or being deleted: listed for cleanup, never served."""
        self._ensure(epoch)
        self.drop(epoch, start, row)
        self._unreference_row(epoch, row)

    def drop(self, epoch: int, start: int, row: int) -> None:
        """The segment no longer holds `epoch` from `start` (deleted, or cut by a truncation)."""
        k = self._find(epoch)
        if k is None:
            return
        lo, hi = self._bounds(k)
        i = bisect.bisect_left(self.ref_start, start, lo, hi)
        if i < hi and self.ref_start[i] == start and self.ref_row[i] == row:
            self._delete(k, i)
        self._forget_unreferenced(epoch, row)

    def cut_highest(self, epoch: int, cut: int) -> None:
        """After a truncation at `cut`: the epoch's offsets at or past it are gone; what remains
        ends at cut - 1 if a finished segment still holds the epoch below the cut."""
        k = self._find(epoch)
        if k is None or self.highest[k] == NO_OFFSET or self.highest[k] < cut:
            return
        lo, hi = self._bounds(k)
        self.highest[k] = cut - 1 if hi > lo else NO_OFFSET

    # ------------------------------------------------------------------ lookups

    def floor(self, epoch: int, offset: int) -> int | None:
        """The referenced segment of `epoch` with the greatest start offset <= `offset`."""
        k = self._find(epoch)
        if k is None:
            return None
        lo, hi = self._bounds(k)
        i = bisect.bisect_right(self.ref_start, offset, lo, hi)
        return self.ref_row[i - 1] if i > lo else None

    def highest_offset(self, epoch: int) -> int | None:
        k = self._find(epoch)
        if k is None or self.highest[k] == NO_OFFSET:
            return None
        return self.highest[k]

    def history(self) -> list[tuple[int, int]]:
        """(epoch, first start offset) of each epoch a COPY_SEGMENT_FINISHED segment serves, by
        epoch: the remote log's leader-epoch history, as the leader's checkpoint holds it."""
        history = []
        for k, epoch in enumerate(self.keys):
            lo, hi = self._bounds(k)
            if hi > lo:
                history.append((epoch, self.ref_start[lo]))
        return history

    def rows(self, epoch: int) -> list[int]:
        """The epoch's segments: referenced by start offset, then unreferenced by row."""
        k = self._find(epoch)
        if k is None:
            return []
        lo, hi = self._bounds(k)
        unreferenced = sorted(key & _ROW_MASK for key in self.unref if key >> 32 == epoch)
        return list(self.ref_row[lo:hi]) + unreferenced

    # ------------------------------------------------------------------ compaction and snapshots

    def renumber(self, new_row: Sequence[int]) -> None:
        """Rows moved (the segment table dropped forgotten segments): `new_row[old]`."""
        self.ref_row = array("i", [new_row[r] for r in self.ref_row])
        self.unref = array("q", [key >> 32 << 32 | new_row[key & _ROW_MASK] for key in self.unref])

    def arrays(self) -> tuple[array, ...]:
        return self.keys, self.lo, self.highest, self.ref_start, self.ref_row, self.unref

    @classmethod
    def from_arrays(cls, arrays: Sequence[array], rows: int) -> LeaderEpochIndex:
        """The inverse of `arrays`; raises ValueError on arrays that cannot be an index of `rows` rows."""
        index = cls.__new__(cls)
        index.keys, index.lo, index.highest, index.ref_start, index.ref_row, index.unref = arrays
        n = len(index.ref_start)
        if len(index.lo) != len(index.keys) or len(index.highest) != len(index.keys) or len(index.ref_row) != n:
            raise ValueError("leader epoch index arrays disagree in length")
        if list(index.keys) != sorted(set(index.keys)) or list(index.lo) != sorted(index.lo) \
                or (index.lo and (index.lo[0] != 0 or index.lo[-1] > n)):
            raise ValueError("leader epoch index is not sorted")
        if (index.ref_row and not 0 <= min(index.ref_row) <= max(index.ref_row) < rows) \
                or any(not 0 <= key & _ROW_MASK < rows for key in index.unref):
            raise ValueError("leader epoch index names a row that does not exist")
        return index
