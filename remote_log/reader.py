"""Reading a partition's remote log: Kafka's `RemoteLogManager.read()` over the caches.

A remote fetch of (partition, fetch offset, max bytes):

1. remote log start offset > fetch offset: OFFSET_OUT_OF_RANGE (the client's reset
   policy applies); metadata not loaded yet: MetadataNotReady (REPLICA_NOT_AVAILABLE).
2. The COPY_SEGMENT_FINISHED segment holding the offset. The proxy has no broker
   leader-epoch cache, so the epoch is the segment's own epoch at that offset, and
   the metadata's `segment_for(offset, epoch)` has the last word (it knows which
   segments a new leader's uploads replaced). A known current leader epoch from the
   client keeps segments written in later epochs out.
3. Offset index -> position; the `.log` is read from there through the chunk cache,
   whose read-ahead carries on into the following segment near a segment's end.
4. Skip to the first batch whose last offset >= fetch offset, then whole batches
   within max bytes, at least one when `min_one_batch` (KIP-74). Without it, a first
   batch above max bytes gives empty records, as Kafka does. Bytes come from one
   segment only; a segment holding nothing at or after the offset (compacted away)
   hands over to the next one, as Kafka's `findNextSegmentMetadata`.
5. Never past the segment's end offset: a segment cut by a truncation keeps its
   bytes, and the tail past its new end offset is not served.
6. Every batch served passes its CRC-32C. A fetch stops before a batch that does
   not, or whose header or length cannot be read (the intact batches before it are
   served, as Kafka's reader stops at the first invalid batch); when it is the first one, the fetch fails with CorruptRemoteSegment, counted,
   and the segment's cached bytes are dropped so that a retry reads the store afresh.
7. READ_COMMITTED: aborted transactions overlapping [fetch offset, last offset
   served + 1) from the transaction indexes of this and the following remote
   segments, until one says later segments cannot add any (`is_complete`).

Records come back as memoryview slices of cached chunks (a batch cut by a chunk
boundary is the one copy), to be written with `writelines`.

Errors are the storage's own (RemoteStorageError and subclasses, MetadataNotReady);
only the Fetch handler turns them into Kafka error codes.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from cachetools import LRUCache

from tierproxy.cache.chunk_cache import ChunkCache
from tierproxy.cache.index_cache import RemoteIndexCache
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    crc_valid,
    read_batch_header,
)
from tierproxy.storage.errors import (
    CorruptRemoteSegment,
    MetadataNotReady,
    RemoteResourceNotFound,
    RemoteStorageError,
)
from tierproxy.storage.indexes import CorruptIndexError, CorruptLogError
from tierproxy.storage.indexes.transaction_index import AbortedTxn
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import IndexType, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tierproxy.storage.records import first_record_at_or_after
from tierproxy.storage.rsm import RemoteStorageManager

from tierproxy.config import (
    Config,
    REMOTE_FETCH_MAX_WAIT_MS,
    REMOTE_LOG_CHUNK_CACHE_SIZE_BYTES,
    REMOTE_LOG_CHUNK_SIZE_BYTES,
    REMOTE_LOG_INDEX_CACHE_DIR,
    REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES,
    REMOTE_LOG_READER_MAX_PENDING_TASKS,
    REMOTE_LOG_READER_THREADS,
    REMOTE_LOG_READ_AHEAD_CHUNKS,
)
from .reader_pool import ReadOutcome, RemoteLogReaderPool
from .remote_metrics import ReadErrorReason, RemoteMetrics

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
NO_LEADER_EPOCH = -1


class IsolationLevel(enum.IntEnum):
    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class RemoteReadResult:
    """One partition's answer from the remote tier."""

    #: Whole record batches in offset order, zero-copy slices; send with `writelines`.
    records: list[memoryview]
    records_size: int
    #: Last offset served + 1; the fetch offset when nothing was served.
    next_fetch_offset: int
    #: The remote log start offset (the response's `log_start_offset`); -1 when nothing is remote.
    log_start_offset: int
    #: READ_COMMITTED only (None otherwise): aborted transactions overlapping what was served.
    aborted_transactions: list[AbortedTxn] | None = None
    #: False when the remote transaction indexes ran out before one ruled out later aborts:
    #: an ABORT marker for a served transaction may then sit in the broker's local log.
    aborted_transactions_complete: bool = True
    #: The fetch offset is below the remote log start or in no remote segment.
    offset_out_of_range: bool = False
    #: The segment the records came from.
    segment: RemoteLogSegmentMetadata | None = field(default=None, compare=False)

    @property
    def is_empty(self) -> bool:
        return self.records_size == 0


class TimestampAndOffset(NamedTuple):
    """A ListOffsets answer: Kafka's `TimestampAndOffset` (-1 for an unknown epoch)."""

    timestamp: int
    offset: int
    leader_epoch: int


class OffsetAndEpoch(NamedTuple):
    offset: int
    leader_epoch: int


class _Batch(NamedTuple):
    header: BatchHeader  # positions relative to `buffer`
    buffer: bytes | bytearray  # the chunk holding the batch, or a copy of a batch cut by a chunk boundary

    @property
    def view(self) -> memoryview:
        return memoryview(self.buffer)[self.header.position : self.header.end_position]


def epoch_at(segment: RemoteLogSegmentMetadata, offset: int) -> int:
    """The leader epoch of `offset` within the segment (its first epoch for an offset before it)."""
    epoch = segment.segment_leader_epochs[0][0]
    for e, start in segment.segment_leader_epochs:
        if start > offset:
            break
        epoch = e
    return epoch


class RemoteLogReader:
    def __init__(
        self,
        rsm: RemoteStorageManager,
        rlmm: RemoteLogMetadataManager,
        index_cache: RemoteIndexCache,
        chunk_cache: ChunkCache,
        metrics: RemoteMetrics | None = None,
    ) -> None:
        self.rsm = rsm
        self.rlmm = rlmm
        self.index_cache = index_cache
        self.chunk_cache = chunk_cache
        self.metrics = metrics if metrics is not None else RemoteMetrics()
        # The segment each partition was last read from: sequential readers stay in it.
        self._last_segment: LRUCache[TopicIdPartition, RemoteLogSegmentMetadata] = LRUCache(maxsize=65_536)

    # ------------------------------------------------------------------ Fetch

    async def read(
        self,
        tp: TopicIdPartition,
        fetch_offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        leader_epoch: int = NO_LEADER_EPOCH,
        isolation_level: int = IsolationLevel.READ_UNCOMMITTED,
    ) -> RemoteReadResult:
        """Records of `tp` from `fetch_offset`, at most `max_bytes` (but one batch if `min_one_batch`).

        `leader_epoch` is the current leader epoch the client sent (-1 unknown).
        Raises MetadataNotReady or a RemoteStorageError.
        """
        self.metrics.read_requests.labels(tp.topic).inc()
        with self._counting_errors(tp):
            result = await self._read(tp, fetch_offset, max_bytes, min_one_batch, leader_epoch, isolation_level)
        if result.records_size:
            self.metrics.fetch_bytes.labels(tp.topic).inc(result.records_size)
        return result

    async def _read(
        self,
        tp: TopicIdPartition,
        fetch_offset: int,
        max_bytes: int,
        min_one_batch: bool,
        leader_epoch: int,
        isolation_level: int,
    ) -> RemoteReadResult:
        log_start = self.rlmm.log_start_offset(tp)
        segment = None
        if log_start is not None and fetch_offset >= log_start:
            segment = self._segment_for(tp, fetch_offset, leader_epoch)
        if segment is None:
            return RemoteReadResult([], 0, fetch_offset, -1 if log_start is None else log_start,
                                    offset_out_of_range=True)
        while True:
            records, size, last_offset, found, next_position = await self._read_segment(
                segment, fetch_offset, max_bytes, min_one_batch)
            if found:
                break
            following = self._segment_for(tp, segment.end_offset + 1, leader_epoch)
            if following is None:
                break
            segment = following
        if records:
            self._read_ahead_following(tp, segment, next_position, leader_epoch)
        next_offset = fetch_offset if last_offset is None else last_offset + 1
        aborted, complete = None, True
        if isolation_level == IsolationLevel.READ_COMMITTED:
            aborted, complete = ([], True) if last_offset is None else await self._collect_aborted(
                tp, segment, fetch_offset, next_offset, leader_epoch)
        return RemoteReadResult(records, size, next_offset, log_start, aborted, complete, segment=segment)

    async def _read_segment(
        self, segment: RemoteLogSegmentMetadata, fetch_offset: int, max_bytes: int, min_one_batch: bool
    ) -> tuple[list[memoryview], int, int | None, bool, int]:
        """(records, their size, last offset served, whether a batch at or after the offset
        exists, the byte position in the segment's `.log` after what was read)."""
        records: list[memoryview] = []
        size = 0
        last_offset = None
        found = False
        with self._corruption_of(segment):
            offset_index = await self.index_cache.offset_index(segment)
            position = offset_index.lookup(fetch_offset).position
            batches = self._batches(segment, position, read_ahead=True)
            async with contextlib.aclosing(batches):
                async for batch in _until_invalid(batches, records):
                    header = batch.header
                    if header.last_offset > segment.end_offset:
                        break  # past a truncated segment's end: never served
                    if header.last_offset < fetch_offset:
                        position += header.size
                        continue
                    found = True
                    if size + header.size > max_bytes and not (min_one_batch and not records):
                        break
                    if not crc_valid(batch.buffer, header):
                        if records:
                            break  # serve the good batches before it; the next fetch starts at it
                        raise CorruptRemoteSegment(
                            f"segment {segment.segment_id.id} of {segment.topic_id_partition}: batch at offset "
                            f"{header.base_offset} fails its CRC-32C check"
                        )
                    records.append(batch.view)
                    size += header.size
                    position += header.size
                    last_offset = header.last_offset
                    if header.last_offset >= segment.end_offset or max_bytes - size < HEADER_SIZE:
                        break  # nothing more fits: do not load a chunk just to learn that
        return records, size, last_offset, found, position

    def _read_ahead_following(
        self, tp: TopicIdPartition, segment: RemoteLogSegmentMetadata, position: int, leader_epoch: int
    ) -> None:
        """Read-ahead that reaches a segment's last chunk goes on into the next segment: its
        offset index and first chunks load while this one is served, so a sequential reader
        does not wait for the store's first byte at every segment boundary."""
        cache = self.chunk_cache
        beyond = position // cache.chunk_size + cache.read_ahead_chunks - (cache.chunk_count(segment) - 1)
        if beyond <= 0:
            return
        following = self._segment_for(tp, segment.end_offset + 1, leader_epoch)
        if following is not None:
            self.index_cache.prefetch(following, IndexType.OFFSET)
            cache.prefetch(following, 0, beyond)

    async def _collect_aborted(
        self,
        tp: TopicIdPartition,
        segment: RemoteLogSegmentMetadata,
        fetch_offset: int,
        upper_bound: int,
        leader_epoch: int,
    ) -> tuple[list[AbortedTxn], bool]:
        """Kafka's `collectAbortedTransactions` over this and the following remote segments."""
        aborted: list[AbortedTxn] = []
        current: RemoteLogSegmentMetadata | None = segment
        while current is not None:
            if not current.txn_index_empty:
                with self._corruption_of(current):
                    index = await self.index_cache.transaction_index(current)
                found = index.collect_aborted(fetch_offset, upper_bound)
                aborted.extend(found.aborted)
                if found.is_complete:
                    return aborted, True
            current = self._segment_for(tp, current.end_offset + 1, leader_epoch, remember=False)
        return aborted, False

    # ------------------------------------------------------------------ ListOffsets

    async def offset_for_timestamp(
        self, tp: TopicIdPartition, timestamp: int, *, starting_offset: int | None = None
    ) -> TimestampAndOffset | None:
        """The first remote record with timestamp >= `timestamp` (and offset >= `starting_offset`).

        Through the time and offset indexes to the first batch whose max timestamp
        reaches the target, then into that batch (decompressed if it is) to the record,
        as Kafka's `RemoteLogManager.findOffsetByTimestamp`: the record's own offset and
        timestamp (a LOG_APPEND_TIME batch's records all carry its max timestamp). None
        when no remote record is that recent.
        """
        with self._counting_errors(tp):
            log_start = self.rlmm.log_start_offset(tp)
            if log_start is None:
                return None
            start = log_start if starting_offset is None else max(log_start, starting_offset)
            for segment in self._serving_segments(tp):
                if segment.end_offset < start or segment.max_timestamp_ms < timestamp:
                    continue
                found = await self._find_timestamp(segment, timestamp, start)
                if found is not None:
                    return found
            return None

    async def max_timestamp(self, tp: TopicIdPartition) -> TimestampAndOffset | None:
        """The remote record with the largest timestamp (the first such): ListOffsets -3 on remote data."""
        with self._counting_errors(tp):
            log_start = self.rlmm.log_start_offset(tp)
            best: RemoteLogSegmentMetadata | None = None
            for segment in self._serving_segments(tp):
                if best is None or segment.max_timestamp_ms > best.max_timestamp_ms:
                    best = segment
            if log_start is None or best is None or best.max_timestamp_ms < 0:
                return None
            return await self._find_timestamp(best, best.max_timestamp_ms, log_start)

    def earliest_remote_offset(self, tp: TopicIdPartition) -> OffsetAndEpoch | None:
        """The remote log start offset and its leader epoch (ListOffsets -2 with remote data)."""
        start = self.rlmm.log_start_offset(tp)
        if start is None:
            return None
        segment = self._segment_for(tp, start, NO_LEADER_EPOCH, remember=False)
        return OffsetAndEpoch(start, epoch_at(segment, start) if segment is not None else NO_LEADER_EPOCH)

    def latest_tiered_offset(self, tp: TopicIdPartition) -> OffsetAndEpoch | None:
        """The highest offset in remote storage and its leader epoch (ListOffsets -5)."""
        end = self.rlmm.log_end_offset(tp)
        if end is None:
            return None
        segment = self._segment_for(tp, end, NO_LEADER_EPOCH, remember=False)
        return OffsetAndEpoch(end, epoch_at(segment, end) if segment is not None else NO_LEADER_EPOCH)

    async def _find_timestamp(
        self, segment: RemoteLogSegmentMetadata, timestamp: int, starting_offset: int
    ) -> TimestampAndOffset | None:
        with self._corruption_of(segment):
            time_index = await self.index_cache.time_index(segment)
            offset_index = await self.index_cache.offset_index(segment)
            indexed = time_index.lookup(timestamp)
            position = offset_index.lookup(max(indexed.offset, starting_offset)).position
            batches = self._batches(segment, position, read_ahead=False)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    header = batch.header
                    if header.last_offset > segment.end_offset:
                        return None
                    if header.max_timestamp < timestamp or header.last_offset < starting_offset:
                        continue
                    if not crc_valid(batch.buffer, header):
                        raise CorruptRemoteSegment(
                            f"segment {segment.segment_id.id}: batch at offset {header.base_offset} fails its CRC-32C"
                        )
                    found = _record_at_or_after(batch, timestamp, starting_offset)
                    if found is not None:
                        return found
        return None

    # ------------------------------------------------------------------ segments

    def _segment_for(
        self, tp: TopicIdPartition, offset: int, leader_epoch: int, *, remember: bool = True
    ) -> RemoteLogSegmentMetadata | None:
        last = self._last_segment.get(tp)
        if last is not None and last.start_offset <= offset <= last.end_offset:
            found = self._lookup(tp, last, offset, leader_epoch)
            if found is not None:
                return found
        candidates = [
            m for m in self.rlmm.list_segments(tp)
            if m.state == _FINISHED and m.start_offset <= offset <= m.end_offset
        ]
        # Newest lineage first: after an unclean election the later epoch's copy wins.
        candidates.sort(key=lambda m: epoch_at(m, offset), reverse=True)
        for candidate in candidates:
            found = self._lookup(tp, candidate, offset, leader_epoch)
            if found is not None:
                if remember:
                    self._last_segment[tp] = found
                return found
        return None

    def _lookup(
        self, tp: TopicIdPartition, candidate: RemoteLogSegmentMetadata, offset: int, leader_epoch: int
    ) -> RemoteLogSegmentMetadata | None:
        epoch = epoch_at(candidate, offset)
        if leader_epoch >= 0 and epoch > leader_epoch:
            return None
        found = self.rlmm.segment_for(tp, offset, epoch)
        if found is None or not found.start_offset <= offset <= found.end_offset:
            return None
        return found

    def _serving_segments(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        """COPY_SEGMENT_FINISHED segments the metadata would serve, by start offset."""
        for m in self.rlmm.list_segments(tp):
            if m.state != _FINISHED:
                continue
            found = self._lookup(tp, m, m.start_offset, NO_LEADER_EPOCH)
            if found is not None and found.segment_id == m.segment_id:
                yield found

    # ------------------------------------------------------------------ bytes

    async def _batches(
        self, segment: RemoteLogSegmentMetadata, position: int, *, read_ahead: bool
    ) -> AsyncIterator[_Batch]:
        """Every batch of the segment's `.log` from `position`, read through the chunk cache."""
        size = segment.segment_size_in_bytes
        chunk_size = self.chunk_cache.chunk_size
        chunk_index, chunk = -1, b""
        while position < size:
            if position // chunk_size != chunk_index:
                chunk_index = position // chunk_size
                chunk = await self.chunk_cache.get(segment, chunk_index, read_ahead=read_ahead)
            header = read_batch_header(chunk, position - chunk_index * chunk_size)
            if header is not None:
                yield _Batch(header, chunk)
                position += header.size
                continue
            # Cut by a chunk boundary: gather the batch from the following chunks, one copy.
            buffer = bytearray(memoryview(chunk)[position - chunk_index * chunk_size :])
            while (header := read_batch_header(buffer)) is None:
                needed = LOG_OVERHEAD
                if len(buffer) >= LOG_OVERHEAD:
                    needed += int.from_bytes(buffer[8:LOG_OVERHEAD], "big", signed=True)
                if position + needed > size:
                    raise CorruptRemoteSegment(
                        f"segment {segment.segment_id.id}: batch at byte {position} runs past the end "
                        f"of the {size}-byte segment"
                    )
                gathered = position + len(buffer)  # the next byte to take
                if gathered // chunk_size != chunk_index:
                    chunk_index = gathered // chunk_size
                    chunk = await self.chunk_cache.get(segment, chunk_index, read_ahead=read_ahead)
                start = gathered - chunk_index * chunk_size
                buffer += memoryview(chunk)[start : start + needed - len(buffer)]
            yield _Batch(header, buffer)  # the one copy: nothing writes to it again
            position += header.size

    # ------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _corruption_of(self, segment: RemoteLogSegmentMetadata) -> Iterator[None]:
        """Bytes or indexes of `segment` that cannot be what Kafka wrote: CorruptRemoteSegment,
        and the segment's cached copies are dropped so that a retry reads the store again."""
        try:
            yield
        except (DecodeError, CorruptIndexError, CorruptLogError) as e:
            self._forget(segment)
            raise CorruptRemoteSegment(f"segment {segment.segment_id.id} of {segment.topic_id_partition}: {e}") from e
        except CorruptRemoteSegment:
            self._forget(segment)
            raise

    def _forget(self, segment: RemoteLogSegmentMetadata) -> None:
        self.chunk_cache.invalidate(segment.segment_id.id)
        self.index_cache.invalidate(segment.segment_id.id)

    @contextlib.contextmanager
    def _counting_errors(self, tp: TopicIdPartition) -> Iterator[None]:
        try:
            yield
        except MetadataNotReady:
            self.metrics.read_error(tp.topic, ReadErrorReason.METADATA_NOT_READY)
            raise
        except CorruptRemoteSegment:
            self.metrics.read_error(tp.topic, ReadErrorReason.CORRUPT)
            raise
        except RemoteResourceNotFound:
            self.metrics.read_error(tp.topic, ReadErrorReason.NOT_FOUND)
            raise
        except RemoteStorageError:
            self.metrics.read_error(tp.topic, ReadErrorReason.STORAGE)
            raise


async def _until_invalid(batches: AsyncIterator[_Batch], served: list[memoryview]) -> AsyncIterator[_Batch]:
    """The batches until one cannot be read (a corrupt length or header). Like Kafka's log
    reader, which stops at the first invalid batch, the intact batches before it are
    served; only a read that starts at the invalid batch fails."""
    try:
        async for batch in batches:
            yield batch
    except (DecodeError, CorruptLogError, CorruptRemoteSegment):
        if not served:
            raise


def _record_at_or_after(batch: _Batch, timestamp: int, starting_offset: int) -> TimestampAndOffset | None:
    """The first record of the batch with timestamp >= `timestamp` and offset >= `starting_offset`,
    with its own offset and timestamp: the batch is decompressed when it must be."""
    header = batch.header
    found = first_record_at_or_after(batch.view, timestamp, starting_offset)
    if found is None:
        return None
    epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else NO_LEADER_EPOCH
    return TimestampAndOffset(found[1], found[0], epoch)


# ---------------------------------------------------------------------- wiring


@dataclass
class RemoteReadEngine:
    """The caches, the reader and its pool, built from the proxy's configuration."""

    reader: RemoteLogReader
    pool: RemoteLogReaderPool
    index_cache: RemoteIndexCache
    chunk_cache: ChunkCache
    metrics: RemoteMetrics
    fetch_max_wait_s: float

    @classmethod
    def from_config(
        cls,
        config: Config,
        rsm: RemoteStorageManager,
        rlmm: RemoteLogMetadataManager,
        metrics: RemoteMetrics | None = None,
        *,
        shared_index_dir: bool = False,
    ) -> RemoteReadEngine:
        """With `shared_index_dir`, other worker processes use `remote.log.index.cache.dir` too."""
        metrics = metrics if metrics is not None else RemoteMetrics()
        index_cache = RemoteIndexCache(
            rsm,
            max_bytes=config[REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES],
            cache_dir=config[REMOTE_LOG_INDEX_CACHE_DIR] or None,
            shared=shared_index_dir,
            metrics=metrics.cache("index"),
        )
        chunk_cache = ChunkCache(
            rsm,
            chunk_size=config[REMOTE_LOG_CHUNK_SIZE_BYTES],
            max_bytes=config[REMOTE_LOG_CHUNK_CACHE_SIZE_BYTES],
            read_ahead_chunks=config[REMOTE_LOG_READ_AHEAD_CHUNKS],
            metrics=metrics.cache("chunk"),
        )
        return cls(
            reader=RemoteLogReader(rsm, rlmm, index_cache, chunk_cache, metrics),
            pool=RemoteLogReaderPool(
                threads=config[REMOTE_LOG_READER_THREADS],
                max_pending_tasks=config[REMOTE_LOG_READER_MAX_PENDING_TASKS],
                metrics=metrics,
            ),
            index_cache=index_cache,
            chunk_cache=chunk_cache,
            metrics=metrics,
            fetch_max_wait_s=config[REMOTE_FETCH_MAX_WAIT_MS] / 1000,
        )

    async def start(self) -> None:
        await self.index_cache.start()

    async def close(self) -> None:
        await self.pool.close()
        await self.chunk_cache.close()
        await self.index_cache.close()

    async def read(
        self,
        tp: TopicIdPartition,
        fetch_offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        leader_epoch: int = NO_LEADER_EPOCH,
        isolation_level: int = IsolationLevel.READ_UNCOMMITTED,
    ) -> ReadOutcome[RemoteReadResult]:
        """`RemoteLogReader.read` on the pool, waiting at most remote.fetch.max.wait.ms. Never raises
        for the read: the outcome holds the result, the error (ReaderQueueFull included), or `expired`."""
        return await self.pool.read(
            lambda: self.reader.read(
                tp, fetch_offset, max_bytes,
                min_one_batch=min_one_batch, leader_epoch=leader_epoch, isolation_level=isolation_level,
            ),
            timeout=self.fetch_max_wait_s,
            topic=tp.topic,
        )
