"""FileRemoteLogMetadataManager: remote log metadata in one local append-only file.

The embedded default, for a single proxy (or pipeline) host. The file
`<directory>/remote_log_metadata.log` is a sequence of entries:

    length   unsigned varint, size of the record
    crc      uint32 big-endian, CRC-32C (Castagnoli) of the length bytes and the record
             (so a zero-filled tail, which a crash can leave, never passes)
    record   one metadata record, as `serde.serialize` writes it (Kafka's topic format)

An append is one `write` on an O_APPEND descriptor followed by `fsync`, and returns only
then. A crash can leave only the last entry torn; at start the first entry that is short or
fails its CRC, and everything after it, is cut off the file with a warning (as Kafka's log
recovery truncates at the first invalid batch). An entry whose CRC matches but which does not
decode is not a torn write: start-up fails with MetadataDecodeError. The file is read a chunk
at a time, never whole.

Snapshot: `<directory>/remote_log_metadata.snapshot` (`snapshot.py`) holds the state of every
partition as of a position in the log, so a start loads it and replays only the log after
it. Writers write it (temp file, fsync, rename) when the log grew `snapshot_interval_bytes`
past the last one, at start, after an append, or at close; readers only read it. One that
does not decode, or whose position is not where an entry of this log ends with the CRC it
names (another log, or a log cut shorter), is ignored with a warning: the log is replayed
from its start.

Processes, all through an exclusive `flock` on `<directory>/remote_log_metadata.lock`:

- by default one writer per directory: it holds the lock for its whole life (a second
  writer fails at start);
- `shared=True` writers (the tiering pipeline's driver and its tasks, which may run in
  several processes at once) take the lock for each append only. Under the lock a writer
  first replays the entries others appended since its last read (and cuts a torn tail: whoever
  left it no longer holds the lock), then checks its record against that state, appends and
  fsyncs. So every writer's checks see every earlier write, and the file stays one valid
  sequence. They need a file system where `flock` works across all of them (one machine).
  A shared writer's reads see others' appends after `refresh()` (or its next append);
- any number of `read_only=True` instances may follow the file: they take no lock, never
  truncate, and `refresh()` picks up entries appended since the last read (a half-written
  tail is left for the next refresh).

An instance for some `partitions` only (a copy task's) skips the others' snapshot sections
and records, and never writes a snapshot.

Once started, the cache changes only on the event loop's thread (files are read in threads),
so lookups never see half of a change.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import crc32c

from ..errors import MetadataNotReady, RemoteLogMetadataError
from ..files import fsync_directory
from ..model import TopicIdPartition
from . import LoadedAtStart
from .cache import RemoteLogMetadataCache
from .serde import (
    MetadataDecodeError,
    RemoteLogMetadata,
    deserialize,
    read_uvarint,
    serialize,
    topic_id_partition_of,
    uvarint_bytes,
)
from .snapshot import LogPosition, read_snapshot_header, read_snapshot_partitions, write_snapshot

log = logging.getLogger(__name__)

LOG_FILE_NAME = "remote_log_metadata.log"
LOCK_FILE_NAME = "remote_log_metadata.lock"
SNAPSHOT_FILE_NAME = "remote_log_metadata.snapshot"
DEFAULT_SNAPSHOT_INTERVAL_BYTES = 4 << 20  # about 40,000 records: a second or two of replay
READ_CHUNK_BYTES = 1 << 20
_CRC = struct.Struct(">I")
_MAX_UVARINT_BYTES = 5


def _checked_entry(record_bytes: bytes) -> tuple[bytes, int]:
    """(entry, its CRC)."""
    length = uvarint_bytes(len(record_bytes))
    crc = crc32c.crc32c(record_bytes, crc32c.crc32c(length))
    return length + _CRC.pack(crc) + record_bytes, crc


def encode_checked_entry(record_bytes: bytes) -> bytes:
    return _checked_entry(record_bytes)[0]


def _scan(view: memoryview, base: int) -> tuple[list[tuple[RemoteLogMetadata, int, int]], int, int | None]:
    """Whole, CRC-valid entries of `view` (which starts at file position `base`).

    Returns [(record, entry start, CRC)] (positions in `view`), where they end, and how many
    bytes of `view` the next entry needs: None when what follows is invalid (torn or
    corrupt) rather than cut short by the end of `view`."""
    entries: list[tuple[RemoteLogMetadata, int, int]] = []
    pos = 0
    while pos < len(view):
        try:
            length, start = read_uvarint(view, pos)
        except MetadataDecodeError:
            return entries, pos, pos + _MAX_UVARINT_BYTES if len(view) - pos < _MAX_UVARINT_BYTES else None
        end = start + _CRC.size + length
        if length == 0:
            return entries, pos, None
        if end > len(view):
            return entries, pos, end
        (crc,) = _CRC.unpack_from(view, start)
        record_bytes = view[start + _CRC.size:end]
        if crc32c.crc32c(record_bytes, crc32c.crc32c(view[pos:start])) != crc:
            return entries, pos, None
        try:
            entries.append((deserialize(record_bytes), pos, crc))
        except MetadataDecodeError as exc:
            raise MetadataDecodeError(
                f"entry at position {base + pos} has a valid CRC but does not decode: {exc}") from exc
        pos = end
    return entries, pos, pos


def scan_entries(data: bytes, pos: int = 0) -> tuple[list[RemoteLogMetadata], int]:
    """Decodes whole, CRC-valid entries from `pos`; returns them and where the valid part ends."""
    entries, end, _ = _scan(memoryview(data)[pos:], pos)
    return [record for record, _, _ in entries], pos + end


def read_entries(path: Path, at: LogPosition, chunk: int = READ_CHUNK_BYTES
                 ) -> tuple[list[RemoteLogMetadata], LogPosition]:
    """The records of whole, valid entries after `at`, about `chunk` bytes of them (more if one
    entry is larger), and the position after them: none at the end of the log or at a torn tail."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return [], at
    with f:
        f.seek(at.position)
        data = f.read(chunk)
        while True:
            entries, end, needs = _scan(memoryview(data), at.position)
            if entries or needs is None or needs <= len(data):
                break
            more = f.read(needs - len(data))  # one entry larger than the chunk
            if not more:
                break
            data += more
    if not entries:
        return [], at
    _, last, crc = entries[-1]
    first_crc = at.first_crc if at.position else entries[0][2]
    return [record for record, _, _ in entries], LogPosition(at.position + end, at.position + last, crc, first_crc)


class FileRemoteLogMetadataManager(LoadedAtStart):
    def __init__(
        self, directory: str | os.PathLike[str], *, read_only: bool = False, shared: bool = False,
        snapshot_interval_bytes: int = DEFAULT_SNAPSHOT_INTERVAL_BYTES,
        partitions: Iterable[TopicIdPartition] | None = None,
    ) -> None:
        super().__init__(partitions)
        if read_only and shared:
            raise ValueError("a read-only metadata manager takes no lock: read_only and shared exclude each other")
        self.directory = Path(directory)
        self.path = self.directory / LOG_FILE_NAME
        self.snapshot_path = self.directory / SNAPSHOT_FILE_NAME
        self.read_only = read_only
        self.shared = shared
        self.snapshot_interval_bytes = snapshot_interval_bytes
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._at = LogPosition()  # end of the valid entries read or written so far
        self._snapshot_at = LogPosition()  # where the newest snapshot known to this instance stands
        self._snapshot_unusable = False  # the one on disk did not load: replace it, whatever it claims
        self._write_lock = asyncio.Lock()
        self._started = asyncio.Event()
        self._closed = False
        # How many log records the last start replayed after its snapshot (tests and benchmarks).
        self.records_replayed_at_start = 0

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        if self._started.is_set():
            return
        await asyncio.to_thread(self._open)
        self._started.set()

    def _open(self) -> None:
        """In a thread, before any lookup is allowed: load, and as a writer cut a torn tail."""
        self._load_snapshot()
        if self.read_only:
            self.records_replayed_at_start = self._replay_tail()
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.directory / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        if self.shared:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        else:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock_fd)
                raise RemoteLogMetadataError(
                    f"{self.directory} is already open for writing by another process") from None
        self._lock_fd = lock_fd
        try:
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            if created:
                fsync_directory(self.directory)
            self.records_replayed_at_start = self._replay_tail()
            self._cut_torn_tail()
            if self._snapshot_due():
                self._write_snapshot()
        finally:
            if self.shared:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _load_snapshot(self) -> None:
        try:
            f = open(self.snapshot_path, "rb")
        except FileNotFoundError:
            return
        cache = RemoteLogMetadataCache()
        with f:
            try:
                at, count = read_snapshot_header(f)
                self._check_snapshot_matches_log(at)
                for state in read_snapshot_partitions(f, count, None if self.scope is None else self.in_scope):
                    cache.install(state)
            except (MetadataDecodeError, OSError) as exc:
                log.warning("%s is not usable (%s): replaying %s from its start instead",
                            self.snapshot_path, exc, self.path)
                self._snapshot_unusable = True
                return
        self._cache, self._at, self._snapshot_at = cache, at, at

    def _check_snapshot_matches_log(self, at: LogPosition) -> None:
        if at.position == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(at.last_entry)
            data = f.read(at.position - at.last_entry)
        entries, end, _ = _scan(memoryview(data), at.last_entry)
        if len(entries) != 1 or end != len(data) or entries[0][2] != at.last_crc:
            raise MetadataDecodeError(
                f"its position {at.position} is not the end of the entry it names in the log")
        if read_entries(self.path, LogPosition(), chunk=4096)[1].first_crc != at.first_crc:
            raise MetadataDecodeError("it was taken of a log with another first entry")

    def _replay(self, records: list[RemoteLogMetadata], at: LogPosition) -> int:
        for record in records:
            if self.in_scope(topic_id_partition_of(record)):
                self._cache.replay(record)
        self._at = at
        return len(records)

    def _replay_tail(self) -> int:
        """In a thread before start: replays the log after `_at`; returns how many records."""
        count = 0
        while (chunk := read_entries(self.path, self._at))[0]:
            count += self._replay(*chunk)
        return count

    def _cut_torn_tail(self) -> None:
        """Under the lock, at the end of the valid entries: whoever left a torn tail is gone."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size > self._at.position:
            log.warning("%s: cutting %d bytes of a torn or corrupt tail at position %d",
                        self.path, size - self._at.position, self._at.position)
            os.ftruncate(self._fd, self._at.position)
            os.fsync(self._fd)

    # ------------------------------------------------------------------ snapshots

    def _snapshot_due(self) -> bool:
        # An instance that keeps some partitions only cannot write a snapshot of them all.
        return self.scope is None and self._at.position - self._snapshot_at.position >= self.snapshot_interval_bytes

    def _write_snapshot(self) -> None:
        """Writes the snapshot as of `_at` unless one as new is there. In a thread while no
        change can come (before start, or under `_write_lock` after `_compact`)."""
        on_disk = LogPosition()
        if not self._snapshot_unusable:
            try:
                with open(self.snapshot_path, "rb") as f:
                    on_disk, _ = read_snapshot_header(f)  # another writer's may be newer
            except (FileNotFoundError, MetadataDecodeError):
                pass
        if on_disk.position < self._at.position:
            write_snapshot(self.snapshot_path, self._at, self._cache.partition_states())
            on_disk, self._snapshot_unusable = self._at, False
        self._snapshot_at = on_disk

    async def _snapshot_if_due(self) -> None:
        """On the loop under `_write_lock`."""
        if self._snapshot_due():
            for state in self._cache.partition_states():
                state.compact()  # on the loop: a snapshot only reads the arrays in its thread
            await asyncio.to_thread(self._write_snapshot)

    # ------------------------------------------------------------------ following the log

    @property
    def needs_refresh(self) -> bool:
        return self.read_only or self.shared

    async def refresh(self) -> int:
        """Read-only and shared instances: applies entries another process appended; returns how many."""
        if self._fd is not None and not self.shared:
            return 0  # the only writer already sees its own appends
        async with self._write_lock:  # not while an append of ours moves `_at`
            return await self._follow()

    async def _follow(self) -> int:
        """Replays the log after `_at`: read in a thread, applied here a chunk at a time."""
        count = 0
        while (chunk := await asyncio.to_thread(read_entries, self.path, self._at))[0]:
            count += self._replay(*chunk)
        return count

    # ------------------------------------------------------------------ writes

    async def _publish(self, record: RemoteLogMetadata) -> None:
        if self.read_only:
            raise RemoteLogMetadataError(f"{self.path} is open read-only")
        if self._fd is None:
            raise MetadataNotReady(f"{self.path} is not open (start() not called, or closed)")
        # Once begun, a write runs to its end even if the caller is cancelled: an entry in the
        # file but not in memory, or a file lock never released, is worse than a late return.
        await asyncio.shield(self._append_record(record))

    async def _append_record(self, record: RemoteLogMetadata) -> None:
        # The lock spans the append so records reach the file in the order they were checked.
        async with self._write_lock:
            entry, crc = _checked_entry(serialize(record))
            if self.shared:
                assert self._lock_fd is not None
                await asyncio.to_thread(fcntl.flock, self._lock_fd, fcntl.LOCK_EX)
                try:
                    await self._follow()
                    await asyncio.to_thread(self._cut_torn_tail)
                    self._cache.check(record)  # against every write that came before, whoever made it
                    await asyncio.to_thread(self._append, entry)
                finally:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            else:
                self._cache.check(record)
                await asyncio.to_thread(self._append, entry)
            self._at = self._at.after(self._at.position, self._at.position + len(entry), crc)
            self._cache.apply(record)
            await self._snapshot_if_due()

    def _append(self, entry: bytes) -> None:
        assert self._fd is not None
        try:
            written = os.write(self._fd, entry)
            if written != len(entry):
                raise OSError(f"short write of {written} of {len(entry)} bytes to {self.path}")
            os.fsync(self._fd)
        except OSError:
            # Leave no partial entry behind for the next append to follow.
            os.ftruncate(self._fd, self._at.position)
            raise

    # ------------------------------------------------------------------ readiness, close

    def _source(self) -> str:
        return str(self.path)

    async def close(self) -> None:
        async with self._write_lock:
            if self._fd is not None and not self._closed:
                await self._snapshot_if_due()
            self._closed = True
            for fd in (self._fd, self._lock_fd):
                if fd is not None:
                    os.close(fd)  # closing the lock descriptor releases the flock
            self._fd = self._lock_fd = None
