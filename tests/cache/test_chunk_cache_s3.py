"""ChunkCache over the S3 store (moto's S3 server): runs of consecutive chunks read with one
ranged GET, each chunk served as soon as its own bytes are in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path

import pytest

from tierproxy.cache.chunk_cache import ChunkCache, CorruptChunk
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.manifest import BLOCK_BYTES
from tierproxy.storage.model import RemoteLogSegmentMetadata
from tierproxy.storage.rsm import ObjectType
from tierproxy.storage.s3 import S3RemoteStorageManager
from testbed.s3 import S3Server

from tests.helpers.s3 import manager
from tests.storage.rsm_contract import Segment, key_ring, make_segment

CHUNK = 4 * BLOCK_BYTES
CHUNKS = 9  # the last one short


@contextlib.asynccontextmanager
async def _stored(s3_server: S3Server, tmp_path: Path, *, encrypted: bool = False) -> AsyncIterator[
        tuple[S3RemoteStorageManager, Segment, list[str]]]:
    """(the store, a segment of CHUNKS chunks copied there, the ranged GETs it answers from now on)."""
    segment = make_segment(tmp_path, log_size=(CHUNKS - 1) * CHUNK + 12345)
    options = {"keys": key_ring("k1", active="k1")} if encrypted else {}
    async with manager(s3_server, **options) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await rsm.fetch_manifest(segment.metadata)
        gets: list[str] = []

        def observe(operation: str, seconds: float, ok: bool) -> None:
            if operation == "get_range":
                gets.append(operation)

        rsm.observe_requests(observe)
        yield rsm, segment, gets


def _chunk(segment: Segment, index: int) -> bytes:
    return segment.log[index * CHUNK:(index + 1) * CHUNK]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_a_sequential_read_ahead_reads_runs_of_chunks_with_one_get(
        s3_server: S3Server, tmp_path: Path, encrypted: bool) -> None:
    async with _stored(s3_server, tmp_path, encrypted=encrypted) as (rsm, segment, gets):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=32 * CHUNK)
        await cache.start()
        read = []
        for i in range(CHUNKS):  # as the remote log reader reads: read-ahead, then the chunk
            cache.prefetch(segment.metadata, i + 1, 2)
            read.append(bytes(await cache.get(segment.metadata, i, read_ahead=False, leases=None)))
        await cache.close()
    assert read == [_chunk(segment, i) for i in range(CHUNKS)]
    # Chunk 0 on demand, then runs of four (the last run is the segment's end): not one GET a chunk.
    assert len(gets) == 3


async def test_a_waiter_on_a_later_chunk_of_a_run_is_served_by_the_run(s3_server: S3Server, tmp_path: Path) -> None:
    async with _stored(s3_server, tmp_path) as (rsm, segment, gets):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=32 * CHUNK)
        cache.prefetch(segment.metadata, 0, 4)
        chunks = await asyncio.gather(*(cache.get(segment.metadata, i, read_ahead=False, leases=None)
                                        for i in (2, 3, 1, 0)))
        assert [bytes(c) for c in chunks] == [_chunk(segment, i) for i in (2, 3, 1, 0)]
        await cache.close()
    assert len(gets) == 1


async def test_each_chunk_of_a_run_is_cached_as_soon_as_its_bytes_are_in(
        s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _stored(s3_server, tmp_path) as (rsm, segment, gets):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=32 * CHUNK)
        segment_id = segment.metadata.segment_id.id
        cached_before_the_next: list[bool] = []
        read_run = rsm.read_log_run

        async def watched(metadata: RemoteLogSegmentMetadata, start: int,
                          buffers: Sequence[memoryview]) -> AsyncGenerator[memoryview, None]:
            index = start // CHUNK
            async for buffer in read_run(metadata, start, buffers):
                yield buffer
                # Back here, the chunk is with the cache, while the rest of the body is not read yet.
                cached_before_the_next.append((segment_id, index) in cache)
                index += 1

        monkeypatch.setattr(rsm, "read_log_run", watched)
        cache.prefetch(segment.metadata, 0, 4)
        assert bytes(await cache.get(segment.metadata, 3, read_ahead=False, leases=None)) == _chunk(segment, 3)
        await cache.close()
    assert cached_before_the_next == [True] * 4 and len(gets) == 1


async def test_a_corrupt_block_in_a_run_fails_its_chunk_only(s3_server: S3Server, tmp_path: Path) -> None:
    async with _stored(s3_server, tmp_path) as (rsm, segment, gets):
        corrupt_at = CHUNK + 2 * BLOCK_BYTES + 100  # the third block of chunk 1
        damaged = bytearray(segment.log)
        damaged[corrupt_at] ^= 0xFF
        key = rsm._key(segment.metadata, ObjectType.LOG)
        await asyncio.to_thread(s3_server.client().put_object, Bucket=s3_server.bucket, Key=key, Body=bytes(damaged))
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=32 * CHUNK)
        cache.prefetch(segment.metadata, 0, 4)
        outcomes = await asyncio.gather(*(cache.get(segment.metadata, i, read_ahead=False, leases=None)
                                          for i in range(4)), return_exceptions=True)
        await cache.close()
    assert bytes(outcomes[0]) == _chunk(segment, 0)  # type: ignore[arg-type]  # a chunk, checked below
    error = outcomes[1]
    assert isinstance(error, CorruptChunk) and error.index == 1
    assert error.intact == _chunk(segment, 1)[:2 * BLOCK_BYTES]  # the blocks in front of the corrupt one
    # The chunks after it load on their own, intact.
    assert [bytes(c) for c in outcomes[2:]] == [_chunk(segment, 2), _chunk(segment, 3)]  # type: ignore[arg-type]
    assert len(gets) == 3  # the run, stopped at the block; then chunks 2 and 3 alone


async def test_a_run_that_fails_fails_only_the_chunks_not_yet_in(
        s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _stored(s3_server, tmp_path) as (rsm, segment, gets):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=32 * CHUNK)
        read_run = rsm.read_log_run

        async def cut_after_one(metadata: RemoteLogSegmentMetadata, start: int,
                                buffers: Sequence[memoryview]) -> AsyncGenerator[memoryview, None]:
            async for buffer in read_run(metadata, start, buffers):
                yield buffer
                raise RemoteStorageError("connection reset", retriable=True)  # the body cut after a chunk

        monkeypatch.setattr(rsm, "read_log_run", cut_after_one)
        cache.prefetch(segment.metadata, 0, 4)
        outcomes = await asyncio.gather(*(cache.get(segment.metadata, i, read_ahead=False, leases=None)
                                          for i in range(4)), return_exceptions=True)
        assert bytes(outcomes[0]) == _chunk(segment, 0)  # type: ignore[arg-type]  # a chunk, checked here
        assert all(isinstance(o, RemoteStorageError) and "connection reset" in str(o) for o in outcomes[1:])
        assert (segment.metadata.segment_id.id, 0) in cache and len(cache) == 1 and cache.reserved_bytes == 0
        # Nothing of the failed ones is remembered: the next read of one is a read of its own.
        assert bytes(await cache.get(segment.metadata, 2, read_ahead=False, leases=None)) == _chunk(segment, 2)
        await cache.close()
    assert len(gets) == 2
