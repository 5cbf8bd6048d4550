"""Builds real v2 record batches for unit tests (kio's writer, CRC included), and runs of them."""

from __future__ import annotations

import datetime
import io
import struct

from hypothesis import strategies as st
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from tierproxy.protocol.records import ControlType

_EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)

# (records in batch, value size) for a run of consecutive batches.
batch_shapes = st.lists(st.tuples(st.integers(1, 20), st.integers(0, 300)), min_size=1, max_size=12)


def batch(
    base_offset: int,
    count: int = 1,
    *,
    leader_epoch: int = 0,
    timestamp_ms: int = 1_700_000_000_000,
    value_size: int = 8,
    producer_id: int = -1,
    producer_epoch: int = -1,
    transactional: bool = False,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> bytes:
    """One uncompressed batch holding `count` records from `base_offset`."""
    records = tuple(
        Record(
            attributes=i8(0),
            timestamp=TZAwareMicros(_ms(timestamp_ms + i)),
            offset=i64(base_offset + i),
            key=b"k%d" % (base_offset + i),
            value=(b"v%d-" % (base_offset + i)).ljust(value_size, b"x"),
            headers=tuple(RecordHeader(key=k, value=v) for k, v in headers),
        )
        for i in range(count)
    )
    return _write(records, leader_epoch, producer_id, producer_epoch, 0x10 if transactional else 0)


def build_log(shapes, base_offset=0, leader_epoch=0) -> tuple[bytes, list[tuple[int, int]]]:
    """Consecutive batches of `batch_shapes`; returns the bytes and each batch's (base, last) offsets."""
    parts, ranges, offset = [], [], base_offset
    for count, value_size in shapes:
        parts.append(batch(offset, count, value_size=value_size, leader_epoch=leader_epoch))
        ranges.append((offset, offset + count - 1))
        offset += count
    return b"".join(parts), ranges


def control_batch(
    offset: int, marker: ControlType, *, producer_id: int, producer_epoch: int = 0, leader_epoch: int = 0,
    timestamp_ms: int = 1_700_000_000_000,
) -> bytes:
    """A transaction marker: one record whose key is (version 0, type)."""
    record = Record(
        attributes=i8(0),
        timestamp=TZAwareMicros(_ms(timestamp_ms)),
        offset=i64(offset),
        key=struct.pack(">hh", 0, int(marker)),
        value=struct.pack(">hi", 0, leader_epoch),
        headers=(),
    )
    return _write((record,), leader_epoch, producer_id, producer_epoch, 0x10 | 0x20)


def _write(records, leader_epoch, producer_id, producer_epoch, attributes) -> bytes:
    out = io.BytesIO()
    write_new_batch(
        out,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(producer_epoch),
            partition_leader_epoch=i32(leader_epoch),
            base_sequence=i32(-1 if producer_id < 0 else 0),
            records=records,
            attributes=i16(attributes),
        ),
    )
    return out.getvalue()


def _ms(timestamp_ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.timezone.utc)
