"""A corrupt block of a remote `.log` (its CRC-32C in the manifest, or the GCM tag of an
encrypted segment's chunk): the whole batches in front of it are still served, a read
that starts at or after it fails and is counted, nothing of it is served or cached, and
a read starting in a later chunk is served. Local files (read in pieces smaller and
larger than a block) and S3 on moto's server, plaintext and encrypted."""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.storage.encryption import KeyEncryptionKey, KeyRing
from tierproxy.storage.errors import CorruptRemoteSegment, DecryptionFailed
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.manifest import BLOCK_BYTES, TAG_BYTES
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.rsm import ObjectStoreRemoteStorageManager, ObjectType
from tierproxy.storage.s3 import S3RemoteStorageManager
from tests.helpers.remote_log import Partition, build_partition, check, close, make_reader

CHUNK = 2 * BLOCK_BYTES  # the proxy reads two blocks at a time here
STORES = ["local-16KiB-pieces", "local-4MiB-pieces", "s3"]


@contextlib.asynccontextmanager
async def remote_log(store: str, encrypted: bool, directory: Path, request: pytest.FixtureRequest
                     ) -> AsyncIterator[tuple[ObjectStoreRemoteStorageManager, FileRemoteLogMetadataManager]]:
    keys = KeyRing([KeyEncryptionKey("k1", Path("/keys/k1"), os.urandom(32))], "k1") if encrypted else None
    if store == "s3":
        server = request.getfixturevalue("s3_server")
        rsm: ObjectStoreRemoteStorageManager = S3RemoteStorageManager(
            server.bucket, f"corrupt-{uuid.uuid4().hex[:8]}", endpoint_url=server.endpoint_url,
            region=server.region, access_key_id=server.access_key, secret_access_key=server.secret_key, keys=keys)
    else:
        piece = 16 * 1024 if store == "local-16KiB-pieces" else 4 << 20
        rsm = LocalRemoteStorageManager(directory / "remote", chunk_bytes=piece, keys=keys)
    async with rsm, FileRemoteLogMetadataManager(directory / "metadata") as rlmm:
        yield rsm, rlmm


async def _corrupt_block(rsm: ObjectStoreRemoteStorageManager, partition: Partition, block: int,
                         encrypted: bool) -> bytes:
    """Flip one byte inside `block` of the stored `.log` (inside its ciphertext when encrypted);
    returns the object as it was."""
    key = rsm._key(partition.segments[0], ObjectType.LOG)
    stored = await rsm._get_bytes(key)
    step = BLOCK_BYTES + TAG_BYTES if encrypted else BLOCK_BYTES
    tampered = bytearray(stored)
    tampered[block * step + 1000] ^= 0x01
    await rsm._put_bytes(key, bytes(tampered))
    return stored


@pytest.mark.parametrize("encrypted", [False, True], ids=["plaintext", "encrypted"])
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("block", [2, 3], ids=["first-block-of-a-chunk", "second-block-of-a-chunk"])
async def test_the_intact_batches_in_front_of_a_corrupt_block_are_served(
        store: str, encrypted: bool, block: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async with remote_log(store, encrypted, tmp_path, request) as (rsm, rlmm):
        # One segment of about 2 MiB: 8 blocks, 4 chunks.
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=170,
                                          value_size=4000)
        segment = partition.segments[0]
        assert segment.segment_size_in_bytes > 3 * CHUNK
        good = await _corrupt_block(rsm, partition, block, encrypted)
        corrupt_from = block * BLOCK_BYTES  # in the segment's plaintext `.log`
        next_chunk = (corrupt_from // CHUNK + 1) * CHUNK
        ends = list(itertools.accumulate(len(b.data) for b in partition.batches))
        intact = [b for b, end in zip(partition.batches, ends) if end <= corrupt_from]
        in_block = partition.batches[len(intact)]  # the first batch with a byte in the corrupt block
        # The offset index points a fetch at the batch before the one holding the offset
        # (its entries are last offsets): the batch after the first one in a later chunk.
        later_chunk = next(b for previous, end, b in zip(partition.batches, ends, partition.batches[1:])
                           if end - len(previous.data) >= next_chunk)
        error = DecryptionFailed if encrypted else CorruptRemoteSegment

        metrics = RemoteMetrics()
        reader = make_reader(rsm, rlmm, chunk_size=CHUNK, chunk_cache_bytes=16 * CHUNK, metrics=metrics)
        corrupt = {"topic": partition.tp.topic, "reason": "corrupt"}
        for attempt in (1, 2):  # the second read loads the chunk again: it was not cached
            result = await reader.read(partition.tp, partition.log_start_offset, 1 << 30, min_one_batch=True)
            assert b"".join(result.records) == b"".join(b.data for b in intact)
            assert result.next_fetch_offset == in_block.base_offset
            assert metrics.value("tierproxy_remote_read_errors_total", corrupt) == attempt
            assert (segment.segment_id.id, corrupt_from // CHUNK) not in reader.chunk_cache
        # A read starting at the corrupt block fails with the store's own error, counted.
        with pytest.raises(error):
            await reader.read(partition.tp, in_block.base_offset, 1 << 30, min_one_batch=True)
        assert metrics.value("tierproxy_remote_read_errors_total", corrupt) == 3
        assert (segment.segment_id.id, corrupt_from // CHUNK) not in reader.chunk_cache
        # A read starting in a later chunk is served, to the segment's end.
        check(await reader.read(partition.tp, later_chunk.base_offset, 1 << 30, min_one_batch=True),
              partition, later_chunk.base_offset, 1 << 30, True)
        # The object repaired, every batch is served from the start: nothing corrupt stayed cached.
        await rsm._put_bytes(rsm._key(segment, ObjectType.LOG), good)
        check(await reader.read(partition.tp, partition.log_start_offset, 1 << 30, min_one_batch=True),
              partition, partition.log_start_offset, 1 << 30, True)
        assert metrics.value("tierproxy_remote_read_errors_total", corrupt) == 3
        await close(reader)
