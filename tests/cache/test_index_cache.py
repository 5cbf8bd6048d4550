"""RemoteIndexCache against the local-file RemoteStorageManager and real segment indexes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tierproxy.cache.index_cache import ENTRY_OVERHEAD_BYTES, TEMP_FILE_AGE_S, RemoteIndexCache, prune_index_directory
from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.indexes import OffsetIndex, TimeIndex, TransactionIndex
from tierproxy.storage.model import IndexType
from tierproxy.storage.rsm import ObjectType

from tests.helpers.remote_log import CountingRSM, Partition, build_partition, local_remote_log, one_segment


def _value(metrics: RemoteMetrics, name: str) -> float:
    return metrics.value(name, {"cache": "index"})


async def _stored_index(rsm, segment, index_type: IndexType) -> bytes:
    return await rsm.fetch_index(segment, index_type)


async def test_indexes_are_parsed_and_hit_after_the_first_load(tmp_path: Path) -> None:
    async with one_segment(tmp_path) as (rsm, _, segment, counting):
        metrics = RemoteMetrics()
        cache = RemoteIndexCache(counting, max_bytes=1 << 20, metrics=metrics.cache("index"))

        offset_index = await cache.offset_index(segment)
        assert isinstance(offset_index, OffsetIndex) and len(offset_index) > 0
        assert offset_index.to_bytes() == await _stored_index(rsm, segment, IndexType.OFFSET)
        assert offset_index.base_offset == segment.start_offset
        assert isinstance(await cache.time_index(segment), TimeIndex)
        assert await cache.offset_index(segment) is offset_index

        assert len(counting.index_reads) == 2
        assert _value(metrics, "tierproxy_cache_hits_total") == 1
        assert _value(metrics, "tierproxy_cache_misses_total") == 2
        assert _value(metrics, "tierproxy_cache_entries") == 2
        assert cache.total_bytes == _value(metrics, "tierproxy_cache_bytes")
        await cache.close()


async def test_missing_transaction_index_is_an_empty_one(tmp_path: Path) -> None:
    async with one_segment(tmp_path) as (rsm, _, segment, _):
        assert segment.txn_index_empty
        cache = RemoteIndexCache(rsm, max_bytes=1 << 20)
        index = await cache.transaction_index(segment)
        assert isinstance(index, TransactionIndex) and len(index) == 0
        await cache.close()


async def test_concurrent_misses_share_one_load(tmp_path: Path) -> None:
    async with one_segment(tmp_path, delay_s=0.02) as (_, _, segment, counting):
        cache = RemoteIndexCache(counting, max_bytes=1 << 20)
        results = await asyncio.gather(*(cache.offset_index(segment) for _ in range(25)))
        assert len(counting.index_reads) == 1
        assert all(r is results[0] for r in results)
        await cache.close()


async def test_a_failed_load_reaches_every_waiter_and_is_not_cached(tmp_path: Path) -> None:
    async with one_segment(tmp_path, delay_s=0.02) as (_, _, segment, counting):
        counting.fail_with = RemoteStorageError("store down", retriable=True)
        cache = RemoteIndexCache(counting, max_bytes=1 << 20)
        outcomes = await asyncio.gather(*(cache.offset_index(segment) for _ in range(10)), return_exceptions=True)
        assert all(isinstance(o, RemoteStorageError) and o.retriable for o in outcomes)
        assert len(counting.index_reads) == 1
        assert len(cache) == 0

        counting.fail_with = None
        assert len(await cache.offset_index(segment)) > 0
        assert len(counting.index_reads) == 2
        await cache.close()


async def test_a_cancelled_caller_does_not_cancel_the_load_for_others(tmp_path: Path) -> None:
    async with one_segment(tmp_path, delay_s=0.05) as (_, _, segment, counting):
        cache = RemoteIndexCache(counting, max_bytes=1 << 20)
        impatient = asyncio.create_task(cache.offset_index(segment))
        patient = asyncio.create_task(cache.offset_index(segment))
        await asyncio.sleep(0.01)
        impatient.cancel()
        assert len(await patient) > 0
        assert impatient.cancelled()
        assert len(counting.index_reads) == 1
        await cache.close()


async def test_bounded_by_bytes_least_recently_used_goes_first(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=4)
        sizes = [len(await _stored_index(rsm, s, IndexType.OFFSET)) + ENTRY_OVERHEAD_BYTES for s in partition.segments]
        bound = sizes[0] + sizes[1] + sizes[2]  # three of the four fit
        metrics = RemoteMetrics()
        counting = CountingRSM(rsm)
        cache = RemoteIndexCache(counting, max_bytes=bound, metrics=metrics.cache("index"))
        first, second, third, fourth = partition.segments
        for segment in (first, second, third):
            await cache.offset_index(segment)
        await cache.offset_index(first)  # now second is the least recently used
        await cache.offset_index(fourth)
        assert cache.total_bytes <= bound
        assert (second.segment_id.id, IndexType.OFFSET) not in cache
        assert (first.segment_id.id, IndexType.OFFSET) in cache
        assert _value(metrics, "tierproxy_cache_evictions_total") == 1
        reads = len(counting.index_reads)
        await cache.offset_index(second)
        assert len(counting.index_reads) == reads + 1
        assert cache.total_bytes <= bound
        await cache.close()


async def test_an_index_larger_than_the_cache_is_served_not_kept(tmp_path: Path) -> None:
    async with one_segment(tmp_path) as (rsm, _, segment, _):
        cache = RemoteIndexCache(rsm, max_bytes=10)
        assert len(await cache.offset_index(segment)) > 0
        assert len(cache) == 0 and cache.total_bytes == 0
        await cache.close()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file())


async def test_directory_entries_survive_a_restart(tmp_path: Path) -> None:
    cache_dir = tmp_path / "index-cache"
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2)
        async with RemoteIndexCache(rsm, max_bytes=1 << 20, cache_dir=cache_dir) as cache:
            for segment in partition.segments:
                await cache.offset_index(segment)
                await cache.time_index(segment)
        files = _files(cache_dir)
        assert len(files) == 4
        assert not [p for p in files if p.name.startswith(".")]  # temp names were renamed
        offset_file = next(p for p in files if p.name.endswith(".index"))
        assert offset_file.name.startswith(f"{partition.segments[0].start_offset:020d}_")

        counting = CountingRSM(rsm)
        async with RemoteIndexCache(counting, max_bytes=1 << 20, cache_dir=cache_dir) as reloaded:
            assert len(reloaded) == 4
            for segment in partition.segments:
                index = await reloaded.offset_index(segment)
                assert index.to_bytes() == await _stored_index(rsm, segment, IndexType.OFFSET)
                await reloaded.time_index(segment)
            assert counting.index_reads == []


async def _aged_offset_indexes(rsm, rlmm, tmp_path: Path, cache_dir: Path) -> tuple[Partition, list[Path]]:
    """Three segments' offset indexes cached in `cache_dir`; their files, oldest first."""
    partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3)
    async with RemoteIndexCache(rsm, max_bytes=1 << 20, cache_dir=cache_dir) as cache:
        for segment in partition.segments:
            await cache.offset_index(segment)
    files = _files(cache_dir)
    # Make the last segment's file the newest regardless of the clock's resolution.
    for age, path in enumerate(reversed(files)):
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    return partition, files


async def test_reload_keeps_the_newest_within_the_bound_and_deletes_the_rest(tmp_path: Path) -> None:
    cache_dir = tmp_path / "index-cache"
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition, files = await _aged_offset_indexes(rsm, rlmm, tmp_path, cache_dir)
        newest = files[-1]
        weight = newest.stat().st_size + ENTRY_OVERHEAD_BYTES

        async with RemoteIndexCache(rsm, max_bytes=weight, cache_dir=cache_dir) as small:
            assert len(small) == 1 and small.total_bytes <= weight
            assert (partition.segments[-1].segment_id.id, IndexType.OFFSET) in small
        assert _files(cache_dir) == [newest]


async def test_a_corrupt_or_half_written_file_is_dropped_and_refetched(tmp_path: Path) -> None:
    cache_dir = tmp_path / "index-cache"
    async with one_segment(tmp_path) as (rsm, _, segment, counting):
        async with RemoteIndexCache(rsm, max_bytes=1 << 20, cache_dir=cache_dir) as cache:
            await cache.offset_index(segment)
        (path,) = _files(cache_dir)
        data = bytearray(path.read_bytes())
        data[5] ^= 0x40  # still a well-formed index, but not the bytes that were stored
        path.write_bytes(bytes(data))
        leftover = cache_dir / f".{path.name}.0123.tmp"
        leftover.write_bytes(b"half")

        async with RemoteIndexCache(counting, max_bytes=1 << 20, cache_dir=cache_dir) as reloaded:
            assert len(reloaded) == 0
            assert not leftover.exists()
            index = await reloaded.offset_index(segment)
            assert index.to_bytes() == await _stored_index(rsm, segment, IndexType.OFFSET)
            assert len(counting.index_reads) == 1
        (refetched,) = _files(cache_dir)
        assert refetched.read_bytes() == await _stored_index(rsm, segment, IndexType.OFFSET)


async def test_eviction_removes_the_file_too(tmp_path: Path) -> None:
    cache_dir = tmp_path / "index-cache"
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3)
        weight = max([len(await _stored_index(rsm, s, IndexType.OFFSET)) for s in partition.segments])
        async with RemoteIndexCache(rsm, max_bytes=weight + ENTRY_OVERHEAD_BYTES, cache_dir=cache_dir) as cache:
            for segment in partition.segments:
                await cache.offset_index(segment)
            assert len(cache) == 1
        (only,) = _files(cache_dir)
        assert only.name.startswith(f"{partition.segments[-1].start_offset:020d}_")


async def test_a_corrupt_stored_index_is_a_corrupt_segment(tmp_path: Path) -> None:
    async with one_segment(tmp_path) as (rsm, _, segment, _):
        path = rsm.path_of(rsm._key(segment, ObjectType.OFFSET_INDEX))
        path.write_bytes(path.read_bytes()[:-3])
        cache = RemoteIndexCache(rsm, max_bytes=1 << 20)
        with pytest.raises(RemoteStorageError) as raised:
            await cache.offset_index(segment)
        assert not raised.value.retriable
        assert len(cache) == 0
        await cache.close()


async def test_workers_sharing_a_directory_read_each_others_indexes(tmp_path: Path) -> None:
    """A worker's miss is answered from a file another worker wrote (CRC-checked), not
    from the store; start-up leaves the other workers' files and their writes in flight."""
    cache_dir = tmp_path / "index-cache"
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3)
        async with RemoteIndexCache(rsm, max_bytes=1 << 20, cache_dir=cache_dir, shared=True) as first:
            for segment in partition.segments:
                await first.offset_index(segment)
        written = _files(cache_dir)
        assert len(written) == 3
        in_flight = cache_dir / f".{written[0].name}.0123.tmp"
        in_flight.write_bytes(b"being written")
        stale = cache_dir / f".{written[0].name}.4567.tmp"
        stale.write_bytes(b"cut short")
        os.utime(stale, (os.path.getmtime(stale) - TEMP_FILE_AGE_S - 1,) * 2)
        one = written[-1].stat().st_size + ENTRY_OVERHEAD_BYTES

        counting = CountingRSM(rsm)
        async with RemoteIndexCache(counting, max_bytes=one, cache_dir=cache_dir, shared=True) as second:
            assert len(second) == 1  # its own share, newest first
            assert [p for p in _files(cache_dir) if not p.name.startswith(".")] == written  # the rest: others'
            assert in_flight.exists() and not stale.exists()
            for segment in partition.segments[:2]:  # the first worker's, not reloaded by this one
                index = await second.offset_index(segment)
                assert index.to_bytes() == await _stored_index(rsm, segment, IndexType.OFFSET)
            assert counting.index_reads == []
            await asyncio.sleep(0.1)  # let the disk thread finish any removal
            # Evicting what it only read leaves the file; evicting what it reloaded removes it.
            assert [p for p in _files(cache_dir) if not p.name.startswith(".")] == written[:2]
            await second.time_index(partition.segments[0])  # nobody has it yet: from the store
            assert len(counting.index_reads) == 1


async def test_pruning_a_shared_directory_keeps_the_newest_within_the_whole_bound(tmp_path: Path) -> None:
    cache_dir = tmp_path / "index-cache"
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        _, files = await _aged_offset_indexes(rsm, rlmm, tmp_path, cache_dir)
    newest_two = files[-2:]
    prune_index_directory(cache_dir, sum(p.stat().st_size + ENTRY_OVERHEAD_BYTES for p in newest_two))
    assert _files(cache_dir) == newest_two

