"""Reading a partition's remote log: Kafka's `RemoteLogManager.read()` over the caches.

A remote fetch of (partition, fetch offset, max bytes):

1. remote log start offset > fetch offset: OFFSET_OUT_OF_RANGE (the client's reset
   policy applies); metadata not loaded yet: MetadataNotReady (REPLICA_NOT_AVAILABLE).
   The caller passes the remote log start offset when it has read it already.
2. The segment serving the offset by leader-epoch lineage (`segments`); a known current
   leader epoch from the client keeps segments written in later epochs out.
3. Offset index -> position; the `.log` is read from there through the chunk cache,
   whose read-ahead carries on into the following segment near a segment's end.
4. Skip to the first batch whose last offset >= fetch offset, then whole batches
   within max bytes, at least one when `min_one_batch` (KIP-74). Without it, a first
   batch above max bytes gives empty records, as Kafka does. Bytes come from one
   segment only; a segment holding nothing at or after the offset (compacted away)
   hands over to the next one, as Kafka's `findNextSegmentMetadata`.
5. Never past the segment's end offset: a segment cut by a truncation keeps its
   bytes, and the tail past its new end offset is not served.
6. A corrupt stored object is never served. The store checks each block of a chunk
   against the manifest's CRC-32C as the chunk loads, the one check of those bytes: a
   cache hit checks nothing again (consumers check batch CRCs themselves, as with a
   broker). A segment whose manifest predates block checksums gets the size check only
   from the store, so each batch of it passes its own CRC-32C as it is read instead.
   A read stops before a batch that cannot be read, or before a block that fails its
   check (the chunk holding it is never cached, and none of the block's bytes are
   used): the intact batches in front of it are served, as Kafka's reader stops at the
   first invalid batch, and the corruption is counted and logged. When there is no
   intact batch in front of it, the read fails with CorruptRemoteSegment, counted, and
   the segment's cached bytes are dropped so that a retry reads the store afresh.
7. READ_COMMITTED: aborted transactions overlapping [fetch offset, last offset
   served + 1) from the transaction indexes of this and the following remote
   segments (`transactions`).

Records come back as memoryview slices of cached chunks (a batch cut by a chunk
boundary as the slices of both, `protocol.records.log_batches_async`), to be written
with `writelines`: nothing is copied. The chunks are leased to the response being made
(`cache.chunk_buffers`), which gives them back once written. A reader outside a response
(`batches`, a Spark task's) holds the chunks of the batch it was given until it asks for
the next one.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import uuid
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from cachetools import LRUCache

from tierproxy.cache.chunk_buffers import ChunkLeases, current_leases
from tierproxy.cache.chunk_cache import ChunkCache, CorruptChunk, ResponseCutShort
from tierproxy.cache.index_cache import RemoteIndexCache
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.records import HEADER_SIZE, Batch, log_batches_async
from tierproxy.storage.errors import CorruptRemoteSegment, RemoteStorageError
from tierproxy.storage.indexes import CorruptIndexError, TransactionIndex, TxnIndexSearchResult
from tierproxy.storage.indexes.transaction_index import AbortedTxn
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import IndexType, RemoteLogSegmentMetadata, TopicIdPartition
from tierproxy.storage.records import first_record_at_or_after
from tierproxy.storage.rsm import RemoteStorageManager

from .failures import Cause, cause_of
from .metrics import RemoteMetrics
from .read_ahead import ReadAhead
from .reader_pool import owner_read, owner_reads_ahead, owner_reads_on
from .segments import NO_LEADER_EPOCH, RemoteLogSegments, epoch_at
from .throttled_log import ThrottledLog
from .transactions import collect_aborted

log = logging.getLogger(__name__)


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


class TimestampAndOffset(NamedTuple):
    """A ListOffsets answer: Kafka's `TimestampAndOffset` (-1 for an unknown epoch)."""

    timestamp: int
    offset: int
    leader_epoch: int


class OffsetAndEpoch(NamedTuple):
    offset: int
    leader_epoch: int


class _SegmentRead(NamedTuple):
    records: list[memoryview]
    size: int
    last_offset: int | None  # of the last batch served
    found: bool  # a batch at or after the fetch offset exists in the segment
    next_position: int  # in the segment's `.log`, after what was read


class RemoteLogReader:
    """Reads remote segments through the index and chunk caches.

    Without `rlmm` the reader reads given segments only (`batches`): what a Spark task
    does with the segment its driver chose.
    """

    def __init__(
        self,
        rsm: RemoteStorageManager,
        rlmm: RemoteLogMetadataManager | None,
        index_cache: RemoteIndexCache,
        chunk_cache: ChunkCache,
        metrics: RemoteMetrics | None = None,
    ) -> None:
        self.rsm = rsm
        self.index_cache = index_cache
        self.chunk_cache = chunk_cache
        # Chunks in flight ahead of a sequential reader, from the store's observed latency.
        self.read_ahead = ReadAhead(chunk_cache.read_ahead_chunks,
                                    max(chunk_cache.read_ahead_chunks, chunk_cache.max_prefetch_per_segment, 1))
        rsm.observe_range_reads(self.read_ahead.observe)
        self.metrics = metrics if metrics is not None else RemoteMetrics()
        self._segments = RemoteLogSegments(rlmm) if rlmm is not None else None
        # Whether the store checks each segment's `.log` blocks (False: its batches are checked here).
        self._blocks_checked: LRUCache[uuid.UUID, bool] = LRUCache(maxsize=65_536)
        # Every consumer reading past the same corrupt bytes meets them again.
        self._corruption_log = ThrottledLog(log)

    async def close(self) -> None:
        """Close the caches (the store and the metadata are the caller's)."""
        await self.chunk_cache.close()
        await self.index_cache.close()

    @property
    def segments(self) -> RemoteLogSegments:
        if self._segments is None:
            raise RuntimeError("this remote log reader has no metadata manager: it reads given segments only")
        return self._segments

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
        log_start_offset: int | None = None,
    ) -> RemoteReadResult:
        """Records of `tp` from `fetch_offset`, at most `max_bytes` (but one batch if `min_one_batch`).

        `leader_epoch` is the current leader epoch the client sent (-1 unknown);
        `log_start_offset` the remote log start offset when the caller read it already.
        Raises MetadataNotReady or a RemoteStorageError.
        """
        self.metrics.read_requests.labels(tp.topic).inc()
        with self._counting_errors(tp):
            result = await self._read(tp, fetch_offset, max_bytes, min_one_batch, leader_epoch, isolation_level,
                                      log_start_offset)
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
        log_start: int | None,
    ) -> RemoteReadResult:
        if log_start is None:
            log_start = self.segments.rlmm.log_start_offset(tp)
        segment = None
        if log_start is not None and fetch_offset >= log_start:
            segment = self.segments.segment_for(tp, fetch_offset, leader_epoch, remember=True)
        if segment is None:
            return RemoteReadResult([], 0, fetch_offset, -1 if log_start is None else log_start,
                                    offset_out_of_range=True)
        assert log_start is not None  # a segment is looked for only from the log start on
        # Chunks beyond what this read reads are loaded ahead only for a sequential reader.
        sequential = owner_reads_on(tp, fetch_offset)
        try:
            while True:
                read = await self._read_segment(segment, fetch_offset, max_bytes, min_one_batch, sequential)
                if read.found:
                    break
                following = self.segments.following(segment, leader_epoch)
                if following is None:
                    break
                segment = following
        except ResponseCutShort:
            # No room for this partition's first chunk beside what its own response holds: it
            # gets no records this time, no error; the response goes out with the others'.
            self.metrics.fetch_cut_short.labels(tp.topic).inc()
            return RemoteReadResult([], 0, fetch_offset, log_start)
        if read.records and sequential and owner_reads_ahead():
            self._read_ahead_following(segment, read.next_position, leader_epoch)
        next_offset = fetch_offset if read.last_offset is None else read.last_offset + 1
        owner_read(tp, fetch_offset, next_offset)
        aborted, complete = None, True
        if isolation_level == IsolationLevel.READ_COMMITTED:
            aborted, complete = ([], True) if read.last_offset is None else await self.aborted_transactions(
                segment, fetch_offset, next_offset, leader_epoch=leader_epoch)
        return RemoteReadResult(read.records, read.size, next_offset, log_start, aborted, complete, segment=segment)

    async def _read_segment(
        self, segment: RemoteLogSegmentMetadata, fetch_offset: int, max_bytes: int, min_one_batch: bool,
        sequential: bool = True,
    ) -> _SegmentRead:
        records: list[memoryview] = []
        size = 0
        last_offset = None
        found = False
        with self._corruption_of(segment):
            position = (await self.index_cache.offset_index(segment)).lookup(fetch_offset).position
            # Not sequential: its own chunks load alongside each other, none beyond them.
            last_chunk = None if sequential else (position + max(max_bytes, 1) - 1) // self.chunk_cache.chunk_size
            async with contextlib.aclosing(self._batches(segment, position, fetch_offset,
                                                         read_ahead=owner_reads_ahead(),
                                                         read_ahead_to=last_chunk)) as batches:
                try:
                    async for batch in batches:
                        header = batch.header
                        found = True
                        if size + header.size > max_bytes and not (min_one_batch and not records):
                            break
                        records.extend(batch.parts)
                        size += header.size
                        position = batch.position + header.size
                        last_offset = header.last_offset
                        if header.last_offset >= segment.end_offset or max_bytes - size < HEADER_SIZE:
                            break  # nothing more fits: do not load a chunk just to learn that
                except ResponseCutShort:
                    if not records:
                        raise
                    self.metrics.fetch_cut_short.labels(segment.topic_id_partition.topic).inc()
                except (DecodeError, CorruptRemoteSegment) as e:
                    # Like Kafka's log reader, which stops at the first invalid batch: the
                    # intact batches before it are served; only a read that starts there fails.
                    if not records:
                        raise
                    self._stopped_early(segment, e)
        return _SegmentRead(records, size, last_offset, found, position)

    def _read_ahead_following(self, segment: RemoteLogSegmentMetadata, position: int, leader_epoch: int) -> None:
        """Read-ahead that reaches a segment's last chunk goes on into the next segment: its
        offset index and first chunks load while this one is served, so a sequential reader
        does not wait for the store's first byte at every segment boundary."""
        cache = self.chunk_cache
        ahead = self.read_ahead.chunks(cache.chunk_size)
        beyond = position // cache.chunk_size + ahead - (cache.chunk_count(segment) - 1)
        if beyond <= 0:
            return
        following = self.segments.following(segment, leader_epoch)
        if following is not None:
            self.index_cache.prefetch(following, IndexType.OFFSET)
            cache.prefetch(following, 0, beyond)

    async def aborted_transactions(
        self, segment: RemoteLogSegmentMetadata, start_offset: int, upper_bound_offset: int, *,
        leader_epoch: int = NO_LEADER_EPOCH,
    ) -> TxnIndexSearchResult:
        """Aborted transactions overlapping [start_offset, upper_bound_offset), from the
        transaction indexes of `segment` and the segments following it."""
        return await collect_aborted(self.segments, segment, start_offset, upper_bound_offset,
                                     self._transaction_index, leader_epoch=leader_epoch)

    async def _transaction_index(self, segment: RemoteLogSegmentMetadata) -> TransactionIndex:
        with self._corruption_of(segment):
            return await self.index_cache.transaction_index(segment)

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
            log_start = self.segments.rlmm.log_start_offset(tp)
            if log_start is None:
                return None
            start = log_start if starting_offset is None else max(log_start, starting_offset)
            for segment, first_offset in self.segments.walk(tp, start):
                if segment.max_timestamp_ms < timestamp:
                    continue
                found = await self._find_timestamp(segment, timestamp, first_offset)
                if found is not None:
                    return found
            return None

    async def max_timestamp(self, tp: TopicIdPartition) -> TimestampAndOffset | None:
        """The remote record with the largest timestamp (the first such): ListOffsets -3 on remote data."""
        with self._counting_errors(tp):
            log_start = self.segments.rlmm.log_start_offset(tp)
            if log_start is None:
                return None
            best: tuple[RemoteLogSegmentMetadata, int] | None = None
            for segment, first_offset in self.segments.walk(tp, log_start):
                if best is None or segment.max_timestamp_ms > best[0].max_timestamp_ms:
                    best = segment, first_offset
            if best is None or best[0].max_timestamp_ms < 0:
                return None
            return await self._find_timestamp(best[0], best[0].max_timestamp_ms, best[1])

    def earliest_remote_offset(self, tp: TopicIdPartition) -> OffsetAndEpoch | None:
        """The remote log start offset and its leader epoch (ListOffsets -2 with remote data)."""
        return self._offset_and_epoch(tp, self.segments.rlmm.log_start_offset(tp))

    def latest_tiered_offset(self, tp: TopicIdPartition) -> OffsetAndEpoch | None:
        """The highest offset in remote storage and its leader epoch (ListOffsets -5)."""
        return self._offset_and_epoch(tp, self.segments.rlmm.log_end_offset(tp))

    def _offset_and_epoch(self, tp: TopicIdPartition, offset: int | None) -> OffsetAndEpoch | None:
        if offset is None:
            return None
        segment = self.segments.segment_for(tp, offset)
        return OffsetAndEpoch(offset, epoch_at(segment, offset) if segment is not None else NO_LEADER_EPOCH)

    async def _find_timestamp(
        self, segment: RemoteLogSegmentMetadata, timestamp: int, starting_offset: int
    ) -> TimestampAndOffset | None:
        with self._corruption_of(segment):
            time_index = await self.index_cache.time_index(segment)
            offset_index = await self.index_cache.offset_index(segment)
            indexed = time_index.lookup(timestamp)
            position = offset_index.lookup(max(indexed.offset, starting_offset)).position
            # Nothing of these batches is sent: the walk holds their chunks, not the response.
            batches = self._batches(segment, position, starting_offset, read_ahead=False, sent=False)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    if batch.header.max_timestamp < timestamp:
                        continue
                    found = _record_at_or_after(batch, timestamp, starting_offset)
                    if found is not None:
                        return found
        return None

    # ------------------------------------------------------------------ batches

    async def batches(
        self, segment: RemoteLogSegmentMetadata, position: int = 0, *, from_offset: int = 0, read_ahead: bool = True
    ) -> AsyncGenerator[Batch, None]:
        """The segment's batches from byte `position` of its `.log` (a batch boundary, as the
        offset index gives), those ending before `from_offset` passed over, none past the
        segment's end offset. Bytes that cannot be what Kafka wrote raise CorruptRemoteSegment
        and drop the segment's cached bytes."""
        with self._corruption_of(segment):
            async with contextlib.aclosing(self._batches(segment, position, from_offset,
                                                         read_ahead=read_ahead)) as batches:
                async for batch in batches:
                    yield batch

    async def _batches(
        self, segment: RemoteLogSegmentMetadata, position: int, from_offset: int, *, read_ahead: bool,
        read_ahead_to: int | None = None, sent: bool = True,
    ) -> AsyncGenerator[Batch, None]:
        """With `read_ahead`, chunks load ahead of the one read, up to chunk `read_ahead_to`
        if given. Unless `sent` is False, the batches go into the response being made in
        this context, if any, which holds their chunks."""
        blocks_checked = await self._store_checks_blocks(segment)
        cache = self.chunk_cache
        first = position // cache.chunk_size
        # Outside a response, the chunks of the batches not yet passed over are held here.
        window = ChunkLeases(response=False) if current_leases() is None or not sent else None
        held: collections.deque[tuple[int, memoryview]] = collections.deque()

        def from_position(chunk: bytes | memoryview, index: int) -> bytes | memoryview:
            return memoryview(chunk)[position - index * cache.chunk_size:] if index == first else chunk

        async def chunks() -> AsyncGenerator[bytes | memoryview, None]:
            for index in range(first, cache.chunk_count(segment)):
                if read_ahead:  # before waiting on a miss: the next chunks load alongside this one
                    ahead = self.read_ahead.chunks(cache.chunk_size)
                    cache.prefetch(segment, index + 1, ahead if read_ahead_to is None else
                                   min(ahead, read_ahead_to - index))
                try:
                    chunk = await cache.get(segment, index, read_ahead=False, leases=window)
                except CorruptChunk as e:
                    # The checked bytes in front of the corrupt block still give their whole
                    # batches; the read stops at the block with the store's own error.
                    intact = from_position(e.intact, index)
                    if len(intact):
                        yield intact
                    raise e.error from None
                if window is not None:
                    held.append((index, chunk))
                yield from_position(chunk, index)

        try:
            async with contextlib.aclosing(chunks()) as pieces, contextlib.aclosing(
                    log_batches_async(pieces, position=position, end=segment.segment_size_in_bytes)) as batches:
                async for batch in batches:
                    if window is not None:  # the batches before this one are done with
                        while held and (held[0][0] + 1) * cache.chunk_size <= batch.position:
                            window.release_one(held.popleft()[1].obj)  # type: ignore[arg-type]  # a chunk's view is over its mmap buffer
                    header = batch.header
                    if header.last_offset > segment.end_offset:
                        return  # past a truncated segment's end: never served
                    if header.last_offset < from_offset:
                        continue
                    if not blocks_checked and not batch.crc_valid():
                        raise CorruptRemoteSegment(
                            f"segment {segment.segment_id.id} of {segment.topic_id_partition}: batch at offset "
                            f"{header.base_offset} fails its CRC-32C check")
                    yield batch
        finally:
            if window is not None:
                window.release()

    async def _store_checks_blocks(self, segment: RemoteLogSegmentMetadata) -> bool:
        checked = self._blocks_checked.get(segment.segment_id.id)
        if checked is None:
            checked = self._blocks_checked[segment.segment_id.id] = await self.rsm.checks_log_blocks(segment)
        return checked

    # ------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _corruption_of(self, segment: RemoteLogSegmentMetadata) -> Iterator[None]:
        """Bytes or indexes of `segment` that cannot be what Kafka wrote: CorruptRemoteSegment,
        and the segment's cached copies are dropped so that a retry reads the store again."""
        try:
            yield
        except (DecodeError, CorruptIndexError) as e:
            self._forget(segment)
            raise CorruptRemoteSegment(f"segment {segment.segment_id.id} of {segment.topic_id_partition}: {e}") from e
        except CorruptRemoteSegment:
            self._forget(segment)
            raise

    def _stopped_early(self, segment: RemoteLogSegmentMetadata, error: Exception) -> None:
        """A read served the intact batches in front of bytes that cannot be read: the
        corruption is counted as a failed read's would be."""
        tp = segment.topic_id_partition
        self.metrics.read_error(tp.topic, Cause.CORRUPT)
        self._corruption_log.log(
            segment.segment_id.id, logging.WARNING,
            "segment %s of %s: served the intact batches in front of bytes that cannot be read: %s",
            segment.segment_id.id, tp, error)

    def _forget(self, segment: RemoteLogSegmentMetadata) -> None:
        self.chunk_cache.invalidate(segment.segment_id.id)
        self.index_cache.invalidate(segment.segment_id.id)
        self._blocks_checked.pop(segment.segment_id.id, None)

    @contextlib.contextmanager
    def _counting_errors(self, tp: TopicIdPartition) -> Iterator[None]:
        try:
            yield
        except RemoteStorageError as e:
            # MetadataNotReady is counted where the proxy answers it (RemoteTier.error_code_for):
            # most reads meet it before they reach this reader.
            self.metrics.read_error(tp.topic, cause_of(e))
            raise


def _record_at_or_after(batch: Batch, timestamp: int, starting_offset: int) -> TimestampAndOffset | None:
    """The first record of the batch with timestamp >= `timestamp` and offset >= `starting_offset`,
    with its own offset and timestamp: the batch is decompressed when it must be."""
    found = first_record_at_or_after(batch.view, timestamp, starting_offset)
    if found is None:
        return None
    epoch = batch.header.partition_leader_epoch
    return TimestampAndOffset(found[1], found[0], epoch if epoch >= 0 else NO_LEADER_EPOCH)
