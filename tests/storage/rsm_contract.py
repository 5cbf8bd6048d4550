"""The contract every RemoteStorageManager backend passes.

A backend's test module subclasses `RemoteStorageManagerContract` as `Test...`,
provides the `rsm` fixture, and implements the raw-object hooks the corruption
cases use to change the store behind the manager's back.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest

from tierproxy.storage.encryption import KeyEncryptionKey, KeyRing
from tierproxy.storage.errors import (
    CorruptRangeRead,
    CorruptRemoteSegment,
    DecryptionFailed,
    EncryptionKeyNotFound,
    RemoteObjectMismatch,
    RemoteResourceNotFound,
    RemoteSegmentNotFound,
    RemoteStorageError,
    UnencryptedSegment,
    WrongEncryptionKey,
)
from tierproxy.storage.manifest import BLOCK_BYTES, TAG_BYTES
from tierproxy.storage.model import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    TopicIdPartition,
)
from tierproxy.storage.rsm import ObjectType, RemoteStorageManager, segment_key_prefix, segment_object_key

LARGE_SEGMENT_BYTES = 12 * (1 << 20)  # above the multipart threshold backends use in these tests
CHUNK_STEP = BLOCK_BYTES + TAG_BYTES  # an encrypted chunk and its tag


@dataclass
class Segment:
    """A segment's local files, its metadata and the bytes copied for each object."""

    metadata: RemoteLogSegmentMetadata
    data: LogSegmentData
    log: bytes
    indexes: dict[IndexType, bytes]


def make_segment(
    directory: Path,
    *,
    log_size: int = 100_000,
    start_offset: int = 1234,
    with_txn_index: bool = True,
    topic_id_partition: TopicIdPartition | None = None,
    segment_id: RemoteLogSegmentId | None = None,
) -> Segment:
    """Random bytes for every file (the manager does not parse them) of the given sizes."""
    tip = topic_id_partition or TopicIdPartition(uuid.uuid4(), "orders", 3)
    segment_id = segment_id or RemoteLogSegmentId.generate(tip)
    directory = directory / uuid.uuid4().hex
    directory.mkdir(parents=True)
    log = os.urandom(log_size)
    indexes = {
        IndexType.OFFSET: os.urandom(8 * 50),
        IndexType.TIMESTAMP: os.urandom(12 * 50),
        IndexType.PRODUCER_SNAPSHOT: os.urandom(77),
        IndexType.LEADER_EPOCH: b"0\n2\n0 1234\n1 1300\n",
    }
    if with_txn_index:
        indexes[IndexType.TRANSACTION] = os.urandom(34 * 3)
    name = f"{start_offset:020d}"

    def write(suffix: str, content: bytes) -> Path:
        path = directory / (name + suffix)
        path.write_bytes(content)
        return path

    data = LogSegmentData(
        log_segment=write(".log", log),
        offset_index=write(".index", indexes[IndexType.OFFSET]),
        time_index=write(".timeindex", indexes[IndexType.TIMESTAMP]),
        transaction_index=write(".txnindex", indexes[IndexType.TRANSACTION]) if with_txn_index else None,
        producer_snapshot_index=write(".snapshot", indexes[IndexType.PRODUCER_SNAPSHOT]),
        leader_epoch_index=indexes[IndexType.LEADER_EPOCH],
    )
    metadata = RemoteLogSegmentMetadata(
        segment_id=segment_id,
        start_offset=start_offset,
        end_offset=start_offset + 99,
        max_timestamp_ms=1_700_000_000_000,
        leader_epoch=1,
        event_timestamp_ms=1_700_000_000_500,
        segment_leader_epochs=((0, start_offset), (1, start_offset + 66)),
        segment_size_in_bytes=log_size,
        txn_index_empty=not with_txn_index,
    )
    return Segment(metadata, data, log, indexes)


async def read_all(
    rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None
) -> bytes:
    return b"".join([bytes(c) async for c in rsm.fetch_log_segment(metadata, start, end)])


class RemoteStorageManagerContract(abc.ABC):
    """Subclasses provide the `rsm` fixture and the raw-object hooks below."""

    def assert_stored_form(self, stored: bytes | None, content: bytes) -> None:
        """What the store holds for an object of this content (an encrypting contract overrides)."""
        assert stored == content

    @pytest.fixture
    def rsm(self) -> RemoteStorageManager:  # pragma: no cover - always overridden
        raise NotImplementedError

    @abc.abstractmethod
    async def raw_write(self, rsm: RemoteStorageManager, key: str, data: bytes) -> None:
        """Overwrite an object directly in the store."""

    @abc.abstractmethod
    async def raw_delete(self, rsm: RemoteStorageManager, key: str) -> None:
        """Delete an object directly in the store."""

    @abc.abstractmethod
    async def raw_read(self, rsm: RemoteStorageManager, key: str) -> bytes | None:
        """An object's bytes read directly from the store, None when absent."""

    def key(self, rsm: RemoteStorageManager, segment: Segment, object_type: ObjectType) -> str:
        return segment_object_key(rsm.prefix, segment.metadata, object_type)

    async def flip(self, rsm: RemoteStorageManager, key: str, position: int, bits: int) -> None:
        """XOR one stored byte of the object with `bits`: same size, other bytes."""
        stored = bytearray(await self.raw_read(rsm, key))
        stored[position] ^= bits
        await self.raw_write(rsm, key, bytes(stored))

    # -- copy and fetch ---------------------------------------------------------

    async def test_copy_then_fetch_whole_segment(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert await read_all(rsm, segment.metadata, 0) == segment.log
        assert await read_all(rsm, segment.metadata, 0, len(segment.log) - 1) == segment.log

    async def test_every_object_lands_under_its_key(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        self.assert_stored_form(await self.raw_read(rsm, self.key(rsm, segment, ObjectType.LOG)), segment.log)
        for index_type, content in segment.indexes.items():
            key = self.key(rsm, segment, ObjectType.of_index(index_type))
            self.assert_stored_form(await self.raw_read(rsm, key), content)
        keys = await rsm.list_partition_objects(segment.metadata.topic_id_partition)
        assert keys == sorted(self.key(rsm, segment, t) for t in ObjectType)

    @pytest.mark.parametrize(
        ("start", "end", "expected"),
        [
            (0, 0, slice(0, 1)),  # first byte only
            (99_999, 99_999, slice(99_999, 100_000)),  # last byte only
            (99_999, None, slice(99_999, 100_000)),
            (1_000, 54_321, slice(1_000, 54_322)),  # middle, end inclusive
            (50_000, 10_000_000, slice(50_000, 100_000)),  # end past the end: clamped
            (0, 100_000, slice(0, 100_000)),  # end one past the last byte
        ],
    )
    async def test_range_edges(
        self, rsm: RemoteStorageManager, tmp_path: Path, start: int, end: int | None, expected: slice
    ) -> None:
        segment = make_segment(tmp_path, log_size=100_000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert await read_all(rsm, segment.metadata, start, end) == segment.log[expected]

    @pytest.mark.parametrize(("start", "size"), [(0, 262_144), (262_144, 600_000 - 262_144), (1000, 5000)])
    async def test_read_into_a_buffer(self, rsm: RemoteStorageManager, tmp_path: Path, start: int, size: int) -> None:
        """What the chunk cache reads with: the same checked bytes as a stream, into a buffer
        the caller reuses (dirty from an earlier read); fewer bytes than asked is corrupt."""
        segment = make_segment(tmp_path, log_size=600_000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        buffer = bytearray(b"\xee" * (size + 10))
        await rsm.read_log_into(segment.metadata, start, memoryview(buffer)[:size])
        assert bytes(buffer[:size]) == segment.log[start:start + size]
        assert buffer[size:] == b"\xee" * 10
        with pytest.raises(CorruptRemoteSegment):
            await rsm.read_log_into(segment.metadata, 599_000, memoryview(bytearray(2000)))

    async def test_start_at_or_past_the_end_is_an_empty_stream(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=1000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert await read_all(rsm, segment.metadata, 1000) == b""
        assert await read_all(rsm, segment.metadata, 1000, 2000) == b""
        assert await read_all(rsm, segment.metadata, 5000) == b""

    async def test_invalid_positions_are_rejected(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=1000)
        with pytest.raises(ValueError):
            rsm.fetch_log_segment(segment.metadata, -1)
        with pytest.raises(ValueError):
            rsm.fetch_log_segment(segment.metadata, 10, 9)

    async def test_fetch_index_returns_what_was_copied(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        for index_type in IndexType:
            assert await rsm.fetch_index(segment.metadata, index_type) == segment.indexes[index_type]

    async def test_missing_transaction_index_is_not_found(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, with_txn_index=False)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        with pytest.raises(RemoteResourceNotFound) as raised:
            await rsm.fetch_index(segment.metadata, IndexType.TRANSACTION)
        assert not isinstance(raised.value, RemoteSegmentNotFound)  # the segment is there
        assert await rsm.fetch_index(segment.metadata, IndexType.OFFSET) == segment.indexes[IndexType.OFFSET]
        manifest = await rsm.verify_segment(segment.metadata, check_crc=True)
        assert ObjectType.TRANSACTION_INDEX.value not in manifest.objects

    async def test_never_copied_segment_is_not_found(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        with pytest.raises(RemoteResourceNotFound):
            await read_all(rsm, segment.metadata, 0)
        with pytest.raises(RemoteResourceNotFound):
            await rsm.fetch_index(segment.metadata, IndexType.OFFSET)
        with pytest.raises(RemoteResourceNotFound):
            await rsm.verify_segment(segment.metadata)

    # -- idempotence ------------------------------------------------------------

    async def test_copy_twice_overwrites(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        first = make_segment(tmp_path, log_size=5000)
        await rsm.copy_log_segment_data(first.metadata, first.data)
        assert await read_all(rsm, first.metadata, 0) == first.log  # now cached
        second = make_segment(tmp_path, log_size=7000, with_txn_index=False, segment_id=first.metadata.segment_id)
        await rsm.copy_log_segment_data(second.metadata, second.data)
        assert await read_all(rsm, first.metadata, 0) == second.log
        assert await rsm.fetch_index(first.metadata, IndexType.OFFSET) == second.indexes[IndexType.OFFSET]
        # The first copy's transaction index does not outlive the second copy.
        with pytest.raises(RemoteResourceNotFound):
            await rsm.fetch_index(first.metadata, IndexType.TRANSACTION)
        assert await self.raw_read(rsm, self.key(rsm, first, ObjectType.TRANSACTION_INDEX)) is None
        await rsm.verify_segment(first.metadata, check_crc=True)

    async def test_delete_twice_then_not_found(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert await rsm.fetch_index(segment.metadata, IndexType.OFFSET)  # caches the manifest
        await rsm.delete_log_segment_data(segment.metadata)
        await rsm.delete_log_segment_data(segment.metadata)
        with pytest.raises(RemoteResourceNotFound):
            await read_all(rsm, segment.metadata, 0)
        with pytest.raises(RemoteResourceNotFound):
            await rsm.fetch_index(segment.metadata, IndexType.OFFSET)
        assert await rsm.list_partition_objects(segment.metadata.topic_id_partition) == []

    async def test_delete_of_a_never_copied_segment_succeeds(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        await rsm.delete_log_segment_data(make_segment(tmp_path).metadata)

    async def test_delete_leaves_other_segments_alone(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        tip = TopicIdPartition(uuid.uuid4(), "orders", 0)
        kept = make_segment(tmp_path, topic_id_partition=tip, start_offset=0, log_size=3000)
        gone = make_segment(tmp_path, topic_id_partition=tip, start_offset=100, log_size=3000)
        for segment in (kept, gone):
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await rsm.delete_log_segment_data(gone.metadata)
        assert await read_all(rsm, kept.metadata, 0) == kept.log
        assert await rsm.list_partition_objects(tip) == sorted(self.key(rsm, kept, t) for t in ObjectType)

    async def test_delete_partition(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        tip = TopicIdPartition(uuid.uuid4(), "orders", 7)
        other = TopicIdPartition(tip.topic_id, "orders", 8)
        segments = [
            make_segment(tmp_path, topic_id_partition=tip, start_offset=o, log_size=2000) for o in (0, 100, 200)
        ]
        survivor = make_segment(tmp_path, topic_id_partition=other, start_offset=0, log_size=2000)
        for segment in [*segments, survivor]:
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert len(await rsm.list_partition_objects(tip)) == 3 * len(ObjectType)
        await rsm.delete_partition(tip)
        await rsm.delete_partition(tip)
        assert await rsm.list_partition_objects(tip) == []
        for segment in segments:
            with pytest.raises(RemoteResourceNotFound):
                await read_all(rsm, segment.metadata, 0)
        assert await read_all(rsm, survivor.metadata, 0) == survivor.log

    # -- size -------------------------------------------------------------------

    async def test_segment_above_the_multipart_threshold(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=LARGE_SEGMENT_BYTES)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        chunks = [bytes(c) async for c in rsm.fetch_log_segment(segment.metadata, 0)]
        assert b"".join(chunks) == segment.log
        # Streamed in chunks, never as one piece.
        assert len(chunks) > 1
        # A piece is at most a checksum block (verified whole before it is passed on) or a chunk.
        assert max(map(len, chunks)) <= max(rsm.chunk_bytes, BLOCK_BYTES)
        middle = await read_all(rsm, segment.metadata, 5_000_000, 7_654_321)
        assert middle == segment.log[5_000_000:7_654_322]
        manifest = await rsm.verify_segment(segment.metadata, check_crc=True)
        assert manifest.objects[ObjectType.LOG.value].size == LARGE_SEGMENT_BYTES

    async def test_concurrent_ranged_reads(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=400_000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        ranges = [(i * 19_001, i * 19_001 + 25_000 + i) for i in range(20)]
        results = await asyncio.gather(*(read_all(rsm, segment.metadata, s, e) for s, e in ranges))
        for (start, end), result in zip(ranges, results):
            assert result == segment.log[start : end + 1]

    async def test_a_stream_closed_early_releases_and_later_reads_work(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=LARGE_SEGMENT_BYTES // 4)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        for _ in range(3):
            async with contextlib.aclosing(rsm.fetch_log_segment(segment.metadata, 0)) as stream:
                first = await anext(stream)
                assert bytes(first) == segment.log[: len(first)]
        assert await read_all(rsm, segment.metadata, 10, 20) == segment.log[10:21]

    # -- corruption -------------------------------------------------------------

    async def test_verify_accepts_an_intact_segment(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        manifest = await rsm.verify_segment(segment.metadata, check_crc=True)
        assert manifest.segment_id == segment.metadata.segment_id.id
        assert manifest.start_offset == segment.metadata.start_offset
        assert manifest.end_offset == segment.metadata.end_offset
        assert manifest.objects[ObjectType.LOG.value].size == len(segment.log)

    async def test_overwritten_index_is_corrupt(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert await rsm.fetch_index(segment.metadata, IndexType.OFFSET)  # manifest now cached
        key = self.key(rsm, segment, ObjectType.OFFSET_INDEX)
        await self.flip(rsm, key, 3, 0xFF)  # only the CRC (or the GCM tag) can tell
        with pytest.raises(CorruptRemoteSegment, match=key):
            await rsm.fetch_index(segment.metadata, IndexType.OFFSET)
        await rsm.verify_segment(segment.metadata)  # sizes alone agree
        with pytest.raises(CorruptRemoteSegment, match=key):
            await rsm.verify_segment(segment.metadata, check_crc=True)
        # The other indexes are still served.
        assert await rsm.fetch_index(segment.metadata, IndexType.TIMESTAMP) == segment.indexes[IndexType.TIMESTAMP]

    async def test_truncated_log_is_corrupt(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=50_000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert await read_all(rsm, segment.metadata, 0, 9) == segment.log[:10]  # manifest now cached
        key = self.key(rsm, segment, ObjectType.LOG)
        await self.raw_write(rsm, key, segment.log[:30_000])
        with pytest.raises(CorruptRemoteSegment, match=key):
            await rsm.verify_segment(segment.metadata)
        with pytest.raises(CorruptRemoteSegment, match=key):
            await read_all(rsm, segment.metadata, 0, 9)
        # A range that starts past the shortened object.
        with pytest.raises(CorruptRemoteSegment, match=key):
            await read_all(rsm, segment.metadata, 40_000, 40_100)

    async def test_flipped_log_byte_is_found_by_crc_only(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=50_000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = self.key(rsm, segment, ObjectType.LOG)
        await self.flip(rsm, key, 40_000, 0x01)
        await rsm.verify_segment(segment.metadata)
        with pytest.raises(CorruptRemoteSegment, match=key):
            await rsm.verify_segment(segment.metadata, check_crc=True)
        # A read of the bytes around it refuses them too (the block CRC-32C, or the GCM tag).
        with pytest.raises(CorruptRemoteSegment, match=key):
            await read_all(rsm, segment.metadata, 39_000, 41_000)

    async def test_missing_object_is_corrupt(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = self.key(rsm, segment, ObjectType.TIME_INDEX)
        await self.raw_delete(rsm, key)
        with pytest.raises(CorruptRemoteSegment, match=key):
            await rsm.verify_segment(segment.metadata)

    async def test_verify_names_each_damaged_object_and_what_is_wrong(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        """What the pipeline checks before it trims the broker: every object of the segment
        is in the store with the size and CRC-32C its manifest records (the store's own
        checksum where it keeps one, the bytes read back where not)."""
        tip = TopicIdPartition(uuid.uuid4(), "orders", 0)
        deleted, flipped, truncated, intact = (
            make_segment(tmp_path, topic_id_partition=tip, start_offset=o, log_size=60_000) for o in (0, 100, 200, 300))
        for segment in (deleted, flipped, truncated, intact):
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await self.raw_delete(rsm, self.key(rsm, deleted, ObjectType.LOG))
        await self.flip(rsm, self.key(rsm, flipped, ObjectType.LOG), 59_999, 0x80)
        index = self.key(rsm, truncated, ObjectType.OFFSET_INDEX)
        await self.raw_write(rsm, index, (await self.raw_read(rsm, index))[:-8])

        for segment, object_type, reason in ((deleted, ObjectType.LOG, RemoteObjectMismatch.MISSING),
                                             (flipped, ObjectType.LOG, RemoteObjectMismatch.CHECKSUM),
                                             (truncated, ObjectType.OFFSET_INDEX, RemoteObjectMismatch.SIZE)):
            key = self.key(rsm, segment, object_type)
            with pytest.raises(RemoteObjectMismatch, match=key) as raised:
                await rsm.verify_segment(segment.metadata, check_crc=True)
            assert (raised.value.key, raised.value.reason) == (key, reason)
        # Without the checksum, only what sizes tell.
        await rsm.verify_segment(flipped.metadata)
        with pytest.raises(RemoteObjectMismatch, match=RemoteObjectMismatch.MISSING):
            await rsm.verify_segment(deleted.metadata)
        manifest = await rsm.verify_segment(intact.metadata, check_crc=True)
        assert manifest.objects[ObjectType.LOG.value].size == len(intact.log)

    async def test_copy_without_manifest_is_refused(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await self.raw_delete(rsm, self.key(rsm, segment, ObjectType.MANIFEST))
        # verify_segment reads the store, not the manifest cached by the copy. Objects
        # without their manifest (a copy or a restore not finished) are a missing segment,
        # nothing known to be damaged.
        for attempt in (rsm.verify_segment(segment.metadata), read_all(rsm, segment.metadata, 0),
                        rsm.fetch_index(segment.metadata, IndexType.OFFSET),
                        rsm.fetch_index(segment.metadata, IndexType.TRANSACTION)):
            with pytest.raises(RemoteSegmentNotFound, match="incomplete") as raised:
                await attempt
            assert not isinstance(raised.value, CorruptRemoteSegment)
        # A retried copy completes it.
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await rsm.verify_segment(segment.metadata, check_crc=True)

    async def test_garbled_manifest_is_corrupt(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = self.key(rsm, segment, ObjectType.MANIFEST)
        await self.raw_write(rsm, key, b'{"version": 1, "objects": ')
        with pytest.raises(CorruptRemoteSegment, match=key):
            await rsm.verify_segment(segment.metadata)

    async def test_context_manager_closes(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=100)
        async with rsm as manager:
            assert manager is rsm
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
            assert await read_all(rsm, segment.metadata, 0) == segment.log


def key_ring(*ids: str, active: str = "", directory: Path = Path("/etc/tierproxy")) -> KeyRing:
    """Keys of fresh random material, named as if read from files in `directory`."""
    return KeyRing([KeyEncryptionKey(i, directory / f"{i}.key", os.urandom(32)) for i in ids], active)


class EncryptedRemoteStorageManagerContract(RemoteStorageManagerContract):
    """The contract once more with an active encryption key, and what encryption adds:
    nothing stored in plaintext, a data key per copy, and keys that are wrong, missing,
    rotated, or chunks and keys moved elsewhere, all refused rather than served.

    Subclasses create their `rsm` with the `keys` fixture and implement `other_manager`.
    """

    @pytest.fixture
    def keys(self) -> KeyRing:
        return key_ring("k1", active="k1")

    @abc.abstractmethod
    def other_manager(self, rsm: RemoteStorageManager, keys: KeyRing) -> RemoteStorageManager:
        """Another manager over the same store and prefix, with these keys (not started)."""

    def assert_stored_form(self, stored: bytes | None, content: bytes) -> None:
        assert stored is not None
        chunks = max(1, -(-len(content) // BLOCK_BYTES))
        assert len(stored) == len(content) + TAG_BYTES * chunks
        for start in range(0, len(content) - 15, 4096):  # no 16 bytes of the content anywhere in it
            assert content[start:start + 16] not in stored

    async def manifest_body(self, rsm: RemoteStorageManager, segment: Segment) -> dict:
        return json.loads(await self.raw_read(rsm, self.key(rsm, segment, ObjectType.MANIFEST)))

    async def copied_log(self, rsm: RemoteStorageManager, segment: Segment) -> tuple[str, bytes]:
        """Copy the segment; its `.log`'s key and stored bytes (chunk i at i * CHUNK_STEP)."""
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = self.key(rsm, segment, ObjectType.LOG)
        return key, await self.raw_read(rsm, key)

    async def rewritten_log(self, rsm: RemoteStorageManager, segment: Segment, change) -> None:
        """Copy the segment, then store `change(stored bytes)` as its `.log`."""
        key, stored = await self.copied_log(rsm, segment)
        await self.raw_write(rsm, key, change(stored))

    async def test_the_manifest_names_the_key_and_holds_no_plaintext_checksum(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=3 * BLOCK_BYTES + 5)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        body = await self.manifest_body(rsm, segment)
        assert body["version"] == 2
        # the GCM tags check every chunk: a reader need not check batch CRCs again
        assert await rsm.checks_log_blocks(segment.metadata)
        encryption = body["encryption"]
        assert (encryption["cipher"], encryption["key_id"], encryption["chunk_bytes"]) == (
            "AES-256-GCM", "k1", BLOCK_BYTES)
        assert len(base64.b64decode(encryption["wrapped_data_key"])) == 60
        for extension, entry in body["objects"].items():
            assert set(entry) == {"size", "crc32c"}, extension
            stored = await self.raw_read(rsm, segment_key_prefix(rsm.prefix, segment.metadata) + extension)
            assert entry["crc32c"] == crc32c.crc32c(stored)  # of the ciphertext
        assert body["objects"]["log"]["size"] == len(segment.log)
        manifest = await rsm.fetch_manifest(segment.metadata)
        assert manifest.encryption is not None and manifest.encryption.key_id == "k1"

    async def test_a_retried_copy_draws_a_new_data_key(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=10_000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        first = await self.manifest_body(rsm, segment)
        first_log = await self.raw_read(rsm, self.key(rsm, segment, ObjectType.LOG))
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        second = await self.manifest_body(rsm, segment)
        assert first["encryption"]["wrapped_data_key"] != second["encryption"]["wrapped_data_key"]
        assert await self.raw_read(rsm, self.key(rsm, segment, ObjectType.LOG)) != first_log
        assert await read_all(rsm, segment.metadata, 0) == segment.log

    async def test_ranged_reads_open_only_the_chunks_they_cover(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=4 * BLOCK_BYTES + 1000)
        key, _ = await self.copied_log(rsm, segment)
        await self.flip(rsm, key, CHUNK_STEP + 7, 0x40)  # a byte of chunk 1
        # Chunks 0, 2, 3 and 4 are served; any read that covers chunk 1 is refused.
        for start, end in ((0, BLOCK_BYTES - 1), (2 * BLOCK_BYTES, 4 * BLOCK_BYTES + 999), (100, 200)):
            assert await read_all(rsm, segment.metadata, start, end) == segment.log[start:end + 1]
        for start, end in ((0, BLOCK_BYTES), (BLOCK_BYTES + 5, BLOCK_BYTES + 6), (0, None)):
            with pytest.raises(DecryptionFailed, match=rf"{key}: chunk 1 fails its AES-GCM tag"):
                await read_all(rsm, segment.metadata, start, end)

    async def test_a_buffer_read_decrypts_in_place_and_stops_at_a_tampered_chunk(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        """The chunk cache's reads: whole chunks are decrypted into the caller's (reused,
        dirty) buffer; at a chunk that fails its tag the read says how much before it is
        good, and those bytes are the plaintext."""
        segment = make_segment(tmp_path, log_size=4 * BLOCK_BYTES + 1000)
        key, _ = await self.copied_log(rsm, segment)
        buffer = bytearray(b"\xee" * len(segment.log))
        for _ in range(2):  # the second read reuses what the first read the ciphertext into
            await rsm.read_log_into(segment.metadata, 0, memoryview(buffer))
            assert buffer == segment.log
        await self.flip(rsm, key, 2 * CHUNK_STEP + 7, 0x40)  # a byte of chunk 2
        buffer[:] = b"\xee" * len(buffer)
        with pytest.raises(CorruptRangeRead) as failed:
            await rsm.read_log_into(segment.metadata, 100, memoryview(buffer)[:3 * BLOCK_BYTES])
        assert failed.value.filled == 2 * BLOCK_BYTES - 100
        assert buffer[:failed.value.filled] == segment.log[100:2 * BLOCK_BYTES]

    async def test_a_chunk_moved_to_another_position_is_refused(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=3 * BLOCK_BYTES)
        step = CHUNK_STEP
        await self.rewritten_log(rsm, segment, lambda stored: stored[step:2 * step] + stored[:step] + stored[2 * step:])
        with pytest.raises(DecryptionFailed, match="chunk 0"):
            await read_all(rsm, segment.metadata, 0, 10)
        with pytest.raises(DecryptionFailed, match="chunk 1"):
            await read_all(rsm, segment.metadata, BLOCK_BYTES, BLOCK_BYTES + 10)
        assert await read_all(rsm, segment.metadata, 2 * BLOCK_BYTES) == segment.log[2 * BLOCK_BYTES:]

    async def test_an_object_moved_to_another_object_or_segment_is_refused(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        # A log as long as the offset index (8 * 50 bytes): the two objects have equal sizes.
        tip = TopicIdPartition(uuid.uuid4(), "orders", 1)
        one = make_segment(tmp_path, log_size=400, topic_id_partition=tip, start_offset=0)
        other = make_segment(tmp_path, log_size=400, topic_id_partition=tip, start_offset=100)
        for segment in (one, other):
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        index_key = self.key(rsm, one, ObjectType.OFFSET_INDEX)
        await self.raw_write(rsm, self.key(rsm, one, ObjectType.LOG), await self.raw_read(rsm, index_key))
        with pytest.raises(DecryptionFailed):
            await read_all(rsm, one.metadata, 0)
        await self.raw_write(rsm, index_key, await self.raw_read(rsm, self.key(rsm, other, ObjectType.OFFSET_INDEX)))
        with pytest.raises(DecryptionFailed):
            await rsm.fetch_index(one.metadata, IndexType.OFFSET)
        assert await read_all(rsm, other.metadata, 0) == other.log

    async def test_an_object_cut_at_a_chunk_boundary_is_refused_even_with_its_manifest(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=2 * BLOCK_BYTES + 100)
        await self.rewritten_log(rsm, segment, lambda stored: stored[:2 * CHUNK_STEP])
        body = await self.manifest_body(rsm, segment)
        body["objects"]["log"]["size"] = 2 * BLOCK_BYTES  # the manifest agrees with the cut
        await self.raw_write(rsm, self.key(rsm, segment, ObjectType.MANIFEST), json.dumps(body).encode())
        await rsm.verify_segment(segment.metadata)  # sizes alone agree
        with pytest.raises(DecryptionFailed):
            await read_all(rsm, segment.metadata, BLOCK_BYTES)

    async def test_wrong_and_missing_keys_are_refused_and_name_the_key(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        segment = make_segment(tmp_path, log_size=5000)
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        impostor = key_ring("k1", "k2", active="k2")  # another key under the same id
        async with self.other_manager(rsm, impostor) as wrong:
            with pytest.raises(WrongEncryptionKey, match=r"key 'k1' \(file /etc/tierproxy/k1.key\)") as raised:
                await read_all(wrong, segment.metadata, 0)
            assert not raised.value.retriable
            with pytest.raises(WrongEncryptionKey):
                await wrong.fetch_index(segment.metadata, IndexType.OFFSET)
        for keys in (key_ring("k2", active="k2"), KeyRing()):
            async with self.other_manager(rsm, keys) as missing:
                with pytest.raises(EncryptionKeyNotFound, match="encrypted with key 'k1'") as raised:
                    await read_all(missing, segment.metadata, 0)
                assert isinstance(raised.value, RemoteStorageError) and not raised.value.retriable
                with pytest.raises(EncryptionKeyNotFound):
                    await missing.fetch_index(segment.metadata, IndexType.TIMESTAMP)
                # What does not need the key still works: the objects are all there.
                await missing.verify_segment(segment.metadata, check_crc=True)
        assert await read_all(rsm, segment.metadata, 0) == segment.log

    async def test_a_wrapped_data_key_moved_to_another_segment_is_refused(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        one, other = make_segment(tmp_path, log_size=1000), make_segment(tmp_path, log_size=1000)
        for segment in (one, other):
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        body = await self.manifest_body(rsm, other)
        body["encryption"] = (await self.manifest_body(rsm, one))["encryption"]
        await self.raw_write(rsm, self.key(rsm, other, ObjectType.MANIFEST), json.dumps(body).encode())
        async with self.other_manager(rsm, rsm.keys) as fresh:  # no manifest cached
            with pytest.raises(WrongEncryptionKey):
                await read_all(fresh, other.metadata, 0)
            assert await read_all(fresh, one.metadata, 0) == one.log

    async def test_rotation_and_plaintext_segments_read_side_by_side(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        tip = TopicIdPartition(uuid.uuid4(), "orders", 2)
        plain, old, new = (make_segment(tmp_path, log_size=BLOCK_BYTES + 77, topic_id_partition=tip, start_offset=o)
                           for o in (0, 100, 200))
        async with self.other_manager(rsm, KeyRing()) as before_encryption:
            await before_encryption.copy_log_segment_data(plain.metadata, plain.data)
        await rsm.copy_log_segment_data(old.metadata, old.data)  # k1, active
        rotated = KeyRing([*rsm.keys.keys.values(), *key_ring("k2").keys.values()], "k2")
        async with self.other_manager(rsm, rotated) as after_rotation:
            await after_rotation.copy_log_segment_data(new.metadata, new.data)
            for segment, key_id in ((plain, None), (old, "k1"), (new, "k2")):
                assert await read_all(after_rotation, segment.metadata, 0) == segment.log
                assert await after_rotation.fetch_index(segment.metadata, IndexType.LEADER_EPOCH) == \
                    segment.indexes[IndexType.LEADER_EPOCH]
                manifest = await after_rotation.fetch_manifest(segment.metadata)
                assert (manifest.encryption.key_id if manifest.encryption else None) == key_id
        assert (await self.manifest_body(rsm, plain))["version"] == 1
        self.assert_stored_form(await self.raw_read(rsm, self.key(rsm, new, ObjectType.LOG)), new.log)
        # The old key retired too early: its segments are refused, the others still read.
        async with self.other_manager(rsm, KeyRing([rotated.keys["k2"]], "k2")) as retired:
            with pytest.raises(EncryptionKeyNotFound, match="'k1'"):
                await read_all(retired, old.metadata, 0)
            assert await read_all(retired, new.metadata, 0) == new.log
            assert await read_all(retired, plain.metadata, 0) == plain.log

    async def test_with_encryption_required_a_segment_stored_unencrypted_is_refused(
        self, rsm: RemoteStorageManager, tmp_path: Path
    ) -> None:
        """A segment copied again without encryption over an encrypted one, as whoever may write
        the store could do with records of their own: read as it says, unless encryption is
        required; then refused as corrupt, and encrypted segments still read."""
        replaced, kept = make_segment(tmp_path, log_size=BLOCK_BYTES + 10), make_segment(tmp_path, log_size=500)
        for segment in (replaced, kept):
            await rsm.copy_log_segment_data(segment.metadata, segment.data)
        async with self.other_manager(rsm, KeyRing()) as plaintext_writer:
            await plaintext_writer.copy_log_segment_data(replaced.metadata, replaced.data)
        assert (await self.manifest_body(rsm, replaced))["version"] == 1
        async with self.other_manager(rsm, rsm.keys) as lenient:
            assert await read_all(lenient, replaced.metadata, 0) == replaced.log
        required = KeyRing(rsm.keys.keys.values(), "k1", required=True)
        async with self.other_manager(rsm, required) as strict:
            with pytest.raises(UnencryptedSegment, match="stored unencrypted and "
                               "remote.log.storage.encryption.required=true") as raised:
                await read_all(strict, replaced.metadata, 0)
            assert isinstance(raised.value, CorruptRemoteSegment) and not raised.value.retriable
            with pytest.raises(UnencryptedSegment):
                await strict.fetch_index(replaced.metadata, IndexType.OFFSET)
            await strict.verify_segment(replaced.metadata, check_crc=True)  # what needs no reading still works
            assert await read_all(strict, kept.metadata, 0) == kept.log

    async def test_empty_objects_are_sealed_too(self, rsm: RemoteStorageManager, tmp_path: Path) -> None:
        segment = make_segment(tmp_path, log_size=1)
        segment.data.producer_snapshot_index.write_bytes(b"")
        segment.indexes[IndexType.PRODUCER_SNAPSHOT] = b""
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        key = self.key(rsm, segment, ObjectType.PRODUCER_SNAPSHOT)
        assert len(await self.raw_read(rsm, key)) == TAG_BYTES
        assert await rsm.fetch_index(segment.metadata, IndexType.PRODUCER_SNAPSHOT) == b""
        await self.raw_write(rsm, key, os.urandom(TAG_BYTES))
        with pytest.raises(DecryptionFailed):
            await rsm.fetch_index(segment.metadata, IndexType.PRODUCER_SNAPSHOT)
