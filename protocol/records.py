"""Record-batch headers (magic v2), read without touching the records.

A batch on the wire and in a segment's `.log` is

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8
    | crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64
    | maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32
    | recordsCount int32 | records...

`batchLength` counts the bytes after itself, so a batch occupies 12 + batchLength
bytes. The CRC-32C covers attributes to the end of the batch. Brokers may end a
fetch response with a partial batch (a fetch is cut at max bytes, not on batch
boundaries); the walker stops before it and reports how many bytes were whole.

A log read in chunks (a remote segment through the chunk cache, a `.log` file read
piece by piece) gives its batches with `log_batches` / `log_batches_async`: one
reassembly for every reader, with no I/O of its own. A batch wholly inside a chunk is a
view of that chunk; a batch cut by a chunk boundary is the views of its parts in the
chunks it spans (only its header is copied, to be read), so nothing is copied on the way
to a socket; the next chunk is asked for only when a batch needs it.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Iterator
from typing import Final, NamedTuple

import crc32c

from .errors import DecodeError

# Offsets of the fixed fields, in Kafka's DefaultRecordBatch order.
_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE: Final = _HEADER.size  # 61
LOG_OVERHEAD: Final = _PREFIX.size  # 12: offset + length, as Kafka calls it
MAGIC_OFFSET: Final = 16
CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21
CURRENT_MAGIC: Final = 2
# Kafka refuses a batch smaller than its own header; anything below is garbage.
_MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD

_COMPRESSION_MASK: Final = 0x07
_TIMESTAMP_TYPE_FLAG: Final = 0x08
_TRANSACTIONAL_FLAG: Final = 0x10
_CONTROL_FLAG: Final = 0x20


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(enum.IntEnum):
    """The key of the single record in a control batch (transaction marker)."""

    ABORT = 0
    COMMIT = 1


class BatchHeader:
    """The fixed header of one record batch and where it sits in its buffer."""

    __slots__ = (
        "position",
        "base_offset",
        "batch_length",
        "partition_leader_epoch",
        "magic",
        "crc",
        "attributes",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "records_count",
    )

    def __init__(self, position: int, fields: tuple) -> None:
        self.position = position
        (
            self.base_offset,
            self.batch_length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        ) = fields

    @property
    def size(self) -> int:
        """Bytes the batch occupies, size fields included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def end_position(self) -> int:
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & _COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & _TIMESTAMP_TYPE_FLAG else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_FLAG)

    def __repr__(self) -> str:
        return (
            f"BatchHeader(position={self.position}, base_offset={self.base_offset}, "
            f"last_offset={self.last_offset}, size={self.size}, "
            f"leader_epoch={self.partition_leader_epoch}, records={self.records_count}, "
            f"compression={self.compression.name}, transactional={self.is_transactional}, "
            f"control={self.is_control})"
        )


def read_batch_header(buffer: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader | None:
    """The batch starting at `position`, or None when the buffer holds only part of it.

    Raises DecodeError for bytes that cannot be a v2 batch.
    """
    return _read_header(buffer, position, position)


def _read_header(buffer: bytes | bytearray | memoryview, position: int, named: int,
                 available: int | None = None) -> BatchHeader | None:
    """`read_batch_header`, naming byte `named` (where the batch is in its log) in errors.
    `available`: the bytes of the batch there are, when more than `buffer` holds (a batch
    whose header alone was copied together)."""
    if available is None:
        available = len(buffer) - position
    if available < LOG_OVERHEAD:
        return None
    _, batch_length = _PREFIX.unpack_from(buffer, position)
    if batch_length < _MIN_BATCH_LENGTH:
        raise DecodeError(f"record batch at byte {named} has invalid length {batch_length}")
    if available < HEADER_SIZE:
        return None
    magic = buffer[position + MAGIC_OFFSET]
    if magic != CURRENT_MAGIC:
        raise DecodeError(f"record batch at byte {named} has magic {magic}, only v2 is supported")
    if available < LOG_OVERHEAD + batch_length:
        return None
    header = BatchHeader(position, _HEADER.unpack_from(buffer, position))
    if header.attributes & _COMPRESSION_MASK > Compression.ZSTD:
        raise DecodeError(f"record batch at byte {named} has unknown compression {header.attributes & 7}")
    return header


def iter_batches(
    buffer: bytes | bytearray | memoryview,
    start: int = 0,
    *,
    verify_crc: bool = False,
) -> Iterator[BatchHeader]:
    """Every whole batch from `start`; a partial trailing batch ends the walk."""
    position = start
    while True:
        header = read_batch_header(buffer, position)
        if header is None:
            return
        if verify_crc and not crc_valid(buffer, header):
            raise DecodeError(
                f"record batch at offset {header.base_offset} (byte {position}) failed its CRC-32C check"
            )
        yield header
        position = header.end_position


class Batch(NamedTuple):
    """One whole batch of a log read in chunks."""

    header: BatchHeader  # header.position: where the batch starts in `buffer`
    #: the chunk holding the batch; for a batch cut by a chunk boundary, its header's bytes
    buffer: bytes | bytearray | memoryview
    position: int  # where the batch starts in the log
    #: a batch cut by a chunk boundary: views of its parts in the chunks it spans, in order
    cut: tuple[memoryview, ...] = ()

    @property
    def parts(self) -> tuple[memoryview, ...]:
        """The batch's bytes as views of the chunks they are in: what a response sends."""
        return self.cut or (self.view,)

    @property
    def view(self) -> memoryview:
        """The batch's bytes in one piece (those of a cut batch joined: a copy)."""
        if self.cut:
            return memoryview(b"".join(self.cut))
        return memoryview(self.buffer)[self.header.position : self.header.end_position]

    def crc_valid(self) -> bool:
        """The batch's CRC-32C matches its bytes, read where they are."""
        if not self.cut:
            return crc_valid(self.buffer, self.header)
        value, skip = 0, ATTRIBUTES_OFFSET
        for part in self.cut:
            if skip < len(part):
                value = crc32c.crc32c(part[skip:], value)
            skip = max(skip - len(part), 0)
        return value == self.header.crc


class _Reassembly:
    """The batches of a log fed chunk by chunk; `next` asks for a chunk by returning None.

    `position` is where the first chunk starts in the log (and the first batch with
    it); `end`, when known, is the log's size: a batch running past it fails before
    any chunk it would need is asked for.
    """

    __slots__ = ("chunk", "chunk_at", "end", "pending", "pending_size", "position")

    def __init__(self, position: int, end: int | None) -> None:
        self.position = position  # where the next batch starts in the log
        self.chunk: bytes | bytearray | memoryview = b""
        self.chunk_at = position  # where `chunk` starts in the log
        self.end = end
        self.pending: list[memoryview] = []  # the parts so far of a batch cut by a chunk boundary
        self.pending_size = 0

    @property
    def at_end(self) -> bool:
        return self.end is not None and self.position >= self.end and not self.pending

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """The chunk after the current one (whose bytes are all used by now)."""
        self.chunk_at += len(self.chunk)
        self.chunk = chunk

    def next(self) -> Batch | None:
        """The next whole batch, or None when the next chunk is needed (or the log ended)."""
        if not self.pending:
            offset = self.position - self.chunk_at
            header = _read_header(self.chunk, offset, self.position)
            if header is not None:
                return self._served(Batch(header, self.chunk, self.position))
            if offset >= len(self.chunk):
                return None
            self._take(memoryview(self.chunk)[offset:])
            return None
        taken = self.position + self.pending_size - self.chunk_at  # the next byte of the chunk to take
        while (size := self._pending_batch_size()) is None or self.pending_size < size:
            if taken >= len(self.chunk):
                return None
            want = (LOG_OVERHEAD if size is None else size) - self.pending_size
            part = memoryview(self.chunk)[taken : taken + want]
            self._take(part)
            taken += len(part)
        head = self._head()
        header = _read_header(head, 0, self.position, self.pending_size)
        if header is None:  # whole but shorter than a header: refused by its length already
            raise DecodeError(f"record batch at byte {self.position} is cut short")
        cut = tuple(self.pending)
        self.pending, self.pending_size = [], 0
        return self._served(Batch(header, head, self.position, cut))

    def _take(self, part: memoryview) -> None:
        self.pending.append(part)
        self.pending_size += len(part)
        if self.pending_size >= LOG_OVERHEAD:
            self._check_end(self._head())

    def _head(self) -> bytes | memoryview:
        """The first HEADER_SIZE bytes of the pending batch (fewer if it has fewer), in one piece."""
        first = self.pending[0]
        if len(first) >= HEADER_SIZE or len(self.pending) == 1:
            return first
        return b"".join(self.pending)[:HEADER_SIZE]

    def _pending_batch_size(self) -> int | None:
        if self.pending_size < LOG_OVERHEAD:
            return None
        return LOG_OVERHEAD + _length(self._head())

    def ready(self) -> Iterator[Batch]:
        """The batches the chunks fed so far complete, in order."""
        while (batch := self.next()) is not None:
            yield batch

    def take(self, chunk: bytes | bytearray | memoryview | None) -> bool:
        """Feeds the next chunk; None says the chunks ran out (see `finish`). False when
        nothing more will come."""
        if chunk is None:
            self.finish()
            return False
        self.feed(chunk)
        return True

    def finish(self) -> None:
        """The chunks ran out: the log must end on a batch boundary (at `end`, when known)."""
        if self.pending:
            raise DecodeError(f"the log ends inside the record batch at byte {self.position}"
                              f" ({self.pending_size} bytes of it)")
        if self.end is not None and self.position < self.end:
            raise DecodeError(f"the log ends at byte {self.position}, before its end at byte {self.end}")

    def _served(self, batch: Batch) -> Batch:
        self.position += batch.header.size
        if self.end is not None and self.position > self.end:
            raise DecodeError(f"the record batch at byte {batch.position} runs past the end of the"
                              f" {self.end}-byte log")
        return batch

    def _check_end(self, start: bytes | bytearray | memoryview) -> None:
        """A batch whose length field says it is not one, or runs past the log's end, fails
        now, before the chunks it would need are asked for."""
        if len(start) < LOG_OVERHEAD:
            return
        length = _length(start)
        if length < _MIN_BATCH_LENGTH:
            raise DecodeError(f"record batch at byte {self.position} has invalid length {length}")
        if self.end is not None and self.position + LOG_OVERHEAD + length > self.end:
            raise DecodeError(f"the record batch at byte {self.position} ({LOG_OVERHEAD + length} bytes) runs"
                              f" past the end of the {self.end}-byte log")


def _length(start: bytes | bytearray | memoryview) -> int:
    return _PREFIX.unpack_from(start, 0)[1]


def log_batches(
    chunks: Iterable[bytes | bytearray | memoryview], *, position: int = 0, end: int | None = None
) -> Iterator[Batch]:
    """Every batch of a log given as consecutive chunks, the first starting at byte
    `position` of the log (where the walk starts); `end` is the log's size when known.

    A log that ends inside a batch, or bytes that cannot be a v2 batch, raise DecodeError
    naming the byte of the log.
    """
    reassembly = _Reassembly(position, end)
    pieces = iter(chunks)
    while True:
        yield from reassembly.ready()
        # A chunk is read only when no batch is complete without it.
        if reassembly.at_end or not reassembly.take(next(pieces, None)):
            return


async def log_batches_async(
    chunks: AsyncIterable[bytes | bytearray | memoryview], *, position: int = 0, end: int | None = None
) -> AsyncGenerator[Batch, None]:
    """`log_batches` over chunks that arrive asynchronously (a chunk is awaited only when
    a batch needs it)."""
    reassembly = _Reassembly(position, end)
    pieces = aiter(chunks)
    while True:
        for batch in reassembly.ready():
            yield batch
        if reassembly.at_end or not reassembly.take(await anext(pieces, None)):
            return


def crc_valid(buffer: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    view = memoryview(buffer)[header.position + ATTRIBUTES_OFFSET : header.end_position]
    return crc32c.crc32c(view) == header.crc


class EndTxnMarker(NamedTuple):
    """The record of a control batch: Kafka's `EndTransactionMarker`."""

    type: ControlType
    coordinator_epoch: int
    timestamp: int


def read_end_txn_marker(buffer: bytes | bytearray | memoryview, header: BatchHeader) -> EndTxnMarker:
    """COMMIT or ABORT, coordinator epoch and timestamp of a control batch.

    Control batches are never compressed and hold one record whose key is
    (version int16, type int16) and value (version int16, coordinator epoch int32).
    """
    if not header.is_control:
        raise ValueError(f"batch at offset {header.base_offset} is not a control batch")
    end = header.end_position
    position = header.position + HEADER_SIZE
    position = _skip_varint(buffer, position, end)  # record length
    position += 1  # record attributes
    timestamp_delta, position = read_varint(buffer, position, end)
    position = _skip_varint(buffer, position, end)  # offset delta
    key_length, position = read_varint(buffer, position, end)
    if key_length < 4 or position + key_length > end:
        raise DecodeError(f"control batch at offset {header.base_offset} has a malformed key")
    _, type_ = struct.unpack_from(">hh", buffer, position)
    position += key_length
    value_length, position = read_varint(buffer, position, end)
    if value_length < 6 or position + value_length > end:
        raise DecodeError(f"control batch at offset {header.base_offset} has a malformed value")
    _, coordinator_epoch = struct.unpack_from(">hi", buffer, position)
    try:
        marker = ControlType(type_)
    except ValueError:
        raise DecodeError(f"control batch at offset {header.base_offset} has unknown type {type_}") from None
    if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
        timestamp = header.max_timestamp
    else:
        timestamp = header.base_timestamp + timestamp_delta
    return EndTxnMarker(marker, coordinator_epoch, timestamp)


def control_type(buffer: bytes | bytearray | memoryview, header: BatchHeader) -> ControlType:
    """Whether a control batch is a COMMIT or ABORT marker."""
    return read_end_txn_marker(buffer, header).type


def read_varint(buffer, position: int, end: int) -> tuple[int, int]:
    """A zig-zag varint as used inside records."""
    shift = 0
    raw = 0
    while True:
        if position >= end or shift > 63:
            raise DecodeError("malformed varint in record")
        byte = buffer[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7


def _skip_varint(buffer, position: int, end: int) -> int:
    return read_varint(buffer, position, end)[1]
