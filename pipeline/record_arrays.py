"""A record batch's records as Arrow arrays, for the data source's rows.

The pure-Python reference reads them with aiokafka's decoder (`storage.records.batch_columns`)
and converts its lists; the compiled twin (`_record_arrays.c`) reads the decompressed records
straight into Arrow's buffers (keys and values copied once, no Python object per record
unless it has headers): most of what the Iceberg table step spends per record otherwise
(`benchmarks/iceberg.py`). Both give the same arrays, and the same RecordDecodeError for a
batch that does not decode (tests/pipeline/test_record_arrays.py). A LOG_APPEND_TIME batch
gives every record the batch's max timestamp, as Kafka's records report it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode

from tierproxy.protocol.extensions import compiled
from tierproxy.protocol.records import HEADER_SIZE, BatchHeader, Compression, TimestampType
from tierproxy.storage.records import batch_columns, decode_error

__all__ = ("RecordArrays", "batch_arrays", "concat")

_compiled = compiled("tierproxy.pipeline._record_arrays")

_DECOMPRESS = {
    Compression.GZIP: gzip_decode,
    Compression.SNAPPY: lambda data: snappy_decode(bytes(data)),  # raw and xerial's framing
    Compression.LZ4: lambda data: lz4_decode(bytes(data)),
    Compression.ZSTD: lambda data: zstd_decode(bytes(data)),
}

Headers = list[tuple[tuple[str, bytes | None], ...]]


@dataclass(frozen=True, slots=True)
class RecordArrays:
    """The records of one batch, column by column, in offset order; timestamps in ms."""

    offsets: pa.Array  # int64
    timestamps: pa.Array  # int64
    keys: pa.Array  # binary
    values: pa.Array  # binary
    headers: Headers

    def __len__(self) -> int:
        return len(self.offsets)

    def filter(self, keep: pa.BooleanArray) -> RecordArrays:
        return RecordArrays(self.offsets.filter(keep), self.timestamps.filter(keep), self.keys.filter(keep),
                            self.values.filter(keep), [h for h, k in zip(self.headers, keep.to_pylist()) if k])

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values (their offsets and validity included)."""
        return self.keys.nbytes + self.values.nbytes


def batch_arrays(batch: bytes | bytearray | memoryview, header: BatchHeader) -> RecordArrays:
    """The records of one whole batch (exactly its bytes, `header` its header)."""
    if _compiled is None:
        return _from_columns(batch)
    try:
        records = memoryview(batch)[HEADER_SIZE:]
        if header.compression != Compression.NONE:
            records = memoryview(_DECOMPRESS[header.compression](records))
        append_time = header.max_timestamp if header.timestamp_type == TimestampType.LOG_APPEND_TIME else None
        (offsets, timestamps, key_valid, key_nulls, key_offsets, key_data, value_valid, value_nulls, value_offsets,
         value_data, headers) = _compiled.decode(records, header.records_count, header.base_offset,
                                                 header.base_timestamp, append_time)
    except Exception as e:  # the codecs' errors, the decoder's ValueError, UTF-8 of a header key
        raise decode_error(batch, e) from e
    n = header.records_count
    return RecordArrays(
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(timestamps)]),
        _binary(n, key_valid, key_nulls, key_offsets, key_data),
        _binary(n, value_valid, value_nulls, value_offsets, value_data),
        headers if headers is not None else [()] * n,
    )


def _binary(n: int, valid: bytes | None, nulls: int, offsets: bytes, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(valid) if valid is not None else None,
                                                  pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def _from_columns(batch: bytes | bytearray | memoryview) -> RecordArrays:
    columns = batch_columns(batch)
    return RecordArrays(pa.array(columns.offsets, pa.int64()), pa.array(columns.timestamps, pa.int64()),
                        pa.array(columns.keys, pa.binary()), pa.array(columns.values, pa.binary()),
                        columns.headers)


def concat(arrays: list[RecordArrays]) -> RecordArrays:
    """Several batches' records as one."""
    return RecordArrays(pa.concat_arrays([a.offsets for a in arrays]),
                        pa.concat_arrays([a.timestamps for a in arrays]),
                        pa.concat_arrays([a.keys for a in arrays]), pa.concat_arrays([a.values for a in arrays]),
                        [h for a in arrays for h in a.headers])
