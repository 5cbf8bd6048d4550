"""Remote log metadata records: byte-exact with Kafka 4.3.1, round trips, garbage rejected."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.storage.metadata.serde import (
    MetadataDecodeError,
    RemoteLogTruncation,
    deserialize,
    encode_entry,
    iter_entries,
    serialize,
)
from tierproxy.storage.model import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentMetadataUpdate
from tierproxy.storage.model import RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState
from tierproxy.storage.model import TopicIdPartition

# Written by Kafka 4.3.1's own RemoteLogMetadataSerde (kafka-storage-4.3.1.jar, run in jshell)
# for topic "orders" id 01234567-89ab-cdef-0fed-cba987654321 partition 7,
# segment id 11112222-3333-4444-5555-666677778888.
KAFKA_SEGMENT = bytes.fromhex(
    "010000076f72646572730123456789abcdef0fedcba98765432100000007001111222233334444555566667777888800"
    "000000000000006400000000000000c7000000050000018bcfe5687b0000018bcfe56be70300000003000000000000006400"
    "0000000500000000000000960000001000000000")
KAFKA_SEGMENT_TXN_INDEX_EMPTY = KAFKA_SEGMENT[:-1] + bytes.fromhex("01000101")
KAFKA_UPDATE = bytes.fromhex(
    "010100076f72646572730123456789abcdef0fedcba98765432100000007001111222233334444555566667777888800"
    "000000060000018bcfe56be8000100")
KAFKA_DELETE = bytes.fromhex(
    "010200076f72646572730123456789abcdef0fedcba9876543210000000700000000090000018bcfe56fd00000")

TP = TopicIdPartition(uuid.UUID("01234567-89ab-cdef-0fed-cba987654321"), "orders", 7)
SEGMENT_ID = RemoteLogSegmentId(TP, uuid.UUID("11112222-3333-4444-5555-666677778888"))
SEGMENT = RemoteLogSegmentMetadata(
    segment_id=SEGMENT_ID, start_offset=100, end_offset=199, max_timestamp_ms=1700000000123, leader_epoch=5,
    event_timestamp_ms=1700000000999, segment_leader_epochs=((3, 100), (5, 150)), segment_size_in_bytes=4096)
UPDATE = RemoteLogSegmentMetadataUpdate(SEGMENT_ID, 1700000001000, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 6)
DELETE = RemotePartitionDeleteMetadata(TP, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1700000002000, 9)


@pytest.mark.parametrize("record, kafka_bytes", [
    (SEGMENT, KAFKA_SEGMENT),
    (RemoteLogSegmentMetadata(**{**{f: getattr(SEGMENT, f) for f in SEGMENT.__slots__}, "txn_index_empty": True}),
     KAFKA_SEGMENT_TXN_INDEX_EMPTY),
    (UPDATE, KAFKA_UPDATE),
    (DELETE, KAFKA_DELETE),
])
def test_bytes_are_kafkas(record, kafka_bytes):
    assert serialize(record) == kafka_bytes
    assert deserialize(kafka_bytes) == record


def test_version_1_reads_broker_leader_epoch_tag_and_skips_unknown_tags():
    # Version 1 of the update record: BrokerId 6, tags {0: BrokerLeaderEpoch=42, 1: EndOffset=199, 9: unknown}.
    body = bytearray(KAFKA_UPDATE)
    body[2] = 1  # version
    tags = bytes.fromhex("03" "00" "04" "0000002a" "01" "08" "00000000000000c7" "09" "02" "abcd")
    v1 = bytes(body[:-1]) + tags
    assert deserialize(v1).leader_epoch == 42
    # The same tag number in version 0 is not a field there: skipped, BrokerId stays.
    v0 = bytes(KAFKA_UPDATE[:-1]) + tags
    assert deserialize(v0).leader_epoch == 6


topic_ids = st.uuids()
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=40)
int32s = st.integers(-2**31, 2**31 - 1)
int64s = st.integers(-2**63, 2**63 - 1)
tps = st.builds(TopicIdPartition, topic_ids, names, st.integers(0, 2**31 - 1))
segment_ids = st.builds(RemoteLogSegmentId, tps, st.uuids())


@st.composite
def segments(draw):
    start = draw(st.integers(0, 2**62))
    end = draw(st.integers(start, 2**63 - 1))
    epochs = sorted(draw(st.sets(st.integers(0, 2**31 - 1), min_size=1, max_size=6)))
    offsets = sorted(draw(st.lists(st.integers(start, end), min_size=len(epochs), max_size=len(epochs))))
    return RemoteLogSegmentMetadata(
        segment_id=draw(segment_ids), start_offset=start, end_offset=end, max_timestamp_ms=draw(int64s),
        leader_epoch=draw(int32s), event_timestamp_ms=draw(int64s),
        segment_leader_epochs=tuple(zip(epochs, offsets)), segment_size_in_bytes=draw(int32s),
        state=draw(st.sampled_from(RemoteLogSegmentState)), txn_index_empty=draw(st.booleans()))


records = st.one_of(
    segments(),
    st.builds(RemoteLogSegmentMetadataUpdate, segment_ids, int64s, st.sampled_from(RemoteLogSegmentState), int32s),
    st.builds(RemotePartitionDeleteMetadata, tps, st.sampled_from(RemotePartitionDeleteState), int64s, int32s),
    st.builds(RemoteLogTruncation, tps, st.integers(0, 2**63 - 1), int32s, int64s),
)


@settings(max_examples=300, deadline=None)
@given(records)
def test_round_trip(record):
    assert deserialize(serialize(record)) == record


@settings(max_examples=50, deadline=None)
@given(st.lists(records, max_size=5))
def test_entries_round_trip(batch):
    data = b"".join(encode_entry(serialize(r)) for r in batch)
    assert [r for r, _ in iter_entries(data)] == batch


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_a_decode_error(data):
    with contextlib.suppress(MetadataDecodeError):
        deserialize(data)


@settings(max_examples=200, deadline=None)
@given(records, st.data())
def test_truncated_or_corrupted_record_is_a_decode_error_or_a_valid_record(record, data):
    raw = serialize(record)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(MetadataDecodeError):
        deserialize(raw[:cut])
    i = data.draw(st.integers(0, len(raw) - 1))
    flipped = raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:]
    try:
        decoded = deserialize(flipped)
    except MetadataDecodeError:
        return
    assert type(decoded).__name__ in {"RemoteLogSegmentMetadata", "RemoteLogSegmentMetadataUpdate",
                                      "RemotePartitionDeleteMetadata", "RemoteLogTruncation"}


@pytest.mark.parametrize("data, reason", [
    (b"", "Buffer"),
    (b"\x02\x00\x00", "frame version"),
    (b"\x01\x03\x00", "api key 3"),  # Kafka's snapshot record: never on the topic
    (b"\x01\x07\x00", "api key 7"),
    (b"\x01\x01\x05", "version 5"),
    (KAFKA_UPDATE + b"\x00", "trailing"),
    (KAFKA_SEGMENT[:-2] + b"\x07" + KAFKA_SEGMENT[-1:], "state id 7"),
    (KAFKA_DELETE[:-2] + b"\x05\x00", "delete state id 5"),
])
def test_specific_garbage(data, reason):
    with pytest.raises(MetadataDecodeError, match=reason):
        deserialize(data)


def test_short_entry_is_a_decode_error():
    data = encode_entry(KAFKA_UPDATE)
    with pytest.raises(MetadataDecodeError, match="needs"):
        list(iter_entries(data[:-1]))
