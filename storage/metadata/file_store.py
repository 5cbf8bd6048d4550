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
decode is not a torn write: start-up fails with MetadataDecodeError.

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
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
from pathlib import Path

import crc32c

from ..errors import MetadataNotReady, RemoteLogMetadataError
from ..files import fsync_directory
from ..model import TopicIdPartition
from . import RemoteLogMetadataManager
from .serde import MetadataDecodeError, RemoteLogMetadata, deserialize, read_uvarint, serialize, uvarint_bytes

log = logging.getLogger(__name__)

LOG_FILE_NAME = "remote_log_metadata.log"
LOCK_FILE_NAME = "remote_log_metadata.lock"
_CRC = struct.Struct(">I")


def encode_checked_entry(record_bytes: bytes) -> bytes:
    length = uvarint_bytes(len(record_bytes))
    return length + _CRC.pack(crc32c.crc32c(record_bytes, crc32c.crc32c(length))) + record_bytes


def scan_entries(data: bytes, pos: int = 0) -> tuple[list[RemoteLogMetadata], int]:
    """Decodes whole, CRC-valid entries from `pos`; returns them and where the valid part ends."""
    records: list[RemoteLogMetadata] = []
    view = memoryview(data)
    while pos < len(view):
        try:
            length, start = read_uvarint(view, pos)
        except MetadataDecodeError:
            break  # a torn length
        end = start + _CRC.size + length
        if end > len(view):
            break
        (crc,) = _CRC.unpack_from(view, start)
        record_bytes = view[start + _CRC.size:end]
        if length == 0 or crc32c.crc32c(record_bytes, crc32c.crc32c(view[pos:start])) != crc:
            break
        try:
            records.append(deserialize(record_bytes))
        except MetadataDecodeError as exc:
            raise MetadataDecodeError(f"entry at position {pos} has a valid CRC but does not decode: {exc}") from exc
        pos = end
    return records, pos


class FileRemoteLogMetadataManager(RemoteLogMetadataManager):
    def __init__(self, directory: str | os.PathLike[str], *, read_only: bool = False, shared: bool = False) -> None:
        super().__init__()
        if read_only and shared:
            raise ValueError("a read-only metadata manager takes no lock: read_only and shared exclude each other")
        self.directory = Path(directory)
        self.path = self.directory / LOG_FILE_NAME
        self.read_only = read_only
        self.shared = shared
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._position = 0  # end of the valid entries read or written so far
        self._write_lock = asyncio.Lock()
        self._started = asyncio.Event()
        self._closed = False

    async def start(self) -> None:
        if self._started.is_set():
            return
        await asyncio.to_thread(self._open)
        self._started.set()

    def _open(self) -> None:
        if self.read_only:
            self._load()
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
            self._catch_up()
        finally:
            if self.shared:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _catch_up(self) -> None:
        """Under the lock: replay what others appended, and cut a torn tail (its writer is gone)."""
        assert self._fd is not None
        self._load()
        size = os.fstat(self._fd).st_size
        if size > self._position:
            log.warning("%s: cutting %d bytes of a torn or corrupt tail at position %d",
                        self.path, size - self._position, self._position)
            os.ftruncate(self._fd, self._position)
            os.fsync(self._fd)

    def _load(self) -> int:
        """Replays entries past `_position`; returns how many."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._position)
                data = f.read()
        except FileNotFoundError:
            return 0
        records, end = scan_entries(data)
        for record in records:
            self._cache.replay(record)
        self._position += end
        return len(records)

    @property
    def needs_refresh(self) -> bool:
        return self.read_only or self.shared

    async def refresh(self) -> int:
        """Read-only and shared instances: applies entries another process appended; returns how many."""
        if self._fd is not None and not self.shared:
            return 0  # the only writer already sees its own appends
        async with self._write_lock:  # not while an append of ours moves `_position`
            return await asyncio.to_thread(self._load)

    async def _publish(self, record: RemoteLogMetadata) -> None:
        if self.read_only:
            raise RemoteLogMetadataError(f"{self.path} is open read-only")
        if self._fd is None:
            raise MetadataNotReady(f"{self.path} is not open (start() not called, or closed)")
        # The lock spans the append so records reach the file in the order they were checked.
        async with self._write_lock:
            if self.shared:
                await asyncio.to_thread(self._append_shared, record)
            else:
                self._cache.check(record)
                await asyncio.to_thread(self._append, encode_checked_entry(serialize(record)))
            self._cache.apply(record)

    def _append_shared(self, record: RemoteLogMetadata) -> None:
        assert self._lock_fd is not None
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._catch_up()
            self._cache.check(record)  # against every write that came before, whoever made it
            self._append(encode_checked_entry(serialize(record)))
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _append(self, entry: bytes) -> None:
        assert self._fd is not None
        try:
            written = os.write(self._fd, entry)
            if written != len(entry):
                raise OSError(f"short write of {written} of {len(entry)} bytes to {self.path}")
            os.fsync(self._fd)
        except OSError:
            # Leave no partial entry behind for the next append to follow.
            os.ftruncate(self._fd, self._position)
            raise
        self._position += len(entry)

    def _is_ready(self, tp: TopicIdPartition) -> bool:
        return self._started.is_set() and not self._closed

    async def wait_until_ready(self, tp: TopicIdPartition, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._started.wait(), timeout)
        except TimeoutError:
            raise MetadataNotReady(f"remote log metadata in {self.path} not loaded after {timeout}s") from None

    async def close(self) -> None:
        async with self._write_lock:
            self._closed = True
            for fd in (self._fd, self._lock_fd):
                if fd is not None:
                    os.close(fd)  # closing the lock descriptor releases the flock
            self._fd = self._lock_fd = None
