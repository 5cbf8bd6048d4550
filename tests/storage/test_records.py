"""storage.records on real batches: aiokafka's builder for every codec, kio's writer for
uncompressed ones, and records blocks compressed as other clients compress them (snappy
both raw and in the xerial framing of Kafka's Java clients, LZ4 frames, gzip, zstd)."""

from __future__ import annotations

import struct

import crc32c
import cramjam
import pytest
from aiokafka.codec import snappy_encode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierproxy.storage.records import Record, RecordDecodeError, batch_columns, batch_records, first_record_at_or_after
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    Compression,
    ControlType,
    TimestampType,
    iter_batches,
    read_batch_header,
)
from tests.helpers.batches import batch, control_batch
from tests.helpers.record_batches import BASE_TIMESTAMP, COMPRESSORS, build, sample, with_body


def decode(data: bytes) -> list[Record]:
    (header,) = iter_batches(data, verify_crc=True)
    assert header.end_position == len(data)
    return list(batch_records(data))


def as_records(records, base_offset: int = 0) -> list[Record]:
    return [Record(base_offset + i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(records)]


# ----------------------------------------------------------------------------- codecs

# What Kafka's Java clients write for snappy (xerial's SnappyOutputStream): this magic,
# version 1 and compatible version 1, then blocks of (length int32, raw snappy).
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_records_compressed_as_each_client_writes_them(name):
    compression, compress = COMPRESSORS[name]
    records = sample(200)
    plain = build(records)
    body = compress(plain[HEADER_SIZE:])
    assert len(body) < len(plain) - HEADER_SIZE
    data = with_body(plain, body, compression)
    assert decode(data) == as_records(records)
    assert list(batch_records(memoryview(bytearray(data)))) == as_records(records)


def test_xerial_snappy_is_told_from_raw_snappy_by_its_header():
    plain = build(sample(100))
    body = plain[HEADER_SIZE:]
    framed = snappy_encode(body, xerial_compatible=True, xerial_blocksize=1024)
    assert framed.startswith(XERIAL_HEADER) and len(framed) > 16 + 4
    raw = bytes(cramjam.snappy.compress_raw(body))
    assert not raw.startswith(XERIAL_HEADER[:8])
    assert decode(with_body(plain, framed, Compression.SNAPPY)) == decode(
        with_body(plain, raw, Compression.SNAPPY)) == decode(plain)


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_garbage_does_not_decompress(compression):
    plain = build(sample(3), base_offset=77)
    with pytest.raises(RecordDecodeError, match="batch at offset 77"):
        decode(with_body(plain, b"\x00\x01 certainly not compressed data \xff" * 3, compression))


def test_truncated_xerial_block_is_an_error():
    plain = build(sample(100))
    framed = snappy_encode(plain[HEADER_SIZE:], xerial_compatible=True, xerial_blocksize=1024)
    with pytest.raises(RecordDecodeError, match="batch at offset 0"):
        decode(with_body(plain, framed[:-10], Compression.SNAPPY))
    with pytest.raises(RecordDecodeError, match="batch at offset 0"):
        decode(with_body(plain, framed[:16] + b"\x00\x00", Compression.SNAPPY))


# ----------------------------------------------------------------------------- whole batches


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name)
def test_aiokafka_batches_of_every_codec(compression):
    records = sample()
    data = build(records, compression, base_offset=1000)
    header = read_batch_header(data)
    assert header.compression is compression  # the builder did compress
    assert decode(data) == as_records(records, 1000)


def test_kio_uncompressed_batch_with_headers():
    data = batch(42, 5, headers=((b"h1", b"v1"), (b"h2", b"")), timestamp_ms=BASE_TIMESTAMP, value_size=16)
    records = decode(data)
    assert [r.offset for r in records] == [42, 43, 44, 45, 46]
    assert [r.timestamp for r in records] == [BASE_TIMESTAMP + i for i in range(5)]
    assert records[0].key == b"k42" and records[0].value == b"v42-".ljust(16, b"x")
    assert all(r.headers == (("h1", b"v1"), ("h2", b"")) for r in records)


def test_log_append_time_gives_every_record_the_batch_max_timestamp():
    records = sample(20)
    plain = bytearray(build(records))
    append_time = BASE_TIMESTAMP + 10_000
    struct.pack_into(">q", plain, 35, append_time)  # maxTimestamp
    data = with_body(bytes(plain), bytes(plain[HEADER_SIZE:]), Compression.NONE, extra_attributes=0x08)
    header = read_batch_header(data)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in decode(data)} == {append_time}


def test_the_first_record_at_or_after_a_timestamp_and_an_offset():
    records = [(BASE_TIMESTAMP + t, b"k", b"v", []) for t in (5, 1, 9, 9, 3)]  # need not grow
    data = build(records, Compression.ZSTD, base_offset=10)
    assert first_record_at_or_after(data, BASE_TIMESTAMP + 6, 0) == (12, BASE_TIMESTAMP + 9)
    assert first_record_at_or_after(data, BASE_TIMESTAMP, 11) == (11, BASE_TIMESTAMP + 1)
    assert first_record_at_or_after(data, BASE_TIMESTAMP + 4, 13) == (13, BASE_TIMESTAMP + 9)
    assert first_record_at_or_after(data, BASE_TIMESTAMP + 10, 0) is None
    assert first_record_at_or_after(data, 0, 15) is None


def test_transactional_and_control_batches():
    records = sample(10)
    data = build(records, Compression.ZSTD, base_offset=5, transactional=True)
    header = read_batch_header(data)
    assert header.is_transactional and header.producer_id == 7
    assert decode(data) == as_records(records, 5)
    marker = control_batch(15, ControlType.ABORT, producer_id=7)
    (record,) = decode(marker)
    assert record.offset == 15 and struct.unpack(">hh", record.key) == (0, int(ControlType.ABORT))


# ----------------------------------------------------------------------------- round trips


header_keys = st.text(max_size=12)
payloads = st.one_of(st.none(), st.binary(max_size=300))
record_strategy = st.tuples(
    st.integers(min_value=0, max_value=2**41),
    payloads,
    payloads,
    st.lists(st.tuples(header_keys, payloads), max_size=4),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_strategy, min_size=1, max_size=40),
    compression=st.sampled_from(list(Compression)),
    base_offset=st.integers(min_value=0, max_value=2**40),
)
def test_round_trip(records, compression, base_offset):
    data = build(records, compression, base_offset=base_offset)
    decoded = decode(data)
    assert decoded == as_records(records, base_offset)


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(record_strategy, min_size=1, max_size=10),
    compression=st.sampled_from(list(Compression)),
)
def test_round_trip_through_external_compression(records, compression):
    """Records the builder left uncompressed, compressed by cramjam as librdkafka would."""
    plain = build(records)
    body = plain[HEADER_SIZE:]
    compressors = {
        Compression.NONE: bytes,
        Compression.GZIP: lambda d: bytes(cramjam.gzip.compress(d)),
        Compression.SNAPPY: lambda d: bytes(cramjam.snappy.compress_raw(d)),
        Compression.LZ4: lambda d: bytes(cramjam.lz4.compress(d)),
        Compression.ZSTD: lambda d: bytes(cramjam.zstd.compress(d)),
    }
    assert decode(with_body(plain, compressors[compression](body), compression)) == as_records(records)


# ----------------------------------------------------------------------------- bad input


def test_more_records_announced_than_present():
    data = bytearray(build(sample(5)))
    struct.pack_into(">i", data, 57, 6)  # recordsCount
    with pytest.raises(RecordDecodeError, match="offset 0"):
        decode(with_body(bytes(data), bytes(data[HEADER_SIZE:]), Compression.NONE))


def test_bytes_left_after_the_records():
    data = build(sample(5))
    with pytest.raises(RecordDecodeError, match="unconsumed bytes"):
        decode(with_body(data, data[HEADER_SIZE:] + b"\x00\x00", Compression.NONE))


def test_record_overrunning_its_batch():
    data = build(sample(1))
    body = bytearray(data[HEADER_SIZE:])
    body[0] = 0x7E  # record length 63: more than there is
    with pytest.raises(RecordDecodeError, match="batch at offset 0"):
        decode(with_body(data, bytes(body), Compression.NONE))


def test_compressed_garbage_in_a_batch():
    data = build(sample(50), Compression.LZ4)
    body = bytearray(data[HEADER_SIZE:])
    body[len(body) // 2 :] = b"\xa5" * (len(body) - len(body) // 2)
    with pytest.raises(RecordDecodeError, match="(?i)lz4"):
        decode(with_body(data, bytes(body), Compression.LZ4))


def test_header_key_that_is_not_utf8():
    data = build([(BASE_TIMESTAMP, b"k", b"v", [("hk", b"hv")])])
    body = data[HEADER_SIZE:].replace(b"hk", b"\xff\xfe")
    with pytest.raises(RecordDecodeError, match="(?i)utf-8"):
        decode(with_body(data, body, Compression.NONE))


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), compression=st.sampled_from(list(Compression)), count=st.integers(0, 5))
def test_garbage_is_a_clean_error(body, compression, count):
    """Any records block either decodes or raises RecordDecodeError, nothing else."""
    data = bytearray(with_body(build(sample(1)), body, compression))
    struct.pack_into(">i", data, 57, count)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c.crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    try:
        decode(bytes(data))
    except RecordDecodeError:
        pass
    assert issubclass(RecordDecodeError, DecodeError)


# ----------------------------------------------------------------------------- columns


@pytest.mark.parametrize("name", ["none", *sorted(COMPRESSORS)])
def test_columns_hold_the_records_field_by_field(name):
    records = sample(200)
    data = build(records, base_offset=40)
    if name != "none":
        compression, compress = COMPRESSORS[name]
        data = with_body(data, compress(data[HEADER_SIZE:]), compression)
    expected = as_records(records, base_offset=40)
    columns = batch_columns(memoryview(bytearray(data)))
    assert [Record(*fields) for fields in zip(*columns)] == expected
    keep = [r.offset % 3 == 0 or r.value is None for r in expected]
    assert [Record(*fields) for fields in zip(*columns.select(keep))] == [r for r, k in zip(expected, keep) if k]


def test_columns_of_a_bad_batch_raise_as_the_records_do():
    data = bytearray(build(sample(20), base_offset=1234))
    data[-5:] = b"\xff" * 5  # the last record cut short
    with pytest.raises(RecordDecodeError, match="batch at offset 1234") as by_records:
        list(batch_records(bytes(data)))
    with pytest.raises(RecordDecodeError, match="batch at offset 1234") as by_columns:
        batch_columns(bytes(data))
    assert type(by_columns.value.__cause__) is type(by_records.value.__cause__)
