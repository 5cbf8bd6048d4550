"""Kafka's `RemoteIndexCache`: remote segments' indexes, parsed, bounded by bytes.

Entries are keyed by (segment id, index type) and weighted by the bytes of the
index file (plus a small fixed overhead, so that many empty transaction indexes
still count). Only the offset, time and transaction indexes are cached: those are
what a remote fetch and a ListOffsets lookup read.

A missing key is loaded once however many readers ask at the same time
(`SingleFlight`); a failed load is not cached. A segment copied without a
transaction index gets an empty one, as Kafka's cache does.

With a directory, every cached entry is also a file there, named

    <20-digit segment start offset>_<segment id as Kafka prints it>_<CRC-32C hex><suffix>

holding the index exactly as stored remotely. Files are written to a temporary
name and renamed, and removed when their entry is evicted, all on one worker
thread so that a write and a later removal of the same file keep their order. At
start-up the files are reloaded, most recently written first, up to the same byte
bound; the rest, leftover temporary files, and files whose CRC or format is wrong
are deleted (a dropped entry is simply fetched again when asked for).

The proxy's worker processes share one directory (`shared`): a miss first looks
for a file another worker wrote, and takes it without a remote read. A worker
removes only the files it wrote or reloaded at start-up, and its start-up leaves the
others' files (and their temporary files younger than TEMP_FILE_AGE_S) alone; the
supervisor cuts the directory to the whole proxy's bound before the workers start.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import crc32c
from cachetools import LRUCache

from tierproxy.storage.errors import CorruptRemoteSegment, RemoteResourceNotFound, RemoteSegmentNotFound
from tierproxy.storage.files import TEMP_SUFFIX, write_atomically
from tierproxy.storage.indexes import CorruptIndexError, OffsetIndex, TimeIndex, TransactionIndex
from tierproxy.storage.model import IndexType, RemoteLogSegmentMetadata
from tierproxy.storage.rsm import RemoteStorageManager, kafka_uuid

from . import NO_METRICS, CacheMetrics
from .single_flight import SingleFlight

log = logging.getLogger(__name__)

Index = OffsetIndex | TimeIndex | TransactionIndex
CACHED_TYPES = (IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION)
# Per-entry bookkeeping counted on top of the file bytes.
ENTRY_OVERHEAD_BYTES = 128
# In a shared directory a younger temporary file may be another process's write in flight.
TEMP_FILE_AGE_S = 60.0

_FILE_NAME = re.compile(r"^(\d{20})_([A-Za-z0-9_-]{22})_([0-9a-f]{8})(\.index|\.timeindex|\.txnindex)$")

CacheKey = tuple[uuid.UUID, IndexType]


@dataclass(frozen=True, slots=True)
class _Entry:
    index: Index
    weight: int
    file_name: str
    # False for a file another worker wrote and this one only read: that worker removes it.
    owns_file: bool = True


def parse_index(index_type: IndexType, data: bytes, base_offset: int) -> Index:
    if index_type is IndexType.OFFSET:
        return OffsetIndex.from_bytes(data, base_offset)
    if index_type is IndexType.TIMESTAMP:
        return TimeIndex.from_bytes(data, base_offset)
    if index_type is IndexType.TRANSACTION:
        return TransactionIndex.from_bytes(data)
    raise ValueError(f"{index_type.name} indexes are not cached")


def index_file_name(base_offset: int, segment_id: uuid.UUID, index_type: IndexType, data: bytes) -> str:
    return f"{base_offset:020d}_{kafka_uuid(segment_id)}_{crc32c.crc32c(data):08x}{index_type.suffix}"


class _WeightedLru(LRUCache):
    """cachetools' LRU by weight, telling its owner about every eviction."""

    def __init__(self, maxsize: int, on_evict: Callable[[CacheKey, _Entry], None]) -> None:
        super().__init__(maxsize, getsizeof=lambda entry: entry.weight)
        self._on_evict = on_evict

    def popitem(self) -> tuple[CacheKey, _Entry]:
        key, entry = super().popitem()
        self._on_evict(key, entry)
        return key, entry


class RemoteIndexCache:
    def __init__(
        self,
        rsm: RemoteStorageManager,
        *,
        max_bytes: int,
        cache_dir: str | os.PathLike[str] | None = None,
        shared: bool = False,
        metrics: CacheMetrics = NO_METRICS,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.rsm = rsm
        self.max_bytes = max_bytes
        self.cache_dir = Path(cache_dir) if cache_dir else None
        # Other processes (the proxy's workers) use the same directory: a miss looks there
        # before the remote store, and start-up leaves their files alone.
        self.shared = shared
        self._metrics = metrics
        self._entries = _WeightedLru(max_bytes, self._evicted)
        self._flight: SingleFlight[CacheKey, Index] = SingleFlight()
        # One thread: file writes and removals run in the order they were asked for.
        self._disk = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="remote-index-cache")
            if self.cache_dir is not None
            else None
        )
        self._disk_pending: set[asyncio.Future[None]] = set()
        self._publish_size()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Reload the directory's files (no-op without a directory)."""
        if self.cache_dir is None or self._disk is None:
            return
        loop = asyncio.get_running_loop()
        loaded = await loop.run_in_executor(self._disk, functools.partial(
            load_index_directory, self.cache_dir, self.max_bytes, shared=self.shared))
        for key, entry in loaded:  # oldest first, so the newest end up most recently used
            self._entries[key] = entry
        self._publish_size()
        if loaded:
            log.info("remote index cache: reloaded %d indexes (%d bytes) from %s",
                     len(loaded), self.total_bytes, self.cache_dir)

    async def close(self) -> None:
        await self._flight.close()
        if self._disk_pending:
            await asyncio.gather(*self._disk_pending, return_exceptions=True)
        if self._disk is not None:
            self._disk.shutdown(wait=True)

    async def __aenter__(self) -> RemoteIndexCache:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ reads

    @property
    def total_bytes(self) -> int:
        return int(self._entries.currsize)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries

    async def offset_index(self, segment: RemoteLogSegmentMetadata) -> OffsetIndex:
        index = await self.get(segment, IndexType.OFFSET)
        assert isinstance(index, OffsetIndex)
        return index

    async def time_index(self, segment: RemoteLogSegmentMetadata) -> TimeIndex:
        index = await self.get(segment, IndexType.TIMESTAMP)
        assert isinstance(index, TimeIndex)
        return index

    async def transaction_index(self, segment: RemoteLogSegmentMetadata) -> TransactionIndex:
        index = await self.get(segment, IndexType.TRANSACTION)
        assert isinstance(index, TransactionIndex)
        return index

    async def get(self, segment: RemoteLogSegmentMetadata, index_type: IndexType) -> Index:
        """The parsed index; errors are the storage's (CorruptRemoteSegment for a bad file)."""
        if index_type not in CACHED_TYPES:
            raise ValueError(f"{index_type.name} indexes are not cached")
        key = (segment.segment_id.id, index_type)
        entry = self._entries.get(key)
        if entry is not None:
            self._metrics.hit()
            return entry.index
        self._metrics.miss()
        return await self._flight.run(key, lambda: self._load(segment, index_type))

    def prefetch(self, segment: RemoteLogSegmentMetadata, index_type: IndexType) -> None:
        """Load an index a reader will want soon in the background, unless cached or loading;
        a failure is not reported here but to the reader that asks for it."""
        key = (segment.segment_id.id, index_type)
        if key not in self._entries and not self._flight.in_flight(key):
            self._flight.start(key, lambda: self._load(segment, index_type))

    def invalidate(self, segment_id: uuid.UUID) -> None:
        """Forget a segment's indexes (it was deleted, or found corrupt)."""
        for index_type in CACHED_TYPES:
            entry = self._entries.pop((segment_id, index_type), None)
            if entry is not None:
                self._remove_file(entry)
        self._publish_size()

    # ------------------------------------------------------------------ loading

    async def _load(self, segment: RemoteLogSegmentMetadata, index_type: IndexType) -> Index:
        if self.shared and self._disk is not None:
            data = await asyncio.get_running_loop().run_in_executor(
                self._disk, self._read_shared, segment, index_type)
            if data is not None:  # another worker fetched it
                return self._keep(segment, index_type, data, write=False)
        try:
            data = await self.rsm.fetch_index(segment, index_type)
        except RemoteSegmentNotFound:
            raise  # no manifest (yet): nothing is known of its indexes, keep nothing
        except RemoteResourceNotFound:
            if index_type is not IndexType.TRANSACTION:
                raise
            data = b""  # copied without a transaction index: no aborted transactions
        self._metrics.loaded(segment.topic_id_partition.topic, len(data))
        return self._keep(segment, index_type, data, write=True)

    def _keep(self, segment: RemoteLogSegmentMetadata, index_type: IndexType, data: bytes, *, write: bool) -> Index:
        """Parse and cache an index's bytes; with `write`, also into the directory."""
        try:
            index = parse_index(index_type, data, segment.start_offset)
        except CorruptIndexError as e:
            raise CorruptRemoteSegment(f"{index_type.name} index of segment {segment.segment_id.id}: {e}") from e
        key = (segment.segment_id.id, index_type)
        name = index_file_name(segment.start_offset, segment.segment_id.id, index_type, data)
        entry = _Entry(index, len(data) + ENTRY_OVERHEAD_BYTES, name, owns_file=write)
        replaced = self._entries.pop(key, None)
        if replaced is not None:
            self._remove_file(replaced)
        try:
            self._entries[key] = entry
        except ValueError:
            return index  # larger than the whole cache: served, not kept
        if write:
            self._write_file(name, data)
        self._publish_size()
        return index

    def _read_shared(self, segment: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes | None:
        """The index's bytes from the directory, if a process sharing it wrote them (CRC-checked)."""
        assert self.cache_dir is not None
        prefix = f"{segment.start_offset:020d}_{kafka_uuid(segment.segment_id.id)}_"
        for path in self.cache_dir.glob(f"{prefix}*{index_type.suffix}"):
            match = _FILE_NAME.match(path.name)
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # evicted meanwhile
                continue
            if match is not None and crc32c.crc32c(data) == int(match.group(3), 16):
                return data
        return None

    def _evicted(self, key: CacheKey, entry: _Entry) -> None:
        self._metrics.evicted()
        self._remove_file(entry)

    def _publish_size(self) -> None:
        self._metrics.size(self.total_bytes, len(self._entries))

    # ------------------------------------------------------------------ disk

    def _submit_disk(self, function: Callable[..., None], *args: object) -> None:
        if self._disk is None:
            return
        future = asyncio.get_running_loop().run_in_executor(self._disk, function, *args)
        self._disk_pending.add(future)
        future.add_done_callback(self._disk_done)

    def _disk_done(self, future: asyncio.Future[None]) -> None:
        self._disk_pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            # The disk copy is only a head start for the next start-up; memory stays right.
            log.warning("remote index cache: disk operation failed: %s", future.exception())

    def _write_file(self, name: str, data: bytes) -> None:
        self._submit_disk(self._write_sync, name, data)

    def _remove_file(self, entry: _Entry) -> None:
        if entry.owns_file:
            self._submit_disk(self._remove_sync, entry.file_name)

    def _write_sync(self, name: str, data: bytes) -> None:
        assert self.cache_dir is not None
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # The disk copy is only a head start: no directory fsync.
        write_atomically(self.cache_dir / name, data, sync_directory=False)

    def _remove_sync(self, name: str) -> None:
        assert self.cache_dir is not None
        (self.cache_dir / name).unlink(missing_ok=True)


def load_index_directory(directory: Path, max_bytes: int, *, shared: bool = False) -> list[tuple[CacheKey, _Entry]]:
    """Valid index files, newest first up to `max_bytes`; returned oldest first.

    Unreadable files and leftover temporary files are deleted. Alone, so are the valid
    files beyond the bound. In a directory `shared` with other live processes, the rest
    may be theirs: it is left, and only temporary files older than TEMP_FILE_AGE_S count
    as leftovers.
    """
    directory.mkdir(parents=True, exist_ok=True)
    candidates: list[tuple[float, Path, re.Match[str]]] = []
    now = time.time()
    for path in directory.iterdir():
        match = _FILE_NAME.match(path.name)
        if match is None or not path.is_file():
            if path.is_file() and (path.name.endswith(TEMP_SUFFIX) or path.name.startswith(".")):
                if not shared or now - path.stat().st_mtime > TEMP_FILE_AGE_S:
                    path.unlink(missing_ok=True)  # a write cut short by a crash
            continue
        candidates.append((path.stat().st_mtime, path, match))
    candidates.sort(key=lambda c: c[0], reverse=True)
    kept: list[tuple[CacheKey, _Entry]] = []
    seen: set[CacheKey] = set()
    used = 0
    for _, path, match in candidates:
        entry = _read_index_file(path, match)
        if entry is None:
            path.unlink(missing_ok=True)
            continue
        key, value = entry
        if used + value.weight > max_bytes or key in seen:
            if not shared:
                path.unlink(missing_ok=True)
            continue
        used += value.weight
        seen.add(key)
        kept.append(entry)
    kept.reverse()
    return kept


def prune_index_directory(directory: str | os.PathLike[str], max_bytes: int) -> None:
    """Cut a directory to `max_bytes` of valid index files, as a cache alone in it does at
    start-up (before workers that share it start)."""
    load_index_directory(Path(directory), max_bytes)


def _read_index_file(path: Path, match: re.Match[str]) -> tuple[CacheKey, _Entry] | None:
    base_offset = int(match.group(1))
    segment_id = uuid.UUID(bytes=base64.urlsafe_b64decode(match.group(2) + "=="))
    crc = int(match.group(3), 16)
    index_type = IndexType(match.group(4))
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # removed by a process sharing the directory
        return None
    if crc32c.crc32c(data) != crc:
        log.warning("remote index cache: dropping %s: CRC-32C mismatch", path)
        return None
    try:
        index = parse_index(index_type, data, base_offset)
    except CorruptIndexError as e:
        log.warning("remote index cache: dropping %s: %s", path, e)
        return None
    return (segment_id, index_type), _Entry(index, len(data) + ENTRY_OVERHEAD_BYTES, path.name)
