"""Remote partitions for tests: real v2 batches, Kafka's indexes, copied with a real
RemoteStorageManager and committed (COPY_SEGMENT_FINISHED) in a real metadata store; and a
RemoteLogReader over them with its caches.

`Partition` also keeps the batches it wrote, so tests compute the expected answer of
a read from the batches themselves, not from the code under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierproxy.cache.chunk_cache import ChunkCache
from tierproxy.cache.index_cache import RemoteIndexCache
from tierproxy.protocol.records import ControlType, iter_batches
from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.remote_log.reader import RemoteLogReader, RemoteReadResult
from tierproxy.storage.indexes.producer_snapshot import ProducerState
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.model import LogSegmentData, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.segment_copy import copy_segment, finish_segment_copy
from tests.helpers.batches import batch, control_batch


BASE_TIMESTAMP_MS = 1_700_000_000_000
CHUNK = 500  # a reader's chunk size: small, so that most reads cross chunk boundaries


@dataclass(frozen=True)
class StoredBatch:
    base_offset: int
    last_offset: int
    data: bytes
    segment: int  # index in Partition.segments


@dataclass
class Partition:
    tp: TopicIdPartition
    segments: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    batches: list[StoredBatch] = field(default_factory=list)
    segment_data: list[LogSegmentData] = field(default_factory=list)  # the local files, to copy again
    producer_state: ProducerState | None = None
    leader_epochs: tuple[tuple[int, int], ...] = ()

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].start_offset

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].end_offset

    def expected(self, fetch_offset: int, max_bytes: int, *, min_one_batch: bool) -> list[StoredBatch]:
        """What Kafka serves: from the first batch holding or after the offset, whole batches of
        that one segment within max_bytes (one at least when min_one_batch)."""
        start = next((b for b in self.batches if b.last_offset >= fetch_offset), None)
        if start is None:
            return []
        out: list[StoredBatch] = []
        size = 0
        for b in self.batches:
            if b.segment != start.segment or b.last_offset < fetch_offset:
                continue
            if size + len(b.data) > max_bytes and not (min_one_batch and not out):
                break
            out.append(b)
            size += len(b.data)
        return out

    def log_of(self, segment: int) -> bytes:
        return b"".join(b.data for b in self.batches if b.segment == segment)


def new_tp(topic: str = "orders", partition: int = 0) -> TopicIdPartition:
    return TopicIdPartition(uuid.uuid4(), topic, partition)


async def add_segment(
    rsm: RemoteStorageManager,
    rlmm: RemoteLogMetadataManager,
    partition: Partition,
    batches: Sequence[bytes],
    workdir: Path,
    *,
    index_interval_bytes: int = 256,
    end_offset: int | None = None,
) -> RemoteLogSegmentMetadata:
    """Write the batches as one segment, copy it with its indexes and commit it COPY_SEGMENT_FINISHED."""
    log = b"".join(batches)
    headers = list(iter_batches(log))
    assert sum(h.size for h in headers) == len(log), "batches must be whole"
    base = headers[0].base_offset
    directory = workdir / uuid.uuid4().hex
    directory.mkdir(parents=True)
    log_path = directory / f"{base:020d}.log"
    log_path.write_bytes(log)
    copied = await copy_segment(rsm, rlmm, partition.tp, log_path, base, directory,
                                producer_state=partition.producer_state, leader_epochs=partition.leader_epochs,
                                index_interval_bytes=index_interval_bytes, end_offset=end_offset)
    finished = await finish_segment_copy(rlmm, copied.metadata)
    number = len(partition.segments)
    partition.segments.append(finished)
    partition.segment_data.append(copied.data)
    for h in headers:
        partition.batches.append(StoredBatch(h.base_offset, h.last_offset, log[h.position : h.end_position], number))
    partition.producer_state = copied.indexes.producer_state
    partition.leader_epochs = tuple(tuple(e) for e in copied.indexes.leader_epochs)
    return finished


def plain_batches(
    first_offset: int,
    count: int,
    *,
    leader_epoch: int = 0,
    timestamp_ms: int = BASE_TIMESTAMP_MS,
    value_size: int = 40,
) -> tuple[list[bytes], int]:
    """`count` batches of 1-5 records each (sizes vary), timestamps growing by 10 ms per record.
    Returns the batches and the next offset."""
    out = []
    offset = first_offset
    for i in range(count):
        records = 1 + (i * 7) % 5
        out.append(batch(offset, records, leader_epoch=leader_epoch, timestamp_ms=timestamp_ms + 10 * offset,
                         value_size=value_size + (i * 13) % 60))
        offset += records
    return out, offset


async def build_partition(
    rsm: RemoteStorageManager,
    rlmm: RemoteLogMetadataManager,
    workdir: Path,
    *,
    tp: TopicIdPartition | None = None,
    segments: int = 3,
    batches_per_segment: int = 20,
    first_offset: int = 100,
    value_size: int = 40,
    epochs: Sequence[int] | None = None,
) -> Partition:
    partition = Partition(tp or new_tp())
    offset = first_offset
    for n in range(segments):
        epoch = epochs[n] if epochs is not None else 0
        batches, offset = plain_batches(offset, batches_per_segment, leader_epoch=epoch, value_size=value_size)
        await add_segment(rsm, rlmm, partition, batches, workdir)
    return partition


def abort_marker(offset: int, producer_id: int, **kwargs: Any) -> bytes:
    return control_batch(offset, ControlType.ABORT, producer_id=producer_id, **kwargs)


def commit_marker(offset: int, producer_id: int, **kwargs: Any) -> bytes:
    return control_batch(offset, ControlType.COMMIT, producer_id=producer_id, **kwargs)


class CountingRSM:
    """A RemoteStorageManager wrapper counting the reads that reach the store, optionally slow."""

    def __init__(self, inner: RemoteStorageManager, *, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.range_reads: list[tuple[uuid.UUID, int, int | None]] = []
        self.index_reads: list[tuple[uuid.UUID, Any]] = []
        self.fail_with: BaseException | None = None

    def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int | None = None
    ) -> AsyncIterator[bytes | memoryview]:
        return self._fetch(metadata, start_position, end_position)

    async def _fetch(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None
    ) -> AsyncIterator[bytes | memoryview]:
        await self._range_read(metadata, start, end)
        async for chunk in self.inner.fetch_log_segment(metadata, start, end):
            yield chunk

    async def read_log_into(self, metadata: RemoteLogSegmentMetadata, start: int, buffer: memoryview) -> None:
        await self._range_read(metadata, start, start + len(buffer) - 1)
        await self.inner.read_log_into(metadata, start, buffer)

    async def _range_read(self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None) -> None:
        self.range_reads.append((metadata.segment_id.id, start, end))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with

    async def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: Any) -> bytes:
        self.index_reads.append((metadata.segment_id.id, index_type))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with
        return await self.inner.fetch_index(metadata, index_type)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.asynccontextmanager
async def one_segment(directory: Path, *, batches: int = 20, delay_s: float = 0.0) -> AsyncIterator[
        tuple[LocalRemoteStorageManager, Partition, RemoteLogSegmentMetadata, CountingRSM]]:
    """(the store, the partition, its segment, a CountingRSM over the store whose reads take
    `delay_s`): a partition of one remote segment of `batches` batches, in the local stores
    under `directory`."""
    async with local_remote_log(directory) as (rsm, rlmm):
        partition = await build_partition(rsm, rlmm, directory / "work", segments=1, batches_per_segment=batches)
        yield rsm, partition, partition.segments[0], CountingRSM(rsm, delay_s=delay_s)


@contextlib.asynccontextmanager
async def local_remote_log(directory: Path) -> AsyncIterator[tuple[LocalRemoteStorageManager, FileRemoteLogMetadataManager]]:
    """The local-file RemoteStorageManager and the file metadata store, under `directory`."""
    async with (
        LocalRemoteStorageManager(directory / "remote", chunk_bytes=16 * 1024) as rsm,
        FileRemoteLogMetadataManager(directory / "metadata") as rlmm,
    ):
        yield rsm, rlmm


def make_reader(
    rsm,
    rlmm,
    *,
    chunk_size: int = CHUNK,
    chunk_cache_bytes: int = 1 << 20,
    index_cache_bytes: int = 1 << 20,
    read_ahead: int = 2,
    metrics: RemoteMetrics | None = None,
) -> RemoteLogReader:
    metrics = metrics or RemoteMetrics()
    return RemoteLogReader(
        rsm,
        rlmm,
        RemoteIndexCache(rsm, max_bytes=index_cache_bytes, metrics=metrics.cache("index")),
        ChunkCache(rsm, chunk_size=chunk_size, max_bytes=chunk_cache_bytes, read_ahead_chunks=read_ahead,
                   metrics=metrics.cache("chunk")),
        metrics,
    )


async def close(reader: RemoteLogReader) -> None:
    await reader.close()


def check(result: RemoteReadResult, partition: Partition, fetch_offset: int, max_bytes: int, min_one: bool) -> None:
    expected = partition.expected(fetch_offset, max_bytes, min_one_batch=min_one)
    data = b"".join(result.records)
    assert data == b"".join(b.data for b in expected), (fetch_offset, max_bytes, min_one)
    assert result.records_size == len(data)
    assert not result.offset_out_of_range
    assert result.log_start_offset == partition.log_start_offset
    assert result.next_fetch_offset == (expected[-1].last_offset + 1 if expected else fetch_offset)
    assert result.aborted_transactions is None
