"""One user partition's remote log metadata, compact: about 100 bytes per segment.

Segments not yet DELETE_SEGMENT_FINISHED are fixed-size rows of one bytearray, in the order
they were added (Kafka keeps that order too; a superset upload replaces what came before it):

    segment id (16 bytes), start offset, end offset, max timestamp, event timestamp,
    size in bytes (int64 each), writer leader epoch (int32), state, txn index empty (1 byte
    each), position and count of its (leader epoch, start offset) pairs in `segment_epochs`

A forgotten (DELETE_SEGMENT_FINISHED) segment's row stays as a hole until holes outnumber
the segments; then the table is compacted and rows renumbered. Beside the rows:

- `by_id`: rows sorted by segment id, for updates (a bisection, no dict entry per segment);
- `epochs`: the leader-epoch index (`epoch_index.py`), Kafka's referenced and
  unreferenced segments per epoch;
- made on first need after a change: rows by (start offset, end offset) with the running
  maximum of their end offsets (the segments holding an offset, by bisection), and the
  remote log start and end offsets.

RemoteLogSegmentMetadata objects are made only for what a lookup returns (the last few
thousand are kept until their partition changes).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import struct
import uuid
from array import array
from collections.abc import Iterator, Sequence
from typing import Final

from ..model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from .epoch_index import LeaderEpochIndex
from .lineage import EpochChain, epoch_end, epochs_within_lineage

ROW = struct.Struct("<16sqqqqqiBBII")
ROW_SIZE = ROW.size
_START_END = struct.Struct("<qq")
_START_AT = 16
_EVENT_AT = 40
_LEADER_EPOCH = struct.Struct("<i")
_LEADER_EPOCH_AT = 56
_STATE_AT = 60
_EPOCHS = struct.Struct("<II")
_EPOCHS_AT = 62

_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
_FORGOTTEN = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED  # a hole in the table
_STATES = tuple(RemoteLogSegmentState)


class _Unknown(enum.Enum):
    # An enum member, so that `is _UNKNOWN` narrows for a type checker.
    UNKNOWN = 0


_UNKNOWN: Final = _Unknown.UNKNOWN
_MIN_HOLES_TO_COMPACT = 32
# Every change takes a new number from one sequence, so (version, row) never names two segments.
_versions = itertools.count(1)
# Segments made for recent lookups: a remote read asks for the same few again and again.
_made: dict[tuple[int, int], RemoteLogSegmentMetadata] = {}
_MAX_MADE = 4096


class PartitionState:
    """Everything known about one user partition's remote log. Callers check records against
    the rules first (`cache.py`); these methods only apply them."""

    __slots__ = ("tp", "rows", "segment_epochs", "by_id", "epochs", "delete_metadata", "holes",
                 "stale_epochs", "version", "_order", "_reach", "_log_start", "_log_end")

    def __init__(
        self, tp: TopicIdPartition, rows: bytearray | None = None, segment_epochs: array | None = None,
        by_id: array | None = None, epochs: LeaderEpochIndex | None = None,
    ) -> None:
        self.tp = tp
        self.rows = bytearray() if rows is None else rows
        # (leader epoch, start offset) pairs of every row
        self.segment_epochs = array("q") if segment_epochs is None else segment_epochs
        self.by_id = array("i") if by_id is None else by_id
        self.epochs = LeaderEpochIndex() if epochs is None else epochs
        self.delete_metadata: RemotePartitionDeleteMetadata | None = None
        self.holes = 0  # forgotten rows
        self.stale_epochs = 0  # pairs in segment_epochs no row points at any more
        self.version = next(_versions)
        self._order: array | None = None
        self._reach: array | None = None  # made with _order
        self._log_start: int | None | _Unknown = _UNKNOWN
        self._log_end: int | None | _Unknown = _UNKNOWN

    # ------------------------------------------------------------------ rows

    def __len__(self) -> int:
        """Segments not DELETE_SEGMENT_FINISHED."""
        return len(self.rows) // ROW_SIZE - self.holes

    def _id_of(self, row: int) -> bytearray:
        at = row * ROW_SIZE
        return self.rows[at:at + 16]

    def find(self, segment_id: uuid.UUID) -> int | None:
        """The row of a segment not DELETE_SEGMENT_FINISHED, or None."""
        key: bytes | bytearray = segment_id.bytes
        # The newest row first: a segment's updates mostly follow its COPY_SEGMENT_STARTED.
        newest = len(self.rows) - ROW_SIZE
        if newest >= 0 and self.rows[newest:newest + 16] == key and self.rows[newest + _STATE_AT] != _FORGOTTEN:
            return newest // ROW_SIZE
        i = bisect.bisect_left(self.by_id, key, key=self._id_of)
        if i < len(self.by_id) and self._id_of(self.by_id[i]) == key:
            return self.by_id[i]
        return None

    def state(self, row: int) -> RemoteLogSegmentState:
        return _STATES[self.rows[row * ROW_SIZE + _STATE_AT]]

    def offsets(self, row: int) -> tuple[int, int]:
        """(start offset, end offset)."""
        return _START_END.unpack_from(self.rows, row * ROW_SIZE + _START_AT)

    def leader_epochs(self, row: int) -> tuple[tuple[int, int], ...]:
        position, count = _EPOCHS.unpack_from(self.rows, row * ROW_SIZE + _EPOCHS_AT)
        if count == 1:  # most segments
            return ((self.segment_epochs[2 * position], self.segment_epochs[2 * position + 1]),)
        pairs = self.segment_epochs[2 * position:2 * (position + count)]
        return tuple(zip(pairs[0::2], pairs[1::2]))

    def epoch_end(self, row: int, epoch: int) -> int:
        return epoch_end(self.leader_epochs(row), self.offsets(row)[1], epoch)

    def within_lineage(self, row: int, epoch_chain: EpochChain, log_end_offset: int | None = None) -> bool:
        return epochs_within_lineage(self.leader_epochs(row), self.offsets(row)[1], epoch_chain, log_end_offset)

    def segment(self, row: int) -> RemoteLogSegmentMetadata:
        key = (self.version, row)
        made = _made.get(key)
        if made is None:
            if len(_made) >= _MAX_MADE:
                _made.clear()
            made = _made[key] = self._make(row)
        return made

    def _make(self, row: int) -> RemoteLogSegmentMetadata:
        (segment_id, start, end, max_timestamp, event_timestamp, size, leader_epoch, state, txn_index_empty,
         _, _) = ROW.unpack_from(self.rows, row * ROW_SIZE)
        return RemoteLogSegmentMetadata(
            segment_id=RemoteLogSegmentId(self.tp, uuid.UUID(bytes=segment_id)),
            start_offset=start,
            end_offset=end,
            max_timestamp_ms=max_timestamp,
            leader_epoch=leader_epoch,
            event_timestamp_ms=event_timestamp,
            segment_leader_epochs=self.leader_epochs(row),
            segment_size_in_bytes=size,
            state=_STATES[state],
            txn_index_empty=bool(txn_index_empty),
        )

    def live_rows(self) -> Iterator[int]:
        """Rows of segments not DELETE_SEGMENT_FINISHED, in the order they were added."""
        states = self.rows[_STATE_AT::ROW_SIZE]
        return (row for row, state in enumerate(states) if state != _FORGOTTEN)

    # ------------------------------------------------------------------ changes

    def _changed(self) -> None:
        self.version = next(_versions)
        self._log_start = self._log_end = _UNKNOWN

    def _pack(self, m: RemoteLogSegmentMetadata) -> bytes:
        position = len(self.segment_epochs) // 2
        for epoch, start in m.segment_leader_epochs:
            self.segment_epochs.append(epoch)
            self.segment_epochs.append(start)
        return ROW.pack(m.segment_id.id.bytes, m.start_offset, m.end_offset, m.max_timestamp_ms,
                        m.event_timestamp_ms, m.segment_size_in_bytes, m.leader_epoch, m.state,
                        m.txn_index_empty, position, len(m.segment_leader_epochs))

    def add(self, m: RemoteLogSegmentMetadata) -> None:
        """A segment whose id is not in the table."""
        row = len(self.rows) // ROW_SIZE
        self.rows += self._pack(m)
        key: bytes | bytearray = m.segment_id.id.bytes
        self.by_id.insert(bisect.bisect_left(self.by_id, key, key=self._id_of), row)
        order, reach = self._order, self._reach
        if order is not None and reach is not None and (
                not order or self.offsets(order[-1]) <= (m.start_offset, m.end_offset)):
            order.append(row)  # the usual case: the log grows at its end
            reach.append(max(m.end_offset, reach[-1]) if reach else m.end_offset)
        else:
            self._order = None
        self._register(row)
        self._changed()

    def replace(self, row: int, m: RemoteLogSegmentMetadata) -> None:
        """Overwrites a row with `m` (same segment id), without transition checks."""
        self._unregister(row)
        self.stale_epochs += _EPOCHS.unpack_from(self.rows, row * ROW_SIZE + _EPOCHS_AT)[1]
        self.rows[row * ROW_SIZE:(row + 1) * ROW_SIZE] = self._pack(m)
        self._order = None
        self._register(row)
        self._changed()

    def transition(self, row: int, state: RemoteLogSegmentState, event_timestamp_ms: int, leader_epoch: int) -> None:
        """Moves a segment to `state` (already checked). DELETE_SEGMENT_FINISHED forgets it."""
        if state == _FORGOTTEN:
            self._unregister(row)
            self._forget(row)
        else:
            at = row * ROW_SIZE
            # FINISHED: referenced per epoch. DELETE_STARTED: unreferenced but listable for
            # cleanup, and (as in Kafka) the epoch's highest offset stays.
            self.rows[at + _STATE_AT] = state
            struct.pack_into("<q", self.rows, at + _EVENT_AT, event_timestamp_ms)
            _LEADER_EPOCH.pack_into(self.rows, at + _LEADER_EPOCH_AT, leader_epoch)
            self._register(row)
        self._changed()

    def truncate(self, cut: int, leader_epoch: int, event_timestamp_ms: int) -> None:
        """See `serde.RemoteLogTruncation`: segments from `cut` on go to DELETE_SEGMENT_STARTED,
        one straddling it ends at cut - 1."""
        touched_epochs: set[int] = set()
        for row in list(self.live_rows()):
            start, end = self.offsets(row)
            if self.state(row) == _DELETE_STARTED or end < cut:
                continue
            epochs = self.leader_epochs(row)
            touched_epochs.update(e for e, _ in epochs)
            if start >= cut:
                self.transition(row, _DELETE_STARTED, event_timestamp_ms, leader_epoch)
                continue
            # Leave the epochs below the cut as they are indexed (re-registering would let the
            # shorter segment displace others); only drop it from the epochs it no longer holds.
            kept = tuple((e, o) for e, o in epochs if o < cut) or epochs[:1]
            for epoch, epoch_start in epochs[len(kept):]:
                self.epochs.drop(epoch, epoch_start, row)
            self._cut(row, cut - 1, kept)
        for epoch in touched_epochs:
            self.epochs.cut_highest(epoch, cut)
        self._order = None
        self._changed()

    def _cut(self, row: int, end: int, epochs: tuple[tuple[int, int], ...]) -> None:
        at = row * ROW_SIZE
        position, count = _EPOCHS.unpack_from(self.rows, at + _EPOCHS_AT)
        self.stale_epochs += count
        struct.pack_into("<q", self.rows, at + _START_AT + 8, end)
        _EPOCHS.pack_into(self.rows, at + _EPOCHS_AT, len(self.segment_epochs) // 2, len(epochs))
        for epoch, start in epochs:
            self.segment_epochs.append(epoch)
            self.segment_epochs.append(start)

    def _register(self, row: int) -> None:
        finished = self.state(row) == _FINISHED
        for epoch, start in self.leader_epochs(row):
            if finished:
                self.epochs.add_finished(epoch, start, row, self.epoch_end(row, epoch))
            else:
                self.epochs.unreference(epoch, start, row)

    def _unregister(self, row: int) -> None:
        for epoch, start in self.leader_epochs(row):
            self.epochs.drop(epoch, start, row)

    def _forget(self, row: int) -> None:
        self.by_id.pop(bisect.bisect_left(self.by_id, self._id_of(row), key=self._id_of))
        self.rows[row * ROW_SIZE + _STATE_AT] = _FORGOTTEN
        self.stale_epochs += _EPOCHS.unpack_from(self.rows, row * ROW_SIZE + _EPOCHS_AT)[1]
        self.holes += 1
        self._order = None
        if self.holes >= _MIN_HOLES_TO_COMPACT and self.holes > len(self):
            self.compact()

    def compact(self) -> None:
        """Drops the holes and the leader epochs no row points at; rows keep their order."""
        if not self.holes and not self.stale_epochs:
            return
        live = list(self.live_rows())
        new_row = array("i", [-1]) * (len(self.rows) // ROW_SIZE)
        rows = bytearray()
        segment_epochs = array("q")
        for new, old in enumerate(live):
            new_row[old] = new
            at = old * ROW_SIZE
            position, count = _EPOCHS.unpack_from(self.rows, at + _EPOCHS_AT)
            rows += self.rows[at:at + _EPOCHS_AT]
            rows += _EPOCHS.pack(len(segment_epochs) // 2, count)
            segment_epochs.extend(self.segment_epochs[2 * position:2 * (position + count)])
        self.rows, self.segment_epochs = rows, segment_epochs
        self.by_id = array("i", [new_row[r] for r in self.by_id])
        self.epochs.renumber(new_row)
        self.holes = self.stale_epochs = 0
        self._order = None
        self._changed()

    # ------------------------------------------------------------------ lookups

    def _ordered(self) -> tuple[array, array]:
        """Rows by (start offset, end offset, row), and the running maximum of their end offsets."""
        if self._order is None or self._reach is None:
            keyed = sorted((*self.offsets(row), row) for row in self.live_rows())
            self._order = array("i", [row for _, _, row in keyed])
            self._reach = array("q", itertools.accumulate((end for _, end, _ in keyed), max))
        return self._order, self._reach

    def ordered_rows(self) -> array:
        return self._ordered()[0]

    def rows_from(self, offset: int) -> Iterator[int]:
        """Rows ending at or after `offset`, by (start offset, end offset); the first found by
        bisection. Raises RuntimeError if the partition changes while it is being iterated."""
        order, reach = self._ordered()
        version = self.version
        for i in range(bisect.bisect_left(reach, offset), len(order)):
            if self.version != version:
                raise RuntimeError(f"remote log metadata of {self.tp} changed during iteration")
            row = order[i]
            if self.offsets(row)[1] >= offset:
                yield row

    def log_start_offset(self) -> int | None:
        """Lowest start offset of the COPY_SEGMENT_FINISHED segments."""
        if self._log_start is _UNKNOWN:
            self._log_start = next((self.offsets(row)[0] for row in self.ordered_rows()
                                    if self.state(row) == _FINISHED), None)
        return self._log_start

    def log_end_offset(self) -> int | None:
        """Highest end offset of the COPY_SEGMENT_FINISHED segments."""
        if self._log_end is _UNKNOWN:
            self._log_end = max((self.offsets(row)[1] for row in self.live_rows()
                                 if self.state(row) == _FINISHED), default=None)
        return self._log_end

    # ------------------------------------------------------------------ snapshots

    def arrays(self) -> tuple[array, ...]:
        """The state as arrays (the delete metadata aside); `from_arrays` takes them back.
        Compacted first, so a snapshot carries no holes."""
        self.compact()
        return (array("B", self.rows), self.segment_epochs, self.by_id, *self.epochs.arrays())

    @classmethod
    def from_arrays(cls, tp: TopicIdPartition, arrays: Sequence[array]) -> PartitionState:
        """Raises ValueError on arrays that are not a consistent state."""
        rows, segment_epochs, by_id, *epochs = arrays
        if len(rows) % ROW_SIZE:
            raise ValueError(f"{len(rows)} bytes of rows are not whole rows of {ROW_SIZE}")
        count = len(rows) // ROW_SIZE
        if len(by_id) != count or sorted(by_id) != list(range(count)):
            raise ValueError("the id index is not a permutation of the rows")
        if _FORGOTTEN in rows[_STATE_AT::ROW_SIZE]:
            raise ValueError("a snapshot row is DELETE_SEGMENT_FINISHED")
        # Compacted rows point at consecutive pairs: the last one ends where the pairs do.
        last = sum(_EPOCHS.unpack_from(rows, (count - 1) * ROW_SIZE + _EPOCHS_AT)) if count else 0
        if 2 * last != len(segment_epochs):
            raise ValueError("the rows and their leader epochs disagree")
        return cls(tp, _with_room(rows), segment_epochs, by_id, LeaderEpochIndex.from_arrays(epochs, count))


def _with_room(data: array) -> bytearray:
    """A copy of `data` with room to grow by an eighth, as appending would give it. Appending to
    an exact-size copy would move it, and the holes that 10,000 partitions leave behind at a
    restart (one per partition, none reusable: every later buffer is larger) stay resident."""
    rows = bytearray(len(data) + max(len(data) // 8, 4 * ROW_SIZE))
    rows[:len(data)] = data
    del rows[len(data):]  # keeps the allocation (bytearray shrinks in place by less than half)
    return rows


ARRAY_TYPECODES = ("B", "q", "i", *(a.typecode for a in LeaderEpochIndex().arrays()))
"""The typecodes of `PartitionState.arrays()`, in order."""
