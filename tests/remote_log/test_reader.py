"""RemoteLogReader: Kafka's remote fetch over the local-file store, the file metadata store
and real v2 batches; expected answers come from the batches the test wrote."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

from tierproxy.cache.chunk_buffers import ChunkLeases, response_leases
from tierproxy.cache.chunk_cache import ChunkCacheFull
from tierproxy.remote_log.reader_pool import RemoteLogReaderPool, read_owner
from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.remote_log.reader import IsolationLevel, RemoteLogReader, RemoteReadResult
from tierproxy.protocol.records import HEADER_SIZE, crc_valid, iter_batches
from tierproxy.remote_log.failures import Cause, cause_of
from tierproxy.storage.errors import CorruptRemoteSegment, MetadataNotReady, RemoteResourceNotFound
from tierproxy.storage.indexes.transaction_index import AbortedTxn
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.model import IndexType
from tierproxy.storage.rsm import ObjectType
from tests.helpers.batches import batch
from tests.helpers.remote_log import (
    BASE_TIMESTAMP_MS,
    CHUNK,
    CountingRSM,
    Partition,
    abort_marker,
    add_segment,
    build_partition,
    check,
    close,
    commit_marker,
    local_remote_log,
    make_reader,
    new_tp,
)


async def test_reads_at_every_offset_return_the_right_batches(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3, batches_per_segment=25)
        # Small chunks: most reads cross chunk boundaries and many batches straddle them.
        reader = make_reader(rsm, rlmm, chunk_size=CHUNK)
        for offset in range(partition.log_start_offset, partition.log_end_offset + 1):
            for max_bytes, min_one in ((1 << 20, True), (700, True), (700, False), (120, True), (120, False)):
                result = await reader.read(partition.tp, offset, max_bytes, min_one_batch=min_one)
                check(result, partition, offset, max_bytes, min_one)
        await close(reader)


async def test_batches_cut_anywhere_by_a_chunk_boundary(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=12)
        position = sum(len(b.data) for b in partition.batches[:5])
        # A boundary inside batch 5's size field, its header, just after it, and in its records.
        for cut in (1, 4, 8, 11, 12, 13, 60, 61, 62, len(partition.batches[5].data) - 1):
            reader = make_reader(rsm, rlmm, chunk_size=position + cut, read_ahead=0)
            result = await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
            assert b"".join(result.records) == partition.log_of(0), cut
            start_at_5 = await reader.read(partition.tp, partition.batches[5].base_offset, 1, min_one_batch=True)
            assert b"".join(start_at_5.records) == partition.batches[5].data, cut
            await close(reader)


async def test_a_read_stays_within_one_segment(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2)
        first, second = partition.segments
        reader = make_reader(rsm, rlmm)
        result = await reader.read(partition.tp, first.end_offset, 1 << 20, min_one_batch=True)
        (last_batch,) = [b for b in partition.batches if b.last_offset == first.end_offset]
        assert b"".join(result.records) == last_batch.data
        assert result.next_fetch_offset == second.start_offset
        assert result.segment.segment_id == first.segment_id
        follow = await reader.read(partition.tp, result.next_fetch_offset, 1 << 20, min_one_batch=True)
        assert b"".join(follow.records) == partition.log_of(1)
        await close(reader)


async def test_a_first_batch_above_max_bytes_needs_min_one_batch(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, value_size=900)
        first = partition.batches[0]
        assert len(first.data) > 900
        reader = make_reader(rsm, rlmm)
        empty = await reader.read(partition.tp, first.base_offset, 500, min_one_batch=False)
        assert empty.records == [] and not empty.offset_out_of_range
        assert empty.next_fetch_offset == first.base_offset
        one = await reader.read(partition.tp, first.base_offset, 500, min_one_batch=True)
        assert b"".join(one.records) == first.data  # whole, though above max bytes (KIP-74)
        zero = await reader.read(partition.tp, first.base_offset, 0, min_one_batch=True)
        assert b"".join(zero.records) == first.data
        await close(reader)


async def test_offsets_outside_the_remote_log_are_out_of_range(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2)
        reader = make_reader(rsm, rlmm)
        for offset in (0, partition.log_start_offset - 1, partition.log_end_offset + 1):
            result = await reader.read(partition.tp, offset, 1 << 20, min_one_batch=True)
            assert result.offset_out_of_range and result.records == []
            assert result.log_start_offset == partition.log_start_offset
        unknown = await reader.read(new_tp(), 0, 1 << 20, min_one_batch=True)
        assert unknown.offset_out_of_range and unknown.log_start_offset == -1
        await close(reader)


async def test_metadata_not_loaded_is_metadata_not_ready(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1)
    not_started = FileRemoteLogMetadataManager(tmp_path / "metadata", read_only=True)
    metrics = RemoteMetrics()
    async with local_remote_log(tmp_path / "other") as (rsm, _):
        reader = make_reader(rsm, not_started, metrics=metrics)
        with pytest.raises(MetadataNotReady):
            await reader.read(partition.tp, partition.log_start_offset, 1000, min_one_batch=True)
        # Counted where the proxy answers it (RemoteTier.error_code_for), once.
        assert metrics.value("tierproxy_remote_read_errors_total",
                             {"topic": partition.tp.topic, "reason": "metadata_not_ready"}) == 0
        await close(reader)


async def test_a_segment_whose_manifest_is_not_back_yet_is_not_found_then_served(tmp_path: Path) -> None:
    """A store being restored: the segment's objects are there, its manifest is not yet.
    That is a missing object (not_found), not corruption; once the manifest is back the
    segment is served, with the aborted transactions of its transaction index."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = Partition(new_tp())
        txn = dict(transactional=True, producer_epoch=0)
        await add_segment(rsm, rlmm, partition, [batch(100, 1), batch(101, 2, producer_id=7, **txn),
                                                 abort_marker(103, 7), batch(104, 1)], tmp_path / "work")
        manifest = rsm.path_of(rsm._key(partition.segments[0], ObjectType.MANIFEST))
        kept = manifest.read_bytes()
        manifest.unlink()
        rsm._forget(partition.segments[0])  # the manifest the copy left in its cache
        metrics = RemoteMetrics()
        reader = make_reader(rsm, rlmm, metrics=metrics)
        committed = IsolationLevel.READ_COMMITTED
        with pytest.raises(RemoteResourceNotFound, match="no manifest") as raised:
            await reader.read(partition.tp, 100, 1 << 20, min_one_batch=True, isolation_level=committed)
        assert not isinstance(raised.value, CorruptRemoteSegment)
        assert cause_of(raised.value) is Cause.NOT_FOUND
        topic = partition.tp.topic
        assert metrics.value("tierproxy_remote_read_errors_total", {"topic": topic, "reason": "not_found"}) == 1
        assert metrics.value("tierproxy_remote_read_errors_total", {"topic": topic, "reason": "corrupt"}) == 0

        manifest.write_bytes(kept)  # the restore reaches the manifest
        read = await reader.read(partition.tp, 100, 1 << 20, min_one_batch=True, isolation_level=committed)
        assert b"".join(read.records) == partition.log_of(0)
        assert read.aborted_transactions == [AbortedTxn(7, 101, 103, 104)]
        await close(reader)


async def test_leader_epoch_keeps_later_epochs_out(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3, epochs=[0, 1, 1])
        reader = make_reader(rsm, rlmm)
        in_epoch_0 = partition.segments[0].start_offset + 3
        in_epoch_1 = partition.segments[1].start_offset + 3
        for epoch in (-1, 0, 1, 5):
            result = await reader.read(partition.tp, in_epoch_0, 1000, min_one_batch=True, leader_epoch=epoch)
            check(result, partition, in_epoch_0, 1000, True)
        for epoch in (-1, 1, 5):
            result = await reader.read(partition.tp, in_epoch_1, 1000, min_one_batch=True, leader_epoch=epoch)
            check(result, partition, in_epoch_1, 1000, True)
        stale = await reader.read(partition.tp, in_epoch_1, 1000, min_one_batch=True, leader_epoch=0)
        assert stale.offset_out_of_range
        await close(reader)


async def test_a_truncated_segments_tail_is_never_served(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=2)
        second = [b for b in partition.batches if b.segment == 1]
        cut = second[6].base_offset
        await rlmm.record_truncation(partition.tp, cut, leader_epoch=2)
        reader = make_reader(rsm, rlmm)
        result = await reader.read(partition.tp, second[0].base_offset, 1 << 20, min_one_batch=True)
        assert b"".join(result.records) == b"".join(b.data for b in second[:6])
        assert result.next_fetch_offset == cut
        past = await reader.read(partition.tp, cut, 1 << 20, min_one_batch=True)
        assert past.offset_out_of_range

        # A cut inside a batch: that batch holds offsets past the end, so it is not served.
        mid = second[3]
        assert mid.last_offset > mid.base_offset, "the test needs a batch of several records"
        await rlmm.record_truncation(partition.tp, mid.base_offset + 1, leader_epoch=3)
        inside = await reader.read(partition.tp, mid.base_offset, 1 << 20, min_one_batch=True)
        assert inside.records == [] and not inside.offset_out_of_range
        before = await reader.read(partition.tp, second[0].base_offset, 1 << 20, min_one_batch=True)
        assert b"".join(before.records) == b"".join(b.data for b in second[:3])
        await close(reader)


async def test_read_committed_gets_the_aborted_transactions(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = Partition(new_tp())
        txn = dict(transactional=True, producer_epoch=0)
        first = [
            batch(100, 1),
            batch(101, 2, producer_id=7, **txn),
            batch(103, 1),
            batch(104, 1, producer_id=7, **txn),
            abort_marker(105, 7),
            batch(106, 2, producer_id=9, **txn),  # aborted in the next segment
        ]
        second = [
            batch(108, 1),
            abort_marker(109, 9),
            batch(110, 1, producer_id=11, **txn),
            commit_marker(111, 11),
            batch(112, 3),
        ]
        await add_segment(rsm, rlmm, partition, first, tmp_path / "work")
        await add_segment(rsm, rlmm, partition, second, tmp_path / "work")
        reader = make_reader(rsm, rlmm)
        committed = IsolationLevel.READ_COMMITTED

        whole_first = await reader.read(partition.tp, 100, 1 << 20, min_one_batch=True, isolation_level=committed)
        assert b"".join(whole_first.records) == partition.log_of(0)
        assert sorted(whole_first.aborted_transactions) == [AbortedTxn(7, 101, 105, 106), AbortedTxn(9, 106, 109, 110)]
        assert whole_first.aborted_transactions_complete

        only_100 = await reader.read(partition.tp, 100, 1, min_one_batch=True, isolation_level=committed)
        assert only_100.next_fetch_offset == 101 and only_100.aborted_transactions == []

        from_108 = await reader.read(partition.tp, 108, 1 << 20, min_one_batch=True, isolation_level=committed)
        assert [(t.producer_id, t.first_offset) for t in from_108.aborted_transactions] == [(9, 106)]

        uncommitted = await reader.read(partition.tp, 100, 1 << 20, min_one_batch=True)
        assert uncommitted.aborted_transactions is None
        await close(reader)


async def test_read_committed_says_when_remote_indexes_cannot_rule_out_later_aborts(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = Partition(new_tp())
        # A transaction still open where the remote log ends: its marker is in the broker's log.
        batches = [batch(0, 2), batch(2, 2, producer_id=5, transactional=True, producer_epoch=0), batch(4, 1)]
        await add_segment(rsm, rlmm, partition, batches, tmp_path / "work")
        reader = make_reader(rsm, rlmm)
        result = await reader.read(partition.tp, 0, 1 << 20, min_one_batch=True,
                                   isolation_level=IsolationLevel.READ_COMMITTED)
        assert result.aborted_transactions == []
        assert not result.aborted_transactions_complete
        await close(reader)


def _without_block_checksums(rsm, partition: Partition) -> None:
    """The one segment's manifest as copies before block checksums wrote it: reads of its
    `.log` then rest on the size check and each batch's own CRC-32C."""
    path = rsm.path_of(rsm._key(partition.segments[0], ObjectType.MANIFEST))
    body = json.loads(path.read_bytes())
    for name in ("blocks", "block_bytes"):
        del body["objects"]["log"][name]
    path.write_bytes(json.dumps(body).encode())
    rsm._forget(partition.segments[0])  # the manifest the copy left in its cache


def _damage_batch(rsm, partition: Partition, index: int, damage) -> None:
    """`damage(stored, position)` on the stored `.log` of the one segment, at batch `index`;
    the segment's manifest is an older one (no block checksums), so that what the record
    batches' own checks do shows."""
    _without_block_checksums(rsm, partition)
    path = rsm.path_of(rsm._key(partition.segments[0], ObjectType.LOG))
    stored = bytearray(path.read_bytes())
    damage(stored, sum(len(b.data) for b in partition.batches[:index]))
    path.write_bytes(bytes(stored))


def _flip_a_record_byte(stored: bytearray, position: int) -> None:
    stored[position + HEADER_SIZE + 3] ^= 0x01  # inside the records: only the CRC-32C can tell


def _break_the_length(stored: bytearray, position: int) -> None:
    stored[position + 8:position + 12] = (1 << 30).to_bytes(4, "big")  # runs past the segment's end


@contextlib.asynccontextmanager
async def _damaged(tmp_path: Path, damage) -> AsyncIterator[tuple[Partition, RemoteLogReader, RemoteMetrics]]:
    """A one-segment partition with `damage` done to batch 12 (`_damage_batch`), and a reader
    of it whose read from the log start served the intact batches before it, and only them."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=25)
        _damage_batch(rsm, partition, 12, damage)
        metrics = RemoteMetrics()
        reader = make_reader(rsm, rlmm, metrics=metrics)
        before = await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
        assert b"".join(before.records) == b"".join(b.data for b in partition.batches[:12])
        assert before.next_fetch_offset == partition.batches[12].base_offset
        yield partition, reader, metrics
        await close(reader)


async def test_a_corrupt_batch_is_never_served(tmp_path: Path) -> None:
    async with _damaged(tmp_path, _flip_a_record_byte) as (partition, reader, metrics):
        victim = partition.batches[12]
        corrupt = {"topic": partition.tp.topic, "reason": "corrupt"}
        assert metrics.value("tierproxy_remote_read_errors_total", corrupt) == 1  # served, yet counted
        for _ in range(2):  # the retry reads the store again, and fails again
            with pytest.raises(CorruptRemoteSegment):
                await reader.read(partition.tp, victim.base_offset, 1 << 20, min_one_batch=True)
        assert metrics.value("tierproxy_remote_read_errors_total", corrupt) == 3
        after = await reader.read(partition.tp, victim.last_offset + 1, 1 << 20, min_one_batch=True)
        assert b"".join(after.records) == b"".join(b.data for b in partition.batches[13:])


async def test_concurrent_cold_reads_fetch_each_index_and_chunk_once(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=25)
        counting = CountingRSM(rsm, delay_s=0.02)
        reader = make_reader(counting, rlmm, read_ahead=0)
        offset = partition.batches[10].base_offset
        results = await asyncio.gather(*(reader.read(partition.tp, offset, 2000, min_one_batch=True)
                                         for _ in range(20)))
        for result in results:
            check(result, partition, offset, 2000, True)
        assert [t for _, t in counting.index_reads] == [IndexType.OFFSET]
        assert len(counting.range_reads) == len(set(counting.range_reads)) >= 2
        await close(reader)


async def test_read_ahead_hides_store_latency_for_a_sequential_reader(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=90)
        counting = CountingRSM(rsm, delay_s=0.03)  # an object store's first-byte latency
        metrics = RemoteMetrics()
        reader = make_reader(counting, rlmm, chunk_size=1000, read_ahead=2, metrics=metrics)
        chunks = reader.chunk_cache.chunk_count(partition.segments[0])
        assert chunks >= 12
        offset, served = partition.log_start_offset, []
        while offset <= partition.log_end_offset:
            result = await reader.read(partition.tp, offset, 400, min_one_batch=True)
            served.extend(result.records)
            offset = result.next_fetch_offset
            await asyncio.sleep(0.03)  # the consumer's own work between fetches
        assert b"".join(served) == partition.log_of(0)
        waited = metrics.value("tierproxy_cache_misses_total", {"cache": "chunk"})
        hits = metrics.value("tierproxy_cache_hits_total", {"cache": "chunk"})
        # Only the start waits on the store; every later chunk was prefetched in time.
        assert waited <= 3, (waited, hits)
        assert hits >= chunks - 3
        starts = [start for _, start, _ in counting.range_reads]
        assert sorted(starts) == [i * 1000 for i in range(chunks)]  # each chunk read once
        await close(reader)


class _SlowFirstByte(CountingRSM):
    """A store whose every read waits `delay_s` for its first byte, and says so to the reader
    (`observe_range_reads`), as an object store's reads do; it counts the reads in flight."""

    def __init__(self, inner, *, delay_s: float) -> None:
        super().__init__(inner)
        self.first_byte_s = delay_s
        self.in_flight = self.most_in_flight = 0
        self._observer = None

    def observe_range_reads(self, observer) -> None:
        self._observer = observer

    async def read_log_into(self, metadata, start: int, buffer: memoryview) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            await asyncio.sleep(self.first_byte_s)
            arrived = loop.time()
            await super().read_log_into(metadata, start, buffer)
            if self._observer is not None:
                self._observer(arrived - began, loop.time() - arrived, len(buffer))
        finally:
            self.in_flight -= 1


async def test_read_ahead_grows_with_the_stores_first_byte_latency(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=90)
        slow = _SlowFirstByte(rsm, delay_s=0.05)
        reader = make_reader(slow, rlmm, chunk_size=1000, read_ahead=1)
        offset, served = partition.log_start_offset, []
        while offset <= partition.log_end_offset:
            result = await reader.read(partition.tp, offset, 400, min_one_batch=True)
            served.extend(result.records)
            offset = result.next_fetch_offset
        assert b"".join(served) == partition.log_of(0)
        # One chunk ahead is configured (two reads in flight at most); the latency asks for
        # more, up to the cache's per-segment bound on prefetches.
        assert slow.most_in_flight == reader.chunk_cache.max_prefetch_per_segment > 2
        assert len(slow.range_reads) == len(set(slow.range_reads))  # each chunk once
        await close(reader)


async def test_read_ahead_carries_on_into_the_next_segment(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=5, batches_per_segment=12)
        counting = CountingRSM(rsm, delay_s=0.03)
        metrics = RemoteMetrics()
        reader = make_reader(counting, rlmm, chunk_size=1000, read_ahead=2, metrics=metrics)
        assert all(reader.chunk_cache.chunk_count(s) >= 3 for s in partition.segments)
        offset, served = partition.log_start_offset, []
        while offset <= partition.log_end_offset:
            result = await reader.read(partition.tp, offset, 400, min_one_batch=True)
            served.extend(result.records)
            offset = result.next_fetch_offset
            await asyncio.sleep(0.03)
        assert b"".join(served) == b"".join(partition.log_of(i) for i in range(5))
        # Only the first segment's index and first chunk were waited for.
        assert metrics.value("tierproxy_cache_misses_total", {"cache": "index"}) <= 1
        assert metrics.value("tierproxy_cache_misses_total", {"cache": "chunk"}) <= 2
        assert [t for _, t in counting.index_reads] == [IndexType.OFFSET] * 5  # each index once
        assert len(counting.range_reads) == len(set(counting.range_reads))  # each chunk once
        await close(reader)


class _Connection:
    """The client connection reads are for (`reader_pool.read_owner`), reading its responses."""

    stalled = False


async def test_only_a_sequential_reader_loads_chunks_beyond_its_read(tmp_path: Path) -> None:
    """A connection that fetches where it likes (a first fetch, a seek, a client resetting
    at random offsets) loads the chunks of its own read, alongside each other, and none
    beyond: those would take the chunk cache from readers that read on. Its next read from
    where the last one ended loads ahead."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=90)
        counting = CountingRSM(rsm)
        reader = make_reader(counting, rlmm, chunk_size=1000, read_ahead=2)
        cache = reader.chunk_cache
        assert cache.chunk_count(partition.segments[0]) >= 12

        async def settle() -> None:
            for _ in range(500):
                if cache.reserved_bytes == 0 and not any(cache._flight.in_flight(k) for k in list(cache._flight._tasks)):
                    return
                await asyncio.sleep(0.005)
            raise AssertionError("prefetches still in flight")

        def chunks_read() -> set[int]:
            return {start // 1000 for _, start, _ in counting.range_reads}

        async def read_as(connection: _Connection, offset: int, max_bytes: int):  # type: ignore[no-untyped-def]
            async def read():  # type: ignore[no-untyped-def]
                read_owner(connection)
                return await reader.read(partition.tp, offset, max_bytes, min_one_batch=True)
            result = await asyncio.create_task(read(), context=contextvars.copy_context())
            await settle()
            return result

        def end_of(offset: int) -> int:
            """The position in the segment's `.log` where the batches before `offset` end."""
            return sum(len(b.data) for b in partition.batches if b.last_offset < offset)

        connection = _Connection()
        middle = partition.batches[len(partition.batches) // 2].base_offset
        first = await read_as(connection, middle, 2500)  # its own chunks: about three
        assert max(chunks_read()) <= (end_of(middle) + 2500 - 1) // 1000
        second = await read_as(connection, first.next_fetch_offset, 2500)  # reads on: two chunks ahead
        assert max(chunks_read()) >= (end_of(second.next_fetch_offset) - 1) // 1000 + 2
        # Another connection at offsets of its own: nothing beyond its own chunks either.
        counting.range_reads.clear()
        await read_as(_Connection(), partition.log_start_offset, 500)
        assert chunks_read() == {0}
        # No connection (the pipeline's reads): read-ahead as always.
        counting.range_reads.clear()
        await reader.read(partition.tp, partition.batches[3].base_offset, 500, min_one_batch=True)
        await settle()
        assert len(chunks_read()) > 1
        await close(reader)


async def test_timestamps_find_the_first_record_at_or_after(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=3, epochs=[0, 0, 2])
        reader = make_reader(rsm, rlmm)
        # Record o of a batch based at b has timestamp BASE + 10 * b + (o - b) (tests.helpers.remote_log).
        records = [(BASE_TIMESTAMP_MS + 10 * b.base_offset + (o - b.base_offset), o, b)
                   for b in partition.batches for o in range(b.base_offset, b.last_offset + 1)]

        def expected(target: int, starting: int = 0):
            return next(((t, o) for t, o, _ in records if t >= target and o >= starting), None)

        targets = [0, records[0][0], records[0][0] + 1] + [t + d for t, _, _ in records[::7] for d in (-1, 0, 1)]
        for target in targets:
            found = await reader.offset_for_timestamp(partition.tp, target)
            assert (found.timestamp, found.offset) == expected(target), target
            epoch = 2 if found.offset >= partition.segments[2].start_offset else 0
            assert found.leader_epoch == epoch
        assert await reader.offset_for_timestamp(partition.tp, records[-1][0] + 1) is None
        middle = partition.batches[30].base_offset + 0
        found = await reader.offset_for_timestamp(partition.tp, 0, starting_offset=middle)
        assert (found.timestamp, found.offset) == expected(0, middle)

        latest = await reader.max_timestamp(partition.tp)
        assert (latest.timestamp, latest.offset, latest.leader_epoch) == (records[-1][0], records[-1][1], 2)
        assert reader.earliest_remote_offset(partition.tp) == (partition.log_start_offset, 0)
        assert reader.latest_tiered_offset(partition.tp) == (partition.log_end_offset, 2)
        assert reader.latest_tiered_offset(new_tp()) is None
        assert await reader.offset_for_timestamp(new_tp(), 0) is None
        await close(reader)


async def test_a_timestamp_lookup_holds_no_chunk_for_its_response(tmp_path: Path) -> None:
    """ListOffsets by timestamp sends no batch: the chunks its walk reads are held by the walk
    and given back as it passes them, not by the response until it is written (where they
    would count against the chunk cache's bound, and cut the walk itself short)."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=40)
        reader = make_reader(rsm, rlmm, chunk_cache_bytes=2 * CHUNK, read_ahead=0)
        late = partition.batches[-3]
        target = BASE_TIMESTAMP_MS + 10 * late.base_offset  # its first record's (tests.helpers.remote_log)
        response = ChunkLeases()

        async def list_offsets() -> Any:
            response_leases(response)
            return await reader.offset_for_timestamp(partition.tp, target)

        found = await asyncio.wait_for(asyncio.create_task(list_offsets()), 10)
        assert (found.timestamp, found.offset) == (target, late.base_offset)
        assert len(response) == 0
        await close(reader)


async def test_memory_stays_bounded_with_many_concurrent_replays(tmp_path: Path) -> None:
    chunk_size, chunk_bound, index_bound = 1000, 6_000, 3_000
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partitions = [
            await build_partition(rsm, rlmm, tmp_path / "work", tp=new_tp("replay", p), segments=3,
                                  batches_per_segment=20)
            for p in range(10)
        ]
        counting = CountingRSM(rsm, delay_s=0.002)
        reader = make_reader(counting, rlmm, chunk_size=chunk_size, chunk_cache_bytes=chunk_bound,
                             index_cache_bytes=index_bound, read_ahead=2)
        pool = RemoteLogReaderPool(threads=6, max_pending_tasks=64, metrics=reader.metrics)
        peaks = {"chunk": 0, "index": 0}
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                chunks = reader.chunk_cache
                peaks["chunk"] = max(peaks["chunk"], chunks.stored_bytes + chunks.reserved_bytes)
                peaks["index"] = max(peaks["index"], reader.index_cache.total_bytes)
                assert chunks.stored_bytes + chunks.reserved_bytes <= chunk_bound
                # Beyond the bound: only chunks of demand loads that did not fit, which
                # the responses that read them hold.
                assert chunks.total_bytes <= chunk_bound + pool.threads * chunk_size
                assert reader.index_cache.total_bytes <= index_bound
                await asyncio.sleep(0)

        async def replay(partition: Partition, max_bytes: int) -> bytes:
            offset, served = partition.log_start_offset, []
            while offset <= partition.log_end_offset:
                response = ChunkLeases()  # as the proxy's response holds what it sends
                response_leases(response)
                outcome = await pool.read(
                    lambda: reader.read(partition.tp, offset, max_bytes, min_one_batch=True), timeout=None)
                if isinstance(outcome.error, ChunkCacheFull):  # retriable: as a consumer does
                    response.release()
                    await asyncio.sleep(0.001)
                    continue
                assert outcome.error is None and not outcome.expired
                served.extend(bytes(r) for r in outcome.value.records)
                response.release()
                offset = outcome.value.next_fetch_offset
            return b"".join(served)

        sampler = asyncio.create_task(sample())
        consumers = [(p, size) for p, size in itertools.product(partitions, (300, 900))]
        replays = await asyncio.gather(*(replay(p, size) for p, size in consumers))
        done.set()
        await sampler
        for (partition, _), data in zip(consumers, replays):
            assert data == b"".join(b.data for b in partition.batches)
            assert [h.base_offset for h in iter_batches(data)] == [b.base_offset for b in partition.batches]
        assert 0 < peaks["chunk"] <= chunk_bound and 0 < peaks["index"] <= index_bound
        # The bound was tight: chunks were evicted and read again.
        assert reader.metrics.value("tierproxy_cache_evictions_total", {"cache": "chunk"}) > 0
        await pool.close()
        await close(reader)


async def test_a_response_that_fills_the_chunk_cache_goes_out_with_what_it_read(tmp_path: Path) -> None:
    """The response being made holds the whole chunk cache: its read of a partition ends at
    the chunk it finds no room for, with the whole batches before it, and its read of another
    partition gets no records and no error, not a wait for room that only its own writing
    frees (tierproxy_remote_fetch_cut_short_total counts both). The next Fetch goes on from
    there, and nothing is lost."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        one = await build_partition(rsm, rlmm, tmp_path / "one", segments=1, batches_per_segment=40)
        two = await build_partition(rsm, rlmm, tmp_path / "two", tp=new_tp("other"), segments=1,
                                    batches_per_segment=40)
        metrics = RemoteMetrics()
        reader = make_reader(rsm, rlmm, chunk_cache_bytes=3 * CHUNK, read_ahead=0, metrics=metrics)
        assert len(one.log_of(0)) > 4 * CHUNK
        response = ChunkLeases()

        async def fetch() -> tuple[RemoteReadResult, RemoteReadResult]:
            response_leases(response)
            first = await reader.read(one.tp, one.log_start_offset, 1 << 20, min_one_batch=True)
            second = await reader.read(two.tp, two.log_start_offset, 1 << 20, min_one_batch=True)
            return first, second

        first, second = await asyncio.wait_for(asyncio.create_task(fetch()), 10)
        assert 0 < first.records_size < len(one.log_of(0))
        check(first, one, one.log_start_offset, first.records_size, True)
        assert (second.records, second.records_size, second.offset_out_of_range) == ([], 0, False)
        assert second.next_fetch_offset == two.log_start_offset
        cut_short = [metrics.value("tierproxy_remote_fetch_cut_short_total", {"topic": p.tp.topic}) for p in (one, two)]
        assert cut_short == [1, 1]
        assert metrics.value("tierproxy_remote_read_errors_total", {"topic": one.tp.topic, "reason": "queue_full"}) == 0
        served = b"".join(first.records)
        response.release()  # written: its chunks' buffers may be reused
        offset = first.next_fetch_offset
        while offset < one.log_end_offset:  # the next Fetches, each its own response

            async def next_fetch() -> tuple[bytes, int]:
                leases = ChunkLeases()
                response_leases(leases)
                result = await reader.read(one.tp, offset, 1 << 20, min_one_batch=True)
                data = b"".join(result.records)
                leases.release()
                return data, result.next_fetch_offset

            data, following = await asyncio.create_task(next_fetch())
            assert following > offset
            served += data
            offset = following
        assert served == one.log_of(0)
        await close(reader)


async def test_a_corrupt_batch_length_serves_the_intact_batches_before_it(tmp_path: Path) -> None:
    async with _damaged(tmp_path, _break_the_length) as (partition, reader, metrics):
        with pytest.raises(CorruptRemoteSegment):
            await reader.read(partition.tp, partition.batches[12].base_offset, 1 << 20, min_one_batch=True)
        # The read that stopped before it and the one that failed at it.
        assert metrics.value("tierproxy_remote_read_errors_total",
                             {"topic": partition.tp.topic, "reason": "corrupt"}) == 2


async def test_block_checksums_refuse_a_same_size_change_that_keeps_the_batch_crc(tmp_path: Path) -> None:
    """One value byte changed and its batch's CRC-32C recomputed: the batch checks pass,
    the manifest's block CRC-32C does not. Nothing of the block is served or cached, it is
    counted, and the restored object is served again without a restart."""
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=25)
        path = rsm.path_of(rsm._key(partition.segments[0], ObjectType.LOG))
        good = path.read_bytes()
        position = sum(len(b.data) for b in partition.batches[:12])
        tampered = bytearray(good)
        tampered[position + HEADER_SIZE + 3] ^= 0x01
        crc_start = position + 21  # the batch CRC-32C covers attributes .. end
        tampered[position + 17:crc_start] = crc32c.crc32c(bytes(tampered[crc_start:position + len(
            partition.batches[12].data)])).to_bytes(4, "big")
        assert crc_valid(bytes(tampered), next(h for h in iter_batches(bytes(tampered)) if h.position == position))
        path.write_bytes(bytes(tampered))

        metrics = RemoteMetrics()
        reader = make_reader(rsm, rlmm, metrics=metrics)
        for _ in range(2):
            with pytest.raises(CorruptRemoteSegment, match="fails its CRC-32C in the manifest"):
                await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
        assert len(reader.chunk_cache) == 0
        assert metrics.value("tierproxy_remote_read_errors_total",
                             {"topic": partition.tp.topic, "reason": "corrupt"}) == 2
        path.write_bytes(good)
        result = await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
        assert b"".join(result.records) == b"".join(b.data for b in partition.batches)
        await close(reader)


async def test_batch_crcs_are_checked_only_where_the_store_checks_no_blocks(tmp_path: Path, monkeypatch) -> None:
    """The store checks every block of a chunk as it loads; a read then checks no batch CRC
    (cache hits included). A segment whose manifest has no block checksums has each batch's
    CRC-32C checked as it is read, hit or miss."""
    from tierproxy.protocol.records import Batch

    checked = []
    batch_crc_valid = Batch.crc_valid

    def counting_crc_valid(batch):
        checked.append(batch.header.base_offset)
        return batch_crc_valid(batch)

    monkeypatch.setattr(Batch, "crc_valid", counting_crc_valid)
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=25)
        reader = make_reader(rsm, rlmm)
        for _ in range(2):  # a miss, then hits
            result = await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
            check(result, partition, partition.log_start_offset, 1 << 20, True)
        assert checked == []
        await close(reader)

        _without_block_checksums(rsm, partition)
        reader = make_reader(rsm, rlmm)
        for _ in range(2):
            result = await reader.read(partition.tp, partition.log_start_offset, 1 << 20, min_one_batch=True)
            check(result, partition, partition.log_start_offset, 1 << 20, True)
        assert checked == [b.base_offset for b in partition.batches] * 2
        await close(reader)


async def test_the_batch_iterator_reads_from_a_position_and_loads_only_what_it_needs(tmp_path: Path) -> None:
    async with local_remote_log(tmp_path) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, tmp_path / "work", segments=1, batches_per_segment=25)
        segment = partition.segments[0]
        counting = CountingRSM(rsm)
        reader = make_reader(counting, None, chunk_size=CHUNK)  # a reader of given segments: no metadata
        target = partition.batches[9]
        position = (await reader.index_cache.offset_index(segment)).lookup(target.base_offset + 1).position
        assert position < sum(len(b.data) for b in partition.batches[:9])  # the index lands before it
        served = [bytes(b.view) async for b in reader.batches(segment, position, from_offset=target.base_offset + 1)]
        assert served == [b.data for b in partition.batches[9:]]
        assert sorted(start for _, start, _ in counting.range_reads) == \
            [i * CHUNK for i in range(position // CHUNK, reader.chunk_cache.chunk_count(segment))]

        # A reader that stops after one batch has loaded the chunks of that batch only.
        cold = make_reader(counting, None, chunk_size=CHUNK, read_ahead=0)
        counting.range_reads.clear()
        batches = cold.batches(segment, 0)
        first = await anext(batches)
        await batches.aclose()
        assert bytes(first.view) == partition.batches[0].data
        assert [start for _, start, _ in counting.range_reads] == \
            [i * CHUNK for i in range(0, (len(partition.batches[0].data) - 1) // CHUNK + 1)]
        with pytest.raises(RuntimeError, match="no metadata manager"):
            await cold.read(partition.tp, 0, 100, min_one_batch=True)
        await close(reader)
        await close(cold)
