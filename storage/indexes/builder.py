"""All of a segment's index files from one pass over its `.log`.

The pass replays what Kafka's `LogSegment.recover` does, batch by batch, from
headers only (markers excepted: their one record is read for the coordinator
epoch):

- offset index: an entry (batch last offset, batch position) for the first batch
  that starts more than `index.interval.bytes` after the previous entry;
- time index: beside each offset-index entry, (largest batch max timestamp so
  far, last offset of the batch that had it) when that timestamp grew, plus the
  final such entry that the broker appends when the segment rolls;
- transaction index, producer snapshot: `ProducerState` (see producer_snapshot);
- leader epochs: `LeaderEpochFileCache.assign(batch epoch, batch base offset)`.

A leader appends one batch per produce request and partition, so its indexes
follow the same per-batch rule and the files come out byte-identical. (A
follower appends whole fetched chunks, one index entry per chunk at most; its
offset index may be sparser, its lookups still land on a batch start at or
before the target.)

A `.log` given by path is read in chunks, never whole (`protocol.records.log_batches`
joins a batch cut by a chunk boundary); a 1 GiB segment costs a chunk of memory plus
one index entry per `index.interval.bytes`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import BatchHeader, crc_valid, log_batches
from tierproxy.storage.model import LogSegmentData

from . import CorruptLogError
from .leader_epoch import EpochEntry, LeaderEpochCheckpoint, assign, epochs_in_range
from .offset_index import OffsetIndex
from .producer_snapshot import ProducerState
from .time_index import NO_TIMESTAMP, TimeIndex
from .transaction_index import AbortedTxn

DEFAULT_INDEX_INTERVAL_BYTES = 4096
DEFAULT_CHUNK_BYTES = 1 << 20
_INT32_MAX = 2**31 - 1

LogSource = str | os.PathLike | bytes | bytearray | memoryview


def segment_file_name(offset: int, suffix: str) -> str:
    """Kafka's file name: the offset zero-padded to 20 digits, then the suffix (".index")."""
    return f"{offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class SegmentIndexes:
    """A segment's index files (as bytes) and the facts its remote metadata needs."""

    base_offset: int
    end_offset: int  # offset of the last record
    size_in_bytes: int
    max_timestamp_ms: int  # -1 when no batch carries a timestamp
    offset_of_max_timestamp: int
    first_leader_epoch: int  # -1 when the batches carry none
    last_leader_epoch: int
    segment_leader_epochs: tuple[tuple[int, int], ...]  # (epoch, start offset) within the segment
    leader_epochs: tuple[EpochEntry, ...]  # from the log start to the segment end: what Kafka ships
    offset_index: bytes
    time_index: bytes
    transaction_index: bytes
    producer_snapshot: bytes
    leader_epoch_checkpoint: bytes
    producer_state: ProducerState  # after the segment's last batch: the next segment's initial state

    @property
    def next_offset(self) -> int:
        return self.end_offset + 1

    @property
    def txn_index_empty(self) -> bool:
        return not self.transaction_index


def build_segment_indexes(
    log: LogSource,
    base_offset: int,
    *,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    initial_producer_state: ProducerState | Mapping[int, int] | None = None,
    initial_leader_epochs: Iterable[tuple[int, int]] = (),
    verify_crc: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> SegmentIndexes:
    """Walk the `.log` (a path, or its bytes) once and build every index.

    `initial_producer_state` is the state at `base_offset`: the previous segment's
    `producer_state` (or `ProducerState.from_snapshot` of its `.snapshot`), or a
    {producer id: first offset} map of transactions still open there. Without it,
    a transaction begun in an earlier segment is not seen, and its ABORT marker
    here gets no transaction index entry. `initial_leader_epochs` are the entries
    before this segment; the shipped checkpoint covers them plus this segment's.
    """
    if index_interval_bytes < 0:
        raise ValueError(f"index interval bytes must be >= 0, got {index_interval_bytes}")
    if isinstance(initial_producer_state, ProducerState):
        state = initial_producer_state.copy()
    elif initial_producer_state is None:
        state = ProducerState()
    else:
        state = ProducerState.from_ongoing(initial_producer_state)
    epochs = [EpochEntry(*e) for e in initial_leader_epochs]
    LeaderEpochCheckpoint(epochs)  # validates their order

    pack_offset, pack_time = OffsetIndex.ENTRY.pack, TimeIndex.ENTRY.pack
    offset_index, time_index = bytearray(), bytearray()
    aborted: list[AbortedTxn] = []
    last_index_position = 0
    max_timestamp, offset_of_max_timestamp = NO_TIMESTAMP, base_offset
    last_indexed_timestamp = NO_TIMESTAMP
    first_epoch = last_epoch = -1
    next_offset = base_offset
    size = 0
    first = True

    for header, buffer, position in _walk(log, chunk_bytes):
        if header.base_offset < next_offset:
            raise CorruptLogError(
                f"segment {base_offset}: batch at byte {position} has base offset {header.base_offset},"
                f" below {next_offset}"
            )
        if header.last_offset - base_offset > _INT32_MAX:
            raise CorruptLogError(f"segment {base_offset}: offset {header.last_offset} overflows the index")
        if position + header.size > _INT32_MAX:
            raise CorruptLogError(f"segment {base_offset} is larger than 2 GiB")
        if verify_crc and not crc_valid(buffer, header):
            raise CorruptLogError(f"segment {base_offset}: batch at offset {header.base_offset} fails its CRC-32C")

        if header.max_timestamp > max_timestamp:
            max_timestamp, offset_of_max_timestamp = header.max_timestamp, header.last_offset
        if position - last_index_position > index_interval_bytes:
            offset_index += pack_offset(header.last_offset - base_offset, position)
            if max_timestamp > last_indexed_timestamp:
                time_index += pack_time(max_timestamp, offset_of_max_timestamp - base_offset)
                last_indexed_timestamp = max_timestamp
            last_index_position = position

        epoch = header.partition_leader_epoch
        if epoch >= 0:
            assign(epochs, epoch, header.base_offset)
        if first:
            first_epoch, first = epoch, False
        last_epoch = epoch

        txn = state.append(buffer, header)
        if txn is not None:
            aborted.append(txn)
        next_offset = header.next_offset
        size = position + header.size

    if first:
        raise ValueError(f"segment {base_offset} holds no record batch")
    # What the broker appends when the segment rolls (onBecomeInactiveSegment).
    if max_timestamp > last_indexed_timestamp:
        time_index += pack_time(max_timestamp, offset_of_max_timestamp - base_offset)

    return SegmentIndexes(
        base_offset=base_offset,
        end_offset=next_offset - 1,
        size_in_bytes=size,
        max_timestamp_ms=max_timestamp,
        offset_of_max_timestamp=offset_of_max_timestamp,
        first_leader_epoch=first_epoch,
        last_leader_epoch=last_epoch,
        segment_leader_epochs=tuple((e.epoch, e.start_offset) for e in epochs_in_range(epochs, base_offset, next_offset)),
        leader_epochs=tuple(epochs),
        offset_index=bytes(offset_index),
        time_index=bytes(time_index),
        transaction_index=b"".join(txn.pack() for txn in aborted),
        producer_snapshot=state.snapshot().serialize(),
        leader_epoch_checkpoint=LeaderEpochCheckpoint(epochs).serialize(),
        producer_state=state,
    )


def write_indexes(
    indexes: SegmentIndexes, log_path: str | os.PathLike, out_dir: str | os.PathLike, *, overwrite: bool = False
) -> LogSegmentData:
    """Write the index files into `out_dir` under Kafka's names; the `.log` stays where it is.

    The producer snapshot is named after the next offset, as the broker names the
    snapshot it takes when the segment rolls. An empty transaction index is not
    written (Kafka creates the file on the first aborted transaction). Each file
    is written under a temporary name then renamed; existing files are refused
    unless `overwrite`, so a broker's own log directory is never clobbered.
    """
    out = Path(out_dir)
    base = indexes.base_offset
    files = {
        out / segment_file_name(base, ".index"): indexes.offset_index,
        out / segment_file_name(base, ".timeindex"): indexes.time_index,
        out / segment_file_name(indexes.next_offset, ".snapshot"): indexes.producer_snapshot,
    }
    txn_path = out / segment_file_name(base, ".txnindex")
    if not indexes.txn_index_empty:
        files[txn_path] = indexes.transaction_index
    if not overwrite:
        existing = [str(p) for p in files if p.exists()]
        if existing:
            raise FileExistsError(f"index files already exist: {', '.join(existing)}")
    out.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
    paths = list(files)
    return LogSegmentData(
        log_segment=Path(log_path),
        offset_index=paths[0],
        time_index=paths[1],
        transaction_index=None if indexes.txn_index_empty else txn_path,
        producer_snapshot_index=paths[2],
        leader_epoch_index=indexes.leader_epoch_checkpoint,
    )


def write_segment_files(
    log_path: str | os.PathLike, base_offset: int, out_dir: str | os.PathLike, *, overwrite: bool = False, **options
) -> LogSegmentData:
    """`build_segment_indexes` on the file, then `write_indexes`; options go to the former."""
    return write_indexes(build_segment_indexes(log_path, base_offset, **options), log_path, out_dir, overwrite=overwrite)


def _walk(log: LogSource, chunk_bytes: int) -> Iterator[tuple[BatchHeader, bytes | bytearray | memoryview, int]]:
    """(header, buffer holding the batch at header.position, batch position in the .log)."""
    if not isinstance(log, (str, os.PathLike)):
        yield from _batches([log], len(log), "segment")
        return
    path = Path(log)
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        yield from _batches(iter(lambda: file.read(chunk_bytes), b""), size, str(path))


def _batches(chunks: Iterable[bytes | bytearray | memoryview], size: int,
             name: str) -> Iterator[tuple[BatchHeader, bytes | bytearray | memoryview, int]]:
    try:
        for batch in log_batches(chunks, end=size):
            # A cut batch's header is at 0 of its bytes joined (markers' records are read there).
            yield batch.header, batch.view if batch.cut else batch.buffer, batch.position
    except DecodeError as e:
        raise CorruptLogError(f"{name}: {e}") from None
