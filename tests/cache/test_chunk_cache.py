"""ChunkCache against the local-file RemoteStorageManager and real segments."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tierproxy.cache.chunk_buffers import ChunkBuffers, ChunkLeases, response_leases
from tierproxy.cache.chunk_cache import ChunkCache, ChunkCacheFull, CorruptChunk, ResponseCutShort
from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.storage.errors import CorruptRemoteSegment, RemoteStorageError
from tierproxy.storage.manifest import BLOCK_BYTES
from tierproxy.storage.rsm import ObjectType

from tests.helpers.remote_log import CountingRSM, build_partition, local_remote_log, one_segment

CHUNK = 1000


def _value(metrics: RemoteMetrics, name: str) -> float:
    return metrics.value(name, {"cache": "chunk"})


async def _wait_idle(cache: ChunkCache) -> None:
    """Until no prefetch is in flight."""
    for _ in range(500):
        if cache.reserved_bytes == 0 and len(cache._flight) == 0:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("prefetches still in flight")


async def test_chunks_are_aligned_and_the_last_is_short(tmp_path: Path) -> None:
    async with one_segment(tmp_path, batches=30) as (rsm, partition, segment, counting):
        log = partition.log_of(0)
        assert len(log) % CHUNK, "the test needs a short last chunk"
        counting = CountingRSM(rsm)
        metrics = RemoteMetrics()
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=0,
                           metrics=metrics.cache("chunk"))
        count = cache.chunk_count(segment)
        assert count == -(-len(log) // CHUNK)
        joined = b"".join([await cache.get(segment, i) for i in range(count)])
        assert joined == log
        assert len(await cache.get(segment, count - 1)) == len(log) - (count - 1) * CHUNK
        # One ranged read per chunk, each exactly the chunk's bytes.
        assert sorted(counting.range_reads) == [
            (segment.segment_id.id, i * CHUNK, min((i + 1) * CHUNK, len(log)) - 1) for i in range(count)
        ]
        assert _value(metrics, "tierproxy_cache_misses_total") == count
        assert _value(metrics, "tierproxy_cache_hits_total") == 1
        assert metrics.value("tierproxy_remote_bytes_in_total", {"topic": segment.topic_id_partition.topic}) == len(log)
        with pytest.raises(ValueError):
            await cache.get(segment, count)
        await cache.close()


async def test_concurrent_readers_of_a_cold_chunk_share_one_read(tmp_path: Path) -> None:
    async with one_segment(tmp_path, delay_s=0.02) as (_, partition, segment, counting):
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=0)
        chunks = await asyncio.gather(*(cache.get(segment, 2) for _ in range(30)))
        assert len(counting.range_reads) == 1
        assert all(c == partition.log_of(0)[2 * CHUNK : 3 * CHUNK] for c in chunks)
        await cache.close()


async def test_a_failed_read_is_not_cached(tmp_path: Path) -> None:
    async with one_segment(tmp_path, delay_s=0.01) as (_, partition, segment, counting):
        counting.fail_with = RemoteStorageError("connection reset", retriable=True)
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=0)
        outcomes = await asyncio.gather(*(cache.get(segment, 0) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(o, RemoteStorageError) for o in outcomes)
        assert len(counting.range_reads) == 1 and len(cache) == 0
        counting.fail_with = None
        assert await cache.get(segment, 0) == partition.log_of(0)[:CHUNK]
        assert len(counting.range_reads) == 2
        await cache.close()


async def test_a_chunk_with_a_corrupt_block_is_not_cached_and_gives_its_intact_bytes(tmp_path: Path) -> None:
    """Block 1 of the chunk fails its CRC-32C: `get` raises CorruptChunk carrying the store's
    error and the chunk's bytes of block 0 (checked), and keeps nothing of the chunk."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=60,
                                          value_size=4000)
        segment = partition.segments[0]
        log = partition.log_of(0)
        assert len(log) > 2 * BLOCK_BYTES
        path = rsm.path_of(rsm._key(segment, ObjectType.LOG))
        tampered = bytearray(log)
        tampered[BLOCK_BYTES + 10] ^= 0x01
        path.write_bytes(bytes(tampered))
        cache = ChunkCache(rsm, chunk_size=2 * BLOCK_BYTES, max_bytes=1 << 22, read_ahead_chunks=0)
        outcomes = await asyncio.gather(*(cache.get(segment, 0) for _ in range(3)), return_exceptions=True)
        for outcome in outcomes:  # every waiter of the one load
            assert isinstance(outcome, CorruptChunk) and isinstance(outcome, CorruptRemoteSegment)
            assert outcome.intact == log[:BLOCK_BYTES]
            assert "block 1" in str(outcome.error) and not isinstance(outcome.error, CorruptChunk)
        assert len(cache) == 0 and cache.total_bytes == 0
        path.write_bytes(log)
        assert await cache.get(segment, 0) == log[:2 * BLOCK_BYTES]
        await cache.close()


async def test_read_ahead_prefetches_the_next_chunks_within_the_segment(tmp_path: Path) -> None:
    async with one_segment(tmp_path, batches=30) as (_, _, segment, counting):
        metrics = RemoteMetrics()
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=3,
                           metrics=metrics.cache("chunk"))
        last = cache.chunk_count(segment) - 1
        await cache.get(segment, 0)
        await _wait_idle(cache)
        assert [(segment.segment_id.id, i) in cache for i in range(5)] == [True, True, True, True, False]
        assert _value(metrics, "tierproxy_cache_prefetches_total") == 3
        for i in (1, 2, 3):
            await cache.get(segment, i, read_ahead=False)
        assert _value(metrics, "tierproxy_cache_hits_total") == 3

        await cache.get(segment, last - 1)
        await _wait_idle(cache)
        assert (segment.segment_id.id, last) in cache
        starts = [start for _, start, _ in counting.range_reads]
        assert len(starts) == len(set(starts)), "no chunk was read twice"
        assert max(starts) == last * CHUNK, "nothing was prefetched past the segment's end"
        await cache.close()


async def test_the_read_quota_is_told_every_store_read_as_it_starts_and_read_ahead_yields_to_it(
        tmp_path: Path) -> None:
    """KIP-956's fetch quota counts what the store reads: demand reads and read-ahead alike,
    as they start; read-ahead starts only where the quota has room for it."""
    async with one_segment(tmp_path, batches=30) as (_, _, segment, counting):
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=3)
        room = [2 * CHUNK]
        told: list[int] = []

        def store_read(nbytes: int) -> None:
            told.append(nbytes)
            room[0] -= nbytes

        cache.on_store_read = store_read
        cache.read_ahead_fits = lambda nbytes: nbytes <= room[0]
        await cache.get(segment, 0)
        await _wait_idle(cache)
        # Two chunks of read-ahead fit, the third did not; the demand read went all the same.
        assert [(segment.segment_id.id, i) in cache for i in range(4)] == [True, True, True, False]
        read = sum(end - start + 1 for _, start, end in counting.range_reads)
        assert sum(told) == read == 3 * CHUNK
        await cache.get(segment, 3)
        await _wait_idle(cache)
        assert (segment.segment_id.id, 4) not in cache
        assert sum(told) == sum(end - start + 1 for _, start, end in counting.range_reads) == 4 * CHUNK
        await cache.close()


async def test_never_more_than_the_bound_and_demand_evicts_prefetched_chunks_first(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2, batches_per_segment=30)
        one, two = partition.segments
        metrics = RemoteMetrics()
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=4 * CHUNK, read_ahead_chunks=1,
                           metrics=metrics.cache("chunk"))
        await cache.get(one, 0)  # read: 0; prefetched: 1
        await _wait_idle(cache)
        await cache.get(one, 5)  # read: 0, 5; prefetched: 1, 6
        await _wait_idle(cache)
        assert cache.total_bytes == 4 * CHUNK
        # A demand read of another segment makes room by dropping prefetched chunks, oldest first.
        await cache.get(two, 0, read_ahead=False)
        assert (one.segment_id.id, 0) in cache and (one.segment_id.id, 5) in cache
        assert (one.segment_id.id, 1) not in cache and (one.segment_id.id, 6) in cache
        assert (two.segment_id.id, 0) in cache
        assert cache.total_bytes <= 4 * CHUNK
        assert _value(metrics, "tierproxy_cache_evictions_total") == 1
        assert _value(metrics, "tierproxy_cache_bytes") == cache.total_bytes
        await cache.close()


async def test_prefetch_reserves_room_and_yields_when_there_is_none(tmp_path: Path) -> None:
    async with one_segment(tmp_path, batches=30, delay_s=0.3) as (_, partition, segment, counting):
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=2 * CHUNK, read_ahead_chunks=4)
        reader = asyncio.create_task(cache.get(segment, 0))
        await asyncio.sleep(0.01)
        # Both slots are reserved by the two prefetches that fit; the bound holds while in flight.
        assert cache.reserved_bytes == 2 * CHUNK and cache.total_bytes == 2 * CHUNK
        assert await reader == b"".join(b.data for b in partition.batches)[:CHUNK]
        await _wait_idle(cache)
        assert cache.total_bytes <= 2 * CHUNK
        assert len(counting.range_reads) == 3  # chunk 0 on demand, 1 and 2 ahead; 3 and 4 did not fit
        await cache.close()


async def test_close_cancels_prefetches(tmp_path: Path) -> None:
    async with one_segment(tmp_path, batches=30, delay_s=5) as (_, _, segment, counting):
        cache = ChunkCache(counting, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=2)
        reader = asyncio.create_task(cache.get(segment, 0))
        await asyncio.sleep(0.01)
        assert len(cache._flight) == 3
        await asyncio.wait_for(cache.close(), 2)
        assert len(cache._flight) == 0 and cache.reserved_bytes == 0
        with pytest.raises(asyncio.CancelledError):
            await reader


async def test_invalidate_drops_a_segments_chunks(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2)
        one, two = partition.segments
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=0)
        for segment in (one, two):
            await cache.get(segment, 0)
            await cache.get(segment, 1)
        cache.invalidate(one.segment_id.id)
        assert len(cache) == 2 and cache.total_bytes == 2 * CHUNK
        assert (two.segment_id.id, 1) in cache
        await cache.close()


async def test_a_leased_chunk_is_not_read_into_again_until_its_lease_is_given_back(tmp_path: Path) -> None:
    """A chunk is read into the buffer of an evicted one (no fresh memory per load), but
    never into one a response still holds: those bytes stay what they were; the held
    chunk counts against the bound until the response gives its lease back."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=40)
        segment = partition.segments[0]
        log = partition.log_of(0)
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=3 * CHUNK, read_ahead_chunks=0)
        response = ChunkLeases()
        held = (await cache.get(segment, 0, leases=response))[:100]  # a response's slice
        cache.invalidate(segment.segment_id.id)  # out of the cache, still held
        assert cache.held_bytes == CHUNK and cache.total_bytes == CHUNK
        for index in range(1, cache.chunk_count(segment)):
            chunk = await cache.get(segment, index)
            assert bytes(chunk) == log[index * CHUNK:(index + 1) * CHUNK]
            assert cache.total_bytes <= cache.max_bytes
        assert bytes(held) == log[:100]  # its buffer was never read into again
        assert cache._buffers.reused > 0
        response.release()
        assert cache.held_bytes == 0
        assert cache.total_bytes == cache.stored_bytes
        await cache.close()


async def test_a_hit_is_leased_before_its_read_ahead_makes_room(tmp_path: Path) -> None:
    """The read-ahead a hit starts evicts to make room: never the chunk just handed out."""
    async with one_segment(tmp_path, batches=30) as (rsm, partition, segment, counting):
        log = partition.log_of(0)
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=2 * CHUNK, read_ahead_chunks=1)
        other = ChunkLeases()
        await cache.get(segment, 0, leases=other, read_ahead=False)
        await cache.get(segment, 1, read_ahead=False)
        response = ChunkLeases()
        held = await cache.get(segment, 1, leases=response)  # a hit; the read-ahead of 2 wants room
        await _wait_idle(cache)
        assert bytes(held) == log[CHUNK:2 * CHUNK]
        response.release()
        other.release()
        await cache.close()


async def _bound_full_of_held_chunks(tmp_path: Path, rsm: Any, rlmm: Any) -> tuple[Any, Any, ChunkCache, ChunkLeases]:
    """A cache of two chunks, both held by a response whose client stopped reading."""
    partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=40)
    segment = partition.segments[0]
    cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=2 * CHUNK, read_ahead_chunks=0)
    stuck = ChunkLeases()
    await cache.get(segment, 0, leases=stuck)
    await cache.get(segment, 1, leases=stuck)
    return partition, segment, cache, stuck


async def test_chunks_responses_hold_count_against_the_bound(tmp_path: Path) -> None:
    """A client that stops reading holds its responses' chunks: once they fill the bound a
    new remote read fails, retriable, for that read only; a chunk still cached is served."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition, segment, cache, stuck = await _bound_full_of_held_chunks(tmp_path, rsm, rlmm)
        with pytest.raises(ChunkCacheFull) as failed:
            await cache.get(segment, 2, leases=ChunkLeases())
        assert failed.value.retriable
        assert bytes(await cache.get(segment, 1, leases=ChunkLeases())) == partition.log_of(0)[CHUNK:2 * CHUNK]
        assert cache.total_bytes <= cache.max_bytes
        stuck.release()  # written, or the connection closed
        other = ChunkLeases()
        assert bytes(await cache.get(segment, 2, leases=other)) == partition.log_of(0)[2 * CHUNK:3 * CHUNK]
        other.release()
        await cache.close()


async def test_a_read_with_a_deadline_waits_for_held_chunks_to_be_given_back(tmp_path: Path) -> None:
    """Within its fetch's wait a read waits for room instead of failing; past it, it fails."""
    from tierproxy.storage.backoff import read_deadline

    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition, segment, cache, stuck = await _bound_full_of_held_chunks(tmp_path, rsm, rlmm)
        with read_deadline(0.05), pytest.raises(ChunkCacheFull):
            await cache.get(segment, 2, leases=ChunkLeases())

        async def read_within_the_wait() -> bytes:
            with read_deadline(30):
                return bytes(await cache.get(segment, 2, leases=ChunkLeases()))

        waiting = asyncio.create_task(read_within_the_wait())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        stuck.release()  # the slow client's responses went out
        assert await waiting == partition.log_of(0)[2 * CHUNK:3 * CHUNK]
        await cache.close()


async def test_responses_that_each_hold_part_of_the_bound_are_cut_short_not_kept_waiting(tmp_path: Path) -> None:
    """Two responses hold the whole bound between them and each wants one chunk more (a
    Fetch's partitions are read concurrently, each response holds what it read until it is
    written): waiting, each would wait for the other until its fetch's wait ran out. Each
    ends at once instead (ResponseCutShort), and goes out with what it holds; a response
    holding nothing still waits for room, and gets it once they are written."""
    from tierproxy.storage.backoff import read_deadline

    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=40)
        segment = partition.segments[0]
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=2 * CHUNK, read_ahead_chunks=0)
        first, second = ChunkLeases(), ChunkLeases()
        await cache.get(segment, 0, leases=first)
        await cache.get(segment, 1, leases=second)

        async def one_more(leases: ChunkLeases, index: int) -> bytes:
            with read_deadline(30):
                return bytes(await cache.get(segment, index, leases=leases))

        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.wait_for(asyncio.gather(one_more(first, 2), one_more(second, 3),
                                                        return_exceptions=True), 10)
        assert [type(r) for r in results] == [ResponseCutShort, ResponseCutShort]
        assert all(r.retriable for r in results if isinstance(r, ResponseCutShort))
        assert loop.time() - started < 5  # not the 30 s of their fetches' wait
        assert len(first) == len(second) == 1 and cache.total_bytes <= cache.max_bytes

        fresh = ChunkLeases()
        waiting = asyncio.create_task(one_more(fresh, 2))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # it holds nothing: it waits for room
        first.release()
        second.release()
        assert await waiting == partition.log_of(0)[2 * CHUNK:3 * CHUNK]
        fresh.release()
        await cache.close()


async def test_a_reader_holding_nothing_waits_even_if_the_load_it_joined_was_cut_short(tmp_path: Path) -> None:
    """Two readers miss the same chunk at once: the first for a response that holds the bound,
    the second for one that holds nothing. The load is one; cut short for the first, it is
    not for the second, which waits for room as any reader holding nothing does, and is
    served once the first response is written."""
    from tierproxy.storage.backoff import read_deadline

    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition, segment, cache, stuck = await _bound_full_of_held_chunks(tmp_path, rsm, rlmm)

        async def read(leases: ChunkLeases) -> bytes:
            with read_deadline(30):
                return bytes(await cache.get(segment, 2, leases=leases))

        holding = asyncio.create_task(read(stuck))  # starts the load
        fresh = ChunkLeases()
        joining = asyncio.create_task(read(fresh))  # joins it
        with pytest.raises(ResponseCutShort):
            await asyncio.wait_for(holding, 10)
        await asyncio.sleep(0.1)
        assert not joining.done()  # waiting for room, not failed with the other's answer
        stuck.release()
        assert await asyncio.wait_for(joining, 10) == partition.log_of(0)[2 * CHUNK:3 * CHUNK]
        assert len(fresh) == 1
        fresh.release()
        await cache.close()


async def test_a_load_waiting_for_room_asks_again_for_holders_to_give_chunks_back(tmp_path: Path) -> None:
    """The room is held by a response whose client reads, so at first nothing can be given
    back; its socket then fills and its chunks can be: the waiting load asks again within
    its wait, without a lease coming back by itself, and is served long before the wait
    runs out."""
    from tierproxy.storage.backoff import read_deadline

    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition, segment, cache, stuck = await _bound_full_of_held_chunks(tmp_path, rsm, rlmm)
        socket_full = asyncio.Event()
        asked_after = []

        def give_back() -> int:
            if not socket_full.is_set() or not len(stuck):
                return 0
            asked_after.append(True)
            stuck.release()  # what paced.give_back_paused does once the writer is paused
            return 1

        cache.on_full = give_back

        async def read() -> bytes:
            with read_deadline(30):
                return bytes(await cache.get(segment, 2, leases=ChunkLeases()))

        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = asyncio.create_task(read())
        await asyncio.sleep(0.1)
        assert not waiting.done()
        socket_full.set()  # no lease comes back by itself: only asking again frees the room
        assert await asyncio.wait_for(waiting, 10) == partition.log_of(0)[2 * CHUNK:3 * CHUNK]
        assert asked_after and loop.time() - started < 5
        await cache.close()


async def test_a_response_leases_what_it_reads_in_its_context(tmp_path: Path) -> None:
    """The response being made in a task holds every chunk read in it, without passing its
    leases down; other tasks' reads are not its."""
    async with one_segment(tmp_path, batches=30) as (rsm, partition, segment, counting):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=1 << 20, read_ahead_chunks=0)
        response = ChunkLeases()

        async def respond() -> None:
            response_leases(response)
            await cache.get(segment, 0)
            await cache.get(segment, 1)

        await asyncio.create_task(respond())
        await cache.get(segment, 2)
        assert len(response) == 2
        assert [cache._buffers.leased(cache._read[(segment.segment_id.id, i)].obj) for i in range(3)] == [
            True, True, False]
        response.release()
        assert not any(cache._buffers.leased(chunk.obj) for chunk in cache._read.values())
        await cache.close()


async def test_the_pool_is_mapped_at_start_and_a_cold_read_maps_nothing(tmp_path: Path) -> None:
    async with one_segment(tmp_path, batches=30) as (rsm, partition, segment, counting):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=4 * CHUNK, read_ahead_chunks=1)
        await cache.start()
        assert len(cache._buffers) == 4
        for index in range(cache.chunk_count(segment)):
            await cache.get(segment, index)
            await _wait_idle(cache)
        assert cache._buffers.allocated_on_demand == 0
        await cache.close()


async def test_a_load_finding_no_free_buffer_maps_one_off_the_event_loop(tmp_path: Path) -> None:
    import threading

    async with one_segment(tmp_path, batches=30) as (rsm, partition, segment, counting):
        cache = ChunkCache(rsm, chunk_size=CHUNK, max_bytes=4 * CHUNK, read_ahead_chunks=0)  # not started
        mapped_in = []
        map_one = cache._buffers.map_one

        def recording() -> Any:
            mapped_in.append(threading.current_thread())
            return map_one()

        cache._buffers.map_one = recording  # type: ignore[method-assign]
        assert bytes(await cache.get(segment, 0)) == partition.log_of(0)[:CHUNK]
        assert mapped_in and threading.main_thread() not in mapped_in
        await cache.close()


def test_a_buffer_goes_back_to_the_pool_only_when_its_last_lease_is_released() -> None:
    buffers = ChunkBuffers(16, count=2)
    buffers.fill()
    assert len(buffers) == 2
    first = buffers.take()
    one, two = ChunkLeases(), ChunkLeases()
    one.hold(buffers, first)
    one.hold(buffers, first)  # a lease per holder, however many slices it takes
    two.hold(buffers, first)
    buffers.retire(first, 10)  # the chunk left the cache
    assert buffers.held_bytes == 10 and len(buffers) == 1
    one.release()
    assert buffers.held_bytes == 10 and len(buffers) == 1
    two.release()
    assert buffers.held_bytes == 0 and len(buffers) == 2
    assert not two.hold(buffers, buffers.take())  # released holders hold nothing more
