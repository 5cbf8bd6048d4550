"""The remote read side wired from the configuration: caches, reader and its pool.

Every remote read a request makes goes through here and comes back as a ReadOutcome
(the value, the error, or `expired`), never as an exception. Fetch reads and
ListOffsets lookups by timestamp run on the reader pool, within its bounds: a Fetch
waits at most `remote.fetch.max.wait.ms` (then empty records, as Kafka), a lookup
`remote.list.offsets.request.timeout.ms` (then REQUEST_TIMED_OUT, as Kafka). The
earliest and latest tiered offsets come from the metadata in memory and take no
reader, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tierproxy.cache.chunk_cache import ChunkCache
from tierproxy.cache.index_cache import RemoteIndexCache
from tierproxy.config import (
    Config,
    REMOTE_FETCH_MAX_WAIT_MS,
    REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS,
    REMOTE_LOG_CHUNK_CACHE_SIZE_BYTES,
    REMOTE_LOG_CHUNK_SIZE_BYTES,
    REMOTE_LOG_INDEX_CACHE_DIR,
    REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES,
    REMOTE_LOG_READER_MAX_PENDING_TASKS,
    REMOTE_LOG_READER_THREADS,
    REMOTE_LOG_READ_AHEAD_CHUNKS,
    REMOTE_LOG_READ_AHEAD_MAX_CHUNKS,
)
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import TopicIdPartition
from tierproxy.storage.rsm import RemoteStorageManager

from .metrics import RemoteMetrics
from .reader import OffsetAndEpoch, RemoteLogReader, RemoteReadResult, TimestampAndOffset
from .reader_pool import ReadOutcome, RemoteLogReaderPool

T = TypeVar("T")


@dataclass
class RemoteReadEngine:
    """The caches, the reader and its pool, built from the proxy's configuration."""

    reader: RemoteLogReader
    pool: RemoteLogReaderPool
    index_cache: RemoteIndexCache
    chunk_cache: ChunkCache
    metrics: RemoteMetrics
    fetch_max_wait_s: float
    list_offsets_timeout_s: float

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
            # The reader's read-ahead grows up to this where the store's latency needs it.
            max_prefetch_per_segment=max(config[REMOTE_LOG_READ_AHEAD_CHUNKS],
                                         config[REMOTE_LOG_READ_AHEAD_MAX_CHUNKS]),
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
            list_offsets_timeout_s=config[REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS] / 1000,
        )

    async def start(self) -> None:
        await self.index_cache.start()
        await self.chunk_cache.start()

    async def close(self) -> None:
        await self.pool.close()
        await self.reader.close()

    # ------------------------------------------------------------------ Fetch

    async def read(self, tp: TopicIdPartition, fetch_offset: int, max_bytes: int, **options: Any
                   ) -> ReadOutcome[RemoteReadResult]:
        """`RemoteLogReader.read(tp, fetch_offset, max_bytes, **options)` on the pool, waiting at
        most remote.fetch.max.wait.ms. The outcome holds the result, the error (ReaderQueueFull
        included), or `expired`."""
        return await self.pool.read(lambda: self.reader.read(tp, fetch_offset, max_bytes, **options),
                                    timeout=self.fetch_max_wait_s, topic=tp.topic, cost=max_bytes)

    # ------------------------------------------------------------------ ListOffsets

    async def offset_for_timestamp(self, tp: TopicIdPartition, timestamp: int) -> ReadOutcome[TimestampAndOffset | None]:
        """`RemoteLogReader.offset_for_timestamp` on the pool (ListOffsets with a timestamp >= 0)."""
        return await self.pool.read(lambda: self.reader.offset_for_timestamp(tp, timestamp),
                                    timeout=self.list_offsets_timeout_s, topic=tp.topic)

    async def max_timestamp(self, tp: TopicIdPartition) -> ReadOutcome[TimestampAndOffset | None]:
        """`RemoteLogReader.max_timestamp` on the pool (ListOffsets -3)."""
        return await self.pool.read(lambda: self.reader.max_timestamp(tp),
                                    timeout=self.list_offsets_timeout_s, topic=tp.topic)

    async def earliest_remote_offset(self, tp: TopicIdPartition) -> ReadOutcome[OffsetAndEpoch | None]:
        """The remote log start offset and its epoch (ListOffsets -2), from the metadata."""
        return _at_once(lambda: self.reader.earliest_remote_offset(tp))

    async def latest_tiered_offset(self, tp: TopicIdPartition) -> ReadOutcome[OffsetAndEpoch | None]:
        """The highest remote offset and its epoch (ListOffsets -5), from the metadata."""
        return _at_once(lambda: self.reader.latest_tiered_offset(tp))


def _at_once(lookup: Callable[[], T]) -> ReadOutcome[T]:
    try:
        return ReadOutcome(value=lookup())
    except Exception as e:  # noqa: BLE001 - the outcome carries it, as the pool's do
        return ReadOutcome(error=e)
