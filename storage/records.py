"""The records inside one record batch, decoded by aiokafka's C-accelerated
`DefaultRecordBatch` (codecs from cramjam): for the places that must look inside a
batch, a timestamp lookup in a compressed remote batch (as Kafka's
`LogSegment.findOffsetByTimestamp`) and the Spark data source's rows. Batches are
otherwise never decoded.

aiokafka decompresses every codec Kafka writes: gzip, snappy both raw (librdkafka,
aiokafka) and in xerial's framing (Kafka's Java clients: the magic, version 1 and
compatible version 1, then length-prefixed blocks), LZ4 frames (KIP-57) and zstd.
A LOG_APPEND_TIME batch gives every record the batch's max timestamp, as Kafka's
records report it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from aiokafka.record.default_records import DefaultRecordBatch

from tierproxy.protocol.errors import DecodeError

__all__ = ("Record", "RecordDecodeError", "batch_records", "first_record_at_or_after")


class RecordDecodeError(DecodeError):
    """A batch's records cannot be decoded: bad compressed data, truncation, malformed fields."""


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def batch_records(batch: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Every record of one whole batch (exactly its bytes), decompressed if it is.

    Raises RecordDecodeError, naming the batch's base offset, when its records do not
    decode or do not fill it exactly.
    """
    try:
        for record in DefaultRecordBatch(batch):
            yield Record(record.offset, record.timestamp, record.key, record.value, tuple(record.headers))
    except Exception as e:  # aiokafka's own errors, the codecs', struct's, UTF-8 of a header key
        base_offset = int.from_bytes(batch[:8], "big", signed=True) if len(batch) >= 8 else "?"
        raise RecordDecodeError(f"batch at offset {base_offset}: {type(e).__name__}: {e}") from e


def first_record_at_or_after(batch: bytes | bytearray | memoryview, timestamp: int,
                             starting_offset: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch's first record with timestamp >= `timestamp` and
    offset >= `starting_offset`; None when it has none."""
    for record in batch_records(batch):
        if record.timestamp >= timestamp and record.offset >= starting_offset:
            return record.offset, record.timestamp
    return None
