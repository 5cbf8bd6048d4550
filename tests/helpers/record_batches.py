"""Record batches as clients write them, for the tests of record decoding: aiokafka's builder
for every codec, and records blocks compressed as other clients compress them (snappy both raw
and in the xerial framing of Kafka's Java clients, LZ4 frames, gzip, zstd)."""

from __future__ import annotations

import struct

import crc32c
import cramjam
from aiokafka.codec import snappy_encode
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tierproxy.protocol.records import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE, Compression

BASE_TIMESTAMP = 1_700_000_000_000


def build(
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    compression: Compression = Compression.NONE,
    *,
    base_offset: int = 0,
    transactional: bool = False,
) -> bytes:
    """A batch from aiokafka's builder: (timestamp, key, value, headers) per record."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=int(compression), is_transactional=int(transactional),
        producer_id=7 if transactional else -1, producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1, batch_size=1 << 24,
    )
    for delta, (timestamp, key, value, headers) in enumerate(records):
        assert builder.append(delta, timestamp=timestamp, key=key, value=value, headers=headers) is not None
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)  # the broker assigns the base offset
    return bytes(data)


def with_body(data: bytes, body: bytes, compression: Compression, *, extra_attributes: int = 0) -> bytes:
    """The batch with its records block replaced and its attributes, length and CRC fixed."""
    out = bytearray(data[:HEADER_SIZE] + body)
    (attributes,) = struct.unpack_from(">h", out, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, (attributes & ~0x07) | int(compression) | extra_attributes)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(bytes(out[ATTRIBUTES_OFFSET:])))
    return bytes(out)


def sample(n: int = 300) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    return [
        (BASE_TIMESTAMP + i, b"key-%d" % i if i % 7 else None, (b"value-%d|" % i) * 10 if i % 11 else None,
         [("seq", b"%d" % i), ("empty", b""), ("null", None)] if i % 3 else [])
        for i in range(n)
    ]


COMPRESSORS = {
    "gzip": (Compression.GZIP, lambda d: bytes(cramjam.gzip.compress(d))),
    "snappy-raw": (Compression.SNAPPY, lambda d: bytes(cramjam.snappy.compress_raw(d))),
    "snappy-xerial": (Compression.SNAPPY, lambda d: snappy_encode(d, xerial_compatible=True, xerial_blocksize=512)),
    "lz4-frame": (Compression.LZ4, lambda d: bytes(cramjam.lz4.compress(d))),
    "zstd": (Compression.ZSTD, lambda d: bytes(cramjam.zstd.compress(d))),
}
