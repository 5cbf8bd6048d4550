"""The records inside one record batch, decoded by aiokafka's C-accelerated
`DefaultRecordBatch` (codecs from cramjam), for the few places that must look inside a
batch: a timestamp lookup in a compressed remote batch, as Kafka's
`LogSegment.findOffsetByTimestamp` does. Batches are otherwise never decoded.
"""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatch

from tierproxy.protocol.errors import DecodeError

__all__ = ("first_record_at_or_after",)


def first_record_at_or_after(batch: bytes | bytearray | memoryview, timestamp: int,
                             starting_offset: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch's first record with timestamp >= `timestamp` and
    offset >= `starting_offset`; None when it has none. A LOG_APPEND_TIME batch gives
    every record the batch's max timestamp, as Kafka's records report it."""
    try:
        for record in DefaultRecordBatch(bytes(batch)):
            if record.timestamp >= timestamp and record.offset >= starting_offset:
                return record.offset, record.timestamp
    except Exception as e:  # aiokafka's own errors on a batch it cannot read
        raise DecodeError(f"record batch: {type(e).__name__}: {e}") from e
    return None
