"""Object keys and the per-segment manifest encoding."""

from __future__ import annotations

import base64
import json
import uuid

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierproxy.storage.errors import CorruptRemoteSegment
from tierproxy.storage.manifest import BLOCK_BYTES, Crc32cAccumulator, Manifest, ObjectEntry, SegmentEncryption, entry_of
from tierproxy.storage.model import IndexType, RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import ObjectType, kafka_uuid, partition_key_prefix, segment_key_prefix, segment_object_key

# The ids of the example key in Aiven's ObjectKeyFactory javadoc.
TOPIC_ID = uuid.UUID("31627a14-74df-458c-baee-3cf065d7aa49")
SEGMENT_ID = uuid.UUID("b6a8a629-e670-4ad3-843b-04734f72f9a1")


def metadata(start_offset: int = 1234, partition: int = 7, topic: str = "orders") -> RemoteLogSegmentMetadata:
    tip = TopicIdPartition(TOPIC_ID, topic, partition)
    return RemoteLogSegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, SEGMENT_ID),
        start_offset=start_offset,
        end_offset=start_offset + 10,
        max_timestamp_ms=0,
        leader_epoch=0,
        event_timestamp_ms=0,
        segment_leader_epochs=((0, start_offset),),
        segment_size_in_bytes=1,
    )


# -- keys ----------------------------------------------------------------------


def test_kafka_uuid_matches_kafka_printing() -> None:
    # Kafka prints Uuid.ZERO_UUID as 22 'A's and any Uuid as unpadded URL-safe base64.
    assert kafka_uuid(uuid.UUID(int=0)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert kafka_uuid(TOPIC_ID) == "MWJ6FHTfRYy67jzwZdeqSQ"
    assert base64.urlsafe_b64decode(kafka_uuid(SEGMENT_ID) + "==") == SEGMENT_ID.bytes


def test_segment_object_key_layout() -> None:
    # The same key as the example in Aiven's plugin for the same topic, ids and offset.
    key = segment_object_key("someprefix", metadata(topic="topic"), ObjectType.LOG)
    assert key == "someprefix/topic-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log"


@pytest.mark.parametrize("prefix", ["", "/", "a", "a/", "/a/b/"])
def test_prefix_is_joined_with_one_slash(prefix: str) -> None:
    key = segment_object_key(prefix, metadata(), ObjectType.MANIFEST)
    expected_head = prefix.strip("/") + "/" if prefix.strip("/") else ""
    assert key == f"{expected_head}orders-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.manifest"
    assert "//" not in key and not key.startswith("/")


def test_every_object_type_has_its_extension() -> None:
    extensions = {t: segment_object_key("p", metadata(), t).rsplit(".", 1)[1] for t in ObjectType}
    assert extensions == {
        ObjectType.LOG: "log",
        ObjectType.OFFSET_INDEX: "index",
        ObjectType.TIME_INDEX: "timeindex",
        ObjectType.TRANSACTION_INDEX: "txnindex",
        ObjectType.PRODUCER_SNAPSHOT: "snapshot",
        ObjectType.LEADER_EPOCH_CHECKPOINT: "leader_epoch_checkpoint",
        ObjectType.MANIFEST: "manifest",
    }


def test_index_types_map_to_their_objects() -> None:
    assert {i: ObjectType.of_index(i) for i in IndexType} == {
        IndexType.OFFSET: ObjectType.OFFSET_INDEX,
        IndexType.TIMESTAMP: ObjectType.TIME_INDEX,
        IndexType.PRODUCER_SNAPSHOT: ObjectType.PRODUCER_SNAPSHOT,
        IndexType.TRANSACTION: ObjectType.TRANSACTION_INDEX,
        IndexType.LEADER_EPOCH: ObjectType.LEADER_EPOCH_CHECKPOINT,
    }


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_keys_sort_by_start_offset(a: int, b: int) -> None:
    # 20 digits hold any int64 offset, so listing order is offset order.
    key_a, key_b = (segment_key_prefix("p", metadata(o)) for o in (a, b))
    assert (key_a < key_b) == (a < b)
    assert len(key_a) == len(key_b)


def test_partition_prefix_does_not_match_a_longer_partition_number() -> None:
    tip1 = TopicIdPartition(TOPIC_ID, "orders", 1)
    tip10 = TopicIdPartition(TOPIC_ID, "orders", 10)
    assert not partition_key_prefix("p", tip10).startswith(partition_key_prefix("p", tip1))
    assert segment_key_prefix("p", metadata(partition=1)).startswith(partition_key_prefix("p", tip1))


# -- manifest ------------------------------------------------------------------

entries = st.builds(ObjectEntry, size=st.integers(0, 2**40), crc32c=st.integers(0, 2**32 - 1))
encryptions = st.builds(SegmentEncryption, key_id=st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True),
                        wrapped_data_key=st.binary(min_size=60, max_size=60), chunk_bytes=st.integers(1, 2**30))
manifests = st.builds(
    Manifest,
    segment_id=st.uuids(),
    start_offset=st.integers(0, 2**63 - 1),
    end_offset=st.integers(0, 2**63 - 1),
    objects=st.dictionaries(st.sampled_from([t.value for t in ObjectType if t is not ObjectType.MANIFEST]), entries),
    encryption=st.none() | encryptions,
)


@given(manifests)
def test_manifest_round_trip(manifest: Manifest) -> None:
    encoded = manifest.encode()
    assert Manifest.decode(encoded) == manifest
    assert Manifest.decode(encoded).encode() == encoded  # canonical


def test_manifest_is_readable_json() -> None:
    manifest = Manifest(SEGMENT_ID, 10, 20, {"log": ObjectEntry(3, crc32c.crc32c(b"abc"))})
    assert json.loads(manifest.encode()) == {
        "version": 1,
        "segment_id": str(SEGMENT_ID),
        "start_offset": 10,
        "end_offset": 20,
        "objects": {"log": {"size": 3, "crc32c": 0x364B3FB7}},
    }


def test_an_encrypted_manifest_is_version_2_and_names_its_key() -> None:
    wrapped = bytes(range(60))
    manifest = Manifest(SEGMENT_ID, 10, 20, {"log": ObjectEntry(300_000, 7)},
                        SegmentEncryption("k2", wrapped, BLOCK_BYTES))
    assert json.loads(manifest.encode()) == {
        "version": 2,
        "segment_id": str(SEGMENT_ID),
        "start_offset": 10,
        "end_offset": 20,
        "encryption": {"cipher": "AES-256-GCM", "chunk_bytes": BLOCK_BYTES, "key_id": "k2",
                       "wrapped_data_key": base64.b64encode(wrapped).decode()},
        "objects": {"log": {"size": 300_000, "crc32c": 7}},
    }
    # Two chunks (256 KiB and the rest), each with its 16-byte tag.
    assert manifest.stored_size(manifest.objects["log"]) == 300_000 + 2 * 16
    assert manifest.stored_size(ObjectEntry(0, 0)) == 16  # an empty object is one empty chunk


def _encrypted() -> dict:
    return json.loads(Manifest(SEGMENT_ID, 10, 20, {"log": ObjectEntry(3, 7)},
                               SegmentEncryption("k1", b"w" * 60, BLOCK_BYTES)).encode())


@pytest.mark.parametrize("garble", [
    lambda m: {**m, "version": 1},  # version 1 knows no encryption
    lambda m: {k: v for k, v in m.items() if k != "encryption"},
    lambda m: {**m, "encryption": {**m["encryption"], "cipher": "AES-128-CBC"}},
    lambda m: {**m, "encryption": {**m["encryption"], "key_id": ""}},
    lambda m: {**m, "encryption": {**m["encryption"], "chunk_bytes": 0}},
    lambda m: {**m, "encryption": {**m["encryption"], "wrapped_data_key": "not base64!"}},
    # A plaintext block CRC-32C has no place in an encrypted object's entry.
    lambda m: {**m, "objects": {"log": {"size": 3, "crc32c": 7, "block_bytes": 4, "blocks": "AAAAAA=="}}},
])
def test_malformed_encrypted_manifest_is_corrupt(garble) -> None:
    with pytest.raises(CorruptRemoteSegment, match="some/key.manifest is malformed"):
        Manifest.decode(json.dumps(garble(_encrypted())).encode(), name="some/key.manifest")


def test_manifest_objects_are_read_only() -> None:
    manifest = Manifest(SEGMENT_ID, 0, 0, {"log": ObjectEntry(1, 1)})
    with pytest.raises(TypeError):
        manifest.objects["log"] = ObjectEntry(2, 2)  # type: ignore[index]


def _valid() -> dict:
    return json.loads(Manifest(SEGMENT_ID, 10, 20, {"log": ObjectEntry(3, 7)}).encode())


@pytest.mark.parametrize(
    "garble",
    [
        lambda m: b"",
        lambda m: b"not json",
        lambda m: b"[1, 2]",
        lambda m: json.dumps({**m, "version": 3}).encode(),
        lambda m: json.dumps({**m, "version": 2}).encode(),  # encrypted, but no encryption block
        lambda m: json.dumps({k: v for k, v in m.items() if k != "objects"}).encode(),
        lambda m: json.dumps({**m, "segment_id": "nope"}).encode(),
        lambda m: json.dumps({**m, "start_offset": -1}).encode(),
        lambda m: json.dumps({**m, "end_offset": "20"}).encode(),
        lambda m: json.dumps({**m, "objects": {"log": {"size": True, "crc32c": 7}}}).encode(),
        lambda m: json.dumps({**m, "objects": {"log": {"size": 3, "crc32c": 2**32}}}).encode(),
        lambda m: json.dumps({**m, "objects": {"log": {"size": 3}}}).encode(),
        lambda m: json.dumps({**m, "objects": {"log": {"size": 3.0, "crc32c": 7}}}).encode(),
        lambda m: json.dumps({**m, "objects": []}).encode(),
        lambda m: b"\xff\xfe",
    ],
)
def test_malformed_manifest_is_corrupt(garble) -> None:
    with pytest.raises(CorruptRemoteSegment, match="some/key.manifest is malformed"):
        Manifest.decode(garble(_valid()), name="some/key.manifest")


@given(st.lists(st.binary(max_size=300), max_size=8))
def test_chunked_crc_equals_whole_crc(chunks: list[bytes]) -> None:
    acc = Crc32cAccumulator()
    for chunk in chunks:
        acc.update(memoryview(chunk))
    assert acc.entry() == entry_of(b"".join(chunks))


def test_block_checksums_round_trip_and_cover_the_object():
    from tierproxy.storage.manifest import BLOCK_BYTES

    data = bytes(range(256)) * (BLOCK_BYTES // 256 * 2 + 7)  # two whole blocks and a short one
    acc = Crc32cAccumulator()
    for i in range(0, len(data), 100_003):  # chunks that straddle block boundaries
        acc.update(data[i:i + 100_003])
    entry = acc.entry()
    assert entry.block_bytes == BLOCK_BYTES
    assert entry.blocks == tuple(crc32c.crc32c(data[i:i + BLOCK_BYTES]) for i in range(0, len(data), BLOCK_BYTES))
    assert len(entry.blocks) == 3 and entry == entry_of(data)
    decoded = Manifest.decode(Manifest(SEGMENT_ID, 0, 9, {"log": entry}).encode()).entry("log")
    assert (decoded.blocks, decoded.block_bytes) == (entry.blocks, BLOCK_BYTES)


def test_a_manifest_without_blocks_still_reads_and_bad_blocks_are_corrupt():
    old = _valid()  # as written before block checksums existed
    assert Manifest.decode(json.dumps(old).encode()).entry("log").blocks == ()
    old["objects"]["log"].update(block_bytes=2, blocks="AAAAAA==")  # one CRC for a 3-byte object in 2-byte blocks
    with pytest.raises(CorruptRemoteSegment, match="block checksums do not cover 3 bytes"):
        Manifest.decode(json.dumps(old).encode())
