"""The records inside a v2 record batch: decompression and per-record decoding.

`protocol.records` walks batch headers without touching records; this module opens
a batch for readers that need every record (the Spark data source). After the
61-byte header, a batch holds `recordsCount` records, compressed as one block when
the batch's compression is not NONE:

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint | key | valueLength varint | value
    | headerCount varint | (headerKeyLength varint | headerKey | headerValueLength varint | headerValue)*

All varints are zig-zag encoded; a length of -1 is null. A record's offset is the
batch's base offset plus its delta; its timestamp is the batch's base timestamp
plus its delta, or the batch's max timestamp when the broker set LOG_APPEND_TIME.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final, NamedTuple

import cramjam

from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import HEADER_SIZE, BatchHeader, Compression, TimestampType, read_varint

# Snappy as written by Kafka's Java clients (xerial's SnappyOutputStream): this magic,
# version and compatible-version int32s, then blocks of (length int32, raw snappy).
# librdkafka and aiokafka may write either that or one raw snappy block.
XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16
_INT32 = struct.Struct(">i")


class RecordDecodeError(DecodeError):
    """A batch's records cannot be decoded: bad compressed data, truncation, malformed fields."""


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def decompress(compression: Compression, data: bytes | bytearray | memoryview) -> bytes:
    """The records block of a batch, uncompressed."""
    try:
        if compression is Compression.NONE:
            return bytes(data)
        if compression is Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if compression is Compression.SNAPPY:
            return _snappy_decompress(data)
        if compression is Compression.LZ4:
            # Kafka's v2 batches use the LZ4 frame format (KIP-57 fixed the legacy framing).
            return bytes(cramjam.lz4.decompress(data))
        if compression is Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except RecordDecodeError:
        raise
    except Exception as e:  # cramjam raises its own DecompressionError, or ValueError on odd input
        raise RecordDecodeError(f"{compression.name} data does not decompress: {e}") from e
    raise RecordDecodeError(f"unknown compression {compression!r}")


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    if view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    out = bytearray()
    position, end = _XERIAL_HEADER_SIZE, len(view)
    while position < end:
        if position + _INT32.size > end:
            raise RecordDecodeError(f"xerial snappy block length truncated at byte {position}")
        (length,) = _INT32.unpack_from(view, position)
        position += _INT32.size
        if length < 0 or position + length > end:
            raise RecordDecodeError(f"xerial snappy block of {length} bytes at byte {position} overruns the data")
        out += cramjam.snappy.decompress_raw(view[position : position + length])
        position += length
    return bytes(out)


def batch_records(buffer: bytes | bytearray | memoryview, header: BatchHeader) -> Iterator[Record]:
    """Every record of the batch `header` describes (its bytes are in `buffer` at header.position).

    Raises RecordDecodeError when the records do not decode or do not fill the batch exactly.
    """
    view = memoryview(buffer)[header.position + HEADER_SIZE : header.end_position]
    try:
        compression = header.compression
    except ValueError:
        raise RecordDecodeError(f"batch at offset {header.base_offset} has an unknown compression") from None
    body = decompress(compression, view) if compression is not Compression.NONE else view
    if header.records_count < 0:
        raise RecordDecodeError(f"batch at offset {header.base_offset} has {header.records_count} records")
    log_append_time = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    try:
        yield from _decode(body, header, log_append_time)
    except DecodeError as e:
        if isinstance(e, RecordDecodeError):
            raise
        raise RecordDecodeError(f"batch at offset {header.base_offset}: {e}") from None


def _decode(body: bytes | memoryview, header: BatchHeader, log_append_time: bool) -> Iterator[Record]:
    view = memoryview(body)
    end = len(view)
    position = 0
    base_offset, base_timestamp = header.base_offset, header.base_timestamp
    varint = _read_varint
    for n in range(header.records_count):
        length, position = varint(view, position, end)
        record_end = position + length
        if length < 0 or record_end > end:
            raise RecordDecodeError(
                f"batch at offset {base_offset}: record {n} of {length} bytes overruns the batch"
            )
        position += 1  # attributes: unused in v2
        timestamp_delta, position = varint(view, position, record_end)
        offset_delta, position = varint(view, position, record_end)
        key, position = _bytes(view, position, record_end)
        value, position = _bytes(view, position, record_end)
        header_count, position = varint(view, position, record_end)
        if header_count < 0:
            raise RecordDecodeError(f"batch at offset {base_offset}: record {n} has {header_count} headers")
        headers = []
        for _ in range(header_count):
            header_key, position = _bytes(view, position, record_end)
            if header_key is None:
                raise RecordDecodeError(f"batch at offset {base_offset}: record {n} has a null header key")
            header_value, position = _bytes(view, position, record_end)
            try:
                headers.append((header_key.decode("utf-8"), header_value))
            except UnicodeDecodeError:
                raise RecordDecodeError(
                    f"batch at offset {base_offset}: record {n} has a header key that is not UTF-8"
                ) from None
        if position != record_end:
            raise RecordDecodeError(
                f"batch at offset {base_offset}: record {n} has {record_end - position} bytes past its fields"
            )
        timestamp = header.max_timestamp if log_append_time else base_timestamp + timestamp_delta
        yield Record(base_offset + offset_delta, timestamp, key, value, tuple(headers))
    if position != end:
        raise RecordDecodeError(
            f"batch at offset {base_offset}: {end - position} bytes left after {header.records_count} records"
        )


def _read_varint(view: memoryview, position: int, end: int) -> tuple[int, int]:
    # Most lengths and deltas fit one byte: decode those here, the rest in protocol.records.
    if position < end:
        byte = view[position]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), position + 1
    return read_varint(view, position, end)


def _bytes(view: memoryview, position: int, end: int) -> tuple[bytes | None, int]:
    length, position = _read_varint(view, position, end)
    if length < 0:
        if length != -1:
            raise RecordDecodeError(f"invalid length {length} at byte {position}")
        return None, position
    stop = position + length
    if stop > end:
        raise RecordDecodeError(f"field of {length} bytes at byte {position} overruns its record")
    return bytes(view[position:stop]), stop
